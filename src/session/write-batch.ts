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
  /** The first write collected: most batches hold one, and then no array is touched. */
  private first: Buffer | null = null;
  /** The writes collected after the first, in order. */
  private more: Buffer[] | null = null;
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
    if (this.depth === 0 && !this.deferred) {
      this.send(bytes);
      return;
    }
    if (this.first === null) this.first = bytes;
    else if (this.more === null) this.more = [bytes];
    else this.more.push(bytes);
    if (this.deferred && !this.scheduled) {
      this.scheduled = true;
      scheduleFlush(this);
    }
  }

  end(): void {
    if (--this.depth === 0 && !this.deferred) this.flush();
  }

  /** Sends what is collected now (before the socket is ended, for example). */
  flush(): void {
    this.scheduled = false;
    const first = this.first;
    if (first === null) return;
    const more = this.more;
    this.first = null;
    this.more = null;
    if (more === null) {
      this.send(first);
      return;
    }
    this.socket.cork();
    this.send(first);
    for (const part of more) this.send(part);
    this.socket.uncork();
  }

  /** Drops what is collected: the socket is gone. */
  discard(): void {
    this.first = null;
    this.more = null;
  }
}

/** Deferred batches with writes waiting (the first `dueCount`), flushed together by one setImmediate. */
let due: Array<WriteBatch | null> = [];
let dueCount = 0;
let spare: Array<WriteBatch | null> = [];

function scheduleFlush(batch: WriteBatch): void {
  if (dueCount === 0) setImmediate(flushDue);
  due[dueCount++] = batch;
}

function flushDue(): void {
  // A flush that schedules another (none does today) lands in the other array, for the next round.
  const batches = due;
  const count = dueCount;
  due = spare;
  dueCount = 0;
  for (let i = 0; i < count; i++) {
    (batches[i] as WriteBatch).flush();
    batches[i] = null;
  }
  spare = batches;
}
