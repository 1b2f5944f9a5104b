/**
 * Two connected in-memory sockets: what one end writes, the other reads. They have what a
 * Session uses of a net.Socket (pause/resume, half-close, cork, the timeout and address
 * fields), so the session's mechanics can be tested without a network or a server.
 */
import type net from 'node:net';
import { Duplex } from 'node:stream';

export class MemorySocket extends Duplex {
  peer: MemorySocket | undefined;
  readonly remoteAddress = '127.0.0.1';
  readonly remotePort = 40000;
  readonly localAddress = '127.0.0.1';
  /** Every byte written to this end, in order (what its peer was sent). */
  written: Buffer[] = [];

  constructor() {
    super({ allowHalfOpen: true });
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, done: (error?: Error | null) => void): void {
    this.written.push(chunk);
    this.peer?.push(chunk);
    done();
  }

  override _final(done: (error?: Error | null) => void): void {
    this.peer?.push(null);
    done();
  }

  override _read(): void {}

  override _destroy(error: Error | null, done: (error?: Error | null) => void): void {
    if (this.peer !== undefined && !this.peer.destroyed) this.peer.destroy();
    done(error);
  }

  setTimeout(): this {
    return this;
  }

  setNoDelay(): this {
    return this;
  }

  /** This end as the net.Socket the session expects. */
  asSocket(): net.Socket {
    return this as unknown as net.Socket;
  }
}

export function memorySocketPair(): [MemorySocket, MemorySocket] {
  const a = new MemorySocket();
  const b = new MemorySocket();
  a.peer = b;
  b.peer = a;
  return [a, b];
}

/** Reads what arrives on `socket` into one growing text (latin1), for checks that wait for bytes. */
export class Received {
  private text = '';
  private waiter: (() => void) | undefined;
  ended = false;

  constructor(socket: Duplex) {
    socket.on('data', (chunk: Buffer) => {
      this.text += chunk.toString('latin1');
      this.waiter?.();
    });
    socket.on('end', () => {
      this.ended = true;
      this.waiter?.();
    });
  }

  get all(): string {
    return this.text;
  }

  /** Waits until the text received so far has at least `length` characters (or the socket ends). */
  async atLeast(length: number, timeoutMs = 1000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    while (this.text.length < length && !this.ended && Date.now() < deadline) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.max(1, deadline - Date.now()));
        this.waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    return this.text;
  }

  /** Takes what was received so far. */
  take(): string {
    const text = this.text;
    this.text = '';
    return text;
  }
}
