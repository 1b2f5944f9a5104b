/**
 * A relay that breaks the one rule a proxy must keep, once, on purpose: between clients and
 * Redis it passes every byte, except one chunk from Redis that it gives another connection's
 * bytes (misplace), leaves out (drop), or sends twice (repeat). The integrity stress must catch
 * each; a stress that passes through this relay proves nothing.
 */
import net from 'node:net';
import type { Endpoint } from './client.js';
import { clientsIn } from './pattern.js';

export type Fault = 'misplace' | 'drop' | 'repeat';

export interface FaultyRelay {
  readonly endpoint: Endpoint;
  /** Whether the fault has happened yet. */
  readonly faulted: boolean;
  close(): Promise<void>;
}

/**
 * Whether `standIn` holds whole value records (pattern.ts) of a client whose records `chunk`,
 * which holds some, does not: the report can then say whose bytes came. A large chunk of many
 * short replies names nobody, and a sibling connection's chunk may name the same client.
 */
function namesAnotherClient(standIn: Buffer, chunk: Buffer): boolean {
  const own = clientsIn(chunk);
  if (own.size === 0) return false;
  for (const client of clientsIn(standIn)) if (!own.has(client)) return true;
  return false;
}

/** Chunks from Redis this large carry value bytes worth misplacing. */
const LARGE = 4096;

/**
 * Relays to `upstream`; the fault strikes the first large chunk from Redis after `after` large
 * chunks have passed (for misplace: one that another connection's large chunk, naming another
 * client, can stand in for).
 */
export async function startFaultyRelay(upstream: Endpoint, fault: Fault, after = 200): Promise<FaultyRelay> {
  let largeSeen = 0;
  let faulted = false;
  /** The last large chunk from Redis, and the connection it was for. */
  let lastLarge: { connection: number; bytes: Buffer } | null = null;
  let connections = 0;
  const sockets = new Set<net.Socket>();

  /** What goes to the client instead of `chunk`. */
  const relay = (connection: number, chunk: Buffer): Buffer[] => {
    if (chunk.length < LARGE) return [chunk];
    largeSeen++;
    const other = lastLarge;
    lastLarge = { connection, bytes: Buffer.from(chunk) };
    if (faulted || largeSeen <= after) return [chunk];
    if (fault === 'misplace') {
      if (other === null || other.connection === connection || other.bytes.length < chunk.length) return [chunk];
      const standIn = other.bytes.subarray(0, chunk.length);
      if (!namesAnotherClient(standIn, chunk)) return [chunk];
      faulted = true;
      return [standIn];
    }
    faulted = true;
    return fault === 'drop' ? [] : [chunk, chunk];
  };

  const server = net.createServer((client) => {
    const id = connections++;
    const redis = net.connect(upstream.port, upstream.host);
    for (const socket of [client, redis]) {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      socket.on('error', () => {});
    }
    client.pipe(redis);
    redis.on('data', (chunk: Buffer) => {
      for (const part of relay(id, chunk)) if (!client.write(part)) redis.pause();
    });
    client.on('drain', () => redis.resume());
    redis.on('end', () => client.end());
    client.on('close', () => redis.destroy());
    redis.on('close', () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    endpoint: { host: '127.0.0.1', port },
    get faulted() {
      return faulted;
    },
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
