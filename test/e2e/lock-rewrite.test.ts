/**
 * The rewrite itself, end to end against a real redis-server: Stalwart's exact
 * bytes however TCP splits them, what both ways of sending a block (inside the
 * client's own transaction with NX, and the script) do in every key state, and
 * the blocks that must be left alone. The proxy's default, --lock-method auto,
 * takes the way the server has (asked of it: server-facts.ts): inside the
 * transaction from Redis 7.0 on, the script before; what only the transaction
 * way can do is skipped, with the reason, where the server has no EXPIRE ... NX.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRedis } from '../support/redis.js';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { attemptReplies, lockAttempt, queueLockKey, taskLockKey } from '../support/stalwart.js';

// A generous hold deadline: split-write tests must not depend on how busy the machine is.
// The proxy's default, --lock-method auto.
const env = redisAndProxy({ proxy: { holdMs: 250 } });
let scripted: TestProxy | undefined;
let facts: ServerFacts;
beforeAll(async () => {
  scripted = await startTestProxy({ upstream: env.redis.url, holdMs: 250, lockMethod: 'script' });
  facts = await serverFacts(env.admin);
});
afterAll(async () => {
  await scripted?.close();
});

/** The way auto must take on this server: inside the transaction with NX where it has EXPIRE ... NX, else with the expiry script. */
const autoWay = (): 'transaction' | 'transaction-script' => (facts.has('expire-nx') ? 'transaction' : 'transaction-script');

/** The proxy's default, and the script way, each through a proxy in front of the same Redis. */
const METHODS = [
  { method: 'auto', proxy: (): TestProxy => env.proxy },
  { method: 'script', proxy: (): TestProxy => scripted as TestProxy },
] as const;

const adminCall = (...args: (string | Buffer)[]): Promise<string> => env.admin.call(...args);

const pttl = (key: Buffer | string): Promise<number> => env.admin.pttl(key);

describe.each(METHODS)('Stalwart lock attempts through the proxy ($method)', ({ method, proxy }) => {
  const key = taskLockKey(0x0d0a00ffn); // bytes include \r \n \0

  it('creates the lock with its expiry, and a second attempt leaves the expiry alone', async () => {
    const way = method === 'auto' ? autoWay() : method;
    const before = proxy().stats.rewrittenBy[way];
    expect(await exchange(proxy().port, lockAttempt(key, 3600), 4)).toBe(attemptReplies(1, 1));
    const ttl = await pttl(key);
    expect(ttl).toBeGreaterThan(3_590_000);
    await adminCall('PEXPIRE', key, '5000'); // as if time passed
    expect(await exchange(proxy().port, lockAttempt(key, 3600), 4)).toBe(attemptReplies(2, 1));
    expect(await pttl(key)).toBeLessThanOrEqual(5000);
    expect(proxy().stats.rewrittenBy[way]).toBe(before + 2);
  });

  it('shows the bug directly against Redis: every attempt re-arms the expiry', async () => {
    expect(await exchange(env.redis.port, lockAttempt(key, 3600), 4)).toBe(attemptReplies(1, 1));
    await adminCall('PEXPIRE', key, '5000');
    expect(await exchange(env.redis.port, lockAttempt(key, 3600), 4)).toBe(attemptReplies(2, 1));
    expect(await pttl(key)).toBeGreaterThan(3_590_000);
  });

  it('matches when the block arrives one byte at a time', async () => {
    const client = await RawClient.connect(proxy().port);
    await client.writeSplit(lockAttempt(key, 3600), 'bytewise');
    expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(1, 1));
    await client.writeSplit(lockAttempt(key, 3600), 'bytewise');
    expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(2, 1));
    await client.close();
  });

  it('matches whatever the split points', async () => {
    const client = await RawClient.connect(proxy().port);
    const block = lockAttempt(key, 3600);
    for (let attempt = 1; attempt <= 25; attempt++) {
      const sizes = Array.from({ length: 4 }, () => 1 + Math.floor(Math.random() * 20));
      await client.writeSplit(block, sizes, { delayMs: 1 });
      expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(attempt, 1));
    }
    await client.close();
  });

  it('keeps order on a multiplexed connection with other commands pipelined around the block', async () => {
    const other = queueLockKey(7n, 'local');
    const batch = Buffer.concat([
      cmd('PING'),
      cmd('SET', 'k', 'v'),
      cmd('GET', 'k'),
      lockAttempt(key, 3600),
      cmd('GET', 'k'),
      lockAttempt(other, 600),
      cmd('DEL', key),
      lockAttempt(key, 3600),
      cmd('PING'),
    ]);
    const replies = await exchange(proxy().port, batch, 3 + 4 + 1 + 4 + 1 + 4 + 1);
    expect(replies).toBe(
      '+PONG\r\n+OK\r\n$1\r\nv\r\n' +
        attemptReplies(1, 1) +
        '$1\r\nv\r\n' +
        attemptReplies(1, 1) +
        ':1\r\n' + // the DEL ran after the first attempt
        attemptReplies(1, 1) + // so the lock was free again
        '+PONG\r\n',
    );
    expect(await pttl(other)).toBeGreaterThan(590_000);
  });

  it('speaks RESP3 after HELLO 3', async () => {
    const client = await RawClient.connect(proxy().port);
    client.write(cmd('HELLO', '3'));
    expect((await client.readReplies(1)).toString('latin1')).toMatch(/^%7\r\n/);
    client.write(Buffer.concat([lockAttempt(key, 3600), lockAttempt(key, 3600), cmd('PING')]));
    expect((await client.readReplies(9)).toString('latin1')).toBe(attemptReplies(1, 1) + attemptReplies(2, 1) + '+PONG\r\n');
    await client.close();
  });

  it('handles INCR and PEXPIRE, with the client’s own letter case', async () => {
    const block = Buffer.concat([cmd('multi'), cmd('incr', 'lock:a'), cmd('pexpire', 'lock:a', '60000'), cmd('exec')]);
    expect(await exchange(proxy().port, block, 4)).toBe(attemptReplies(1, 1));
    await adminCall('PEXPIRE', 'lock:a', '5000');
    expect(await exchange(proxy().port, block, 4)).toBe(attemptReplies(2, 1));
    expect(await pttl('lock:a')).toBeLessThanOrEqual(5000);
  });

  it('heals a lock that has no expiry', async () => {
    await adminCall('SET', key, '5');
    expect(await exchange(proxy().port, lockAttempt(key, 3600), 4)).toBe(attemptReplies(6, 1));
    expect(await pttl(key)).toBeGreaterThan(3_590_000);
  });

  it('does not re-arm a lock taken by a fixed node with SET NX EX (rolling upgrade)', async () => {
    const deadline = String(Math.floor(Date.now() / 1000) + 30);
    expect(await adminCall('SET', key, deadline, 'NX', 'EX', '30')).toBe('+OK\r\n');
    const replies = await exchange(proxy().port, lockAttempt(key, 3600), 4);
    expect(replies).toBe(attemptReplies(BigInt(deadline) + 1n, 1)); // counter != 1: the old node does not get the lock
    expect(await pttl(key)).toBeLessThanOrEqual(30_000);
  });

  it('puts increment errors inside the EXEC array exactly as Redis does', async () => {
    for (const setup of [
      ['RPUSH', key, 'x'], // WRONGTYPE
      ['SET', key, 'not-a-number'], // not an integer
      ['SET', key, '9223372036854775807'], // overflow
    ]) {
      await adminCall('FLUSHALL');
      await adminCall(...setup);
      const direct = await exchange(env.redis.port, lockAttempt(key, 3600), 4);
      await adminCall('FLUSHALL');
      await adminCall(...setup);
      const proxied = await exchange(proxy().port, lockAttempt(key, 3600), 4);
      expect(proxied).toBe(direct); // no expiry before: both apply it (:1)
      expect(proxied).toMatch(/\*2\r\n-(WRONGTYPE|ERR) [^\r]+\r\n:1\r\n$/);
      // With an expiry already set, the proxy leaves it alone.
      await adminCall('PEXPIRE', key, '5000');
      expect(await exchange(proxy().port, lockAttempt(key, 3600), 4)).toBe(proxied);
      expect(await pttl(key)).toBeLessThanOrEqual(5000);
    }
  });

  it('returns counters beyond 2^53 exactly', async () => {
    await adminCall('SET', key, '9007199254740993');
    await adminCall('EXPIRE', key, '100');
    expect(await exchange(proxy().port, lockAttempt(key, 3600), 4)).toBe(attemptReplies('9007199254740994', 1));
    await adminCall('SET', key, '-9007199254740999');
    expect(await exchange(proxy().port, lockAttempt(key, 3600), 4)).toBe(attemptReplies('-9007199254740998', 1));
  });
});

describe('auto', () => {
  it('takes the way the server has, asked once per connection: inside the transaction with EXPIRE ... NX, else with the expiry script', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url });
    try {
      const key = taskLockKey(0x0a0a0an);
      const client = await RawClient.connect(proxy.port);
      client.write(Buffer.concat([lockAttempt(key, 3600), cmd('PEXPIRE', key, '5000'), lockAttempt(key, 3600)]));
      expect((await client.readReplies(9)).toString('latin1')).toBe(attemptReplies(1, 1) + ':1\r\n' + attemptReplies(2, 1));
      await client.close();
      expect(await pttl(key)).toBeLessThanOrEqual(5000);
      expect(proxy.stats.rewrittenBy).toEqual({ transaction: 0, 'transaction-script': 0, script: 0, [autoWay()]: 2 });
      const chosen = proxy.logs().filter((line) => line.msg === 'lock method chosen from the server version');
      expect(chosen).toHaveLength(1);
      expect(chosen[0]).toMatchObject({ method: autoWay() });
      // What the server said: HELLO without arguments answers its name and version from 6.2 on (as
      // RESET, of the same release, tells); before, it is an error.
      expect(String(chosen[0].server)).toMatch(facts.has('reset') ? new RegExp(`^${facts.server.replaceAll('.', '\\.')}$`) : /^ERR /);
    } finally {
      await proxy.close();
    }
  });
});

describe('auto: the server version, learnt once per upstream address', () => {
  it('a later connection asks nothing; after Redis closed a connection by itself the next one asks again', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url });
    try {
      const key = taskLockKey(0x0b0b0bn);
      const attempt = async (): Promise<string> => {
        const client = await RawClient.connect(proxy.port);
        try {
          client.write(Buffer.concat([cmd('CLIENT', 'SETNAME', 'learner'), lockAttempt(key, 3600)]));
          return (await client.readReplies(5)).toString('latin1');
        } finally {
          await client.close();
        }
      };
      // Each HELLO's answer is logged (before 6.2 HELLO without arguments is refused, and Redis counts no call).
      const asked = () => proxy.logs().filter((line) => line.msg === 'lock method chosen from the server version').length;
      expect(await attempt()).toBe('+OK\r\n' + attemptReplies(1, 1));
      expect(await attempt()).toBe('+OK\r\n' + attemptReplies(2, 1));
      expect(asked()).toBe(1);
      // Redis closes a connection on its own: the server behind the address may have changed.
      const killer = await RawClient.connect(proxy.port);
      killer.write(cmd('CLIENT', 'SETNAME', 'victim'));
      await killer.readReplies(1);
      const id = /id=(\d+) [^\n]* name=victim /.exec(await adminCall('CLIENT', 'LIST'))?.[1];
      expect(id).toBeDefined();
      expect(await adminCall('CLIENT', 'KILL', 'ID', id as string)).toBe(':1\r\n');
      await killer.readUntilClosed();
      expect(await attempt()).toBe('+OK\r\n' + attemptReplies(3, 1));
      expect(asked()).toBe(2);
    } finally {
      await proxy.close();
    }
  });
});

describe('the script way', () => {
  it('survives a flushed script cache (EVALSHA falls back to EVAL)', async () => {
    const proxy = scripted as TestProxy;
    const key = taskLockKey(0x0d0a00ffn);
    const before = proxy.stats.scriptReloads;
    await adminCall('SCRIPT', 'FLUSH');
    const client = await RawClient.connect(proxy.port);
    client.write(Buffer.concat([cmd('PING'), lockAttempt(key, 3600), cmd('GET', key)]));
    expect((await client.readReplies(6)).toString('latin1')).toBe('+PONG\r\n' + attemptReplies(1, 1) + '$1\r\n1\r\n');
    await adminCall('SCRIPT', 'FLUSH');
    client.write(lockAttempt(key, 3600));
    expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(2, 1));
    await client.close();
    expect(proxy.stats.scriptReloads).toBe(before + 2);
  });
});

describe('blocks the proxy leaves alone', () => {
  const key = taskLockKey(42n);

  /** Runs `bytes` directly and through the proxy from the same starting state; both must agree byte for byte. */
  async function sameAsDirect(bytes: Buffer, replies: number, setup: Array<Array<string | Buffer>> = []): Promise<string> {
    const run = async (port: number): Promise<{ replies: string; ttl: number }> => {
      await adminCall('FLUSHALL');
      for (const command of setup) await adminCall(...command);
      const out = await exchange(port, bytes, replies);
      return { replies: out, ttl: Math.round((await pttl(key)) / 1000) };
    };
    const direct = await run(env.redis.port);
    const proxied = await run(env.proxy.port);
    expect(proxied).toEqual(direct);
    return proxied.replies;
  }

  const existing = [['SET', key, '1', 'EX', '100']];

  it('a key no rule names', async () => {
    const block = Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'other', '1'), cmd('EXPIRE', 'other', '10'), cmd('EXEC')]);
    const before = env.proxy.stats.blocksSeen;
    await sameAsDirect(block, 4, [['SET', 'other', '1', 'EX', '100']]);
    expect(env.proxy.stats.blocksSeen).toBe(before);
  });

  it('a Stalwart rate-limit counter (prefix 0x02)', async () => {
    const limit = Buffer.from([0x02, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 9]);
    const block = lockAttempt(limit, 60);
    await sameAsDirect(block, 4, [['SET', limit, '1', 'EX', '100']]);
  });

  it('EXPIRE with an option, a different key, extra commands, bad integers', async () => {
    const variants = [
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '3600', 'NX'), cmd('EXEC')]),
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', taskLockKey(43n), '3600'), cmd('EXEC')]),
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('GET', key), cmd('EXPIRE', key, '3600'), cmd('EXEC')]),
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '01'), cmd('EXPIRE', key, '3600'), cmd('EXEC')]),
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '+5'), cmd('EXEC')]),
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '0'), cmd('EXEC')]),
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '-5'), cmd('EXEC')]),
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '99999999999999999999'), cmd('EXEC')]),
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '3600'), cmd('DISCARD')]),
      Buffer.concat([cmd('MULTI', 'x'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '3600'), cmd('EXEC')]),
    ];
    const replyCounts = [4, 4, 5, 4, 4, 4, 4, 4, 4, 4];
    for (let i = 0; i < variants.length; i++) await sameAsDirect(variants[i], replyCounts[i], existing);
  });

  it('a block under WATCH (EXEC must be able to fail)', async () => {
    const block = Buffer.concat([cmd('WATCH', key), lockAttempt(key, 3600)]);
    expect(await sameAsDirect(block, 1 + 4, existing)).toBe('+OK\r\n' + attemptReplies(2, 1));
    // EXEC unwatched: the next attempt on the same connection is rewritten again.
    const client = await RawClient.connect(env.proxy.port);
    client.write(Buffer.concat([cmd('WATCH', key), cmd('UNWATCH'), lockAttempt(key, 3600)]));
    expect((await client.readReplies(6)).toString('latin1')).toBe('+OK\r\n+OK\r\n' + attemptReplies(3, 1));
    await client.close();
  });

  /**
   * An increment directly followed by the expiry of its key, inside a longer transaction: the
   * transaction way gives that expiry NX (the key's rule makes it a lock, and right after the
   * increment the key exists), with Redis alone's replies; before 7.0 the expiry script takes
   * the pair where it is the transaction's first two commands (`pairFirst`), and the rest go as
   * sent.
   */
  async function fixedWhereNx(bytes: Buffer, replies: number, pairFirst: boolean, serverMayAbort = false): Promise<void> {
    const run = async (port: number): Promise<{ replies: string; ttl: number }> => {
      await adminCall('FLUSHALL');
      await adminCall('SET', key, '1', 'EX', '100');
      const out = await exchange(port, bytes, replies);
      return { replies: out, ttl: Math.round((await pttl(key)) / 1000) };
    };
    const direct = await run(env.redis.port);
    // A server that aborts the whole transaction (EXECABORT) runs nothing: the proxy must then change nothing either.
    const ranDirectly = direct.ttl === 3600;
    if (!serverMayAbort || ranDirectly) expect(direct.ttl).toBe(3600);
    else expect(direct.ttl).toBe(100);
    const fixed = ranDirectly && (autoWay() === 'transaction' || pairFirst);
    expect(await run(env.proxy.port)).toEqual({ replies: direct.replies, ttl: fixed ? 100 : direct.ttl });
  }

  it('a lock pair inside a longer transaction: fixed with NX anywhere, with the expiry script where it comes first', async () => {
    await fixedWhereNx(
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '3600'), cmd('GET', key), cmd('EXEC')]),
      5,
      true,
    );
    await fixedWhereNx(
      Buffer.concat([cmd('MULTI'), cmd('GET', key), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '3600'), cmd('EXEC')]),
      5,
      false,
    );
    // MULTI, nested MULTI refused, two QUEUED, EXEC, then an EXEC without MULTI. Redis 6.0, 7.0 and 8.0 refuse the
    // nested MULTI alone and run the rest; Valkey 8.1 flags the transaction, and its EXEC answers EXECABORT.
    await fixedWhereNx(Buffer.concat([cmd('MULTI'), lockAttempt(key, 3600), cmd('EXEC')]), 6, true, true);
  });

  it('a rule in observe mode: counted and logged, forwarded unchanged', async () => {
    const before = env.proxy.stats.blocksObserved;
    const block = Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'watch:x', '1'), cmd('EXPIRE', 'watch:x', '60'), cmd('EXEC')]);
    await adminCall('SET', 'watch:x', '1', 'EX', '5');
    expect(await exchange(env.proxy.port, block, 4)).toBe(attemptReplies(2, 1));
    expect(await pttl('watch:x')).toBeGreaterThan(55_000); // re-armed, as without the proxy
    expect(env.proxy.stats.blocksObserved).toBe(before + 1);
    const line = env.proxy.logs().find((l) => l.msg === 'observe: lock block would be rewritten' && l.key === 'watch:x');
    expect(line).toMatchObject({ rule: 'test-observe', key: 'watch:x' });
  });
});

describe('blocks split, typed, or cut short', () => {
  const key = 'lock:slow';

  it.each([
    { method: 'auto', proxy: (): TestProxy => env.proxy },
    { method: 'script', proxy: (): TestProxy => scripted as TestProxy },
  ] as const)(
    'a block typed one command at a time ($method): fixed inside the transaction; on the script way released at the hold deadline and run as sent',
    async ({ method, proxy }) => {
      await adminCall('SET', key, '1', 'PX', '5000');
      const unfixed = () => proxy().stats.byRule.get('test-lock')?.unfixed.get('hold-timeout') ?? 0;
      const before = unfixed();
      const client = await RawClient.connect(proxy().port);
      const releases = proxy().stats.releases.get('hold-timeout') ?? 0;
      client.write(cmd('MULTI'));
      // Without a release the script way would wait for the rest of the block forever.
      expect((await client.readReplies(1, 1000)).toString()).toBe('+OK\r\n');
      // Nothing waits inside the client's transaction: the MULTI went at once, not at the script way's hold deadline.
      if (method === 'auto') expect(proxy().stats.releases.get('hold-timeout') ?? 0).toBe(releases);
      client.write(cmd('INCRBY', key, '1'));
      expect((await client.readReplies(1)).toString()).toBe('+QUEUED\r\n');
      client.write(cmd('EXPIRE', key, '60'));
      expect((await client.readReplies(1)).toString()).toBe('+QUEUED\r\n');
      client.write(cmd('EXEC'));
      expect((await client.readReplies(1)).toString()).toBe('*2\r\n:2\r\n:1\r\n');
      await client.close();
      const fixed = method === 'auto';
      expect((await pttl(key)) > 5000).toBe(!fixed);
      expect(unfixed()).toBe(before + (fixed ? 0 : 1));
      if (!fixed) expect(proxy().stats.releases.get('hold-timeout')).toBeGreaterThanOrEqual(1);
      await adminCall('DEL', key);
    },
  );

  it('still matches a block that trickles in slower than the deadline overall, but byte by byte faster', async () => {
    const client = await RawClient.connect(env.proxy.port);
    const block = lockAttempt(key, 60); // ~90 bytes 5 ms apart: several times the hold deadline in total
    await client.writeSplit(block, 'bytewise', { delayMs: 5 });
    expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(1, 1));
    await client.close();
  });

  it('passes the held bytes of a client that closes mid-block on to Redis, which discards the unfinished transaction, as directly', async () => {
    const block = lockAttempt(key, 60);
    const partial = block.subarray(0, block.length - 5); // MULTI, INCRBY and EXPIRE whole, EXEC cut
    const run = async (port: number): Promise<{ replies: string; multis: number }> => {
      const before = await multiCalls();
      const client = await RawClient.connect(port);
      client.write(partial);
      client.end(); // half-close: the client still reads
      const replies = (await client.readUntilClosed()).toString('latin1');
      return { replies, multis: (await multiCalls()) - before };
    };
    const direct = await run(env.redis.port);
    const proxied = await run(env.proxy.port);
    expect(proxied).toEqual(direct);
    expect(proxied).toEqual({ replies: '+OK\r\n+QUEUED\r\n+QUEUED\r\n', multis: 1 }); // the MULTI reached Redis
    expect(await adminCall('EXISTS', key)).toBe(':0\r\n');
    expect(await exchange(env.proxy.port, lockAttempt(key, 60), 4)).toBe(attemptReplies(1, 1));
  });
});

/** How many MULTIs Redis has run (INFO commandstats). */
async function multiCalls(): Promise<number> {
  const info = await env.admin.call('INFO', 'commandstats');
  return Number(/cmdstat_multi:calls=(\d+)/.exec(info)?.[1] ?? 0);
}

describe('a user Redis refuses a command of the block', () => {
  const key = taskLockKey(99n);

  /** A user who may not run scripts (EVAL, EVALSHA), every channel open where the server has channel rules. */
  const noScriptUser = async (): Promise<void> => {
    expect(await adminCall('ACL', 'SETUSER', 'noscript', 'on', '>pw', '~*', ...facts.allChannels(), '+@all', '-eval', '-evalsha')).toBe(
      '+OK\r\n',
    );
  };

  it("in the transaction: the block gets exactly Redis's replies, and the lock the fix (no EVAL needed)", async (ctx) => {
    ctx.skip(...facts.skipUnless('expire-nx'));
    await noScriptUser();
    const batch = Buffer.concat([
      cmd('AUTH', 'noscript', 'pw'),
      lockAttempt(key, 3600),
      cmd('PEXPIRE', key, '5000'),
      lockAttempt(key, 3600),
    ]);
    const replies = await exchange(env.proxy.port, batch, 1 + 4 + 1 + 4);
    expect(replies).toBe('+OK\r\n' + attemptReplies(1, 1) + ':1\r\n' + attemptReplies(2, 1));
    expect(await pttl(key)).toBeLessThanOrEqual(5000);
  });

  it('as the script: without EVAL the original block goes, in order, and the reason is logged once per connection', async () => {
    await noScriptUser();
    const proxy = scripted as TestProxy;
    const batch = Buffer.concat([
      cmd('AUTH', 'noscript', 'pw'),
      cmd('SET', 'before', '1'),
      lockAttempt(key, 3600),
      cmd('DEL', 'before'),
      lockAttempt(key, 3600),
      cmd('GET', key),
    ]);
    const direct = await exchange(env.redis.port, batch, 1 + 1 + 4 + 1 + 4 + 1);
    await adminCall('DEL', key);
    const fallbacks = proxy.stats.fallbacks.get('NOPERM') ?? 0;
    const proxied = await exchange(proxy.port, batch, 1 + 1 + 4 + 1 + 4 + 1);
    expect(proxied).toBe(direct);
    expect(proxied).toContain(attemptReplies(2, 1)); // original semantics: the expiry was re-armed
    expect(proxy.stats.fallbacks.get('NOPERM')).toBe(fallbacks + 2);
    const warnings = proxy.logs().filter((l) => l.reason === 'NOPERM' && l.level === 40);
    expect(warnings.length).toBe(1);
  });

  it('a user who may not run scripts, logged in between blocks: every block runs, in the order sent, as directly (--lock-pipelining is no more)', async () => {
    await noScriptUser();
    const batch = (n: number, tail: Buffer): Buffer => Buffer.concat([lockAttempt(taskLockKey(BigInt(n)), 3600), tail]);
    const rounds = [
      batch(1, cmd('PING')),
      Buffer.concat([batch(2, cmd('AUTH', 'noscript', 'pw')), lockAttempt(taskLockKey(3n), 3600)]),
      batch(4, cmd('SET', 'after', '1')),
    ];
    const replies = [5, 9, 5];
    const run = async (port: number): Promise<string> => {
      await adminCall('FLUSHALL');
      const client = await RawClient.connect(port);
      let out = '';
      for (let i = 0; i < rounds.length; i++) {
        client.write(rounds[i]);
        out += (await client.readReplies(replies[i])).toString('latin1');
      }
      await client.close();
      for (const n of [1, 2, 3, 4]) out += await adminCall('GET', taskLockKey(BigInt(n)));
      return out + (await adminCall('GET', 'after'));
    };
    const direct = await run(env.redis.port);
    const pipelining = await startTestProxy({ upstream: env.redis.url, lockMethod: 'script', flags: ['--lock-pipelining'] });
    try {
      expect(await run(pipelining.port)).toBe(direct);
      expect(pipelining.logs().some((l) => /^lock-pipelining no longer applies/.test(String(l.msg)))).toBe(true);
    } finally {
      await pipelining.close();
    }
    expect(await run(env.proxy.port)).toBe(direct);
  });

  for (const lockMethod of ['transaction', 'script'] as const) {
    it(`passes queue-time errors through as Redis gives them (READONLY replica), ${lockMethod}`, async (ctx) => {
      if (lockMethod === 'transaction') ctx.skip(...facts.skipUnless('expire-nx'));
      const replica = await startRedis({ args: ['--replicaof', '127.0.0.1', String(env.redis.port)] });
      const proxy = await startTestProxy({ upstream: replica.url, lockMethod });
      try {
        const key = taskLockKey(5n);
        const direct = await exchange(replica.port, lockAttempt(key, 3600), 4);
        expect(direct).toMatch(/^\+OK\r\n-READONLY /);
        expect(await exchange(proxy.port, lockAttempt(key, 3600), 4)).toBe(direct);
      } finally {
        await proxy.close();
        await replica.stop();
      }
    });
  }
});
