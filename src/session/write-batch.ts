/**
 * Writes made while one chunk is processed leave together: in one write (the usual case, no
 * cork needed) or one writev, instead of one system call each.
 *
 * A batch can also be deferred to the end of the event loop's poll phase (setImmediate): the
 * writes towards Redis are. Then everything Redis had sent by the time the loop polled is read
 * before anything more is written to it. Redis closes a connection right after its last reply
 * (a protocol error, QUIT, CLIENT KILL), with a reset when bytes it never read are still
 * arriving; a write into that reset fails, and the socket is then destroyed with that last
 * reply still unread in the kernel. Reading first keeps the reply.
 */
import type net from 'node:net';

/** Collects writes between begin() and the matching end(); outside them a write goes out at once, unless the batch is deferred. */
export class WriteBatch {
  private readonly parts: Buffer[] = [];
  private depth = 0;
  private scheduled = false;

  constructor(
    private readonly socket: net.Socket,
    private readonly send: (bytes: Buffer) => void,
    /** Writes wait for the end of the current poll phase. */
    private readonly deferred = false,
  ) {}

  begin(): void {
    this.depth++;
  }

  add(bytes: Buffer): void {
    if (this.deferred) {
      this.parts.push(bytes);
      if (!this.scheduled) {
        this.scheduled = true;
        scheduleFlush(this);
      }
    } else if (this.depth === 0) {
      this.send(bytes);
    } else {
      this.parts.push(bytes);
    }
  }

  end(): void {
    if (--this.depth === 0 && !this.deferred) this.flush();
  }

  /** Sends what is collected now (before the socket is ended, for example). */
  flush(): void {
    this.scheduled = false;
    const parts = this.parts;
    if (parts.length === 0) return;
    if (parts.length === 1) {
      // The usual case: one write, and the array is reused rather than replaced.
      const only = parts[0];
      parts.length = 0;
      this.send(only);
      return;
    }
    const all = parts.splice(0);
    this.socket.cork();
    for (const part of all) this.send(part);
    this.socket.uncork();
  }

  /** Drops what is collected: the socket is gone. */
  discard(): void {
    this.parts.length = 0;
  }
}

/** Deferred batches with writes waiting, flushed together by one setImmediate. */
let due: WriteBatch[] = [];
let spare: WriteBatch[] = [];

function scheduleFlush(batch: WriteBatch): void {
  if (due.length === 0) setImmediate(flushDue);
  due.push(batch);
}

function flushDue(): void {
  const batches = due;
  due = spare;
  for (let i = 0; i < batches.length; i++) batches[i].flush();
  batches.length = 0;
  spare = batches;
}
