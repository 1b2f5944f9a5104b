/**
 * The bench's `relay` target: a bare Node relay, the floor of what Node
 * itself costs on the bench's loads. It interprets nothing: each client
 * connection gets its own connection to Redis (1:1, as the proxy), and bytes
 * go across as they come, with backpressure and half-close both ways, and
 * nothing else.
 *
 * It is as cheap as public Node APIs make a relay: Redis's bytes are read
 * into one buffer that every connection shares (the `onread` option of
 * net.connect: no buffer allocated, and no stream machinery, per read) and
 * written on at once; a write the kernel did not take whole keeps that
 * buffer, so the next reads get a fresh one. Accepted sockets have no
 * `onread`, so client bytes come as 'data' events; they are written to Redis
 * at the end of the event loop's poll phase, every connection's in one
 * setImmediate (as the proxy writes them), which costs less than a write
 * from each event. The proxy's CPU per request minus this one's is what the
 * proxy's own work costs.
 *
 * Run as `node .bench/relay.js <listen port> <redis port>`, on loopback.
 */
import { Buffer } from 'node:buffer';
import net from 'node:net';
import process from 'node:process';
import { HOST } from './processes.js';

const READ_BUFFER_BYTES = 64 * 1024;

/** Where every upstream read lands; replaced when a write still holds it. */
let readBuffer = Buffer.allocUnsafe(READ_BUFFER_BYTES);

/** Client bytes of one connection waiting for the end of the poll phase. */
interface Pending {
  readonly upstream: net.Socket;
  readonly client: net.Socket;
  chunks: Buffer[];
}

/** Connections with client bytes waiting, written by one setImmediate. */
let due: Pending[] = [];

function writeDue(): void {
  const pending = due;
  due = [];
  for (const p of pending) {
    const chunks = p.chunks;
    p.chunks = [];
    if (chunks.length > 1) p.upstream.cork();
    let room = true;
    for (const chunk of chunks) room = p.upstream.write(chunk);
    if (chunks.length > 1) p.upstream.uncork();
    if (!room) p.client.pause();
  }
}

function relay(client: net.Socket, redisPort: number): void {
  const upstream = net.connect({
    host: HOST,
    port: redisPort,
    noDelay: true,
    allowHalfOpen: true,
    onread: {
      buffer: () => readBuffer,
      callback: (bytes: number, buffer: Uint8Array): boolean => {
        const room = client.write(buffer.subarray(0, bytes));
        // Not all of it reached the kernel: the write goes on from this buffer later.
        if (client.writableLength > 0) readBuffer = Buffer.allocUnsafe(READ_BUFFER_BYTES);
        return room; // false stops reading until the client drains
      },
    },
  });
  const pending: Pending = { upstream, client, chunks: [] };
  client.on('data', (chunk: Buffer) => {
    if (pending.chunks.length === 0) {
      if (due.length === 0) setImmediate(writeDue);
      due.push(pending);
    }
    pending.chunks.push(chunk);
  });
  upstream.on('drain', () => client.resume());
  client.on('drain', () => upstream.resume());
  client.on('end', () => {
    // What waits for the poll phase goes first.
    for (const chunk of pending.chunks) upstream.write(chunk);
    pending.chunks = [];
    upstream.end();
  });
  upstream.on('end', () => client.end());
  client.on('error', () => upstream.destroy());
  upstream.on('error', () => client.destroy());
  client.on('close', () => upstream.destroy());
  upstream.on('close', () => client.destroy());
}

const [listenPort, redisPort] = process.argv.slice(2).map(Number);
if (!(listenPort > 0) || !(redisPort > 0)) {
  process.stderr.write('usage: node relay.js <listen port> <redis port>\n');
  process.exit(2);
}
net
  .createServer({ allowHalfOpen: true, noDelay: true }, (client) => relay(client, redisPort))
  .listen(listenPort, HOST, () => process.stdout.write(`relay listening on ${HOST}:${listenPort}\n`));
