/**
 * Both ways of sending a lock block (inside the client's own transaction with NX, and the
 * script) against Redis itself, from the same starting state: a user Redis refuses each
 * command of the block in turn, keys of another type, overflow, a server out of memory, huge
 * counters. The client must get Redis's own bytes, and the key must end as Redis leaves it,
 * with one difference only, which is the fix: where the key already had an expiry, the proxy
 * leaves it alone and EXPIRE's flag in the reply says 0.
 */
import { describe, expect, it } from 'vitest';
import { proxyPerLockWay } from '../support/lock-ways.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { cmd, exchange } from '../support/resp.js';
import { lockAttempt, taskLockKey } from '../support/stalwart.js';

const env = redisWithAdmin();
const proxies = proxyPerLockWay(() => env.redis.url);

const key = taskLockKey(0x2an);
const call = (...args: Array<string | Buffer>): Promise<string> => env.admin.call(...args);

interface Outcome {
  replies: string;
  /** The key afterwards: its value (or type), and its expiry rounded to seconds (-1: none, -2: no key). */
  value: string;
  ttl: number;
}

interface Scenario {
  /** Admin commands that set the scene (after FLUSHALL). */
  setup?: Array<Array<string | Buffer>>;
  /** Applied right before the client's bytes, undone right after (CONFIG SET maxmemory ...). */
  during?: { apply: Array<Array<string>>; undo: Array<Array<string>> };
  /** What the client sends, and how many replies come. */
  bytes: Buffer;
  replies: number;
}

/** Runs a scenario from an empty Redis against `port`. */
async function run(port: number, scenario: Scenario): Promise<Outcome> {
  expect(await call('FLUSHALL')).toBe('+OK\r\n');
  for (const command of scenario.setup ?? []) await call(...command);
  for (const command of scenario.during?.apply ?? []) await call(...command);
  let replies: string;
  try {
    replies = await exchange(port, scenario.bytes, scenario.replies);
  } finally {
    for (const command of scenario.during?.undo ?? []) await call(...command);
  }
  const type = /^\+(\w+)/.exec(await call('TYPE', key))?.[1];
  const value = type === 'string' ? await call('GET', key) : `(${type})`;
  const ttl = Number(/^:(-?\d+)/.exec(await call('PTTL', key))?.[1]);
  return { replies, value, ttl: ttl < 0 ? ttl : Math.round(ttl / 1000) };
}

/** The scenario directly and through both proxies. */
async function outcomes(scenario: Scenario): Promise<{ direct: Outcome; transaction: Outcome; script: Outcome }> {
  return {
    direct: await run(env.redis.port, scenario),
    transaction: await run(proxies.transaction().port, scenario),
    script: await run(proxies.script().port, scenario),
  };
}

/** The key's state and replies, as Redis would leave them had it not re-armed an expiry the key had. */
function fixed(direct: Outcome, ttlBefore: number): Outcome {
  return {
    ...direct,
    replies: direct.replies.replace(/:1\r\n(-ERR [^\r]*\r\n)?$/, (m, exec?: string) => `:0\r\n${exec ?? ''}`),
    ttl: ttlBefore,
  };
}

const BLOCK_COMMANDS = ['multi', 'incrby', 'expire', 'exec'];
const asUser = (user: string): Buffer => cmd('AUTH', user, 'pw');

describe('a user Redis refuses a command of the block', () => {
  for (const denied of [...BLOCK_COMMANDS, 'eval', 'evalsha', 'getex', 'pttl']) {
    // The script cache empty: a user without EVAL cannot run the script by its hash either.
    const setup = [['SCRIPT', 'FLUSH']];

    it(`-${denied}, no key yet: exactly what Redis gives, and the same key`, async () => {
      await call('ACL', 'SETUSER', 'lim', 'reset', 'on', '>pw', '~*', '&*', '+@all', `-${denied}`);
      const { direct, transaction, script } = await outcomes({
        setup,
        bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]),
        replies: 5,
      });
      expect(transaction).toEqual(direct);
      expect(script).toEqual(direct);
    });

    it(`-${denied}, a lock with an expiry: Redis's refusal as it is, or the fix`, async () => {
      await call('ACL', 'SETUSER', 'lim', 'reset', 'on', '>pw', '~*', '&*', '+@all', `-${denied}`);
      const scenario = {
        setup: [...setup, ['SET', key, '3', 'EX', '100']],
        bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]),
        replies: 5,
      };
      const { direct, transaction, script } = await outcomes(scenario);
      // Where Redis refuses the block it writes nothing; where it runs it, the proxy keeps the expiry.
      // Without MULTI (see below), and where the script may not run, the script way sends the block as it is.
      const expected = direct.ttl === 100 ? direct : fixed(direct, 100);
      expect(transaction).toEqual(expected);
      expect(script).toEqual(['multi', 'eval', 'evalsha'].includes(denied) ? direct : expected);
    });
  }

  it('a user who may not touch the key at all (key pattern)', async () => {
    await call('ACL', 'SETUSER', 'lim', 'reset', 'on', '>pw', '~other:*', '&*', '+@all');
    const { direct, transaction, script } = await outcomes({ bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]), replies: 5 });
    expect(direct.replies).toMatch(/-NOPERM/);
    expect(transaction).toEqual(direct);
    expect(script).toEqual(direct);
  });

  it('without MULTI, the increment and the expiry run on their own, as directly; a held lock keeps its expiry', async () => {
    await call('ACL', 'SETUSER', 'lim', 'reset', 'on', '>pw', '~*', '&*', '+@all', '-multi');
    const scenario = { setup: [['SET', key, '3', 'EX', '100']], bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]), replies: 5 };
    const { direct, transaction, script } = await outcomes(scenario);
    expect(direct.replies).toMatch(/^\+OK\r\n-NOPERM [^\r]*\r\n:4\r\n:1\r\n-ERR /);
    expect(direct.ttl).toBe(600);
    // The transaction's EXPIRE NX runs on its own here too: the lock keeps its expiry.
    expect(transaction).toEqual({ ...direct, replies: direct.replies.replace(':4\r\n:1\r\n', ':4\r\n:0\r\n'), ttl: 100 });
    expect(script).toEqual(direct); // the script refuses, and the original block runs as Redis runs it
  });

  it('without GETEX, a counter past 2^53 is still exact and incremented once', async () => {
    await call('ACL', 'SETUSER', 'lim', 'reset', 'on', '>pw', '~*', '&*', '+@all', '-getex');
    const { direct, transaction, script } = await outcomes({
      setup: [['SET', key, '9007199254740991']],
      bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]),
      replies: 5,
    });
    expect(direct.replies).toContain(':9007199254740992\r\n:1\r\n');
    expect(transaction).toEqual(direct);
    expect(script).toEqual(direct);
  });

  it('without GETEX nor GET, past 2^53: the script closes the connection (the increment ran once) rather than guess', async () => {
    await call('ACL', 'SETUSER', 'lim', 'reset', 'on', '>pw', '~*', '&*', '+@all', '-getex', '-get');
    await call('FLUSHALL');
    await call('SET', key, '9007199254740991');
    const proxy = proxies.script();
    const before = proxy.stats.blocksClosed;
    const { RawClient } = await import('../support/resp.js');
    const client = await RawClient.connect(proxy.port);
    client.write(Buffer.concat([asUser('lim'), lockAttempt(key, 600)]));
    expect((await client.readUntilClosed()).toString('latin1')).toBe('+OK\r\n');
    expect(await call('GET', key)).toBe('$16\r\n9007199254740992\r\n');
    expect(proxy.stats.blocksClosed).toBe(before + 1);
  });
});

describe('errors of the increment, and a server that refuses writes', () => {
  const cases: Array<[string, Array<Array<string | Buffer>>]> = [
    ['a key of another type', [['RPUSH', key, 'x']]],
    ['not an integer', [['SET', key, 'abc']]],
    ['an overflow', [['SET', key, '9223372036854775807']]],
  ];
  for (const [name, setup] of cases) {
    it(`${name}, no expiry: the error inside EXEC's array, as Redis puts it`, async () => {
      const { direct, transaction, script } = await outcomes({ setup, bytes: lockAttempt(key, 600), replies: 4 });
      expect(direct.replies).toMatch(/\*2\r\n-(WRONGTYPE|ERR) [^\r]+\r\n:1\r\n$/);
      expect(transaction).toEqual(direct);
      expect(script).toEqual(direct);
    });

    it(`${name}, with an expiry: the same error, and the expiry left alone`, async () => {
      const { direct, transaction, script } = await outcomes({
        setup: [...setup, ['EXPIRE', key, '100']],
        bytes: lockAttempt(key, 600),
        replies: 4,
      });
      expect(transaction).toEqual(fixed(direct, 100));
      expect(script).toEqual(fixed(direct, 100));
    });
  }

  it('out of memory: OOM when queueing, the transaction discarded, nothing written', async () => {
    const { direct, transaction, script } = await outcomes({
      during: { apply: [['CONFIG', 'SET', 'maxmemory', '1']], undo: [['CONFIG', 'SET', 'maxmemory', '0']] },
      bytes: lockAttempt(key, 600),
      replies: 4,
    });
    expect(direct.replies).toMatch(/^\+OK\r\n-OOM [^]*\r\n-EXECABORT [^\r]*\r\n$/);
    expect(direct.value).toBe('(none)');
    expect(transaction).toEqual(direct);
    expect(script).toEqual(direct);
  });
});
