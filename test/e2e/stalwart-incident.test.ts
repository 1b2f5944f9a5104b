/**
 * The Stalwart incident, scaled down: an owner takes a 2 s lock and dies;
 * three contenders keep retrying every ~150 ms with the same block.
 *
 * Directly against Redis every failed attempt re-arms the expiry, so the
 * abandoned lock never expires (the bug). Through the proxy it expires at the
 * owner's deadline and a contender takes it.
 *
 * Both runs go at the same time, on different keys of the same Redis.
 */
import { expect, it } from 'vitest';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { cmd, RawClient } from '../support/resp.js';
import { counterOf, lockAttempt, taskLockKey } from '../support/stalwart.js';

const LEASE_SECONDS = 2;
const RETRY_MS = 150;
const OBSERVE_MS = 4000;
const CONTENDERS = 3;

const env = redisAndProxy();

interface Outcome {
  /** Milliseconds after the owner took the lock when a contender got counter 1, if ever. */
  takenAfterMs: number | undefined;
  /** The counter and PTTL of the key at the end of the run. */
  finalCounter: number;
  finalPttl: number;
}

async function playIncident(port: number, key: Buffer): Promise<Outcome> {
  const owner = await RawClient.connect(port);
  owner.write(lockAttempt(key, LEASE_SECONDS));
  expect(counterOf(await owner.readReplies(4))).toBe(1);
  const takenAt = Date.now();
  owner.destroy(); // the worker holding the lock is killed

  const contenders = await Promise.all(Array.from({ length: CONTENDERS }, () => RawClient.connect(port)));
  let takenAfterMs: number | undefined;
  const retry = async (client: RawClient, offset: number): Promise<void> => {
    await new Promise((r) => setTimeout(r, offset));
    while (Date.now() - takenAt < OBSERVE_MS && takenAfterMs === undefined) {
      client.write(lockAttempt(key, LEASE_SECONDS));
      if (counterOf(await client.readReplies(4)) === 1) takenAfterMs = Date.now() - takenAt;
      await new Promise((r) => setTimeout(r, RETRY_MS));
    }
  };
  await Promise.all(contenders.map((client, i) => retry(client, (i * RETRY_MS) / CONTENDERS)));
  await Promise.all(contenders.map((client) => client.close()));

  // Not env.admin: both runs read at the same time, and a RawClient takes one read at a time.
  const admin = await RawClient.connect(env.redis.port);
  admin.write(Buffer.concat([cmd('GET', key), cmd('PTTL', key)]));
  const [, counter, pttl] = /^\$\d+\r\n(-?\d+)\r\n:(-?\d+)\r\n$/.exec((await admin.readReplies(2)).toString('latin1')) ?? [];
  await admin.close();
  return { takenAfterMs, finalCounter: Number(counter), finalPttl: Number(pttl) };
}

it('an abandoned lock never expires directly against Redis, and expires on time through the proxy', async () => {
  const [direct, proxied] = await Promise.all([
    playIncident(env.redis.port, taskLockKey(1n)),
    playIncident(env.proxy.port, taskLockKey(2n)),
  ]);

  // The bug: after twice the lease, nobody got the lock and it is still alive, re-armed by the losers.
  expect(direct.takenAfterMs).toBeUndefined();
  expect(direct.finalCounter).toBeGreaterThan(5);
  expect(direct.finalPttl).toBeGreaterThan(0); // twice the lease later, still alive

  // The fix: a contender takes the lock within ~0.5 s after the owner's deadline.
  expect(proxied.takenAfterMs).toBeDefined();
  expect(proxied.takenAfterMs).toBeGreaterThanOrEqual(LEASE_SECONDS * 1000 - 50);
  expect(proxied.takenAfterMs).toBeLessThanOrEqual(LEASE_SECONDS * 1000 + 500);
  console.log(
    `incident: direct counter=${direct.finalCounter} pttl=${direct.finalPttl}ms after ${OBSERVE_MS}ms; ` +
      `proxy: lock taken ${proxied.takenAfterMs}ms after the owner took a ${LEASE_SECONDS}s lease`,
  );
}, 20_000);
