/**
 * A write that meets Redis's close must not cost the reply Redis sent before it
 * (src/upstream/upstream-socket.ts). Redis at its client limit answers a new connection with an
 * error and closes before reading anything; bytes written after that meet a reset. The socket
 * here does not read until its writes have been refused, the order a busy proxy can end up in.
 */
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { UpstreamSocket } from '../src/upstream/upstream-socket.js';
import { startRedis, type RedisServer } from './support/redis.js';
import { cmd, RawClient } from './support/resp.js';

let full: RedisServer;
let holder: RawClient;
beforeAll(async () => {
  full = await startRedis({ args: ['--maxclients', '1'] });
  holder = await RawClient.connect(full.port); // takes the only place
});
afterAll(async () => {
  await holder?.close();
  await full?.stop();
});

interface Outcome {
  received: string;
  refused: boolean;
  /** How the socket ended: 'end', or the error's code. */
  ended: string;
}

/**
 * Connects without reading, writes PINGs until a write is refused (or the socket is gone), then
 * reads what is left.
 */
async function writeUntilRefusedThenRead(socket: net.Socket, refusal: { seen: boolean }, firstWriteAfterMs = 0): Promise<Outcome> {
  let received = '';
  let ended = '';
  const done = new Promise<void>((resolve) => {
    socket.on('data', (bytes: Buffer) => (received += bytes.toString('latin1')));
    socket.on('end', () => {
      ended ||= 'end';
      resolve();
    });
    socket.on('error', (error: NodeJS.ErrnoException) => {
      ended ||= error.code ?? error.message;
      resolve();
    });
    socket.on('close', () => resolve());
  });
  socket.pause();
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  // Again, now that it is connected: an onread socket's pause stops its handle's reads only once
  // connected, and the 'data' listener's resume has started them on connect. Were they running,
  // Redis's reset (it closes with our PING unread, when the PING beats its close) could come in
  // as a read error before any write is refused.
  socket.pause();
  await new Promise((resolve) => setTimeout(resolve, firstWriteAfterMs));
  const deadline = Date.now() + 20_000;
  while (!refusal.seen && !socket.destroyed) {
    if (Date.now() > deadline) throw new Error('no write was refused within 20 s');
    socket.write(cmd('PING'));
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  socket.resume();
  await done;
  return { received, refused: refusal.seen, ended };
}

describe('a write refused because Redis closed', () => {
  it('leaves what Redis sent before it readable, then the connection ends', async () => {
    const refusal = { seen: false };
    const chunks: Buffer[] = [];
    const socket = new UpstreamSocket(
      {
        allowHalfOpen: true,
        onread: { buffer: Buffer.alloc(1024), callback: (n, buf) => (chunks.push(Buffer.from(buf.subarray(0, n))), true) },
      },
      () => (refusal.seen = true),
    );
    socket.connect({ host: full.host, port: full.port });
    const outcome = await writeUntilRefusedThenRead(socket, refusal);
    expect(outcome.refused).toBe(true);
    expect(Buffer.concat(chunks).toString('latin1')).toBe('-ERR max number of clients reached\r\n');
    expect(['end', 'ECONNRESET']).toContain(outcome.ended);
    socket.destroy();
  });

  it('closes by itself once its reads have ended, also after end(): nothing waits for the held-back write', async () => {
    // Redis's close is in before the first write (Redis closes at once at its client limit), so
    // the reads end with EOF, not with the reset: the case where nothing else closes the socket.
    const refusal = { seen: false };
    const socket = new UpstreamSocket({ allowHalfOpen: true }, () => (refusal.seen = true));
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    socket.connect({ host: full.host, port: full.port });
    const outcome = await writeUntilRefusedThenRead(socket, refusal, 200);
    expect(outcome).toEqual({ received: '-ERR max number of clients reached\r\n', refused: true, ended: 'end' });
    socket.end(); // what a session does when its client closes
    const within = await Promise.race([closed.then(() => true), new Promise((resolve) => setTimeout(() => resolve(false), 5000))]);
    expect(within).toBe(true);
    expect(socket.destroyed).toBe(true);
  });

  it('is what a plain net.Socket loses: it is destroyed by the refused write, unread', async () => {
    // The reason for UpstreamSocket: should Node ever keep the bytes itself, this fails and says so.
    const socket = new net.Socket({ allowHalfOpen: true });
    socket.connect({ host: full.host, port: full.port });
    const outcome = await writeUntilRefusedThenRead(socket, { seen: false });
    expect(outcome.received).toBe('');
    expect(['EPIPE', 'ECONNRESET']).toContain(outcome.ended);
  });
});
