/**
 * Every affected Stalwart release line's exact bytes through the proxy with its default rules
 * (every line at once), against a real Redis:
 *
 * - every lock kind of every line: the first attempt sets Stalwart's expiry, a loser's attempt
 *   leaves it where it was, and once the owner is gone the lock is free at its deadline;
 * - every windowed counter of every line: replies byte-identical to Redis's own, and its EXPIRE
 *   re-armed exactly as sent;
 * - the migration lock of 0.12-0.15, scaled down: the holder dies, the waiter retrying at its
 *   interval takes the lock after the expiry through the proxy, and never directly.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { describeKey } from '../../src/key-text.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { cmd, RawClient } from '../support/resp.js';
import { attemptReplies, counterOf, lockAttempt } from '../support/stalwart.js';
import { RELEASE_LINES, type LockKind } from '../support/stalwart-releases.js';

const env = redisAndProxy();

/** Every (line, lock kind) pair, each with one key drawn for it (seeded, so reruns are alike). */
const LOCKS = RELEASE_LINES.flatMap((line, l) =>
  line.locks.map((kind, k) => ({
    line: `${line.first} - ${line.last}`,
    kind,
    key: fc.sample(kind.keys, { numRuns: 1, seed: 1000 * l + k })[0],
  })),
);

/** A connection in database `db` (0: the default), so one key's bytes can be tried twice apart. */
async function connect(port: number, db = 0): Promise<RawClient> {
  const client = await RawClient.connect(port);
  if (db !== 0) expect(await client.call('SELECT', String(db))).toBe('+OK\r\n');
  return client;
}

async function attempt(client: RawClient, key: Buffer, seconds: number, delta: bigint = 1n): Promise<string> {
  client.write(lockAttempt(key, seconds, delta));
  return (await client.readReplies(4)).toString('latin1');
}

/**
 * The owner takes `key` for `leaseSeconds` and dies; a contender retries every `retryMs`. When,
 * if within `observeMs`, does it get the lock; and otherwise what PTTL is left.
 */
async function ownerDies(
  port: number,
  db: number,
  key: Buffer,
  leaseSeconds: number,
  retryMs: number,
  observeMs: number,
): Promise<{ takenAfterMs?: number; pttl: number }> {
  const owner = await connect(port, db);
  // Before the attempt is sent: the lease starts later (when Redis runs it), never earlier, so a
  // slow reply cannot make the lock look free before its deadline.
  const takenAt = Date.now();
  expect(await attempt(owner, key, leaseSeconds), describeKey(key)).toBe(attemptReplies(1, 1));
  owner.destroy();
  const contender = await connect(port, db);
  try {
    while (Date.now() - takenAt < observeMs) {
      await new Promise((resolve) => setTimeout(resolve, retryMs));
      if (counterOf(Buffer.from(await attempt(contender, key, leaseSeconds), 'latin1')) === 1) {
        return { takenAfterMs: Date.now() - takenAt, pttl: 0 };
      }
    }
    return { pttl: await contender.pttl(key) };
  } finally {
    await contender.close();
  }
}

describe.each(RELEASE_LINES)('Stalwart $first - $last: its lock kinds', (line) => {
  const own = LOCKS.filter((entry) => entry.line === `${line.first} - ${line.last}`);

  it.each(own.map((entry) => ({ purpose: entry.kind.purpose, ...entry })))(
    '$purpose: the first attempt sets the expiry, a loser leaves it where it was',
    async ({ kind, key }: { kind: LockKind; key: Buffer }) => {
      const db = 1 + RELEASE_LINES.indexOf(line);
      const client = await connect(env.proxy.port, db);
      try {
        expect(await attempt(client, key, kind.expiry), describeKey(key)).toBe(attemptReplies(1, 1));
        const first = await client.pttl(key);
        expect(first).toBeGreaterThan(kind.expiry * 1000 - 2000);
        expect(first).toBeLessThanOrEqual(kind.expiry * 1000);
        // Lower the lease so that a re-armed expiry would show.
        expect(await client.call('PEXPIRE', key, '5000')).toBe(':1\r\n');
        // The loser gets Redis's own answer (1); its expiry is not applied: the lease stays where it was.
        expect(await attempt(client, key, kind.expiry)).toBe(attemptReplies(2, 1));
        expect(await client.pttl(key)).toBeLessThanOrEqual(5000);
        expect(await client.call('DEL', key)).toBe(':1\r\n');
      } finally {
        await client.close();
      }
    },
  );
});

describe('every lock kind of every line, owner gone', () => {
  const LEASE_SECONDS = 1;
  const RETRY_MS = 100;

  // Re-armed by the contenders (as directly), no lock would be free within the 3 s the test waits: the
  // bound after the deadline is only how late a busy machine may be to notice.
  it('is free at its deadline through the proxy: a contender takes it within 1.5 s after', async () => {
    const takenAfter = await Promise.all(
      LOCKS.map(async ({ key }, i) => (await ownerDies(env.proxy.port, 9 + (i % 6), key, LEASE_SECONDS, RETRY_MS, 3000)).takenAfterMs),
    );
    for (const [i, after] of takenAfter.entries()) {
      const { line, kind } = LOCKS[i];
      expect(after, `${line} ${kind.purpose}`).toBeGreaterThanOrEqual(LEASE_SECONDS * 1000 - 50);
      expect(after, `${line} ${kind.purpose}`).toBeLessThanOrEqual(LEASE_SECONDS * 1000 + 1500);
    }
  }, 20_000);
});

describe('windowed counters of every line', () => {
  const CASES = RELEASE_LINES.flatMap((line, l) =>
    line.windowed.flatMap((kind, k) =>
      fc.sample(kind.attempts, { numRuns: 6, seed: 77 + 100 * l + k }).map((sample) => ({
        line: `${line.first} - ${line.last}`,
        purpose: kind.purpose,
        ...sample,
      })),
    ),
  );

  it.each(CASES)('Stalwart $line, $purpose: byte-identical to Redis, EXPIRE re-armed as sent', async ({ key, delta, expiry }) => {
    const seenBefore = env.proxy.stats.blocksSeen;
    // The same key's bytes in two databases: direct in 15, through the proxy in 14.
    const direct = await connect(env.redis.port, 15);
    const proxied = await connect(env.proxy.port, 14);
    try {
      const second = Math.max(1, Math.floor(expiry / 2));
      for (const seconds of [expiry, second]) {
        const want = await attempt(direct, key, seconds, delta);
        expect(await attempt(proxied, key, seconds, delta), describeKey(key)).toBe(want);
        const [pttlDirect, pttlProxied] = [await direct.pttl(key), await proxied.pttl(key)];
        expect(pttlProxied).toBeGreaterThan(seconds * 1000 - 2000);
        expect(pttlProxied).toBeLessThanOrEqual(seconds * 1000);
        expect(Math.abs(pttlProxied - pttlDirect)).toBeLessThan(2000);
      }
      expect(env.proxy.stats.blocksSeen).toBe(seenBefore);
      direct.write(cmd('DEL', key));
      proxied.write(cmd('DEL', key));
      await Promise.all([direct.readReplies(1), proxied.readReplies(1)]);
    } finally {
      await Promise.all([direct.close(), proxied.close()]);
    }
  });
});

describe('the migration lock of 0.12-0.15, scaled down about a hundred times', () => {
  /** Waiters retry every 30 s; the lock lasts 300 s (core) or 180 s (per account; 2 s here, EXPIRE takes whole seconds). */
  const RETRY_MS = 300;
  const SCENARIOS = [
    { lock: 'core', key: Buffer.concat([Buffer.from([0x18]), Buffer.from('migrate_core_lock')]), leaseMs: 3000 },
    { lock: 'per account', key: Buffer.concat([Buffer.from([0x18]), Buffer.from('migrate_1234_lock')]), leaseMs: 2000 },
  ];

  /** The holder takes the lock and dies; one waiter retries; when (if ever) does it get the lock? */
  const play = (port: number, db: number, key: Buffer, leaseMs: number) => ownerDies(port, db, key, leaseMs / 1000, RETRY_MS, 2 * leaseMs);

  it.each(SCENARIOS)(
    '$lock lock: the waiter takes it after the expiry through the proxy, never directly',
    async ({ key, leaseMs }) => {
      const db = leaseMs === 3000 ? 2 : 3;
      const [direct, proxied] = await Promise.all([play(env.redis.port, db, key, leaseMs), play(env.proxy.port, db + 4, key, leaseMs)]);
      expect(direct.takenAfterMs).toBeUndefined();
      expect(direct.pttl).toBeGreaterThan(0); // twice the lease later, still held: the start-up would hang here
      expect(proxied.takenAfterMs).toBeGreaterThanOrEqual(leaseMs - 50);
      expect(proxied.takenAfterMs).toBeLessThanOrEqual(leaseMs + RETRY_MS + 200);
    },
    20_000,
  );
});
