/**
 * The proxy never waits for bytes Redis would not wait for, and never answers in Redis's place:
 * each case sends the same unfinished or oversized request directly and through the proxy, to
 * the same server, and compares what comes back (never a text of one Redis version).
 *
 * - Outside a held block, bytes go upstream as they arrive, whatever the frame: Redis's
 *   query buffer holds them at once (CLIENT LIST qbuf), and limits that act on a request's first
 *   line (the unauthenticated ones, proto-max-bulk-len) answer through the proxy as directly.
 * - The one frame kept back is the start of a MULTI that may open a lock block: Redis would wait
 *   for its last bytes too. Inside a held block, a frame that cannot be the block's next
 *   releases the block at once, not at the hold deadline.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestProxy, startTransactionProxy, versionAskedAhead, type TestProxy } from '../support/proxy.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { cmd, RawClient } from '../support/resp.js';

/** A hold deadline far above what the tests wait, so that a release before it is the proxy's own decision. */
const HOLD_MS = 10_000;
const REPLY_TIMEOUT_MS = 2000;

let open: RedisServer;
let locked: RedisServer;
/**
 * The server whose read bytes are counted: only these tests' own connections reach it. (Redis
 * closing a connection on its own, as the limits below make it do on `open`, has the proxy ask
 * the server's version again, and that HELLO would be counted if it reached this server.)
 */
let quiet: RedisServer;
let proxyOpen: TestProxy;
/** Forwards to `quiet`, with --lock-method auto. */
let proxyQuiet: TestProxy;
let proxyLocked: TestProxy;
/** The script way, which holds a MULTI until its block matches or cannot. */
let proxyScript: TestProxy;
/** Inside the client's transaction, which holds nothing: with NX, or before 7.0 auto's expiry script. */
let proxyStreaming: TestProxy | undefined;
let admin: RawClient;
let quietAdmin: RawClient;

beforeAll(async () => {
  [open, locked, quiet] = await Promise.all([startRedis(), startRedis({ password: 'secret' }), startRedis()]);
  [proxyOpen, proxyLocked, proxyQuiet] = await Promise.all([
    startTestProxy({ upstream: open.url, holdMs: HOLD_MS }),
    // No password in the URL: the client's own AUTH decides, so Redis sees an unauthenticated client.
    startTestProxy({ upstream: `redis://127.0.0.1:${locked.port}`, holdMs: HOLD_MS }),
    startTestProxy({ upstream: quiet.url, holdMs: HOLD_MS }),
  ]);
  [proxyScript, proxyStreaming] = await Promise.all([
    startTestProxy({ upstream: quiet.url, holdMs: HOLD_MS, lockMethod: 'script' }),
    startTransactionProxy({ upstream: open.url, holdMs: HOLD_MS }).then(
      async (proxy) => proxy ?? (await startTestProxy({ upstream: open.url, holdMs: HOLD_MS })),
    ),
  ]);
  [admin, quietAdmin] = await Promise.all([RawClient.connect(open.port), RawClient.connect(quiet.port)]);
  // What Redis reads is counted below: the version asked ahead is asked before.
  await versionAskedAhead(proxyQuiet);
});

afterAll(async () => {
  await Promise.all([admin?.close(), quietAdmin?.close()]);
  await Promise.all([proxyOpen?.close(), proxyLocked?.close(), proxyQuiet?.close(), proxyScript?.close(), proxyStreaming?.close()]);
  await Promise.all([open?.stop(), locked?.stop(), quiet?.stop()]);
});

/** Everything received until the server closes, or what came within the timeout. */
async function untilClosedOrQuiet(port: number, bytes: Buffer): Promise<string> {
  const client = await RawClient.connect(port);
  try {
    client.write(bytes);
    return (await client.readUntilClosed(REPLY_TIMEOUT_MS)).toString('latin1');
  } catch (error) {
    return `<${(error as Error).message.replace(/;.*$/s, '')}>`;
  } finally {
    client.destroy();
  }
}

async function expectSameAsDirect(direct: number, proxied: number, bytes: Buffer): Promise<string> {
  const want = await untilClosedOrQuiet(direct, bytes);
  expect(want).toMatch(/^-ERR /); // Redis answers these by itself, and closes
  expect(await untilClosedOrQuiet(proxied, bytes)).toBe(want);
  return want;
}

describe('limits Redis applies to a request before it is complete', () => {
  it('an unauthenticated client’s multibulk length: answered at the first line, as directly', async () => {
    await expectSameAsDirect(locked.port, proxyLocked.port, Buffer.from('*100\r\n'));
  });

  it('an unauthenticated client’s bulk length: answered at the length line, as directly', async () => {
    await expectSameAsDirect(locked.port, proxyLocked.port, Buffer.from('*1\r\n$100000000\r\n'));
  });

  it('a bulk longer than proto-max-bulk-len: Redis’s own error, not the proxy’s', async () => {
    await expectSameAsDirect(open.port, proxyOpen.port, Buffer.from('*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n'));
  });

  it('a lowered proto-max-bulk-len applies through the proxy the same way', async () => {
    expect(await admin.call('CONFIG', 'SET', 'proto-max-bulk-len', '1048576')).toBe('+OK\r\n');
    try {
      await expectSameAsDirect(open.port, proxyOpen.port, Buffer.from('*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000\r\n'));
    } finally {
      expect(await admin.call('CONFIG', 'SET', 'proto-max-bulk-len', '536870912')).toBe('+OK\r\n');
    }
  });

  it('an inline request longer than Redis reads: answered as directly', async () => {
    await expectSameAsDirect(open.port, proxyOpen.port, Buffer.alloc(70 * 1024, 'A'));
  });
});

describe('unfinished requests reach Redis as they arrive', () => {
  /** `INFO stats`, as the admin connection sends it: its own bytes count in the total too. */
  const INFO_BYTES = cmd('INFO', 'stats').length;

  /** Bytes Redis has read from all its clients (total_net_input_bytes), without this call's own. */
  async function bytesRedisRead(): Promise<number> {
    const info = await quietAdmin.call('INFO', 'stats');
    return Number(/total_net_input_bytes:(\d+)/.exec(info)?.[1]) - INFO_BYTES;
  }

  /** Waits until Redis has read `expected` bytes more than `base`, or the timeout; returns how many it read. */
  async function readSince(base: number, expected: number): Promise<number> {
    const deadline = Date.now() + REPLY_TIMEOUT_MS;
    let polls = 0;
    for (;;) {
      const read = (await bytesRedisRead()) - base - INFO_BYTES * ++polls; // the INFO calls since base
      if (read >= expected || Date.now() > deadline) return read;
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  const CASES: Array<[string, Buffer]> = [
    ['a long command name, half sent', Buffer.concat([Buffer.from('*2\r\n$2000\r\n'), Buffer.alloc(700, 'X')])],
    ['a long key, half sent', Buffer.concat([Buffer.from('*2\r\n$3\r\nGET\r\n$5000\r\n'), Buffer.alloc(3000, 'k')])],
    ['a short head, cut before the name ends', Buffer.from('*2\r\n$3\r\nGE')],
    ['a count line without its end', Buffer.from('*2')],
    ['an inline command without a newline', Buffer.from('PING')],
    ['an inline MULTI without a newline', Buffer.from('MULTI')],
    ['a MULTI with an argument, cut', Buffer.from('*2\r\n$5\r\nMULTI\r\n$1')],
  ];

  it.each(CASES)('%s', async (_what, bytes) => {
    const client = await RawClient.connect(proxyQuiet.port);
    try {
      const base = await bytesRedisRead();
      client.write(bytes);
      expect(await readSince(base, bytes.length)).toBe(bytes.length);
    } finally {
      client.destroy();
    }
  });

  it('the script way keeps back only the start of a MULTI that may open a lock block (Redis would wait for it too)', async () => {
    const client = await RawClient.connect(proxyScript.port);
    try {
      const base = await bytesRedisRead();
      client.write('*1\r\n$5\r\nMUL');
      await new Promise((r) => setTimeout(r, 100));
      expect(await readSince(base, 1)).toBe(0);
      // It turns out not to be a MULTI: everything goes on at once.
      const next = await bytesRedisRead();
      client.write('X');
      expect(await readSince(next, 12)).toBe(12);
    } finally {
      client.destroy();
    }
  });
});

describe('a lock block inside the transaction (NX, or the expiry script before 7.0): nothing held', () => {
  it('MULTI and the increment are answered as they come; only an expiry frame not yet whole waits, as in Redis', async () => {
    await admin.call('SET', 'lock:t', '1', 'EX', '100');
    const streaming = proxyStreaming as TestProxy;
    const client = await RawClient.connect(streaming.port);
    try {
      const rewritten = streaming.stats.blocksRewritten;
      client.write(cmd('MULTI'));
      expect((await client.readReplies(1, REPLY_TIMEOUT_MS)).toString()).toBe('+OK\r\n');
      client.write(Buffer.concat([cmd('INCRBY', 'lock:t', '1'), Buffer.from('*3\r\n$6\r\nEXPIRE\r\n$6\r\nlock:t\r\n$2\r\n6')]));
      expect((await client.readReplies(1, REPLY_TIMEOUT_MS)).toString()).toBe('+QUEUED\r\n');
      client.write(Buffer.concat([Buffer.from('0\r\n'), cmd('EXEC')]));
      expect((await client.readReplies(2, REPLY_TIMEOUT_MS)).toString()).toBe('+QUEUED\r\n*2\r\n:2\r\n:1\r\n');
      expect(streaming.stats.blocksRewritten).toBe(rewritten + 1);
      expect(Math.round((await admin.pttl('lock:t')) / 1000)).toBe(100); // not re-armed
    } finally {
      client.destroy();
    }
  });
});

describe('a held block (the script way)', () => {
  it('is released at once when the next frame cannot be the block’s (its count or name rules it out)', async () => {
    for (const next of ['*5\r\n', '*2\r\n$3\r\nGET\r\n$1', '*3\r\n$6\r\nEXPIRE\r\n', '*1\r\n$4\r\nPING']) {
      const client = await RawClient.connect(proxyScript.port);
      try {
        const started = Date.now();
        client.write(Buffer.concat([cmd('MULTI'), Buffer.from(next)]));
        expect((await client.readReplies(1, REPLY_TIMEOUT_MS)).toString(), next).toBe('+OK\r\n');
        expect(Date.now() - started).toBeLessThan(HOLD_MS / 4);
      } finally {
        client.destroy();
      }
    }
  });

  it('still waits for a frame that can be the block’s next, cut in its name or its key', async () => {
    for (const [first, rest] of [
      ['*3\r\n$6\r\nINCR', 'BY\r\n$6\r\nlock:z\r\n$1\r\n1\r\n'],
      ['*3\r\n$6\r\nINCRBY\r\n$6\r\nloc', 'k:z\r\n$1\r\n1\r\n'],
      ['*3\r\n$6\r\nINCRBY\r\n$6\r\nlock:z\r\n$', '1\r\n1\r\n'],
    ]) {
      await quietAdmin.call('DEL', 'lock:z');
      const client = await RawClient.connect(proxyScript.port);
      try {
        const rewritten = proxyScript.stats.blocksRewritten;
        client.write(Buffer.concat([cmd('MULTI'), Buffer.from(first)]));
        await expect(client.readReplies(1, 300)).rejects.toThrow(/timed out/);
        client.write(Buffer.concat([Buffer.from(rest), cmd('EXPIRE', 'lock:z', '60'), cmd('EXEC')]));
        expect((await client.readReplies(4)).toString()).toBe('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n:1\r\n');
        expect(proxyScript.stats.blocksRewritten).toBe(rewritten + 1);
      } finally {
        client.destroy();
      }
    }
  });
});
