/**
 * Redis's bytes are read into one buffer that every upstream connection shares
 * (src/upstream/read-buffer.ts). A reply that a client has not taken yet is still being written
 * from that memory, so the reads that serve other connections meanwhile must land elsewhere:
 * the bytes a slow client finally gets are the ones Redis sent, whatever the proxy read since.
 */
import { createHash } from 'node:crypto';
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { cmd } from '../support/resp.js';

const env = redisAndProxy();

const MiB = 1024 * 1024;

/** `length` bytes that differ from position to position and from seed to seed. */
function pattern(length: number, seed: number): Buffer {
  const bytes = Buffer.alloc(length);
  for (let i = 0; i < length; i += 4) bytes.writeUInt32LE((Math.imul(i + seed, 2654435761) ^ seed) >>> 0, i);
  return bytes;
}

const sha = (bytes: Buffer): string => createHash('sha256').update(bytes).digest('hex');

/** Connects to the proxy; the socket is paused (not read) until `take` is called. */
async function pausedClient(port: number): Promise<net.Socket> {
  const socket = net.connect(port, '127.0.0.1');
  socket.pause();
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  return socket;
}

/** Reads one bulk reply of `length` bytes to the end and returns its body. */
function take(socket: net.Socket, length: number): Promise<Buffer> {
  const header = Buffer.from(`$${length}\r\n`);
  const total = header.length + length + 2;
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let received = 0;
    const timer = setTimeout(() => reject(new Error(`only ${received} of ${total} bytes within 20 s`)), 20_000);
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      received += chunk.length;
      if (received < total) return;
      clearTimeout(timer);
      const all = Buffer.concat(chunks);
      expect(all.subarray(0, header.length).toString('latin1')).toBe(header.toString('latin1'));
      expect(received).toBe(total);
      resolve(all.subarray(header.length, header.length + length));
    });
    socket.on('error', reject);
    socket.resume();
  });
}

describe('the shared read buffer', () => {
  it('a reply a client has not read stays intact while the proxy reads other connections', async () => {
    const length = 8 * MiB;
    const held = pattern(length, 1);
    const other = pattern(length, 2);
    await env.admin.call('SET', 'shared:held', held);
    await env.admin.call('SET', 'shared:other', other);

    // A client that asks and does not read: its reply fills the socket buffers, and the proxy has
    // more of it waiting in a write, not yet in the kernel.
    const slow = await pausedClient(env.proxy.port);
    const before = env.proxy.stats.bytesFromUpstream;
    slow.write(cmd('GET', 'shared:held'));
    const deadline = Date.now() + 10_000;
    let read = 0;
    for (;;) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      const now = env.proxy.stats.bytesFromUpstream - before;
      if (now > 0 && now === read) break; // the proxy stopped reading: the slow client is full
      read = now;
      if (Date.now() > deadline) throw new Error(`the proxy kept reading (${read} bytes)`);
    }
    expect(read).toBeLessThan(length);

    // Meanwhile other connections' replies go through the proxy's reads, several times over.
    for (let i = 0; i < 3; i++) {
      const client = await pausedClient(env.proxy.port);
      client.write(cmd('GET', 'shared:other'));
      expect(sha(await take(client, length))).toBe(sha(other));
      client.destroy();
    }

    expect(sha(await take(slow, length))).toBe(sha(held));
    slow.destroy();
  }, 60_000);
});
