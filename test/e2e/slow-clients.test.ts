/**
 * A client that is slow to send or slow to read gets through the proxy what it gets from Redis
 * directly: the bounds that wait on Redis (--upstream-timeout-ms, --own-reply-timeout-ms) count
 * only time in which Redis alone owes a reply, a reply Redis sent is never lost, and no socket to
 * Redis outlives its session. Each case runs the same client against the same server directly and
 * through the proxy, and compares the bytes (never a text of one Redis version).
 *
 * A slow reader here is a socket paused for a while (socket.pause(): nothing more is read from
 * the kernel, whose buffers fill, then the proxy's or Redis's), then read to the end.
 */
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { busyScript, cmd, RawClient } from '../support/resp.js';
import { serverFacts } from '../support/server-facts.js';
import { attemptReplies, lockAttempt } from '../support/stalwart.js';

const env = redisWithAdmin();
const proxies: TestProxy[] = [];

afterAll(async () => {
  await Promise.all(proxies.map((p) => p.close()));
});

async function proxyWith(flags: string[], lockMethod?: 'script' | 'transaction'): Promise<TestProxy> {
  const proxy = await startTestProxy({ upstream: env.redis.url, admin: true, flags, lockMethod });
  proxies.push(proxy);
  return proxy;
}

/**
 * A raw connection that writes `steps` (bytes, or a pause in ms) in order, reads nothing until
 * `readAfterMs` after it connected, then reads until `wanted` bytes came or the server closed.
 */
async function slowClient(
  port: number,
  steps: Array<Buffer | number>,
  readAfterMs: number,
  wanted = Number.POSITIVE_INFINITY,
): Promise<{ bytes: Buffer; closed: boolean }> {
  const socket = net.connect(port, '127.0.0.1');
  socket.setNoDelay(true);
  socket.pause();
  await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
  const chunks: Buffer[] = [];
  let length = 0;
  const done = new Promise<boolean>((resolve) => {
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      length += chunk.length;
      if (length >= wanted) resolve(false);
    });
    socket.on('error', () => {}); // a reset ends the stream like a close
    socket.on('close', () => resolve(true));
  });
  const started = performance.now();
  for (const step of steps) {
    if (typeof step === 'number') await sleep(step);
    else socket.write(step);
  }
  await sleep(Math.max(0, readAfterMs - (performance.now() - started)));
  socket.resume();
  const closed = await Promise.race([done, sleep(30_000).then(() => null)]);
  socket.destroy();
  if (closed === null) throw new Error(`no end after 30 s: ${length} bytes read`);
  return { bytes: Buffer.concat(chunks), closed };
}

/** What `run` gives directly, and through `proxy`: expected to be the same. */
async function bothWays<T>(proxy: TestProxy, run: (port: number) => Promise<T>): Promise<{ direct: T; proxied: T }> {
  const direct = await run(env.redis.port);
  const proxied = await run(proxy.port);
  return { direct, proxied };
}

/** A value of `size` bytes (zeros then "x"), made by Redis itself. */
async function bigValue(key: string, size: number): Promise<void> {
  expect(await env.admin.call('SETRANGE', key, String(size - 1), 'x')).toBe(`:${size}\r\n`);
}

const bulkLength = (size: number): number => `$${size}\r\n`.length + size + 2;

describe('--upstream-timeout-ms counts only time in which Redis owes a reply', () => {
  let proxy: TestProxy;
  beforeAll(async () => {
    proxy = await proxyWith(['--upstream-timeout-ms', '1000']);
  });

  it('a client that takes longer than the bound to finish its command gets its reply', async () => {
    const request = cmd('SET', 'slow-sender', 'value');
    const { direct, proxied } = await bothWays(proxy, (port) =>
      slowClient(port, [request.subarray(0, -4), 1500, request.subarray(-4)], 1500, 5),
    );
    expect(direct.bytes.toString('latin1')).toBe('+OK\r\n');
    expect(proxied.bytes.toString('latin1')).toBe(direct.bytes.toString('latin1'));
    expect(proxy.stats.upstreamTimeouts).toBe(0);
  });

  it('a reply the client reads slowly is not cut: the clock stops while the proxy waits on the client', async () => {
    const size = 32 * 1024 * 1024;
    await bigValue('big', size);
    const { direct, proxied } = await bothWays(proxy, (port) => slowClient(port, [cmd('GET', 'big')], 2500, bulkLength(size)));
    expect(direct.bytes.length).toBe(bulkLength(size));
    expect(proxied.bytes.length).toBe(direct.bytes.length);
    expect(proxied.bytes.equals(direct.bytes)).toBe(true);
    expect(proxy.stats.upstreamTimeouts).toBe(0);
  });
});

describe('--own-reply-timeout-ms counts only time in which Redis owes the reply', () => {
  it("a lock block's replies behind a large reply the client is slow to read", async () => {
    const proxy = await proxyWith(['--own-reply-timeout-ms', '500'], 'script');
    const block = lockAttempt('lock:behind-a-big-reply', 60);
    // At some size the large reply is read whole by the proxy while the client reads nothing,
    // and the script's reply is due while the proxy reads no more: every size must do.
    for (const size of [256 * 1024, 2 * 1024 * 1024, 4_300_000, 8 * 1024 * 1024]) {
      await bigValue('big', size);
      const { direct, proxied } = await bothWays(proxy, async (port) => {
        await env.admin.call('DEL', 'lock:behind-a-big-reply');
        const wanted = bulkLength(size) + attemptReplies(1, 1).length;
        const out = await slowClient(port, [Buffer.concat([cmd('GET', 'big'), block])], 1200, wanted);
        return { ...out, counter: await env.admin.call('GET', 'lock:behind-a-big-reply') };
      });
      expect(direct.bytes.subarray(bulkLength(size)).toString('latin1')).toBe(attemptReplies(1, 1));
      expect(proxied.bytes.equals(direct.bytes), `size ${size}`).toBe(true);
      expect(proxied.counter).toBe(direct.counter);
    }
    expect(proxy.stats.ownRepliesTimedOut).toBe(0);
  });

  it('a slow subscriber that sends RESET gets its whole backlog, then +RESET', async (ctx) => {
    ctx.skip(...(await serverFacts(env.admin)).skipUnless('reset'));
    const proxy = await proxyWith(['--own-reply-timeout-ms', '500']);
    const messages = 120;
    // 9.8 MB in all: more than the kernel's buffers hold. Each message is longer than the proxy's
    // largest read (64 KiB), so its reads, and the RESET after one, end inside a message.
    const payload = 'm'.repeat(80 * 1024);
    let runs = 0;
    const run = async (port: number): Promise<string> => {
      // A channel of its own (one digit apart): the run before's subscriber may still count while Redis closes it.
      const channel = `slow-subscriber-${runs++}`;
      // A subscriber that reads nothing while the backlog is published, then sends RESET.
      const socket = net.connect(port, '127.0.0.1');
      socket.pause();
      await new Promise<void>((resolve) => socket.once('connect', resolve));
      const chunks: Buffer[] = [];
      const received = (): string => Buffer.concat(chunks).toString('latin1');
      socket.on('data', (c: Buffer) => chunks.push(c));
      socket.on('error', () => {});
      socket.write(cmd('SUBSCRIBE', channel));
      // The subscription is in place once Redis counts its subscriber.
      for (let i = 0; i < 200 && (await env.admin.call('PUBSUB', 'NUMSUB', channel)).endsWith(':0\r\n'); i++) await sleep(10);
      for (let i = 0; i < messages; i++) await env.admin.call('PUBLISH', channel, `${i}:${payload}`);
      socket.write(cmd('RESET'));
      await sleep(1500);
      socket.resume();
      const deadline = Date.now() + 20_000;
      while (Date.now() < deadline && !socket.destroyed && !received().endsWith('+RESET\r\n')) await sleep(20);
      socket.destroy();
      return received().replaceAll(channel, 'slow-subscriber-N');
    };
    const { direct, proxied } = await bothWays(proxy, run);
    expect(direct.match(/\$7\r\nmessage\r\n/g)).toHaveLength(messages);
    expect(direct.endsWith('+RESET\r\n')).toBe(true);
    expect(proxied.length).toBe(direct.length);
    expect(proxied).toBe(direct);
    expect(proxy.stats.ownRepliesTimedOut).toBe(0);
  });
});

describe('a bound that closes a connection while a lock block is in flight', () => {
  it("logs the block's rule and key, and counts it: Redis ran it, and its client is not told", async () => {
    // The way the server has, named: auto would first ask the version, which waits behind the busy command.
    const way = (await serverFacts(env.admin)).has('expire-nx') ? 'transaction' : 'script';
    const proxy = await proxyWith(['--upstream-timeout-ms', '500'], way);
    const client = await RawClient.connect(proxy.port);
    // Redis is busy for 1.5 s with the first command, and runs the lock block after it.
    client.write(Buffer.concat([busyScript(1.5), lockAttempt('lock:in-flight', 60)]));
    expect((await client.readUntilClosed(10_000)).toString('latin1')).toBe('');
    expect(proxy.stats.upstreamTimeouts).toBe(1);
    for (let i = 0; i < 100 && (await env.admin.call('GET', 'lock:in-flight')) !== '$1\r\n1\r\n'; i++) await sleep(50);
    expect(await env.admin.call('GET', 'lock:in-flight')).toBe('$1\r\n1\r\n');
    const line = proxy
      .logs()
      .find((l) => l.msg === "connection closed before a lock block's replies came: Redis may have run it, and its client is not told");
    expect(line).toMatchObject({ rule: 'test-lock', key: 'lock:in-flight' });
    expect(await proxy.metrics()).toMatch(/^redis_lock_proxy_blocks_total\{rule="test-lock",outcome="closed"\} 1$/m);
  });
});

/**
 * Sockets of this host connected to `port`, named by their local address, in any state but
 * TIME_WAIT, or only in `state` (hex, as /proc/net/tcp gives it): Redis's clients, the proxy's
 * upstream sockets among them.
 */
const CLOSE_WAIT = '08';

/**
 * Waits for the proxy's sessions to close, then for every socket `sockets()` names that was not
 * among `before` to go: a socket that was open before (another test's, or the admin's) and closes
 * meanwhile is not a leak, one opened since and still there is.
 */
async function settles(proxy: TestProxy, sockets: () => Set<string>, before: Set<string>): Promise<void> {
  const added = (): string[] => [...sockets()].filter((s) => !before.has(s));
  const deadline = Date.now() + 5000;
  while (Date.now() < deadline && (proxy.stats.connectionsOpen > 0 || added().length > 0)) await sleep(50);
  expect(proxy.stats.connectionsOpen).toBe(0);
  expect(added()).toEqual([]);
}

function socketsTo(port: number, state?: string): Set<string> {
  const found = new Set<string>();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(file, 'latin1');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (fields.length < 4) continue;
      const remotePort = parseInt(fields[2].split(':')[1], 16);
      if (remotePort === port && (state === undefined ? fields[3] !== '06' /* TIME_WAIT */ : fields[3] === state))
        found.add(`${file} ${fields[1]}`);
    }
  }
  return found;
}

describe('a slow client that sends QUIT after a large reply, and more after it', () => {
  const size = 6_000_000;
  // PINGs while Redis still writes the reply, and more once it may have closed.
  const pings = Buffer.concat(Array.from({ length: 20 }, () => cmd('PING')));
  const requests = (): Array<Buffer | number> => [Buffer.concat([cmd('GET', 'big'), cmd('QUIT')]), 300, pings, 2500, pings];

  it('gets the whole reply and +OK, as directly, and leaves no socket to Redis behind', async () => {
    const proxy = await proxyWith([]);
    await bigValue('big', size);
    const before = socketsTo(env.redis.port);
    for (let round = 0; round < 3; round++) {
      const { direct, proxied } = await bothWays(proxy, (port) => slowClient(port, requests(), 3000));
      expect(direct.bytes.length).toBe(bulkLength(size) + 5);
      expect(direct.bytes.subarray(-5).toString('latin1')).toBe('+OK\r\n');
      expect(proxied.bytes.length, `round ${round}`).toBe(direct.bytes.length);
      expect(proxied.bytes.equals(direct.bytes)).toBe(true);
    }
    // Each session closes both its sockets once it ends: none is left towards Redis.
    await settles(proxy, () => socketsTo(env.redis.port), before);
  });
});

describe('no socket to Redis outlives its session', () => {
  it('a client that goes while its reply streams, at once or by half-closing', async () => {
    const proxy = await proxyWith([]);
    await bigValue('big', 6_000_000);
    const before = socketsTo(env.redis.port);
    for (let round = 0; round < 3; round++) {
      const client = net.connect(proxy.port, '127.0.0.1');
      await new Promise<void>((resolve) => client.once('connect', resolve));
      client.on('error', () => {});
      client.write(cmd('GET', 'big'));
      // Read part of the reply, then go: reset, or end and stop reading.
      await new Promise<void>((resolve) => client.once('data', () => resolve()));
      if (round === 1) client.destroy();
      else {
        client.pause();
        client.end();
        await sleep(200);
        client.destroy();
      }
    }
    await settles(proxy, () => socketsTo(env.redis.port), before);
  });

  describe('a write refused after Redis closed', () => {
    // Redis closes a connection idle for a second: here, one whose reply it has written whole into
    // the kernel's buffers while the client, and so the proxy, reads slowly. The client's next
    // commands meet the closed connection, and a write that follows Redis's reset is refused
    // (upstream-socket.ts): then the client reads to the end and closes.
    const idle = redisWithAdmin({ redis: { args: ['--timeout', '1'] } });
    const pings = Buffer.concat(Array.from({ length: 20 }, () => cmd('PING')));

    it('the session closes both its sockets', async () => {
      const proxy = await startTestProxy({ upstream: idle.redis.url });
      proxies.push(proxy);
      expect(await idle.admin.call('SETRANGE', 'big', String(6_000_000 - 1), 'x')).toBe(':6000000\r\n');
      for (let round = 0; round < 3; round++) {
        const { bytes, closed } = await slowClient(proxy.port, [cmd('GET', 'big'), 2500, pings, 300, pings], 3500);
        expect(closed).toBe(true);
        expect(bytes.subarray(0, 10).toString('latin1')).toBe('$6000000\r\n');
      }
      // Redis closed each of them: one still open here would wait in CLOSE_WAIT for ever.
      await settles(proxy, () => socketsTo(idle.redis.port, CLOSE_WAIT), new Set());
    });
  });
});
