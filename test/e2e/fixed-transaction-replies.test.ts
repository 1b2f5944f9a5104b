/**
 * A transaction whose lock pair was fixed, answered as Redis alone answers it, whatever else it
 * holds: a push inside EXEC's array, a command after the pair that makes the connection a plain
 * pipe, a large value (which streams, backpressure and all), and a WATCH that Redis ended with an
 * EXEC it refused. Each case is sent to Redis directly and through the proxy, from the same state:
 * the bytes must be the same, and the held lock keeps its expiry through the proxy only.
 */
import net from 'node:net';
import { beforeAll, describe, expect, it } from 'vitest';
import { proxyPerLockWay } from '../support/lock-ways.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { cmd, RawClient } from '../support/resp.js';
import { serverFacts, startedServerFacts, type ServerFacts } from '../support/server-facts.js';
import { lockAttempt, taskLockKey } from '../support/stalwart.js';

// Before 7.0 there is no such setting: DEBUG is always allowed.
const debugArgs = (await startedServerFacts()).has('enable-debug-command') ? ['--enable-debug-command', 'yes'] : [];
const env = redisWithAdmin({ redis: { args: debugArgs } });
const proxies = proxyPerLockWay(() => env.redis.url);
let facts: ServerFacts;
beforeAll(async () => {
  facts = await serverFacts(env.admin);
});

const key = taskLockKey(0x37n);
const HELD_MS = 1_000_000;
const call = (...args: Array<string | Buffer>): Promise<string> => env.admin.call(...args);

/** A held lock: counter 1, and an expiry well below the block's 3600 s. */
async function holdLock(): Promise<void> {
  expect(await call('SET', key, '1', 'PX', String(HELD_MS))).toBe('+OK\r\n');
}

/** Sends `bytes` on a fresh connection to `port` and reads `replies` replies; the key's TTL after. */
async function attempt(port: number, bytes: Buffer, replies: number): Promise<{ replies: string; ttlMs: number }> {
  await holdLock();
  const client = await RawClient.connect(port);
  try {
    client.write(bytes);
    const received = (await client.readReplies(replies)).toString('latin1');
    return { replies: received, ttlMs: await env.admin.pttl(key) };
  } finally {
    client.destroy();
  }
}

/** The block with `between` queued after its pair: MULTI / INCRBY / EXPIRE / between / EXEC. */
function blockWith(between: Buffer): Buffer {
  const whole = lockAttempt(key, 3600);
  const exec = cmd('EXEC');
  return Buffer.concat([whole.subarray(0, whole.length - exec.length), between, exec]);
}

describe('a fixed pair answered as Redis answers it', () => {
  it('with a push inside EXEC’s array (DEBUG PROTOCOL push, RESP3): Redis’s bytes, and the process serves on', async () => {
    if (facts.has('enable-debug-command')) {
      expect(await call('CONFIG', 'GET', 'enable-debug-command')).toMatch(/yes|local/);
    }
    const proxy = proxies.transaction();
    const bystander = await RawClient.connect(proxy.port);
    // Before 7.0 the expiry script takes a pair that comes first in its transaction: the push then comes after it.
    const push = cmd('DEBUG', 'PROTOCOL', 'push');
    const pair = [cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '3600')];
    const queued = facts.has('expire-nx') ? [push, ...pair] : [...pair, push];
    const bytes = Buffer.concat([cmd('HELLO', '3'), cmd('MULTI'), ...queued, cmd('EXEC'), cmd('PING')]);
    const direct = await attempt(env.redis.port, bytes, 7);
    const proxied = await attempt(proxy.port, bytes, 7);
    // Redis 6 and 7.0 send the push inside EXEC's array; later servers may send it after the array.
    expect(direct.replies).toContain('>2\r\n$16\r\nserver-cpu-usage\r\n');
    // HELLO's map names the connection's id: the rest is byte for byte.
    const sameId = (replies: string) => replies.replace(/\$2\r\nid\r\n:\d+\r\n/, '$2\r\nid\r\n:N\r\n');
    expect(sameId(proxied.replies)).toBe(sameId(direct.replies));
    expect(direct.ttlMs).toBeGreaterThan(3_000_000);
    expect(proxied.ttlMs).toBeLessThanOrEqual(HELD_MS);
    expect(await bystander.call('PING')).toBe('+PONG\r\n');
    expect(proxy.stats.sessionFaults).toBe(0);
    await bystander.close();
  });

  // Each makes the connection a plain pipe once the EXEC has run it; the pair before it is restored.
  const PIPE_ENTERING: ReadonlyArray<[string, Buffer]> = [
    ['CLIENT GETNAME, inline', Buffer.from('CLIENT GETNAME\r\n')],
    ['an inline command with quotes', Buffer.from('ECHO "a b"\r\n')],
    ['SUBSCRIBE', cmd('SUBSCRIBE', 'ch37')],
    ['CLIENT REPLY ON', cmd('CLIENT', 'REPLY', 'ON')],
    ['MONITOR', cmd('MONITOR')],
    ['REPLCONF listening-port', cmd('REPLCONF', 'listening-port', '1')],
  ];
  for (const [name, between] of PIPE_ENTERING) {
    it(`with ${name} queued after the pair: Redis's bytes, the expiry restored and the lock's lease kept`, async () => {
      const proxy = proxies.transaction();
      const rewritten = proxy.stats.blocksRewritten;
      // MULTI, INCRBY, EXPIRE, the command, EXEC: five replies, then a PING's (an array in subscribed RESP2).
      const bytes = Buffer.concat([blockWith(between), Buffer.from('PING\r\n')]);
      const direct = await attempt(env.redis.port, bytes, 6);
      const proxied = await attempt(proxy.port, bytes, 6);
      // Redis 6 feeds the EXEC to the new monitor: its time and client address are the connection's own.
      const sameMonitorLine = (replies: string) => replies.replace(/^\+\d+\.\d+ \[\d+ [^\]]+\]/m, '+T [0 ADDR]');
      expect(sameMonitorLine(proxied.replies)).toBe(sameMonitorLine(direct.replies));
      expect(direct.ttlMs).toBeGreaterThan(3_000_000);
      if (/\*\d+\r\n:2\r\n:1\r\n/.test(direct.replies)) {
        // The transaction ran (a server that refuses the command inside MULTI aborts it: nothing to fix).
        expect(proxied.ttlMs).toBeLessThanOrEqual(HELD_MS);
        expect(proxy.stats.blocksRewritten).toBe(rewritten + 1);
      }
    });
  }
});

describe('a fixed transaction’s EXEC reply streams', () => {
  it('holds none of a large value: a client that does not read stops Redis, and then gets every byte', async () => {
    const proxy = proxies.transaction();
    const size = 64 * 1024 * 1024;
    const value = Buffer.alloc(size, 0x78);
    expect(await call('SET', 'big37', value)).toBe('+OK\r\n');
    await holdLock();
    const fromRedis = (): number => proxy.stats.bytesFromUpstream;
    const before = fromRedis();
    const socket = net.connect(proxy.port, '127.0.0.1');
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.pause(); // reads nothing yet
    socket.write(blockWith(cmd('GET', 'big37')));
    // Wait until the proxy has read all it will: Redis's reply stops where the slow client's
    // backpressure holds it (the reads stand still for a while, on a busy machine too).
    const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    for (let i = 0; i < 200 && fromRedis() === before; i++) await sleep(50);
    for (let last = -1, i = 0; i < 60 && fromRedis() !== last; i++) {
      last = fromRedis();
      await sleep(500);
    }
    expect(fromRedis() - before).toBeGreaterThan(0);
    expect(fromRedis() - before).toBeLessThan(size / 2);
    // Now read: every byte, the expiry's element restored.
    const chunks: Buffer[] = [];
    const expected = Buffer.concat([
      Buffer.from(`+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n:2\r\n:1\r\n$${size}\r\n`),
      value,
      Buffer.from('\r\n'),
    ]);
    let received = 0;
    await new Promise<void>((resolve, reject) => {
      socket.on('data', (chunk: Buffer) => {
        chunks.push(chunk);
        received += chunk.length;
        if (received >= expected.length) resolve();
      });
      socket.on('error', reject);
      socket.resume();
    });
    socket.destroy();
    expect(Buffer.concat(chunks).equals(expected)).toBe(true);
    expect(await env.admin.pttl(key)).toBeLessThanOrEqual(HELD_MS);
  }, 60_000);
});

describe('WATCH as Redis holds it', () => {
  it('EXEC refused outside MULTI unwatches: the next lock block is fixed, either way', async () => {
    for (const way of ['transaction', 'script'] as const) {
      const bytes = Buffer.concat([cmd('WATCH', key), cmd('EXEC', 'x'), lockAttempt(key, 3600)]);
      const direct = await attempt(env.redis.port, bytes, 6);
      const proxied = await attempt(proxies[way]().port, bytes, 6);
      expect({ way, replies: proxied.replies }).toEqual({ way, replies: direct.replies });
      expect(direct.ttlMs).toBeGreaterThan(3_000_000);
      expect({ way, ttlKept: proxied.ttlMs <= HELD_MS }).toEqual({ way, ttlKept: true });
    }
  });

  it('EXEC without MULTI leaves the WATCH: the next block is one Redis may abort, and goes as sent', async () => {
    for (const way of ['transaction', 'script'] as const) {
      const proxy = proxies[way]();
      const rewritten = proxy.stats.blocksRewritten;
      const bytes = Buffer.concat([cmd('WATCH', key), cmd('EXEC'), cmd('DISCARD', 'x'), lockAttempt(key, 3600)]);
      const direct = await attempt(env.redis.port, bytes, 7);
      const proxied = await attempt(proxy.port, bytes, 7);
      expect(proxied.replies).toBe(direct.replies);
      expect(proxy.stats.blocksRewritten).toBe(rewritten);
    }
  });
});
