/**
 * Everything that is not a lock block, end to end against a real redis-server:
 * pub/sub, RESP3 pushes, MONITOR, blocking commands, CLIENT REPLY, errors,
 * malformed input, QUIT and half-close, large values, upstream failures,
 * credentials in the upstream URL, a unix socket upstream, and many clients.
 * Where the proxy is meant to be invisible, the same bytes are sent directly
 * and through the proxy and the replies compared byte for byte. What a server
 * cannot do (RESET before 6.2) is skipped with the reason, and where the lock
 * block goes the script way (auto, before 7.0) it is held to what
 * docs/behaviour.md says of that way.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestProxy } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { closedPort } from '../support/ports.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';

/** Redis listens on a unix socket here too. */
const socketDir = mkdtempSync(path.join(os.tmpdir(), 'rlp-sock-'));
const socketPath = path.join(socketDir, 'r.sock');
// Registered first, so it runs last: after Redis has stopped.
afterAll(() => rmSync(socketDir, { recursive: true, force: true }));

const env = redisAndProxy({ redis: { args: ['--unixsocket', socketPath, '--unixsocketperm', '700'] } });
let facts: ServerFacts;
beforeAll(async () => {
  facts = await serverFacts(env.admin);
});

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const adminCall = (...args: (string | Buffer)[]): Promise<string> => env.admin.call(...args);

/**
 * A key's PTTL, read directly. The proxy gives a lock block's expiry Redis's own answer (1)
 * whether or not it applied it: the lease left as it was shows that the block was fixed.
 */
async function adminPttl(key: string | Buffer): Promise<number> {
  return Number(/^:(-?\d+)\r\n$/.exec(await adminCall('PTTL', key))?.[1]);
}

/** Sends `bytes` on a fresh connection and returns everything received until the server closes it. */
async function untilClosed(port: number, bytes: Buffer): Promise<string> {
  const client = await RawClient.connect(port);
  try {
    client.write(bytes);
    return (await client.readUntilClosed()).toString('latin1');
  } finally {
    client.destroy();
  }
}

/** The same bytes directly and through the proxy must give the same replies. */
async function sameAsDirect(bytes: Buffer, replies: number): Promise<string> {
  const direct = await exchange(env.redis.port, bytes, replies);
  const proxied = await exchange(env.proxy.port, bytes, replies);
  expect(proxied).toBe(direct);
  return proxied;
}

/** Expects that no complete reply arrives within `ms`. */
async function expectSilence(client: RawClient, ms: number): Promise<void> {
  await expect(client.readReplies(1, ms)).rejects.toThrow(/timed out/);
}

/** Reads one frame at a time until one matches `test`; returns all frames read. */
async function readUntil(client: RawClient, test: (frame: string) => boolean, timeoutMs = 5000): Promise<string[]> {
  const deadline = Date.now() + timeoutMs;
  const frames: string[] = [];
  for (;;) {
    const frame = (await client.readReplies(1, Math.max(1, deadline - Date.now()))).toString('latin1');
    frames.push(frame);
    if (test(frame)) return frames;
  }
}

function bulk(text: string): string {
  return `$${Buffer.byteLength(text)}\r\n${text}\r\n`;
}

/** Connects with a plain socket, writes, half-closes, and collects everything until the server closes. */
function writeAndHalfClose(port: number, bytes: Buffer, timeoutMs = 5000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no close within ${timeoutMs} ms; got ${JSON.stringify(Buffer.concat(chunks).toString('latin1'))}`));
    }, timeoutMs);
    socket.on('connect', () => {
      socket.write(bytes);
      socket.end();
    });
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    socket.on('error', () => undefined); // 'close' follows
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks).toString('latin1'));
    });
  });
}

// ---------------------------------------------------------------------------
// Pub/sub
// ---------------------------------------------------------------------------

describe('pub/sub', () => {
  /** A RESP2 subscribe session; PUBLISHes go directly to Redis. Returns every byte the subscriber got. */
  async function resp2Session(port: number): Promise<string[]> {
    const sub = await RawClient.connect(port);
    const out: string[] = [];
    const read = async (n: number) => out.push((await sub.readReplies(n)).toString('latin1'));
    try {
      sub.write(cmd('SUBSCRIBE', 'ch1', 'ch2'));
      await read(2);
      sub.write(cmd('PSUBSCRIBE', 'pat.*'));
      await read(1);
      out.push(await adminCall('PUBLISH', 'ch1', 'hello'));
      await read(1);
      out.push(await adminCall('PUBLISH', 'pat.x', 'hi\r\nthere'));
      await read(1);
      sub.write(cmd('PING')); // allowed in RESP2 subscribe mode, with its own reply shape
      await read(1);
      sub.write(cmd('UNSUBSCRIBE', 'ch1'));
      await read(1);
      out.push(await adminCall('PUBLISH', 'ch1', 'lost'));
      out.push(await adminCall('PUBLISH', 'ch2', 'kept'));
      await read(1);
      sub.write(cmd('PUNSUBSCRIBE'));
      await read(1);
      sub.write(cmd('UNSUBSCRIBE'));
      await read(1);
      sub.write(cmd('PING')); // out of subscribe mode again
      await read(1);
    } finally {
      await sub.close();
    }
    return out;
  }

  it('RESP2 SUBSCRIBE / PSUBSCRIBE / UNSUBSCRIBE behave exactly as directly', async () => {
    const direct = await resp2Session(env.redis.port);
    const proxied = await resp2Session(env.proxy.port);
    expect(proxied).toEqual(direct);
    expect(proxied.join('')).toContain('*3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$5\r\nhello\r\n');
    expect(proxied.join('')).toContain('*4\r\n$8\r\npmessage\r\n$5\r\npat.*\r\n$5\r\npat.x\r\n$9\r\nhi\r\nthere\r\n');
    expect(proxied.join('')).toContain('*3\r\n$11\r\nunsubscribe\r\n$3\r\nch1\r\n:2\r\n');
    expect(proxied[proxied.length - 1]).toBe('+PONG\r\n');
  });

  it('a message published through the proxy reaches a subscriber through the proxy, while another connection’s lock block is rewritten', async () => {
    const sub = await RawClient.connect(env.proxy.port);
    sub.write(cmd('SUBSCRIBE', 'news'));
    expect((await sub.readReplies(1)).toString()).toBe('*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n');

    const other = await RawClient.connect(env.proxy.port);
    const key = 'lock:pubsub';
    other.write(lockAttempt(key, 60));
    expect((await other.readReplies(4)).toString('latin1')).toBe(attemptReplies(1, 1));
    // The lease lowered, so that a re-armed expiry would show.
    await adminCall('PEXPIRE', key, '5000');
    other.write(Buffer.concat([cmd('PUBLISH', 'news', 'flash'), lockAttempt(key, 60)]));
    expect((await other.readReplies(5)).toString('latin1')).toBe(':1\r\n' + attemptReplies(2, 1));
    expect((await sub.readReplies(1)).toString()).toBe('*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nflash\r\n');
    const pttl = await adminPttl(key);
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(5000); // rewritten: expiry not re-armed

    other.write(lockAttempt(key, 60));
    expect((await other.readReplies(4)).toString('latin1')).toBe(attemptReplies(3, 1));
    expect(await adminPttl(key)).toBeLessThanOrEqual(pttl);
    await other.close();
    await sub.close();
  });

  it('RESP3 SUBSCRIBE: push frames arrive intact, and ordinary replies still interleave', async () => {
    const session = async (port: number): Promise<string[]> => {
      const sub = await RawClient.connect(port);
      try {
        sub.write(cmd('HELLO', '3'));
        const hello = (await sub.readReplies(1)).toString('latin1');
        expect(hello).toMatch(/^%7\r\n/); // contains the connection id, so not compared
        const out: string[] = [];
        sub.write(cmd('SUBSCRIBE', 'r3'));
        out.push((await sub.readReplies(1)).toString('latin1'));
        out.push(await adminCall('PUBLISH', 'r3', 'push\r\nme'));
        out.push((await sub.readReplies(1)).toString('latin1'));
        sub.write(Buffer.concat([cmd('SET', 'r3key', 'v'), cmd('GET', 'r3key'), cmd('PING')]));
        out.push((await sub.readReplies(3)).toString('latin1'));
        sub.write(cmd('UNSUBSCRIBE', 'r3'));
        out.push((await sub.readReplies(1)).toString('latin1'));
        return out;
      } finally {
        await sub.close();
      }
    };
    const direct = await session(env.redis.port);
    const proxied = await session(env.proxy.port);
    expect(proxied).toEqual(direct);
    expect(proxied[0]).toBe('>3\r\n$9\r\nsubscribe\r\n$2\r\nr3\r\n:1\r\n');
    expect(proxied[2]).toBe('>3\r\n$7\r\nmessage\r\n$2\r\nr3\r\n$8\r\npush\r\nme\r\n');
    expect(proxied[3]).toBe('+OK\r\n$1\r\nv\r\n+PONG\r\n');
  });
});

// ---------------------------------------------------------------------------
// RESP3 client tracking
// ---------------------------------------------------------------------------

describe('RESP3 client tracking', () => {
  /**
   * Frames read one at a time until `n` non-push replies are in; pushes are collected apart, and
   * so are invalidations inside a reply (Redis 6 sends one in the middle of EXEC's array).
   */
  async function readSkippingPushes(client: RawClient, n: number, pushes: string[]): Promise<string> {
    let replies = '';
    for (let got = 0; got < n;) {
      const frame = (await client.readReplies(1)).toString('latin1');
      if (frame.startsWith('>')) {
        pushes.push(frame);
      } else {
        replies += takeNestedPushes(frame, pushes);
        got++;
      }
    }
    return replies;
  }

  const invalidate = (key: string) => `>2\r\n$10\r\ninvalidate\r\n*1\r\n${bulk(key)}`;

  /** `frame` without the invalidation pushes inside it, which go to `pushes`. */
  function takeNestedPushes(frame: string, pushes: string[]): string {
    const head = />2\r\n\$10\r\ninvalidate\r\n\*1\r\n\$(\d+)\r\n/;
    let rest = frame;
    let kept = '';
    for (let found = head.exec(rest); found !== null; found = head.exec(rest)) {
      const end = found.index + found[0].length + Number(found[1]) + 2;
      pushes.push(rest.slice(found.index, end));
      kept += rest.slice(0, found.index);
      rest = rest.slice(end);
    }
    return kept + rest;
  }

  async function trackingClient(port: number): Promise<RawClient> {
    const client = await RawClient.connect(port);
    client.write(cmd('HELLO', '3'));
    expect((await client.readReplies(1)).toString('latin1')).toMatch(/^%7\r\n/);
    client.write(cmd('CLIENT', 'TRACKING', 'ON'));
    expect((await client.readReplies(1)).toString('latin1')).toBe('+OK\r\n');
    return client;
  }

  it('delivers invalidation pushes, and lock blocks on the same connection still get their 4 replies', async () => {
    const client = await trackingClient(env.proxy.port);
    const pushes: string[] = [];
    try {
      client.write(cmd('GET', 'tracked'));
      expect((await client.readReplies(1)).toString('latin1')).toBe('_\r\n');
      expect(await adminCall('SET', 'tracked', 'new')).toBe('+OK\r\n');
      expect((await client.readReplies(1)).toString('latin1')).toBe(invalidate('tracked'));

      // Pushes are not replies: the lock block's replies are still found and replaced.
      const key = 'lock:tracked';
      client.write(Buffer.concat([lockAttempt(key, 60), cmd('PING')]));
      expect(await readSkippingPushes(client, 5, pushes)).toBe(attemptReplies(1, 1) + '+PONG\r\n');

      // Track the lock key itself, then run the block: the script's INCRBY makes Redis push an
      // invalidation to this very connection around the script's reply.
      client.write(cmd('GET', key));
      expect(await readSkippingPushes(client, 1, pushes)).toBe('$1\r\n1\r\n');
      // Its expiry longer than the lease (60 s), so that a re-armed one would show.
      client.write(Buffer.concat([cmd('GET', 'tracked'), lockAttempt(key, 600), cmd('GET', 'tracked')]));
      expect(await readSkippingPushes(client, 6, pushes)).toBe(bulk('new') + attemptReplies(2, 1) + bulk('new'));
      expect(pushes).toContain(invalidate(key));
      expect(await adminPttl(key)).toBeLessThanOrEqual(60_000);

      // An invalidation caused by another client while the script is in flight.
      pushes.length = 0;
      client.write(lockAttempt(key, 600));
      await adminCall('DEL', 'tracked');
      expect(await readSkippingPushes(client, 4, pushes)).toBe(attemptReplies(3, 1));
      expect(await adminPttl(key)).toBeLessThanOrEqual(60_000);
      client.write(cmd('PING'));
      expect(await readSkippingPushes(client, 1, pushes)).toBe('+PONG\r\n');
      expect(pushes).toContain(invalidate('tracked'));
      expect(pushes.every((p) => p === invalidate('tracked') || p === invalidate(key))).toBe(true);
    } finally {
      await client.close();
    }
    expect(env.proxy.stats.blocksRewritten).toBeGreaterThanOrEqual(3);
  });

  // A read-only command inside the script (PTTL, GET) would make Redis track the key for a
  // tracking client, which MULTI/INCRBY/EXPIRE/EXEC never does: the client would then get
  // invalidation pushes for a lock key it never read.
  it('a lock block causes no invalidation push that the original block would not cause', async () => {
    /** Every frame, pushes included and in order, until `n` replies are in. */
    const framesUntil = async (client: RawClient, n: number): Promise<string> => {
      let frames = '';
      for (let got = 0; got < n;) {
        const frame = (await client.readReplies(1)).toString('latin1');
        frames += frame;
        if (!frame.startsWith('>')) got++;
      }
      return frames;
    };
    const run = async (port: number): Promise<string> => {
      await adminCall('DEL', 'lock:untracked');
      const client = await trackingClient(port);
      try {
        client.write(Buffer.concat([lockAttempt('lock:untracked', 60), cmd('PING')]));
        const first = await framesUntil(client, 5);
        await adminCall('INCR', 'lock:untracked'); // another node's attempt
        client.write(cmd('PING'));
        return first + (await framesUntil(client, 1));
      } finally {
        await client.close();
      }
    };
    const direct = await run(env.redis.port);
    expect(direct).toBe(attemptReplies(1, 1) + '+PONG\r\n+PONG\r\n');
    if (facts.has('expire-nx')) {
      expect(await run(env.proxy.port)).toBe(direct);
    } else {
      // Before 7.0 the expiry script reads the expiry (PTTL): Redis tracks the keys a script
      // reads, and the expiry it sets on the new lock then invalidates the key: 6.0 sends that
      // inside EXEC's array, 6.2 right after it (docs/behaviour.md#how-the-block-is-sent). The
      // one difference; nothing after it (the invalidation ended the tracking).
      const proxied = await run(env.proxy.port);
      const push = invalidate('lock:untracked');
      expect(proxied.split(push).length - 1).toBe(1);
      expect(proxied.replace(push, '')).toBe(direct);
    }
  });
});

// ---------------------------------------------------------------------------
// MONITOR
// ---------------------------------------------------------------------------

describe('MONITOR', () => {
  it('sees the commands of other connections, including a lock block as it is sent (with its NX, or the expiry script)', async () => {
    const monitor = await RawClient.connect(env.proxy.port);
    monitor.write(cmd('MONITOR'));
    expect((await monitor.readReplies(1)).toString()).toBe('+OK\r\n');

    await adminCall('SET', 'mon:direct', 'v1');
    await readUntil(monitor, (f) => f.includes('"SET" "mon:direct" "v1"'));

    expect(await exchange(env.proxy.port, cmd('SET', 'mon:proxied', 'v2'), 1)).toBe('+OK\r\n');
    await readUntil(monitor, (f) => f.includes('"SET" "mon:proxied" "v2"'));

    expect(await exchange(env.proxy.port, lockAttempt('lock:mon', 60), 4)).toBe(attemptReplies(1, 1));
    if (facts.has('expire-nx')) {
      const seen = (await readUntil(monitor, (f) => f.includes('"EXEC"'))).join('');
      expect(seen).toMatch(/"MULTI"[^]*"INCRBY" "lock:mon" "1"[^]*"EXPIRE" "lock:mon" "60" "NX"[^]*"EXEC"/);
    } else {
      // Before 7.0 auto sends the expiry as the copy Redis checks and the expiry script, inside the
      // client's transaction (6.x feeds MONITOR the EXEC before the commands it runs).
      const seen = (await readUntil(monitor, (f) => f.includes('[0 lua] "EXPIRE" "lock:mon" "60"'))).join('');
      expect(seen).toMatch(
        /"MULTI"[^]*"INCRBY" "lock:mon" "1"[^]*"EXPIRE" "lock:mon" "x"[^]*"EVAL" "-- redis-lock-proxy: expire-if-none[^]*\[0 lua\] "PTTL" "lock:mon"[^]*\[0 lua\] "EXPIRE" "lock:mon" "60"/,
      );
    }
    await monitor.close();
  });
});

// ---------------------------------------------------------------------------
// Blocking commands
// ---------------------------------------------------------------------------

describe('blocking commands', () => {
  it('BLPOP 0 waits until another connection pushes', async () => {
    const client = await RawClient.connect(env.proxy.port);
    client.write(cmd('BLPOP', 'queue', '0'));
    await expectSilence(client, 150);
    expect(await exchange(env.proxy.port, cmd('RPUSH', 'queue', 'job1'), 1)).toBe(':1\r\n');
    expect((await client.readReplies(1)).toString()).toBe('*2\r\n$5\r\nqueue\r\n$4\r\njob1\r\n');
    client.write(cmd('PING'));
    expect((await client.readReplies(1)).toString()).toBe('+PONG\r\n');
    await client.close();
  });

  it('a lock block pipelined after a blocked BLPOP is answered after it, in order', async () => {
    const client = await RawClient.connect(env.proxy.port);
    const key = 'lock:after-blpop';
    client.write(Buffer.concat([cmd('BLPOP', 'queue2', '0'), lockAttempt(key, 60), cmd('GET', key)]));
    await expectSilence(client, 150);
    // Redis runs nothing after the blocked command: the script has not run yet.
    expect(await adminCall('EXISTS', key)).toBe(':0\r\n');
    await adminCall('RPUSH', 'queue2', 'job');
    expect((await client.readReplies(6)).toString('latin1')).toBe(
      '*2\r\n$6\r\nqueue2\r\n$3\r\njob\r\n' + attemptReplies(1, 1) + '$1\r\n1\r\n',
    );
    // Its expiry longer than the lease (60 s), so that a re-armed one would show.
    client.write(lockAttempt(key, 600));
    expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(2, 1));
    expect(await adminPttl(key)).toBeLessThanOrEqual(60_000);
    await client.close();
  });

  it('a BLPOP that times out gives the same null reply as directly', async () => {
    await sameAsDirect(Buffer.concat([cmd('BLPOP', 'nothing', '0.05'), cmd('PING')]), 2);
  });
});

// ---------------------------------------------------------------------------
// Replies that are not one per command, and errors
// ---------------------------------------------------------------------------

describe('CLIENT REPLY and errors', () => {
  it('CLIENT REPLY OFF / SKIP / ON behaves as directly', async () => {
    const bytes = Buffer.concat([
      cmd('SET', 'cr', '0'),
      cmd('CLIENT', 'REPLY', 'OFF'),
      cmd('SET', 'cr', '1'),
      cmd('GET', 'cr'),
      cmd('CLIENT', 'REPLY', 'SKIP'), // ignored while OFF
      cmd('CLIENT', 'REPLY', 'ON'),
      cmd('CLIENT', 'REPLY', 'SKIP'),
      cmd('GET', 'cr'),
      cmd('INCR', 'cr'),
      cmd('PING'),
    ]);
    expect(await sameAsDirect(bytes, 4)).toBe('+OK\r\n+OK\r\n:2\r\n+PONG\r\n');
  });

  it('after CLIENT REPLY the connection is a plain pipe: later lock blocks pass unchanged', async () => {
    const client = await RawClient.connect(env.proxy.port);
    // The second expiry longer than the first, so that its re-armed lease shows.
    client.write(Buffer.concat([cmd('CLIENT', 'REPLY', 'ON'), lockAttempt('lock:piped', 60), lockAttempt('lock:piped', 600)]));
    expect((await client.readReplies(9)).toString('latin1')).toBe('+OK\r\n' + attemptReplies(1, 1) + attemptReplies(2, 1));
    await client.close();
    expect(await adminPttl('lock:piped')).toBeGreaterThan(60_000);
  });

  it('CLIENT SETINFO (an error on Redis 7.0, +OK from 7.2 on) passes through as the server answers it', async () => {
    const replies = await sameAsDirect(Buffer.concat([cmd('CLIENT', 'SETINFO', 'LIB-NAME', 'x'), cmd('PING')]), 2);
    expect(replies).toMatch(/^(-ERR [^\r]*|\+OK)\r\n\+PONG\r\n$/);
  });

  it('error replies of all kinds pass through unchanged', async () => {
    await sameAsDirect(
      Buffer.concat([
        cmd('NOSUCHCOMMAND', 'a'),
        cmd('GET'),
        cmd('SET', 'str', 'x'),
        cmd('LPUSH', 'str', 'y'),
        cmd('EXEC'),
        cmd('DISCARD'),
        cmd('MULTI'),
        cmd('NOSUCHCOMMAND'),
        cmd('EXEC'),
        cmd('PING'),
      ]),
      10,
    );
  });
});

// ---------------------------------------------------------------------------
// Transaction state the proxy has to follow
// ---------------------------------------------------------------------------

describe('transaction state', () => {
  it('follows inline MULTI / EXEC / WATCH / DISCARD: the lock pairs in and after them fixed, those under WATCH not', async () => {
    const key = 'lock:inline';
    // The key starts with a 100 s lease. The replies are Redis's own either way: what each
    // variant leaves of the lease (`leaseS`) shows which expiries applied. A block that passes
    // unchanged sets 30 s; a rewritten one (60 s) leaves what it finds. The pairs here are their
    // transaction's first two commands: fixed with NX, or with the expiry script before 7.0.
    const variants: Array<{ bytes: Buffer; replies: number; leaseS: number }> = [
      // Inside an inline MULTI: the nested MULTI is refused, the pair queued in the outer transaction.
      {
        bytes: Buffer.concat([Buffer.from('MULTI\r\n'), lockAttempt(key, 30), Buffer.from('EXEC\r\n')]),
        replies: 6,
        leaseS: 100,
      },
      // In and after an inline transaction.
      {
        bytes: Buffer.concat([
          Buffer.from('multi\r\n'),
          cmd('INCRBY', key, '1'),
          cmd('EXPIRE', key, '30'),
          Buffer.from('exec\r\n'),
          lockAttempt(key, 60),
        ]),
        replies: 8,
        leaseS: 100,
      },
      // Under an inline WATCH the first block is left alone; its EXEC unwatches.
      {
        bytes: Buffer.concat([Buffer.from('WATCH lock:inline\r\n'), lockAttempt(key, 30), lockAttempt(key, 60)]),
        replies: 9,
        leaseS: 30,
      },
      { bytes: Buffer.concat([Buffer.from('MULTI\r\nDISCARD\r\n'), lockAttempt(key, 60)]), replies: 6, leaseS: 100 },
    ];
    for (const [i, variant] of variants.entries()) {
      const run = async (port: number) => {
        await adminCall('SET', key, '1', 'EX', '100');
        return exchange(port, variant.bytes, variant.replies);
      };
      const direct = await run(env.redis.port);
      expect(await run(env.proxy.port), `variant ${i}`).toBe(direct);
      const pttl = await adminPttl(key);
      expect(pttl, `variant ${i}`).toBeLessThanOrEqual(variant.leaseS * 1000);
      expect(pttl, `variant ${i}`).toBeGreaterThan(variant.leaseS * 1000 - 5000);
    }
  });

  // A MULTI that Redis refuses (wrong arity) opens no transaction, and the EXEC after it, refused
  // too ("EXEC without MULTI"), does not UNWATCH. Were the proxy to miss that, it would forget the
  // WATCH and rewrite the next lock block, which Redis would have aborted (EXEC -> *-1).
  it('a refused MULTI does not make the proxy forget a WATCH', async () => {
    const key = 'lock:watched';
    const run = async (port: number): Promise<string> => {
      await adminCall('DEL', key);
      const client = await RawClient.connect(port);
      try {
        client.write(Buffer.concat([cmd('WATCH', key), cmd('MULTI', 'x'), cmd('EXEC')]));
        let out = (await client.readReplies(3)).toString('latin1');
        await adminCall('SET', key, '5'); // the watched key changes
        client.write(lockAttempt(key, 60));
        out += (await client.readReplies(4)).toString('latin1');
        return out;
      } finally {
        await client.close();
      }
    };
    const direct = await run(env.redis.port);
    expect(direct).toMatch(/^\+OK\r\n-ERR [^\r]*\r\n-ERR EXEC without MULTI\r\n\+OK\r\n\+QUEUED\r\n\+QUEUED\r\n\*-1\r\n$/);
    expect(await run(env.proxy.port)).toBe(direct);
    expect(await adminCall('GET', key)).toBe('$1\r\n5\r\n');
  });
});

// ---------------------------------------------------------------------------
// Malformed input
// ---------------------------------------------------------------------------

describe('malformed input', () => {
  const cases: Array<[string, Buffer]> = [
    ['a simple string where a bulk string belongs', Buffer.from('*1\r\n+PING\r\n')],
    ['a non-numeric multibulk length', Buffer.from('*abc\r\n')],
    ['a negative bulk length', Buffer.from('*2\r\n$3\r\nGET\r\n$-5\r\nabcde\r\n')],
    ['garbage after valid commands', Buffer.concat([cmd('PING'), cmd('SET', 'm', '1'), Buffer.from('*1\r\n+PING\r\n')])],
    ['garbage inside a held lock block', Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:m', '1'), Buffer.from('*x\r\n')])],
    ['garbage right after a complete lock block', Buffer.concat([lockAttempt('lock:m2', 60), Buffer.from('*1\r\n$-5\r\n')])],
  ];

  it.each(cases)('%s: the client gets what Redis sends, then the connection closes', async (_name, bytes) => {
    await adminCall('FLUSHALL');
    const direct = await untilClosed(env.redis.port, bytes);
    await adminCall('FLUSHALL');
    const proxied = await untilClosed(env.proxy.port, bytes);
    expect(proxied).toBe(direct);
    expect(proxied).toMatch(/-ERR Protocol error: [^\r]*\r\n$/);
    // Other clients are unaffected.
    expect(await exchange(env.proxy.port, cmd('PING'), 1)).toBe('+PONG\r\n');
  });

  it('inline commands pass through, quoted ones too', async () => {
    await sameAsDirect(Buffer.from('PING\r\nSET inl "a b"\r\nGET inl\r\n'), 3);
    await sameAsDirect(Buffer.from('ECHO hello\r\n'), 1);
  });
});

// ---------------------------------------------------------------------------
// Closing
// ---------------------------------------------------------------------------

describe('closing', () => {
  it('QUIT: +OK arrives, then the connection closes, as directly', async () => {
    const bytes = Buffer.concat([cmd('PING'), cmd('QUIT'), cmd('PING')]);
    const direct = await untilClosed(env.redis.port, bytes);
    const proxied = await untilClosed(env.proxy.port, bytes);
    expect(proxied).toBe(direct);
    expect(proxied).toBe('+PONG\r\n+OK\r\n');
    // QUIT waiting behind the proxy's script call.
    expect(await untilClosed(env.proxy.port, Buffer.concat([lockAttempt('lock:quit', 60), cmd('QUIT'), cmd('PING')]))).toBe(
      attemptReplies(1, 1) + '+OK\r\n',
    );
  });

  it('a client that half-closes after pipelining gets all replies', async () => {
    const bytes = Buffer.concat([cmd('PING'), cmd('PING'), cmd('PING')]);
    expect(await writeAndHalfClose(env.redis.port, bytes)).toBe('+PONG\r\n'.repeat(3));
    expect(await writeAndHalfClose(env.proxy.port, bytes)).toBe('+PONG\r\n'.repeat(3));
  });

  it('a client that half-closes right after a lock block gets the block’s replies', async () => {
    const bytes = Buffer.concat([cmd('PING'), lockAttempt('lock:half', 60), cmd('GET', 'lock:half')]);
    expect(await writeAndHalfClose(env.proxy.port, bytes)).toBe('+PONG\r\n' + attemptReplies(1, 1) + '$1\r\n1\r\n');
  });

  it('a client that half-closes inside a transaction gets the replies Redis gives for the complete commands', async () => {
    // MULTI and INCRBY are complete commands: Redis answers both before it sees the close.
    // The transaction itself is discarded either way.
    const bytes = Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:half2', '1')]);
    const direct = await writeAndHalfClose(env.redis.port, bytes);
    expect(direct).toBe('+OK\r\n+QUEUED\r\n');
    expect(await writeAndHalfClose(env.proxy.port, bytes)).toBe(direct);
    expect(await adminCall('EXISTS', 'lock:half2')).toBe(':0\r\n');
  });
});

// ---------------------------------------------------------------------------
// Large values
// ---------------------------------------------------------------------------

describe('large values', () => {
  /** Sends `bytes` and reads the whole of one bulk reply, hashing its body (no quadratic buffering). */
  function getBulkHash(port: number, bytes: Buffer, skip: string, pauseMs = 0): Promise<{ length: number; sha: string }> {
    return new Promise((resolve, reject) => {
      const socket = net.connect({ port, host: '127.0.0.1' });
      const hash = createHash('sha256');
      let header = Buffer.alloc(0);
      let prefixLeft = Buffer.byteLength(skip);
      let bodyLeft = -1;
      let length = -1;
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new Error('large GET timed out'));
      }, 20_000);
      socket.on('connect', () => {
        socket.write(bytes);
        if (pauseMs > 0) {
          // A slow reader: the proxy has to hold Redis back rather than buffer or drop.
          socket.pause();
          setTimeout(() => socket.resume(), pauseMs);
        }
      });
      socket.on('error', reject);
      socket.on('data', (chunk: Buffer) => {
        let data = chunk;
        if (prefixLeft > 0) {
          const n = Math.min(prefixLeft, data.length);
          prefixLeft -= n;
          data = data.subarray(n);
        }
        if (bodyLeft < 0) {
          header = Buffer.concat([header, data]);
          const crlf = header.indexOf('\r\n');
          if (crlf < 0) return;
          length = Number(header.toString('latin1', 1, crlf));
          bodyLeft = length + 2;
          data = header.subarray(crlf + 2);
        }
        const take = data.subarray(0, bodyLeft);
        bodyLeft -= take.length;
        hash.update(bodyLeft >= 2 ? take : take.subarray(0, Math.max(0, take.length - (2 - bodyLeft))));
        if (bodyLeft === 0) {
          clearTimeout(timer);
          socket.destroy();
          resolve({ length, sha: hash.digest('hex') });
        }
      });
    });
  }

  it('SET of 50 MB then GET returns identical bytes, and a lock block right after the value is still rewritten', async () => {
    const value = Buffer.alloc(50 * 1024 * 1024);
    for (let i = 0; i < value.length; i += 4) value.writeUInt32LE((i * 2654435761) >>> 0, i);
    value.write('\r\n*1\r\n$4\r\nMULTI\r\n', 1000); // looks like commands, is data
    const want = createHash('sha256').update(value).digest('hex');

    const client = await RawClient.connect(env.proxy.port);
    // The second expiry longer than the first, so that a re-armed lease would show.
    client.write(Buffer.concat([cmd('SET', 'big', value), lockAttempt('lock:big', 60), lockAttempt('lock:big', 600)]));
    expect((await client.readReplies(9, 20_000)).toString('latin1')).toBe('+OK\r\n' + attemptReplies(1, 1) + attemptReplies(2, 1));
    await client.close();
    expect(await adminPttl('lock:big')).toBeLessThanOrEqual(60_000);

    const got = await getBulkHash(env.proxy.port, Buffer.concat([cmd('PING'), cmd('GET', 'big')]), '+PONG\r\n');
    expect(got.length).toBe(value.length);
    expect(got.sha).toBe(want);
    const slow = await getBulkHash(env.proxy.port, cmd('GET', 'big'), '', 300);
    expect(slow).toEqual(got);
    expect(await adminCall('STRLEN', 'big')).toBe(`:${value.length}\r\n`);
  });
});

// ---------------------------------------------------------------------------
// Upstream failures
// ---------------------------------------------------------------------------

describe('upstream failures', () => {
  it('an unreachable upstream: each client gets an error and a close, and the listener keeps accepting', async () => {
    const port = await closedPort();
    const dead = await startTestProxy({ upstream: `redis://127.0.0.1:${port}` });
    try {
      const expected = new RegExp(
        `^-ERR redis-lock-proxy: upstream redis://127\\.0\\.0\\.1:${port} is unreachable: [^\\r\\n]*ECONNREFUSED[^\\r\\n]*\\r\\n$`,
      );
      expect(await untilClosed(dead.port, Buffer.alloc(0))).toMatch(expected);
      expect(await untilClosed(dead.port, cmd('PING'))).toMatch(expected);
      expect(await untilClosed(dead.port, lockAttempt('lock:dead', 60))).toMatch(expected);
      expect(dead.stats.upstreamConnectFailures).toBe(3);
      expect(dead.stats.connectionsOpen).toBe(0);
      // The proxy in front of the live Redis is untouched.
      expect(await exchange(env.proxy.port, cmd('PING'), 1)).toBe('+PONG\r\n');
    } finally {
      await dead.close();
    }
  });

  it('an upstream that dies mid-connection closes the client connections (idle and blocked)', async () => {
    const doomed = await startRedis();
    const front = await startTestProxy({ upstream: doomed.url });
    try {
      const idle = await RawClient.connect(front.port);
      idle.write(cmd('PING'));
      expect((await idle.readReplies(1)).toString()).toBe('+PONG\r\n');
      const blocked = await RawClient.connect(front.port);
      blocked.write(cmd('BLPOP', 'never', '0'));
      await expectSilence(blocked, 100);
      await doomed.stop();
      await expect(idle.readUntilClosed(5000)).resolves.toBeDefined();
      await expect(blocked.readUntilClosed(5000)).resolves.toBeDefined();
      // New clients now learn that the upstream is gone.
      expect(await untilClosed(front.port, cmd('PING'))).toMatch(
        /^-ERR redis-lock-proxy: upstream redis:\/\/127\.0\.0\.1:\d+ is unreachable: /,
      );
    } finally {
      await front.close();
      await doomed.stop();
    }
  });
});

// ---------------------------------------------------------------------------
// Credentials and database in the upstream URL
// ---------------------------------------------------------------------------

describe('credentials and db in the upstream URL', () => {
  let secured: RedisServer;
  let securedAdmin: RawClient;

  beforeAll(async () => {
    secured = await startRedis({ password: 'secret' });
    securedAdmin = await RawClient.connect(secured.port);
    securedAdmin.write(
      Buffer.concat([
        cmd('AUTH', 'secret'),
        cmd('ACL', 'SETUSER', 'alice', 'on', '>pw', '~*', ...facts.allChannels(), '+@all'),
        cmd('ACL', 'SETUSER', 'bob', 'on', '>p@ss:w/rd é', '~*', ...facts.allChannels(), '+@all'),
      ]),
    );
    expect((await securedAdmin.readReplies(3)).toString()).toBe('+OK\r\n+OK\r\n+OK\r\n');
  });

  afterAll(async () => {
    await securedAdmin?.close();
    await secured?.stop();
  });

  async function securedCall(...args: string[]): Promise<string> {
    securedAdmin.write(cmd(...args));
    return (await securedAdmin.readReplies(1)).toString('latin1');
  }

  it('a client that sends no AUTH can write, into the URL’s db', async () => {
    const front = await startTestProxy({ upstream: `redis://:secret@127.0.0.1:${secured.port}/3` });
    try {
      // Sent at once: these bytes wait for the proxy's AUTH/SELECT.
      const client = await RawClient.connect(front.port);
      // The second expiry longer than the first, so that a re-armed lease would show.
      client.write(Buffer.concat([cmd('SET', 'a', '1'), cmd('GET', 'a'), lockAttempt('lock:db3', 60), lockAttempt('lock:db3', 600)]));
      expect((await client.readReplies(10)).toString('latin1')).toBe('+OK\r\n$1\r\n1\r\n' + attemptReplies(1, 1) + attemptReplies(2, 1));
      await client.close();
      expect(await securedCall('SELECT', '3')).toBe('+OK\r\n');
      expect(await securedCall('GET', 'a')).toBe('$1\r\n1\r\n');
      expect(await securedCall('EXISTS', 'lock:db3')).toBe(':1\r\n');
      expect(Number(/^:(-?\d+)\r\n$/.exec(await securedCall('PTTL', 'lock:db3'))?.[1])).toBeLessThanOrEqual(60_000);
      expect(await securedCall('SELECT', '0')).toBe('+OK\r\n');
      expect(await securedCall('EXISTS', 'a')).toBe(':0\r\n');
      // A client's own AUTH and SELECT still work as usual.
      expect(await exchange(front.port, Buffer.concat([cmd('AUTH', 'secret'), cmd('SELECT', '0'), cmd('GET', 'a')]), 3)).toBe(
        '+OK\r\n+OK\r\n$-1\r\n',
      );
    } finally {
      await front.close();
    }
  });

  it('a wrong password: the client gets an error naming the problem, never the password, then a close', async () => {
    const front = await startTestProxy({ upstream: `redis://:badpw@127.0.0.1:${secured.port}/3` });
    try {
      const got = await untilClosed(front.port, cmd('SET', 'leak', '1'));
      expect(got).toMatch(
        new RegExp(
          `^-ERR redis-lock-proxy: upstream redis://:\\*\\*\\*@127\\.0\\.0\\.1:${secured.port}/3 rejected the proxy's AUTH/SELECT: WRONGPASS [^\\r\\n]*\\r\\n$`,
        ),
      );
      expect(got).not.toContain('badpw');
      expect(JSON.stringify(front.logs())).not.toContain('badpw');
      expect(await untilClosed(front.port, Buffer.alloc(0))).toMatch(/ rejected the proxy's AUTH\/SELECT: WRONGPASS /); // still accepting
    } finally {
      await front.close();
    }
  });

  it('a SELECT that fails: the client’s waiting commands never run', async () => {
    const front = await startTestProxy({ upstream: `redis://:secret@127.0.0.1:${secured.port}/999` });
    try {
      const got = await untilClosed(front.port, cmd('SET', 'leak', '1'));
      expect(got).toMatch(/^-ERR redis-lock-proxy: upstream [^\r\n]* rejected the proxy's AUTH\/SELECT: ERR [^\r\n]*\r\n$/);
      expect(await securedCall('EXISTS', 'leak')).toBe(':0\r\n');
    } finally {
      await front.close();
    }
  });

  // RESET puts the upstream connection back to the default user and db 0: a client that relies on
  // the URL's credentials and db (it sends no AUTH/SELECT of its own) must not end up
  // unauthenticated, or in the wrong database, after a RESET (which some client pools send).
  it('a client’s RESET keeps the connection the URL configured', async (ctx) => {
    ctx.skip(...facts.skipUnless('reset'));
    const front = await startTestProxy({ upstream: `redis://:secret@127.0.0.1:${secured.port}/3` });
    try {
      const got = await exchange(front.port, Buffer.concat([cmd('SET', 'before', '1'), cmd('RESET'), cmd('SET', 'after', '1')]), 3);
      expect(got).toBe('+OK\r\n+RESET\r\n+OK\r\n');
      expect(await securedCall('SELECT', '3')).toBe('+OK\r\n');
      expect(await securedCall('EXISTS', 'before', 'after')).toBe(':2\r\n');
    } finally {
      await securedCall('SELECT', '0');
      await front.close();
    }
  });

  // Redis 6.2 checks ACLs on RESET (7.0 does not): a user refused it keeps its connection as it
  // was, its user and database too. The URL's AUTH/SELECT follow only a RESET that ran; sent after
  // a refused one, they would make the client the URL's user.
  it('a RESET Redis refuses leaves the connection its own user and database: no AUTH/SELECT of the URL after it', async (ctx) => {
    ctx.skip(...facts.skipUnless('reset'));
    expect(await securedCall('ACL', 'SETUSER', 'noreset', 'reset', 'on', '>pw', '~*', ...facts.allChannels(), '+@all', '-reset')).toBe(
      '+OK\r\n',
    );
    const bytes = Buffer.concat([
      cmd('AUTH', 'noreset', 'pw'),
      cmd('SELECT', '5'),
      cmd('RESET'),
      cmd('ACL', 'WHOAMI'),
      cmd('CLIENT', 'INFO'),
    ]);
    const direct = await exchange(secured.port, bytes, 5);
    if (!direct.includes('-NOPERM'))
      ctx.skip(true, `this server runs RESET for a user refused it (${facts.server}): only Redis 6.2 checks`);
    const front = await startTestProxy({ upstream: `redis://:secret@127.0.0.1:${secured.port}/3` });
    try {
      const proxied = await exchange(front.port, bytes, 5);
      // CLIENT INFO names the connection's id, address and age: its user and db must be the direct ones.
      expect(proxied.split('\r\n').slice(0, 5)).toEqual(direct.split('\r\n').slice(0, 5));
      expect(proxied).toContain('$7\r\nnoreset\r\n');
      expect(/ db=(\d+) /.exec(proxied)?.[1]).toBe('5');
      expect(/ user=(\S+) /.exec(proxied)?.[1]).toBe('noreset');
    } finally {
      await front.close();
    }
  });

  // The same in a plain pipe, where the replies cannot be counted (reset-marker.ts): the RESET's
  // outcome is read from its own answer, and replies turned off stay off when Redis refused it.
  describe('a RESET Redis refuses in a plain pipe: the bytes Redis sends directly, and the connection goes on as it was', () => {
    async function refusedReset(ctx: { skip: (skip: boolean, note?: string) => void }, bytes: Buffer, replies: number): Promise<void> {
      ctx.skip(...facts.skipUnless('reset'));
      expect(await securedCall('ACL', 'SETUSER', 'noreset2', 'reset', 'on', '>pw', '~*', ...facts.allChannels(), '+@all', '-reset')).toBe(
        '+OK\r\n',
      );
      const login = Buffer.concat([cmd('AUTH', 'noreset2', 'pw'), cmd('SELECT', '5')]);
      const direct = await exchange(secured.port, Buffer.concat([login, bytes]), 2 + replies);
      // Where RESET ran, the connection is the default user's.
      if (/ user=(\S+) /.exec(direct)?.[1] !== 'noreset2')
        ctx.skip(true, `this server runs RESET for a user refused it (${facts.server}): only Redis 6.2 checks`);
      const front = await startTestProxy({ upstream: `redis://:secret@127.0.0.1:${secured.port}/3`, admin: true });
      try {
        const started = Date.now();
        const proxied = await exchange(front.port, Buffer.concat([login, bytes]), 2 + replies);
        // CLIENT INFO names the connection's id, address, age and buffers: its user and db are compared apart.
        const steady = (text: string): string => text.replace(/\$\d+\r\nid=\d+ [^\r]*\r\n$/, 'CLIENT INFO');
        expect(steady(proxied)).toBe(steady(direct));
        expect(/ db=(\d+) /.exec(proxied)?.[1]).toBe('5');
        expect(/ user=(\S+) /.exec(proxied)?.[1]).toBe('noreset2');
        expect(Date.now() - started).toBeLessThan(5000); // nothing waited for a reply that never comes
        expect(front.stats.ownRepliesTimedOut).toBe(0);
      } finally {
        await front.close();
      }
    }

    it('with replies off: nothing for the RESET, then CLIENT REPLY ON answers', async (ctx) => {
      const bytes = Buffer.concat([
        cmd('CLIENT', 'REPLY', 'OFF'),
        cmd('RESET'),
        cmd('PING', 'unanswered'),
        cmd('CLIENT', 'REPLY', 'ON'),
        cmd('PING'),
        cmd('CLIENT', 'INFO'),
      ]);
      await refusedReset(ctx, bytes, 3);
    });

    it('subscribed: its refusal, then the messages and the unsubscribe as directly', async (ctx) => {
      const bytes = Buffer.concat([
        cmd('SUBSCRIBE', 'refused-reset'),
        cmd('RESET'),
        cmd('UNSUBSCRIBE', 'refused-reset'),
        cmd('PING'),
        cmd('CLIENT', 'INFO'),
      ]);
      await refusedReset(ctx, bytes, 5);
    });

    it('with replies on after OFF and ON: its refusal, and replies as directly', async (ctx) => {
      const bytes = Buffer.concat([
        cmd('CLIENT', 'REPLY', 'OFF'),
        cmd('CLIENT', 'REPLY', 'ON'),
        cmd('RESET'),
        cmd('PING'),
        cmd('CLIENT', 'INFO'),
      ]);
      await refusedReset(ctx, bytes, 4);
    });
  });

  it('the ACL user form redis://user:password@host', async () => {
    const front = await startTestProxy({ upstream: `redis://alice:pw@127.0.0.1:${secured.port}` });
    try {
      expect(await exchange(front.port, Buffer.concat([cmd('ACL', 'WHOAMI'), lockAttempt('lock:acl', 60)]), 5)).toBe(
        '$5\r\nalice\r\n' + attemptReplies(1, 1),
      );
    } finally {
      await front.close();
    }
    const encoded = await startTestProxy({ upstream: `redis://bob:${encodeURIComponent('p@ss:w/rd é')}@127.0.0.1:${secured.port}/1` });
    try {
      expect(await exchange(encoded.port, cmd('ACL', 'WHOAMI'), 1)).toBe('$3\r\nbob\r\n');
    } finally {
      await encoded.close();
    }
  });
});

// ---------------------------------------------------------------------------
// Unix socket upstream
// ---------------------------------------------------------------------------

describe('unix socket upstream', () => {
  it('serves clients and rewrites lock blocks', async () => {
    const front = await startTestProxy({ upstream: `unix://${socketPath}` });
    try {
      const key = taskLockKey(77n);
      const client = await RawClient.connect(front.port);
      // The second expiry longer than the first, so that a re-armed lease would show.
      client.write(Buffer.concat([cmd('PING'), lockAttempt(key, 3600), lockAttempt(key, 7200)]));
      expect((await client.readReplies(9)).toString('latin1')).toBe('+PONG\r\n' + attemptReplies(1, 1) + attemptReplies(2, 1));
      await client.close();
      expect(await adminPttl(key)).toBeLessThanOrEqual(3_600_000);
      expect(front.stats.blocksRewritten).toBe(2);
    } finally {
      await front.close();
    }
    const withDb = await startTestProxy({ upstream: `unix://${socketPath}?db=2` });
    try {
      expect(await exchange(withDb.port, cmd('SET', 'unixdb', 'x'), 1)).toBe('+OK\r\n');
      expect(await adminCall('EXISTS', 'unixdb')).toBe(':0\r\n');
      expect(await adminCall('SELECT', '2')).toBe('+OK\r\n');
      expect(await adminCall('EXISTS', 'unixdb')).toBe(':1\r\n');
      expect(await adminCall('SELECT', '0')).toBe('+OK\r\n');
    } finally {
      await withDb.close();
    }
  });
});

// ---------------------------------------------------------------------------
// Many connections
// ---------------------------------------------------------------------------

describe('many connections', () => {
  it('200 concurrent clients, each with its own lock and data, plus one contended lock', async () => {
    const count = 200;
    const results = await Promise.all(
      Array.from({ length: count }, async (_, i) => {
        const client = await RawClient.connect(env.proxy.port);
        try {
          const own = `lock:many:${i}`;
          // The second expiry longer than the first, so that a re-armed lease would show.
          client.write(
            Buffer.concat([cmd('SET', `data:${i}`, `value-${i}`), lockAttempt(own, 60), cmd('GET', `data:${i}`), lockAttempt(own, 600)]),
          );
          const first = (await client.readReplies(10, 15_000)).toString('latin1');
          expect(first).toBe('+OK\r\n' + attemptReplies(1, 1) + bulk(`value-${i}`) + attemptReplies(2, 1));
          client.write(lockAttempt('lock:contended', 60));
          const contended = (await client.readReplies(4, 15_000)).toString('latin1');
          return Number(/\*2\r\n:(\d+)\r\n:([01])\r\n$/.exec(contended)?.[1]);
        } finally {
          await client.close();
        }
      }),
    );
    expect([...results].sort((a, b) => a - b)).toEqual(Array.from({ length: count }, (_, i) => i + 1));
    expect(await adminCall('GET', 'lock:contended')).toBe(bulk(String(count)));
    const ttl = Number(/:(-?\d+)/.exec(await adminCall('PTTL', 'lock:contended'))?.[1]);
    expect(ttl).toBeGreaterThan(50_000);
    for (let i = 0; i < count; i++) expect(await adminPttl(`lock:many:${i}`), `lock:many:${i}`).toBeLessThanOrEqual(60_000);
    await expect.poll(() => env.proxy.stats.connectionsOpen, { timeout: 10_000 }).toBe(0);
  });
});
