/**
 * Both ways of sending a lock block (inside the client's own transaction with NX, and the
 * script) against Redis itself, from the same starting state: a user Redis refuses each
 * command of the block in turn, keys of another type, overflow, a server out of memory, huge
 * counters. The client must get Redis's own bytes, and the key must end as Redis leaves it,
 * with one difference only, which is the fix: where the key already had an expiry, the proxy
 * leaves it alone. The replies say nothing of it (EXPIRE's element of EXEC's array is Redis's own
 * 1), except where the EXPIRE runs on its own (a user refused MULTI): there its NX answers 0.
 *
 * Each way is its own test, against the server the run has: the transaction way is skipped where
 * the server has no `EXPIRE ... NX` (before Redis 7.0), and there the script, which cannot ask
 * the ACLs, is held to what docs/behaviour.md says it does.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { proxyPerLockWay, type LockWay } from '../support/lock-ways.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { cmd, exchange } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';

const env = redisWithAdmin();
const proxies = proxyPerLockWay(() => env.redis.url);
let facts: ServerFacts;
beforeAll(async () => {
  facts = await serverFacts(env.admin);
});

const WAYS: readonly LockWay[] = ['transaction', 'script'];

const key = taskLockKey(0x2an);
const call = (...args: Array<string | Buffer>): Promise<string> => env.admin.call(...args);

/** `ACL SETUSER <name> reset on >pw <rules...>`, every channel open as well where the server has channel rules. */
async function setUser(name: string, keys: string, ...rules: string[]): Promise<void> {
  expect(await call('ACL', 'SETUSER', name, 'reset', 'on', '>pw', keys, ...facts.allChannels(), ...rules)).toBe('+OK\r\n');
}

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

/** The scenario directly and through the proxy of `way`. */
async function outcomes(way: LockWay, scenario: Scenario): Promise<{ direct: Outcome; proxied: Outcome }> {
  return { direct: await run(env.redis.port, scenario), proxied: await run(proxies[way]().port, scenario) };
}

/**
 * The key's state and replies, as Redis would leave them had it not re-armed an expiry the key had:
 * Redis's own replies, except an EXPIRE that ran on its own (MULTI refused, then EXEC's error),
 * whose NX answers 0.
 */
function fixed(direct: Outcome, ttlBefore: number): Outcome {
  return {
    ...direct,
    replies: direct.replies.replace(/:1\r\n(-ERR [^\r]*\r\n)$/, ':0\r\n$1'),
    ttl: ttlBefore,
  };
}

/**
 * What the script does where it cannot ask the ACLs (before Redis 7.0; docs/behaviour.md#how-the-block-is-sent):
 * a user refused only MULTI or EXEC, or EXPIRE on a lock that exists, gets the block run as if
 * allowed, with the fix (the lock never without its expiry); a user refused PTTL, the original
 * block; anything else, exactly what Redis gives.
 */
function scriptWithoutAclCheck(denied: string, lockBefore: { counter: number; ttl: number } | undefined, direct: Outcome): Outcome {
  const runsAnyway = denied === 'multi' || denied === 'exec' || (denied === 'expire' && lockBefore !== undefined);
  if (!runsAnyway) return direct;
  const counter = (lockBefore?.counter ?? 0) + 1;
  return {
    replies: '+OK\r\n' + attemptReplies(counter, 1), // the expiry answered as Redis alone answers it, applied or not
    value: `$${String(counter).length}\r\n${counter}\r\n`,
    ttl: lockBefore?.ttl ?? 600,
  };
}

const BLOCK_COMMANDS = ['multi', 'incrby', 'expire', 'exec'];

/** The script way's last fallback was logged as an ACL refusal of `command`, not as the script's own error. */
function expectFallbackNaming(command: string): void {
  const line = [...proxies.script().logs()].reverse().find((entry) => String(entry.msg).startsWith('lock script could not run'));
  expect({ reason: line?.reason, command: line?.command }).toEqual({ reason: 'NOPERM', command });
}
const asUser = (user: string): Buffer => cmd('AUTH', user, 'pw');

describe('a user Redis refuses a command of the block', () => {
  for (const denied of [...BLOCK_COMMANDS, 'eval', 'evalsha', 'getex', 'pttl']) {
    // The script cache empty: a user without EVAL cannot run the script by its hash either.
    const setup = [['SCRIPT', 'FLUSH']];

    for (const way of WAYS) {
      it(`-${denied}, no key yet, ${way}: exactly what Redis gives, and the same key`, async (ctx) => {
        if (denied === 'getex') ctx.skip(...facts.skipUnless('getex'));
        await setUser('lim', '~*', '+@all', `-${denied}`);
        const { direct, proxied } = await outcomes(way, {
          setup,
          bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]),
          replies: 5,
        });
        expect(proxied).toEqual(
          way === 'script' && !facts.has('script-acl-check') ? scriptWithoutAclCheck(denied, undefined, direct) : direct,
        );
      });

      it(`-${denied}, a lock with an expiry, ${way}: Redis's refusal as it is, or the fix`, async (ctx) => {
        if (denied === 'getex') ctx.skip(...facts.skipUnless('getex'));
        await setUser('lim', '~*', '+@all', `-${denied}`);
        const scenario = {
          setup: [...setup, ['SET', key, '3', 'EX', '100']],
          bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]),
          replies: 5,
        };
        const { direct, proxied } = await outcomes(way, scenario);
        // Where Redis refuses the block it writes nothing; where it runs it, the proxy keeps the expiry.
        // Without MULTI (see below), and where the script may not run, the script way sends the block as it is.
        const expected = direct.ttl === 100 ? direct : fixed(direct, 100);
        if (way === 'transaction') {
          // Before 7.0 (the expiry script inside the transaction): without MULTI the block runs as
          // sent, as directly; where the script may not run (EVAL) or read the expiry (PTTL), it
          // goes as the client sent it too.
          const asSent = !facts.has('expire-nx') && ['multi', 'eval', 'pttl'].includes(denied);
          expect(proxied).toEqual(asSent ? direct : expected);
        } else if (facts.has('script-acl-check')) {
          expect(proxied).toEqual(['multi', 'eval', 'evalsha'].includes(denied) ? direct : expected);
          if ([...BLOCK_COMMANDS, 'eval', 'evalsha'].includes(denied)) expectFallbackNaming(denied);
        } else {
          // Where the script may not run (EVAL) or read the expiry (PTTL), the block goes as it is.
          const asSent = ['eval', 'evalsha', 'pttl'].includes(denied);
          expect(proxied).toEqual(scriptWithoutAclCheck(denied, { counter: 3, ttl: 100 }, asSent ? direct : expected));
          if (asSent) expectFallbackNaming(denied);
        }
      });
    }
  }

  for (const way of WAYS) {
    it(`a user who may not touch the key at all (key pattern), ${way}`, async () => {
      await setUser('lim', '~other:*', '+@all');
      const { direct, proxied } = await outcomes(way, { bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]), replies: 5 });
      expect(direct.replies).toMatch(/-NOPERM/);
      expect(proxied).toEqual(direct);
    });
  }

  for (const way of WAYS) {
    it(`without MULTI, the increment and the expiry run on their own, as directly; a held lock keeps its expiry, ${way}`, async () => {
      await setUser('lim', '~*', '+@all', '-multi');
      const scenario = {
        setup: [['SET', key, '3', 'EX', '100']],
        bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]),
        replies: 5,
      };
      const { direct, proxied } = await outcomes(way, scenario);
      expect(direct.replies).toMatch(/^\+OK\r\n-NOPERM [^\r]*\r\n:4\r\n:1\r\n-ERR /);
      expect(direct.ttl).toBe(600);
      if (way === 'transaction' && !facts.has('expire-nx')) {
        // The expiry script learns from MULTI's refusal that there is no transaction: the expiry goes as sent.
        expect(proxied).toEqual(direct);
      } else if (way === 'transaction') {
        // The transaction's EXPIRE NX runs on its own here too: the lock keeps its expiry.
        expect(proxied).toEqual({ ...direct, replies: direct.replies.replace(':4\r\n:1\r\n', ':4\r\n:0\r\n'), ttl: 100 });
      } else if (facts.has('script-acl-check')) {
        expect(proxied).toEqual(direct); // the script refuses, and the original block runs as Redis runs it
      } else {
        expect(proxied).toEqual(scriptWithoutAclCheck('multi', { counter: 3, ttl: 100 }, direct));
      }
    });
  }

  for (const way of WAYS) {
    it(`without GETEX, a counter past 2^53 is still exact and incremented once, ${way}`, async () => {
      // A server without GETEX (before 6.2) needs no rule to refuse it.
      await setUser('lim', '~*', '+@all', ...(facts.has('getex') ? ['-getex'] : []));
      const { direct, proxied } = await outcomes(way, {
        setup: [['SET', key, '9007199254740991']],
        bytes: Buffer.concat([asUser('lim'), lockAttempt(key, 600)]),
        replies: 5,
      });
      expect(direct.replies).toContain(':9007199254740992\r\n:1\r\n');
      expect(proxied).toEqual(direct);
    });
  }

  it('without GETEX nor GET, past 2^53: the script closes the connection (the increment ran once) rather than guess', async () => {
    await setUser('lim', '~*', '+@all', ...(facts.has('getex') ? ['-getex'] : []), '-get');
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
    for (const way of WAYS) {
      it(`${name}, no expiry, ${way}: the error inside EXEC's array, as Redis puts it`, async () => {
        const { direct, proxied } = await outcomes(way, { setup, bytes: lockAttempt(key, 600), replies: 4 });
        expect(direct.replies).toMatch(/\*2\r\n-(WRONGTYPE|ERR) [^\r]+\r\n:1\r\n$/);
        expect(proxied).toEqual(direct);
      });

      it(`${name}, with an expiry, ${way}: the same error, and the expiry left alone`, async () => {
        const { direct, proxied } = await outcomes(way, {
          setup: [...setup, ['EXPIRE', key, '100']],
          bytes: lockAttempt(key, 600),
          replies: 4,
        });
        expect(proxied).toEqual(fixed(direct, 100));
      });
    }
  }

  for (const way of WAYS) {
    it(`out of memory, ${way}: OOM when queueing, the transaction discarded, nothing written`, async () => {
      const { direct, proxied } = await outcomes(way, {
        during: { apply: [['CONFIG', 'SET', 'maxmemory', '1']], undo: [['CONFIG', 'SET', 'maxmemory', '0']] },
        bytes: lockAttempt(key, 600),
        replies: 4,
      });
      expect(direct.replies).toMatch(/^\+OK\r\n-OOM [^]*\r\n-EXECABORT [^\r]*\r\n$/);
      expect(direct.value).toBe('(none)');
      expect(proxied).toEqual(direct);
    });
  }
});
