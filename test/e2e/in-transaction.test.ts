/**
 * Lock blocks fixed inside the client's own transaction, on every server line: with NX (Redis
 * 7.0+, Valkey), or before 7.0 with the expiry script beside a copy of the expiry that Redis
 * checks (the transaction-script way). Nothing waits: a MULTI that opens no lock block is
 * answered as Redis answers it, in observe mode too, and a lock block typed one command at a
 * time keeps its lease. Every case is sent to Redis directly and through the proxy, from the same
 * state, and compared byte for byte; the lock's expiry shows what ran.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { cmd, RawClient } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { attemptReplies, lockAttempt } from '../support/stalwart.js';

/** Far above what any test waits: a MULTI held until its block is whole would never be answered in time. */
const HOLD_MS = 60_000;
const REPLY_TIMEOUT_MS = 5_000;

const env = redisWithAdmin();
let enforcing: TestProxy;
let observing: TestProxy;
let facts: ServerFacts;
beforeAll(async () => {
  facts = await serverFacts(env.admin);
  [enforcing, observing] = await Promise.all([
    startTestProxy({ upstream: env.redis.url, holdMs: HOLD_MS }),
    startTestProxy({ upstream: env.redis.url, holdMs: HOLD_MS, mode: 'observe' }),
  ]);
});
afterAll(async () => {
  await Promise.all([enforcing?.close(), observing?.close()]);
});

const key = 'lock:in-tx';
const call = (...args: Array<string | Buffer>): Promise<string> => env.admin.call(...args);

/** `ACL SETUSER <name> reset on >pw ~* <rules...>`, every channel open as well where the server has channel rules. */
async function setUser(name: string, ...rules: string[]): Promise<void> {
  expect(await call('ACL', 'SETUSER', name, 'reset', 'on', '>pw', '~*', ...facts.allChannels(), ...rules)).toBe('+OK\r\n');
}

/** Each write of `writes` on one connection to `port` after a held lock (counter 3, 100 s left), its replies read before the next. */
async function run(port: number, writes: Array<[Buffer, number]>): Promise<{ replies: string[]; counter: string; ttlS: number }> {
  await call('SET', key, '3', 'EX', '100');
  const client = await RawClient.connect(port);
  const replies: string[] = [];
  try {
    for (const [bytes, count] of writes) {
      client.write(bytes);
      replies.push((await client.readReplies(count, REPLY_TIMEOUT_MS)).toString('latin1'));
    }
  } finally {
    client.destroy();
  }
  return { replies, counter: await call('GET', key), ttlS: Math.round((await env.admin.pttl(key)) / 1000) };
}

describe('nothing waits', () => {
  for (const mode of ['enforce', 'observe'] as const) {
    it(`a MULTI that opens no lock block is answered as Redis answers it (${mode})`, async () => {
      const proxy = mode === 'enforce' ? enforcing : observing;
      const writes: Array<[Buffer, number]> = [
        [cmd('MULTI'), 1],
        [cmd('SET', 'plain', 'v'), 1],
        [cmd('EXEC'), 1],
        [Buffer.concat([cmd('WATCH', 'plain'), cmd('MULTI')]), 2],
        [cmd('GET', 'plain'), 1],
        [cmd('EXEC'), 1],
      ];
      const direct = await run(env.redis.port, writes);
      expect(await run(proxy.port, writes)).toEqual(direct);
      expect(proxy.stats.releases.get('hold-timeout') ?? 0).toBe(0);
    });
  }

  it('a lock block typed one command at a time keeps the held lock’s lease; observe mode sends it as it is', async () => {
    const typed: Array<[Buffer, number]> = [
      [cmd('MULTI'), 1],
      [cmd('INCRBY', key, '1'), 1],
      [cmd('EXPIRE', key, '3600'), 1],
      [cmd('EXEC'), 1],
    ];
    const direct = await run(env.redis.port, typed);
    expect(direct).toEqual({
      replies: ['+OK\r\n', '+QUEUED\r\n', '+QUEUED\r\n', '*2\r\n:4\r\n:1\r\n'],
      counter: '$1\r\n4\r\n',
      ttlS: 3600,
    });
    expect(await run(enforcing.port, typed)).toEqual({ ...direct, ttlS: 100 });
    expect(await run(observing.port, typed)).toEqual(direct);
  });
});

describe('Redis’s own answers, whatever the transaction holds', () => {
  it('commands queued after the pair, a large value among them, and a second block on the connection', async () => {
    await call('SET', 'big', Buffer.alloc(3 * 1024 * 1024, 0x62));
    const writes: Array<[Buffer, number]> = [
      [Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '2'), cmd('EXPIRE', key, '3600'), cmd('GET', 'big'), cmd('PING'), cmd('EXEC')]), 6],
      [lockAttempt(key, 3600), 4],
    ];
    const direct = await run(env.redis.port, writes);
    expect(direct.ttlS).toBe(3600);
    expect(await run(enforcing.port, writes)).toEqual({ ...direct, ttlS: 100 });
  });

  it('a refusal of the client’s own, before or after the pair (EXECABORT), a DISCARD, and RESP3', async () => {
    const writes: Array<[Buffer, number]> = [
      [Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '3600'), cmd('NOSUCHCOMMAND'), cmd('EXEC')]), 5],
      [Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, 'x1'), cmd('EXPIRE', key, '3600'), cmd('EXEC')]), 4],
      [Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '3600'), cmd('DISCARD')]), 4],
      [cmd('HELLO', '3'), 1],
      // The increment of a non-integer above made no lock pair: it ran as sent, re-arming. The lease again, and a block.
      [cmd('PEXPIRE', key, '100000'), 1],
      [lockAttempt(key, 3600), 4],
    ];
    const direct = await run(env.redis.port, writes);
    const sameId = (replies: string[]) => replies.map((r) => r.replace(/\$2\r\nid\r\n:\d+\r\n/, '$2\r\nid\r\n:N\r\n'));
    const proxied = await run(enforcing.port, writes);
    expect({ ...proxied, replies: sameId(proxied.replies) }).toEqual({ ...direct, replies: sameId(direct.replies), ttlS: 100 });
    expect(direct.replies[0]).toMatch(/-EXECABORT/);
  });

  it('a user refused EVAL: Redis’s replies and outcome (the lock re-armed, as directly), counted; before 7.0 its later blocks go as sent', async () => {
    await setUser('noeval', '+@all', '-eval');
    const auth = cmd('AUTH', 'noeval', 'pw');
    const writes: Array<[Buffer, number]> = [
      [auth, 1],
      [Buffer.concat([lockAttempt(key, 3600), cmd('PING')]), 5],
      [lockAttempt(key, 3600), 4],
    ];
    const direct = await run(env.redis.port, writes);
    expect(direct.replies.slice(1)).toEqual([attemptReplies(4, 1) + '+PONG\r\n', attemptReplies(5, 1)]);
    const before = enforcing.stats.byRule.get('test-lock')?.unfixed.get('eval-refused') ?? 0;
    const proxied = await run(enforcing.port, writes);
    if (facts.has('expire-nx')) {
      // NX needs no EVAL: fixed.
      expect(proxied).toEqual({ ...direct, ttlS: 100 });
    } else {
      expect(proxied).toEqual(direct);
      expect(enforcing.stats.byRule.get('test-lock')?.unfixed.get('eval-refused') ?? 0).toBe(before + 2);
    }
  });

  it.each([
    ['noexpire', ['-expire']],
    ['noexpireeval', ['-expire', '-eval']],
  ])('the issue’s user refused EXPIRE (%s), after AUTH: the same refusal, EXECABORT, and the counter unchanged', async (user, denied) => {
    await setUser(user, '+@all', ...denied);
    const writes: Array<[Buffer, number]> = [
      [cmd('AUTH', user, 'pw'), 1],
      [lockAttempt(key, 3600), 4],
      [lockAttempt(key, 3600), 4],
    ];
    const direct = await run(env.redis.port, writes);
    expect(direct.replies[1]).toMatch(/^\+OK\r\n\+QUEUED\r\n-NOPERM [^\r]*\r\n-EXECABORT /);
    expect(direct.replies[2]).toBe(direct.replies[1]);
    expect(direct.counter).toBe('$1\r\n3\r\n');
    expect(await run(enforcing.port, writes)).toEqual(direct);
  });
});
