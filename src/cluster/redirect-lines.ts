/**
 * -MOVED and -ASK lines in one connection's server-to-client stream (with
 * --cluster). The reply scanner stops after every error line, at any depth (an
 * EXEC array, say); a redirect is passed on rewritten (see rewrite.ts), any
 * other error as it is. A redirect that TCP splits across reads is held
 * until its end arrives, so that it is always rewritten whole.
 *
 * A redirect to a node the proxy does not know yet waits (a PendingRedirect)
 * until the topology has been asked again: the reply stream pauses at that
 * line, and the line then goes out rewritten, or as Redis wrote it.
 */
import type { ReplyScanner } from '../resp/reply-scanner.js';

/** A redirect line that names a node the proxy does not know yet. */
export interface PendingRedirect {
  /** Settles once the topology has been asked again (or the wait is over). */
  readonly checked: Promise<void>;
  /** The line to send now: rewritten if its node is known by now, else as Redis wrote it. */
  answer(): Buffer;
}

/**
 * The rewritten line (CRLF included), null for an error that is no redirect, or a redirect that
 * must wait. `line` is valid only during the call (a view of a read): a redirect that waits keeps a copy.
 */
export type RedirectRewrite = (line: Buffer) => Buffer | null | PendingRedirect;

/** Longest -MOVED/-ASK line waited for across reads (they are about 40 bytes). */
const MAX_REDIRECT_LINE = 512;
const MOVED_PREFIX = Buffer.from('-MOVED ');
const ASK_PREFIX = Buffer.from('-ASK ');

export class RedirectLines {
  /** The start of an error line that could be a redirect, held until its end arrives. */
  private head: Buffer[] = [];
  /** The error line in progress was already passed on (it cannot be a redirect). */
  private passed = false;
  /** The redirect that waits for the topology: nothing after it goes to the client before it. */
  private pending: PendingRedirect | null = null;

  constructor(
    private readonly scanner: ReplyScanner,
    /** Sends bytes on to the client, in order. */
    private readonly write: (bytes: Buffer) => void,
    private readonly rewrite: RedirectRewrite,
  ) {}

  /** The redirect that waits for the topology, if any. */
  get waiting(): PendingRedirect | null {
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
      return from;
    }
    const line = start >= 0 ? chunk.subarray(start, pos) : Buffer.concat([...head, chunk.subarray(0, pos)]);
    const rewritten = this.rewrite(line);
    if (rewritten === null) {
      if (start < 0) this.write(joined(head));
      return from;
    }
    if (start >= 0) this.write(chunk.subarray(from, start));
    if (Buffer.isBuffer(rewritten)) this.write(rewritten);
    else this.pending = rewritten;
    return pos;
  }

  /** Ends the wait: the waiting line goes to the client (see PendingRedirect.answer). */
  release(): void {
    const waiting = this.pending as PendingRedirect;
    this.pending = null;
    this.write(waiting.answer());
  }

  /** Ends the wait with nothing sent: the client is gone. */
  drop(): void {
    this.pending = null;
  }

  /**
   * The chunk ends inside an error line: when it may be a redirect, its start
   * is held (and what precedes it passed on) and true returned. Otherwise it
   * is passed on now, with the caller's rest of the chunk, and not looked at
   * again.
   */
  holdAtChunkEnd(chunk: Buffer, from: number): boolean {
    if (this.passed) return false;
    const start = this.scanner.errorStart;
    if (start < 0 && this.head.length === 0) return false; // began inside a reply taken aside
    const begin = start >= 0 ? Math.max(start, from) : from;
    const held = this.head.reduce((sum, part) => sum + part.length, 0) + chunk.length - begin;
    if (held > MAX_REDIRECT_LINE || !couldBeRedirect([...this.head, chunk.subarray(begin)])) {
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

/** Whether the bytes an error line began with could still be `-MOVED ` or `-ASK `. */
function couldBeRedirect(parts: Buffer[]): boolean {
  const head = Buffer.concat(parts).subarray(0, MOVED_PREFIX.length);
  const prefixOf = (word: Buffer): boolean => head.subarray(0, word.length).equals(word.subarray(0, Math.min(head.length, word.length)));
  return prefixOf(MOVED_PREFIX) || prefixOf(ASK_PREFIX);
}

function joined(parts: Buffer[]): Buffer {
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}
