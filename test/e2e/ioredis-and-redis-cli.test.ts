/**
 * Real clients through the proxy: ioredis (how Node applications talk to
 * Redis) and redis-cli (how people do). Each gets what it gets from Redis
 * itself, except that a lock block on a key a rule names no longer re-arms
 * an expiry that is already set.
 *
 * ioredis 5 speaks RESP2 only, so there is no RESP3 case for it here.
 */
import { spawn } from 'node:child_process';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { cmd, RawClient } from '../support/resp.js';
import { attemptReplies, lockAttempt } from '../support/stalwart.js';

const env = redisAndProxy();
/** The ioredis clients a test opened and has not quit yet. */
const opened: Redis[] = [];

afterAll(() => {
  for (const client of opened) client.disconnect();
});

const adminCall = (...args: (string | Buffer)[]): Promise<string> => env.admin.call(...args);

const pttl = (key: Buffer | string): Promise<number> => env.admin.pttl(key);

async function ioredis(port: number): Promise<Redis> {
  const client = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0 });
  client.on('error', () => {}); // failures surface in the commands' promises
  opened.push(client);
  await client.connect();
  return client;
}

async function quit(client: Redis): Promise<void> {
  await client.quit();
  opened.splice(opened.indexOf(client), 1);
}

/** A Stalwart task-lock key (0x17 + 8 bytes) with CR, LF and NUL among its bytes. */
const BINARY_LOCK_KEY = Buffer.from([0x17, 0x0d, 0x0a, 0x00, 0x01, 0x0d, 0x0a, 0x00, 0xff]);

describe('ioredis', () => {
  for (const [name, key] of [
    ['a lock: key', 'lock:io'],
    ['a binary Stalwart key', BINARY_LOCK_KEY],
  ] as const) {
    it(`multi().incrby().expire().exec() on ${name}: expiry set once, never re-armed`, async () => {
      const client = await ioredis(env.proxy.port);
      const attempt = () => client.multi().incrby(key, 1).expire(key, 60).exec();
      expect(await attempt()).toEqual([
        [null, 1],
        [null, 1],
      ]);
      expect(await pttl(key)).toBeGreaterThan(55_000);
      await adminCall('PEXPIRE', key, '5000'); // as if 55 s had passed
      expect(await attempt()).toEqual([
        [null, 2],
        [null, 1], // what Redis alone answers; the expiry is left alone all the same
      ]);
      expect(await pttl(key)).toBeLessThanOrEqual(5000);
      await quit(client);

      // Directly, the same attempt re-arms the expiry: the behaviour the proxy is there to fix.
      const direct = await ioredis(env.redis.port);
      expect(await direct.multi().incrby(key, 1).expire(key, 60).exec()).toEqual([
        [null, 3],
        [null, 1],
      ]);
      expect(await pttl(key)).toBeGreaterThan(55_000);
      await quit(direct);
    });
  }

  it('100 pipelined commands with lock blocks in between: the same results as directly', async () => {
    type Outcome = { ok: unknown } | { err: string };
    const settle = (p: Promise<unknown>): Promise<Outcome> =>
      p.then(
        (ok) => ({ ok: normalize(ok) }),
        (e: Error) => ({ err: e.message }),
      );
    const plain: Array<(r: Redis) => Promise<unknown>> = [
      (r) => r.set('p:s', 'v\r\n\0'),
      (r) => r.get('p:s'),
      (r) => r.incr('p:n'),
      (r) => r.incrby('p:n', 5),
      (r) => r.rpush('p:l', 'a', 'b\r\n'),
      (r) => r.lrange('p:l', 0, -1),
      (r) => r.hset('p:h', 'f', '1', 'g', 'x'),
      (r) => r.hincrby('p:h', 'f', 2),
      (r) => r.hgetall('p:h'),
      (r) => r.sadd('p:set', 'm1', 'm2'),
      (r) => r.sismember('p:set', 'm1'),
      (r) => r.zadd('p:z', 2.5, 'a', 1, 'b'),
      (r) => r.zrange('p:z', 0, -1, 'WITHSCORES'),
      (r) => r.zincrby('p:z', 1.5, 'b'),
      (r) => r.incr('p:s'), // not an integer
      (r) => r.lpush('p:s', 'x'), // wrong type
      (r) => r.get('lock:pipe'), // a lock key read the ordinary way
      (r) => r.exists('p:s', 'p:l', 'lock:pipe', 'missing'),
      (r) => r.type('p:h'),
      (r) => r.echo('e\r\ncho'),
      (r) => r.multi().incr('lock:pipe-tx').get('lock:pipe-tx').exec(), // not the lock shape
      (r) => r.getdel('p:n'),
    ];
    const lockKeys = ['lock:pipe', BINARY_LOCK_KEY];
    const run = async (port: number) => {
      await adminCall('FLUSHALL');
      const client = await ioredis(port);
      const pending: Array<Promise<Outcome>> = [];
      const kinds: Array<'plain' | Buffer | string> = [];
      let plainCount = 0;
      for (let i = 0; plainCount < 100; i++) {
        if (i % 9 === 4) {
          const key = lockKeys[(i / 9) & 1];
          kinds.push(key);
          pending.push(settle(client.multi().incrby(key, 1).expire(key, 60).exec()));
        } else {
          kinds.push('plain');
          pending.push(settle(plain[plainCount % plain.length](client)));
          plainCount++;
        }
      }
      const results = await Promise.all(pending); // all sent before the first reply: one pipelined connection
      await quit(client);
      return { kinds, results };
    };

    const rewrittenBefore = env.proxy.stats.blocksRewritten;
    const direct = await run(env.redis.port);
    const proxied = await run(env.proxy.port);
    expect(proxied.kinds).toEqual(direct.kinds);
    const attempts = new Map<unknown, number>();
    let blocks = 0;
    for (let i = 0; i < direct.kinds.length; i++) {
      const kind = direct.kinds[i];
      if (kind === 'plain') {
        expect(proxied.results[i], `command #${i}`).toEqual(direct.results[i]);
        continue;
      }
      blocks++;
      const n = (attempts.get(kind) ?? 0) + 1;
      attempts.set(kind, n);
      // The replies are Redis alone's either way (the proxy's fix shows in the expiry, not in them).
      expect(direct.results[i], `block #${i}`).toEqual({
        ok: [
          [null, n],
          [null, 1],
        ],
      });
      expect(proxied.results[i], `block #${i}`).toEqual({
        ok: [
          [null, n],
          [null, 1],
        ],
      });
    }
    expect(blocks).toBeGreaterThanOrEqual(10);
    expect(env.proxy.stats.blocksRewritten - rewrittenBefore).toBe(blocks);
    // Sanity: the plain commands did hit every kind of reply.
    expect(JSON.stringify(direct.results)).toContain('WRONGTYPE');
    expect(JSON.stringify(direct.results)).toContain('not an integer');
  });

  it('watch() then multi() on a lock key: not rewritten, exactly as directly', async () => {
    const key = 'lock:watched';
    const scenario = async (port: number) => {
      await adminCall('FLUSHALL');
      await adminCall('SET', key, '1', 'PX', '5000');
      const client = await ioredis(port);
      await client.watch(key);
      const untouched = await client.multi().incrby(key, 1).expire(key, 60).exec();
      const rearmed = (await pttl(key)) > 5000;
      await client.watch(key);
      await adminCall('SET', key, '9', 'PX', '5000'); // another client touches it: EXEC must fail
      const touched = await client.multi().incrby(key, 1).expire(key, 60).exec();
      const after = await client.get(key);
      await quit(client);
      return { untouched, rearmed, touched, after };
    };
    const direct = await scenario(env.redis.port);
    expect(direct).toEqual({
      untouched: [
        [null, 2],
        [null, 1],
      ],
      rearmed: true,
      touched: null,
      after: '9',
    });
    expect(await scenario(env.proxy.port)).toEqual(direct);
  });
});

// ---------------------------------------------------------------------------
// redis-cli
// ---------------------------------------------------------------------------

interface CliResult {
  stdout: string;
  stderr: string;
  code: number | null;
}

/** Runs redis-cli (asynchronously: the proxy runs in this process) with `input` on stdin. */
function redisCli(args: string[], input = ''): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn('redis-cli', args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('latin1')));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('latin1')));
    child.on('error', reject);
    child.on('close', (code) => resolve({ stdout, stderr, code }));
    // Given its command as arguments, redis-cli may exit before reading stdin: EPIPE is no error here.
    child.stdin.on('error', () => {});
    child.stdin.end(input);
  });
}

const LOCK_LINES = 'MULTI\nINCRBY lock:cli 1\nEXPIRE lock:cli 60\nEXEC\n';

describe('redis-cli', () => {
  for (const protocol of [[], ['-3']]) {
    it(`typed lock block ${protocol.join(' ') || '(RESP2)'}: the first attempt prints what Redis prints`, async () => {
      const direct = await redisCli(['-p', String(env.redis.port), ...protocol], LOCK_LINES);
      expect(direct).toEqual({ stdout: 'OK\nQUEUED\nQUEUED\n1\n1\n', stderr: '', code: 0 });
      await adminCall('FLUSHALL');
      expect(await redisCli(['-p', String(env.proxy.port), ...protocol], LOCK_LINES)).toEqual(direct);
      expect(await pttl('lock:cli')).toBeGreaterThan(55_000);
    });
  }

  it('typed lock block, second attempt: the same replies, and the held lock keeps its expiry', async () => {
    // redis-cli sends one line and waits for its reply before the next one. Nothing is held: the
    // EXPIRE gains NX as it passes, or (before 7.0) goes as the expiry script.
    const second = async (port: number) => {
      await adminCall('FLUSHALL');
      await adminCall('SET', 'lock:cli', '1', 'PX', '5000');
      const out = await redisCli(['-p', String(port)], LOCK_LINES);
      return { out, rearmed: (await pttl('lock:cli')) > 5000 };
    };
    const direct = await second(env.redis.port);
    expect(direct).toEqual({ out: { stdout: 'OK\nQUEUED\nQUEUED\n2\n1\n', stderr: '', code: 0 }, rearmed: true });
    const rewrittenBefore = env.proxy.stats.blocksRewritten;
    const unfixedBefore = env.proxy.stats.byRule.get('test-lock')?.unfixed.get('hold-timeout') ?? 0;
    expect(await second(env.proxy.port)).toEqual({ out: direct.out, rearmed: false });
    expect(env.proxy.stats.blocksRewritten).toBe(rewrittenBefore + 1);
    expect(env.proxy.stats.byRule.get('test-lock')?.unfixed.get('hold-timeout') ?? 0).toBe(unfixedBefore);
  });

  it('a lock block whose sender stalls mid-block: the same replies, and fixed', async () => {
    const stalled = async (port: number) => {
      await adminCall('FLUSHALL');
      await adminCall('SET', 'lock:stall', '1', 'PX', '5000');
      const client = await RawClient.connect(port);
      try {
        client.write(Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:stall', '1')]));
        await new Promise((resolve) => setTimeout(resolve, 300)); // far beyond --hold-ms (10)
        client.write(Buffer.concat([cmd('EXPIRE', 'lock:stall', '60'), cmd('EXEC')]));
        return { replies: (await client.readReplies(4)).toString('latin1'), rearmed: (await pttl('lock:stall')) > 5000 };
      } finally {
        await client.close();
      }
    };
    const direct = await stalled(env.redis.port);
    expect(direct).toEqual({ replies: attemptReplies(2, 1), rearmed: true });
    const counts = () => env.proxy.stats.byRule.get('test-lock');
    const before = { seen: counts()?.seen ?? 0, unfixed: counts()?.unfixed.get('hold-timeout') ?? 0 };
    expect(await stalled(env.proxy.port)).toEqual({ replies: direct.replies, rearmed: false });
    expect(counts()?.seen).toBe(before.seen + 1);
    expect(counts()?.unfixed.get('hold-timeout') ?? 0).toBe(before.unfixed);
  });

  it('lock block in one write (--pipe): rewritten, counter 2 and the short expiry kept', async () => {
    const block = lockAttempt('lock:cli', 60);
    const second = async (port: number) => {
      await adminCall('FLUSHALL');
      await adminCall('SET', 'lock:cli', '1', 'PX', '5000');
      const out = await redisCli(['-p', String(port), '--pipe'], block.toString('latin1'));
      return { out, counter: await adminCall('GET', 'lock:cli'), ttl: await pttl('lock:cli') };
    };
    const direct = await second(env.redis.port);
    const proxied = await second(env.proxy.port);
    expect(proxied.out).toEqual(direct.out);
    expect(direct.out.stdout).toContain('errors: 0, replies: 4');
    expect(direct.counter).toBe('$1\r\n2\r\n');
    expect(proxied.counter).toBe('$1\r\n2\r\n');
    expect(direct.ttl).toBeGreaterThan(55_000); // re-armed by the loser's EXPIRE
    expect(proxied.ttl).toBeGreaterThan(0);
    expect(proxied.ttl).toBeLessThanOrEqual(5000); // not re-armed
  });

  it('--no-raw PING, and errors, print the same as directly', async () => {
    await adminCall('RPUSH', 'cli:list', 'a');
    const cases: Array<[string[], string]> = [
      [['--no-raw', 'PING'], ''],
      [['PING', 'hello'], ''],
      [['INCR', 'cli:list'], ''],
      [['--no-raw', 'INCR', 'cli:list'], ''],
      [['NOSUCHCMD', 'x'], ''],
      [[], 'RPUSH cli:l2 a\nINCR cli:l2\nGET\nPING\n'],
      [['--no-raw'], 'LRANGE cli:list 0 -1\nHSET cli:h f "a b"\nHGETALL cli:h\n'],
    ];
    for (const [args, input] of cases) {
      await adminCall('DEL', 'cli:l2', 'cli:h');
      const direct = await redisCli(['-p', String(env.redis.port), ...args], input);
      await adminCall('DEL', 'cli:l2', 'cli:h');
      const proxied = await redisCli(['-p', String(env.proxy.port), ...args], input);
      expect(proxied, `redis-cli ${args.join(' ')} <<< ${JSON.stringify(input)}`).toEqual(direct);
    }
    expect((await redisCli(['-p', String(env.proxy.port), '--no-raw', 'PING'])).stdout).toBe('PONG\n');
    expect((await redisCli(['-p', String(env.proxy.port), '--no-raw', 'INCR', 'cli:list'])).stdout).toBe(
      '(error) WRONGTYPE Operation against a key holding the wrong kind of value\n',
    );
  });
});

/** ioredis results as plain JSON-able data (errors inside EXEC arrays become their messages). */
function normalize(value: unknown): unknown {
  if (value instanceof Error) return { error: value.message };
  if (Buffer.isBuffer(value)) return { buffer: value.toString('hex') };
  if (Array.isArray(value)) return value.map(normalize);
  return value;
}
