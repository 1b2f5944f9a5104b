/**
 * Error lines in one connection's server-to-client stream that the proxy acts on (and simple
 * lines, while a RESET's answer is judged: reset-marker.ts): with
 * --cluster, -MOVED and -ASK lines, at any depth (an EXEC array, say), rewritten to name the
 * proxy's listeners (cluster/rewrite.ts); after a RESET in a plain pipe, the refusal of the
 * proxy's own marker command (reset-marker.ts), dropped. The reply scanner stops after every
 * error line while lines are watched; a line that may be one to act on and that TCP splits
 * across reads is held until its end arrives, so that it is always judged whole. Any other
 * error line goes on as it is.
 *
 * A line may also have to wait (a redirect to a node the proxy does not know yet, until the
 * topology has been asked again): the reply stream pauses at that line, and the line then goes
 * out as the wait decides.
 */
import type { ReplyScanner } from '../resp/reply-scanner.js';

/** A line that waits before it goes out. */
export interface PendingLine {
  /** Settles once the line can be decided (or the wait is over). */
  readonly checked: Promise<void>;
  /** The line to send now. */
  answer(): Buffer;
}

/** Which error lines are acted on, and how. */
export interface LineWatch {
  /** Whether an error line that begins with `head` (its first bytes, `-` included) may be one to act on. */
  couldBe(head: Buffer): boolean;
  /**
   * A whole error line (CRLF included), valid only during the call (a view of a read): what to
   * send instead (an empty buffer drops it), null to send it as it is, or a line that waits (it
   * keeps a copy of what it needs).
   */
  replace(line: Buffer): Buffer | null | PendingLine;
  /** A line ended that was passed on without being judged whole (it could not be one to act on). */
  skipped?(): void;
}

/** Longest line held across reads (a redirect is about 40 bytes, the marker's refusal about 100). */
const MAX_HELD_LINE = 512;

export class ErrorLines {
  /** The start of an error line that may be one to act on, held until its end arrives. */
  private head: Buffer[] = [];
  /** The error line in progress was already passed on (it cannot be one to act on). */
  private passed = false;
  /** The line that waits: nothing after it goes to the client before it. */
  private pending: PendingLine | null = null;

  constructor(
    private readonly scanner: ReplyScanner,
    /** Sends bytes on to the client, in order. */
    private readonly write: (bytes: Buffer) => void,
    private readonly watch: LineWatch,
  ) {}

  /** The line that waits, if any. */
  get waiting(): PendingLine | null {
    return this.pending;
  }

  /**
   * An error line ended at `pos`; `from` is where the bytes of the chunk not
   * yet passed on begin. Returns the new `from`.
   */
  lineEnded(chunk: Buffer, from: number, pos: number): number {
    const start = this.scanner.errorStart;
    const head = this.head;
    this.head = [];
    if (this.passed) {
      this.passed = false;
      this.watch.skipped?.();
      return from;
    }
    const line = start >= 0 ? chunk.subarray(start, pos) : Buffer.concat([...head, chunk.subarray(0, pos)]);
    const replacement = this.watch.replace(line);
    if (replacement === null) {
      if (start < 0) this.write(joined(head));
      return from;
    }
    if (start >= 0) this.write(chunk.subarray(from, start));
    if (Buffer.isBuffer(replacement)) this.write(replacement);
    else this.pending = replacement;
    return pos;
  }

  /** Ends the wait: the waiting line goes to the client (see PendingLine.answer). */
  release(): void {
    const waiting = this.pending as PendingLine;
    this.pending = null;
    this.write(waiting.answer());
  }

  /** Ends the wait with nothing sent: the client is gone. */
  drop(): void {
    this.pending = null;
  }

  /**
   * The chunk ends inside an error line: when it may be one to act on, its start is held (and
   * what precedes it passed on) and true returned. Otherwise it is passed on now, with the
   * caller's rest of the chunk, and not looked at again.
   */
  holdAtChunkEnd(chunk: Buffer, from: number): boolean {
    if (this.passed) return false;
    const start = this.scanner.errorStart;
    if (start < 0 && this.head.length === 0) return false; // began inside a reply taken aside
    const begin = start >= 0 ? Math.max(start, from) : from;
    const held = this.head.reduce((sum, part) => sum + part.length, 0) + chunk.length - begin;
    if (held > MAX_HELD_LINE || !this.watch.couldBe(Buffer.concat([...this.head, chunk.subarray(begin)]))) {
      this.passed = true;
      this.flush();
      return false;
    }
    this.write(chunk.subarray(from, begin));
    this.head.push(Buffer.from(chunk.subarray(begin))); // a copy: the chunk is valid only during this call
    return true;
  }

  /** Passes on a held line start (Redis closed the connection: every byte it sent reaches the client). */
  flush(): void {
    if (this.head.length > 0) this.write(joined(this.head.splice(0)));
  }
}

function joined(parts: Buffer[]): Buffer {
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}
