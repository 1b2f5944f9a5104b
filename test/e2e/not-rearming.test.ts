/**
 * What not re-arming a held lock's expiry shows to other clients, both ways of sending a block:
 * the skipped EXPIRE emits no `expire` keyspace event; a WATCH on the key, and a client tracking
 * it, still see the key change when the increment changes it, as directly; only when nothing
 * changes the key (the increment fails on a key of another type, which keeps its expiry) do
 * they see nothing, where directly the re-armed expiry would have touched it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { proxyPerLockWay } from '../support/lock-ways.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { lockAttempt } from '../support/stalwart.js';

const env = redisWithAdmin();
const proxies = proxyPerLockWay(() => env.redis.url);

const key = 'lock:seen'; // a key the test rules name
const call = (...args: string[]): Promise<string> => env.admin.call(...args);

/** The targets: Redis itself, and each way through the proxy. */
const TARGETS = [
  { name: 'directly', port: (): number => env.redis.port },
  { name: 'transaction', port: (): number => proxies.transaction().port },
  { name: 'script', port: (): number => proxies.script().port },
] as const;

/** The keyspace events of `key` that one lock attempt through `port` causes. */
async function eventsOfAttempt(port: number): Promise<string[]> {
  const listener = await RawClient.connect(env.redis.port);
  try {
    listener.write(cmd('SUBSCRIBE', `__keyspace@0__:${key}`));
    await listener.readReplies(1);
    await exchange(port, lockAttempt(key, 600), 4);
    // Redis queues a notification as the command runs: all of the attempt's come before this reply.
    listener.write(cmd('UNSUBSCRIBE'));
    const frames = (await listener.readReplies(1)).toString('latin1');
    const events: string[] = [];
    for (let more = frames; !more.startsWith('*3\r\n$11\r\nunsubscribe'); more = (await listener.readReplies(1)).toString('latin1')) {
      events.push(/\$\d+\r\n([^\r]+)\r\n$/.exec(more)?.[1] ?? more);
    }
    return events;
  } finally {
    await listener.close();
  }
}

describe('keyspace events', () => {
  beforeAll(async () => {
    await call('CONFIG', 'SET', 'notify-keyspace-events', 'K$g');
  });
  afterAll(async () => {
    await call('CONFIG', 'SET', 'notify-keyspace-events', '');
  });

  for (const target of TARGETS) {
    it(`${target.name}: the creating attempt emits incrby and expire; a contender's, ${target.name === 'directly' ? 'incrby and expire again' : 'incrby only'}`, async () => {
      expect(await eventsOfAttempt(target.port())).toEqual(['incrby', 'expire']);
      expect(await eventsOfAttempt(target.port())).toEqual(target.name === 'directly' ? ['incrby', 'expire'] : ['incrby']);
    });
  }
});

/** Whether a WATCH on `key`, set before one lock attempt through `port`, makes the watcher's EXEC fail. */
async function watchTripped(port: number): Promise<boolean> {
  const watcher = await RawClient.connect(env.redis.port);
  try {
    watcher.write(cmd('WATCH', key));
    await watcher.readReplies(1);
    await exchange(port, lockAttempt(key, 600), 4);
    watcher.write(Buffer.concat([cmd('MULTI'), cmd('PING'), cmd('EXEC')]));
    return (await watcher.readReplies(3)).toString('latin1').endsWith('*-1\r\n');
  } finally {
    await watcher.close();
  }
}

/** Whether a client tracking `key` (RESP3, CLIENT TRACKING) is told it changed by one lock attempt through `port`. */
async function trackingInvalidated(port: number): Promise<boolean> {
  const tracker = await RawClient.connect(env.redis.port);
  try {
    tracker.write(Buffer.concat([cmd('HELLO', '3'), cmd('CLIENT', 'TRACKING', 'ON'), cmd('TYPE', key)]));
    await tracker.readReplies(3);
    await exchange(port, lockAttempt(key, 600), 4);
    tracker.write(cmd('PING'));
    // An invalidation push, if the key changed, arrives before the PONG.
    return (await tracker.readReplies(1)).toString('latin1').startsWith('>');
  } finally {
    await tracker.close();
  }
}

describe('WATCH and client-side caching', () => {
  for (const target of TARGETS) {
    it(`${target.name}: a contender's increment changes the key, so WATCH and tracking see it`, async () => {
      await call('FLUSHALL');
      await call('SET', key, '1', 'EX', '100');
      expect(await watchTripped(target.port())).toBe(true);
      expect(await trackingInvalidated(target.port())).toBe(true);
    });

    it(`${target.name}: a key of another type with an expiry: ${target.name === 'directly' ? 'the re-armed expiry touches it' : 'nothing touches it'}`, async () => {
      for (const check of [watchTripped, trackingInvalidated]) {
        await call('FLUSHALL');
        await call('RPUSH', key, 'x');
        await call('EXPIRE', key, '100');
        expect(await check(target.port())).toBe(target.name === 'directly');
      }
    });
  }
});
