/**
 * Writes made while one chunk is processed leave together: in one write (the usual case, no
 * cork needed) or one writev, instead of one system call each (WriteBatch, towards the client).
 * Several small pieces (a chunk cut around a lock pair's expiry, an EXEC reply with its elements
 * restored) are copied into one buffer and written once: a corked writev costs Node far more per
 * piece (its buffered-request list, the array handed to libuv) than copying a few hundred bytes.
 *
 * Writes towards Redis wait for the end of the event loop's poll phase (DeferredWrites, one
 * setImmediate for every connection). Then everything Redis had sent by the time the loop polled
 * is read before anything more is written to it. Redis closes a connection right after its last
 * reply (a protocol error, QUIT, CLIENT KILL), with a reset when bytes it never read are still
 * arriving; a write into that reset fails, and the socket is then destroyed with that last reply
 * still unread in the kernel. Reading first keeps the reply.
 */
import type net from 'node:net';

/** Up to this many bytes in all, several pieces are copied into one buffer rather than corked into a writev. */
const COPY_AT_MOST_BYTES = 16 * 1024;

/**
 * Writes collected for one socket, sent together: one write as it is (the usual case), one write of
 * a copy when several are small together, or one corked writev.
 */
class CollectedWrites {
  /** The first write collected: most batches hold one, and then no array is touched. */
  private first: Buffer | null = null;
  /** The writes collected after the first, in order. */
  private more: Buffer[] | null = null;

  constructor(
    private readonly socket: net.Socket,
    protected readonly send: (bytes: Buffer) => void,
  ) {}

  protected collect(bytes: Buffer): void {
    if (this.first === null) this.first = bytes;
    else if (this.more === null) this.more = [bytes];
    else this.more.push(bytes);
  }

  /** Sends what is collected now (before the socket is ended, for example). */
  flush(): void {
    const first = this.first;
    if (first === null) return;
    const more = this.more;
    this.first = null;
    this.more = null;
    if (more === null) {
      this.send(first);
      return;
    }
    let total = first.length;
    for (let i = 0; i < more.length; i++) total += more[i].length;
    if (total <= COPY_AT_MOST_BYTES) {
      this.send(joinedCopy(first, more, total));
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

/** `first` and then `more`, copied in order into one new buffer of `total` bytes. */
function joinedCopy(first: Buffer, more: readonly Buffer[], total: number): Buffer {
  const out = Buffer.allocUnsafe(total);
  let at = first.copy(out, 0);
  for (let i = 0; i < more.length; i++) at += more[i].copy(out, at);
  return out;
}

/** Collects writes between begin() and the matching end(); outside them a write goes out at once. */
export class WriteBatch extends CollectedWrites {
  private depth = 0;

  begin(): void {
    this.depth++;
  }

  add(bytes: Buffer): void {
    if (this.depth === 0) this.send(bytes);
    else this.collect(bytes);
  }

  end(): void {
    if (--this.depth === 0) this.flush();
  }
}

/** Collects writes until the end of the event loop's poll phase, for every socket in one setImmediate. */
export class DeferredWrites extends CollectedWrites {
  private scheduled = false;

  add(bytes: Buffer): void {
    this.collect(bytes);
    if (!this.scheduled) {
      this.scheduled = true;
      scheduleFlush(this);
    }
  }

  override flush(): void {
    this.scheduled = false;
    super.flush();
  }
}

/** Deferred writes waiting (the first `dueCount`), flushed together by one setImmediate. */
let due: Array<DeferredWrites | null> = [];
let dueCount = 0;
let spare: Array<DeferredWrites | null> = [];

function scheduleFlush(writes: DeferredWrites): void {
  if (dueCount === 0) setImmediate(flushDue);
  due[dueCount++] = writes;
}

function flushDue(): void {
  // A flush that schedules another (none does today) lands in the other array, for the next round.
  const pending = due;
  const count = dueCount;
  due = spare;
  dueCount = 0;
  for (let i = 0; i < count; i++) {
    (pending[i] as DeferredWrites).flush();
    pending[i] = null;
  }
  spare = pending;
}
