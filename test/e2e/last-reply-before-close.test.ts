/**
 * When Redis closes a connection right after its last reply (a protocol error, QUIT, the client
 * limit), that reply reaches the client through the proxy, also while the client keeps sending.
 * Redis reads nothing after such a point and closes with a reset when bytes keep arriving; a
 * proxy that writes into that reset loses the reply (the write fails before the reply is read).
 *
 * The proxy runs as its own process, as operators run it: in the test's own process it would
 * share one event loop with the client, which hides the race.
 */
import net from 'node:net';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { whileBusy } from '../support/busy.js';
import { Cli, cleanEnv, ensureBuilt } from '../support/cli.js';
import { freePort } from '../support/ports.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { startRedis } from '../support/redis.js';
import { cmd, RawClient } from '../support/resp.js';

const env = redisWithAdmin();
const running: Cli[] = [];

/** The built command line in front of `upstream`; resolves with its port once it listens. */
async function startProxyProcess(upstream: string): Promise<number> {
  const port = await freePort();
  const cli = new Cli(['--listen', `127.0.0.1:${port}`, '--upstream', upstream], cleanEnv());
  running.push(cli);
  await cli.waitForLog('redis-lock-proxy listening');
  return port;
}

let proxyPort = 0;
beforeAll(async () => {
  await ensureBuilt();
  proxyPort = await startProxyProcess(env.redis.url);
});
afterAll(async () => {
  await Promise.all(running.map((cli) => cli.stop()));
});

/**
 * Sends `first`, then keeps writing `filler` as fast as the socket takes it, until the last
 * reply (`last`) or the end of the stream arrives; resolves with every byte received.
 */
function sendAndKeepWriting(port: number, first: Buffer, filler: Buffer, last: RegExp): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    let received = '';
    let done = false;
    const finish = (): void => {
      if (done) return;
      done = true;
      socket.destroy();
      resolve(received);
    };
    socket.on('data', (bytes) => (received += bytes.toString('latin1')));
    socket.on('end', finish);
    socket.on('error', finish);
    socket.setTimeout(5000, finish);
    socket.on('connect', async () => {
      socket.write(first);
      for (let i = 0; i < 2000 && !done && !last.test(received); i++) {
        await nextTurn();
        socket.write(filler);
      }
    });
  });
}

/** What Redis answers `bytes` alone, up to its close. */
async function answerAlone(port: number, bytes: Buffer): Promise<string> {
  const client = await RawClient.connect(port);
  client.write(bytes);
  return (await client.readUntilClosed()).toString('latin1');
}

const FILLER = Buffer.alloc(4096, 'a');

/**
 * Writes `bytes` in pieces of the given sizes, one write each, then the rest `lastAfterMs` later;
 * resolves with every byte received until the close, or until the client gives up (1.5 s: Redis
 * answers at once, and a proxy that held the last bytes back waiting for Redis's close would
 * make it wait for ever).
 */
function sendInPieces(port: number, bytes: Buffer, pieces: number[], lastAfterMs: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.setNoDelay(true);
    let received = '';
    const finish = (): void => {
      socket.destroy();
      resolve(received);
    };
    socket.on('data', (chunk) => (received += chunk.toString('latin1')));
    socket.on('close', finish);
    socket.on('error', finish);
    setTimeout(finish, 1500);
    socket.on('connect', () => {
      let at = 0;
      for (const size of pieces) {
        socket.write(bytes.subarray(at, at + size));
        at += size;
      }
      setTimeout(() => {
        if (!socket.destroyed) socket.write(bytes.subarray(at));
      }, lastAfterMs);
    });
  });
}

/** Runs `attempt` `times` times and counts each distinct outcome. */
async function outcomes(times: number, attempt: () => Promise<string>): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for (let i = 0; i < times; i++) {
    const outcome = await attempt();
    counts[outcome] = (counts[outcome] ?? 0) + 1;
  }
  return counts;
}

describe('the last reply before Redis closes reaches the client, while the client keeps sending', () => {
  it('a protocol error: every time, the replies before it and the error itself', async () => {
    const request = Buffer.from('*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$x\r\nk\r\n');
    const expected = await answerAlone(env.redis.port, request);
    expect(expected).toMatch(/^\+PONG\r\n-ERR Protocol error/);
    for (let i = 0; i < 20; i++) expect(await sendAndKeepWriting(proxyPort, request, FILLER, /^-ERR/m)).toBe(expected);
  });

  it('an inline request longer than Redis reads (no newline): its protocol error', async () => {
    const request = Buffer.from('*1\r\n$4\r\nPING\r\n\x00');
    const expected = await answerAlone(env.redis.port, Buffer.concat([request, Buffer.alloc(70 * 1024, 'b')]));
    expect(expected).toMatch(/^\+PONG\r\n-ERR Protocol error/);
    for (let i = 0; i < 5; i++) expect(await sendAndKeepWriting(proxyPort, request, FILLER, /^-ERR/m)).toBe(expected);
  });

  it('QUIT: its +OK, and nothing sent after it runs', async () => {
    const request = Buffer.concat([cmd('PING'), cmd('QUIT')]);
    // Were any of it run, a SET's +OK or an unknown command's error would follow QUIT's +OK.
    const after = Buffer.concat([cmd('SET', 'after-quit', 'x'), FILLER, Buffer.from('\r\n')]);
    for (let i = 0; i < 10; i++) expect(await sendAndKeepWriting(proxyPort, request, after, /\+OK/)).toBe('+PONG\r\n+OK\r\n');
    expect(await env.admin.call('EXISTS', 'after-quit')).toBe(':0\r\n');
  });

  it('QUIT right after a MULTI the proxy was holding (it may have started a lock block)', async () => {
    const request = Buffer.concat([cmd('MULTI'), cmd('QUIT')]);
    const expected = await answerAlone(env.redis.port, request);
    expect(expected).toBe('+OK\r\n+OK\r\n');
    for (let i = 0; i < 5; i++) expect(await sendAndKeepWriting(proxyPort, request, FILLER, /\+OK\r\n\+OK/)).toBe(expected);
  });

  it('a protocol error in a frame that arrives in pieces (9, 1, 1, 5 bytes, the last byte 1 ms later), quiet and busy', async () => {
    const request = Buffer.from('*2\r\n$3\r\nGET\r\n:1\r\n');
    const direct = await sendInPieces(env.redis.port, request, [9, 1, 1, 5], 1);
    expect(direct).toBe("-ERR Protocol error: expected '$', got ':'\r\n");
    const attempt = (): Promise<string> => sendInPieces(proxyPort, request, [9, 1, 1, 5], 1);
    expect(await outcomes(10, attempt)).toEqual({ [direct]: 10 });
    expect(await whileBusy(() => outcomes(10, attempt))).toEqual({ [direct]: 10 });
  });

  it('a protocol error with commands after the bad frame, quiet and busy', async () => {
    const bad = Buffer.from('*6\r\n$4\r\nHSET\r\n$1\r\nh\r\n-7\r\n');
    const request = Buffer.concat([cmd('PING'), bad, cmd('SET', 'after-error', 'x'), cmd('PING'), cmd('GET', 'after-error')]);
    const direct = await sendInPieces(env.redis.port, request, [request.length - 1], 1);
    expect(direct).toMatch(/^\+PONG\r\n-ERR Protocol error: expected '\$', got '-'\r\n$/);
    const attempt = (): Promise<string> => sendInPieces(proxyPort, request, [request.length - 1], 1);
    expect(await outcomes(10, attempt)).toEqual({ [direct]: 10 });
    expect(await whileBusy(() => outcomes(10, attempt))).toEqual({ [direct]: 10 });
    expect(await env.admin.call('EXISTS', 'after-error')).toBe(':0\r\n');
  });

  it('on a busy machine too: the protocol error and QUIT while the client keeps sending', async () => {
    const request = Buffer.from('*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$x\r\nk\r\n');
    const expected = await answerAlone(env.redis.port, request);
    const quit = Buffer.concat([cmd('PING'), cmd('QUIT')]);
    await whileBusy(async () => {
      expect(await outcomes(10, () => sendAndKeepWriting(proxyPort, request, FILLER, /^-ERR/m))).toEqual({ [expected]: 10 });
      expect(await outcomes(10, () => sendAndKeepWriting(proxyPort, quit, FILLER, /\+OK/))).toEqual({ '+PONG\r\n+OK\r\n': 10 });
    });
  });

  it('the client limit: Redis’s refusal, quiet and busy', async () => {
    const full = await startRedis({ args: ['--maxclients', '1'] });
    const holder = await RawClient.connect(full.port); // takes the only place
    try {
      const port = await startProxyProcess(full.url);
      const expected = await answerAlone(full.port, cmd('PING'));
      expect(expected).toMatch(/^-ERR max number of clients reached\r\n$/);
      const attempt = (): Promise<string> => sendAndKeepWriting(port, cmd('PING'), FILLER, /^-ERR/m);
      expect(await outcomes(5, attempt)).toEqual({ [expected]: 5 });
      expect(await whileBusy(() => outcomes(10, attempt))).toEqual({ [expected]: 10 });
    } finally {
      await holder.close();
      await full.stop();
    }
  });
});
