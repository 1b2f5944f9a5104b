/**
 * The server-to-client side of one connection: replies are counted (not decoded) against what
 * was forwarded, so that the replies to the proxy's own commands (the server's version, the lock
 * script, AUTH/SELECT at connect and after RESET, a cluster reply to rewrite) are found and taken
 * aside, in order, and everything else goes to the client untouched.
 *
 * Replies expected for forwarded frames come first (`outstanding`); then marks, in order, each
 * followed by the replies of frames forwarded after it:
 * - a capture: the reply to a command of the proxy's own;
 * - a reset: the connection was a plain pipe when the client sent RESET, so the replies before
 *   Redis's `+RESET` cannot be counted; they pass through until it, and counting starts again.
 *
 * When the count is lost (more replies than requests, a stream that is not RESP), the connection
 * stops being interpreted, unless a reply of the proxy's own is due: then its state is unknown,
 * and the session closes rather than fake it.
 */
import { RedirectLines } from '../cluster/redirect-lines.js';
import { ReplyScanner } from '../resp/reply-scanner.js';

/** What the reply side needs of its session. */
export interface ReplyStreamPort {
  /** Sends bytes to the client, in order. */
  writeClient(bytes: Buffer): void;
  /** The client side is gone: nothing more to scan for it. */
  readonly clientGone: boolean;
  /** Replies no longer follow requests, and no reply of the proxy's own is due: interpreting stops. */
  untracked(reason: string, expected: boolean): void;
  /** A reply of the proxy's own is due but cannot be found. */
  lost(reason: string): void;
}

/** A point in the reply stream, and how many forwarded replies follow it. */
type Mark =
  /** The reply to a command the proxy sent itself. */
  | { readonly kind: 'capture'; readonly handle: (reply: Buffer) => void; after: number }
  /** Replies pass uncounted until Redis's `+RESET` (the client's RESET, sent while the connection was a pipe). */
  | { readonly kind: 'reset'; after: number };

/** RESET's reply (networking.c resetCommand: addReplyStatus(c,"RESET")). */
const RESET_REPLY = Buffer.from('+RESET\r\n');

export class ReplyStream {
  private readonly scanner = new ReplyScanner();
  /** Replies still expected for forwarded frames, before any mark. */
  private outstanding = 0;
  /** Marks still ahead, in stream order. */
  private marks: Mark[] = [];
  private captureParts: Buffer[] = [];
  /** The first bytes of the frame passing before a reset mark, to tell whether it is `+RESET`. */
  private readonly frameHead = Buffer.alloc(RESET_REPLY.length + 1);
  private frameHeadLength = 0;
  /** Replies are no longer counted: bytes go to the client as they come. */
  private passing = false;
  /** Stop counting once the marks due now are passed (the connection became a pipe). */
  private passWhenDone = false;
  /** In front of a cluster: -MOVED/-ASK lines are rewritten, even once replies are no longer counted. */
  private readonly redirects: RedirectLines | null;
  private redirectScan: boolean;

  /** `rewriteRedirect`: with --cluster, the rewriting of a -MOVED/-ASK line (null when it is none); null standalone. */
  constructor(
    private readonly port: ReplyStreamPort,
    rewriteRedirect: ((line: Buffer) => Buffer | null) | null,
  ) {
    this.redirectScan = rewriteRedirect !== null;
    this.scanner.trackErrors = rewriteRedirect !== null;
    this.redirects = rewriteRedirect === null ? null : new RedirectLines(this.scanner, (bytes) => port.writeClient(bytes), rewriteRedirect);
  }

  /** Whether chunks can go to the client without being looked at. */
  get passingThrough(): boolean {
    return this.passing && !this.redirectScan;
  }

  /** Whether any reply is still due: for a forwarded frame, or of the proxy's own. */
  get pending(): boolean {
    return this.outstanding > 0 || this.marks.length > 0;
  }

  /** Whether a reply of the proxy's own is still due. */
  get capturing(): boolean {
    for (const mark of this.marks) if (mark.kind === 'capture') return true;
    return false;
  }

  /** `count` replies come for frames just forwarded: after the last mark, if any. */
  expect(count: number): void {
    if (this.marks.length === 0) this.outstanding += count;
    else this.marks[this.marks.length - 1].after += count;
  }

  /** The reply to the command just sent is the proxy's own: it goes to `handle`, not to the client. */
  capture(handle: (reply: Buffer) => void): void {
    this.marks.push({ kind: 'capture', handle, after: 0 });
    this.passing = false;
  }

  /**
   * The client sent RESET while the connection was a plain pipe: Redis's `+RESET` is found in the
   * stream (what comes before it passes uncounted), and from it on, replies are counted again.
   */
  countAgainAfterReset(): void {
    this.marks.push({ kind: 'reset', after: 0 });
    this.passing = false;
    this.passWhenDone = false;
  }

  /** Replies stop being counted: at once, or after the marks still due. */
  stopCounting(): void {
    this.passWhenDone = true;
    if (this.marks.length === 0) this.passing = true;
  }

  /** Redis closed: a redirect line held across reads goes to the client as it is. */
  flush(): void {
    this.redirects?.flush();
  }

  /** One chunk from Redis. */
  process(chunk: Buffer): void {
    const scanner = this.scanner;
    scanner.newChunk();
    let pos = 0;
    /** Start of the bytes of this chunk not yet forwarded or captured. */
    let from = 0;
    while (pos < chunk.length && !this.port.clientGone) {
      if (this.passing) {
        // Replies are no longer counted; in front of a cluster, redirects still name nodes.
        if (!this.redirectScan) break;
        pos = scanner.scan(chunk, pos, Number.MAX_SAFE_INTEGER);
        if (scanner.error !== '') {
          this.redirectScan = false;
          break;
        }
        if (scanner.errorEnded && this.redirects !== null) from = this.redirects.lineEnded(chunk, from, pos);
        continue;
      }
      if (this.marks.length === 0 || this.outstanding > 0) {
        const limit = this.marks.length === 0 ? Number.MAX_SAFE_INTEGER : this.outstanding;
        pos = scanner.scan(chunk, pos, limit);
        if (scanner.error !== '') return this.desync(chunk, from, scanner.error);
        this.outstanding -= scanner.replies;
        if (scanner.errorEnded && this.redirects !== null) from = this.redirects.lineEnded(chunk, from, pos);
        if (this.outstanding < 0) this.unexpectedReplies(chunk, from);
        continue;
      }
      // The next frame is the mark's: a reply of the proxy's own (pushes excepted), or one passing before +RESET.
      const frameBegin = scanner.atFrameBoundary ? pos : from;
      pos = scanner.scan(chunk, pos, 1, true);
      if (scanner.error !== '') return this.desync(chunk, from, scanner.error);
      if (this.marks[0].kind === 'reset') {
        this.noteFrameHead(chunk, frameBegin, pos);
        if (scanner.errorEnded && this.redirects !== null) from = this.redirects.lineEnded(chunk, from, pos);
        if (scanner.atFrameBoundary && this.frameEnded()) this.passMark();
        continue;
      }
      if (scanner.isPush) continue;
      this.port.writeClient(chunk.subarray(from, frameBegin));
      this.captureParts.push(chunk.subarray(frameBegin, pos));
      from = pos;
      if (scanner.atFrameBoundary) this.captured();
    }
    if (from >= chunk.length) return;
    if (scanner.inErrorLine && this.redirects?.holdAtChunkEnd(chunk, from)) return;
    this.port.writeClient(from === 0 ? chunk : chunk.subarray(from));
  }

  /** Keeps the first bytes of the frame passing before a reset mark (it may span reads). */
  private noteFrameHead(chunk: Buffer, begin: number, end: number): void {
    const take = Math.min(end - begin, this.frameHead.length - this.frameHeadLength);
    if (take > 0) this.frameHeadLength += chunk.copy(this.frameHead, this.frameHeadLength, begin, begin + take);
  }

  /** A frame passed before a reset mark: whether it was Redis's `+RESET`. */
  private frameEnded(): boolean {
    const isReset = this.frameHeadLength === RESET_REPLY.length && RESET_REPLY.equals(this.frameHead.subarray(0, RESET_REPLY.length));
    this.frameHeadLength = 0;
    return isReset;
  }

  /** The mark at the head is passed: the replies that follow it are counted. */
  private passMark(): Mark {
    const mark = this.marks.shift() as Mark;
    this.outstanding += mark.after;
    if (this.passWhenDone && this.marks.length === 0) this.passing = true;
    return mark;
  }

  /** A whole reply of the proxy's own is in: to its handler. */
  private captured(): void {
    const reply = this.captureParts.length === 1 ? this.captureParts[0] : Buffer.concat(this.captureParts);
    this.captureParts = [];
    const mark = this.passMark();
    if (mark.kind === 'capture') mark.handle(reply);
  }

  /** More replies than requests: something the proxy did not account for. */
  private unexpectedReplies(chunk: Buffer, from: number): void {
    this.outstanding = 0;
    if (this.capturing) {
      this.desync(chunk, from, 'more replies than requests');
      return;
    }
    this.port.untracked('more replies than requests', true);
  }

  private desync(chunk: Buffer, from: number, reason: string): void {
    this.redirectScan = false;
    if (this.capturing) {
      this.port.lost(reason);
      return;
    }
    this.port.writeClient(chunk.subarray(from));
    this.port.untracked(reason, false);
  }
}
