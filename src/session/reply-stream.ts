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
 *
 * With --cluster, a -MOVED/-ASK line that names a node not known yet waits for the topology
 * to be asked again (RedirectLines): the bytes Redis sends after it wait behind it, in order.
 *
 * A chunk is valid only during the process() call that gets it (the upstream reads into a
 * shared buffer, upstream/read-buffer.ts): whatever is kept past it is copied.
 */
import { RedirectLines, type RedirectRewrite } from '../cluster/redirect-lines.js';
import { ReplyScanner } from '../resp/reply-scanner.js';

/**
 * Bytes from Redis that may wait behind a redirect line being checked (reading from Redis pauses
 * meanwhile, but a read may be under way): past this, the wait ends and the line goes on as it is.
 */
const MAX_BYTES_BEHIND_REDIRECT = 1024 * 1024;

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
  /** Replies wait behind a redirect line (true), or go on again (false): reading from Redis may pause meanwhile. */
  repliesWaiting(waiting: boolean): void;
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
  /** Chunks from Redis that arrived after a redirect line that waits (RedirectLines.waiting), in order. */
  private behindRedirect: Buffer[] | null = null;
  private bytesBehindRedirect = 0;

  /** `rewriteRedirect`: with --cluster, the rewriting of a -MOVED/-ASK line (see RedirectRewrite); null standalone. */
  constructor(
    private readonly port: ReplyStreamPort,
    rewriteRedirect: RedirectRewrite | null,
  ) {
    this.redirectScan = rewriteRedirect !== null;
    this.scanner.trackErrors = rewriteRedirect !== null;
    this.redirects = rewriteRedirect === null ? null : new RedirectLines(this.scanner, (bytes) => port.writeClient(bytes), rewriteRedirect);
  }

  /** Whether chunks can go to the client without being looked at. */
  get passingThrough(): boolean {
    return this.passing && !this.redirectScan && this.behindRedirect === null;
  }

  /** Whether any reply is still due: for a forwarded frame, or of the proxy's own, or one waiting behind a redirect. */
  get pending(): boolean {
    return this.outstanding > 0 || this.marks.length > 0 || this.behindRedirect !== null;
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

  /** Redis closed: a redirect line that waits, and one held across reads, go to the client now. */
  flush(): void {
    while (this.behindRedirect !== null) this.endRedirectWait();
    this.redirects?.flush();
  }

  /** One chunk from Redis. */
  process(chunk: Buffer): void {
    if (this.behindRedirect !== null) return this.waitBehindRedirect(chunk);
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
        if (this.redirects?.waiting) return this.startRedirectWait(chunk.subarray(pos));
        continue;
      }
      if (this.marks.length === 0 || this.outstanding > 0) {
        const limit = this.marks.length === 0 ? Number.MAX_SAFE_INTEGER : this.outstanding;
        pos = scanner.scan(chunk, pos, limit);
        if (scanner.error !== '') return this.desync(chunk, from, scanner.error);
        this.outstanding -= scanner.replies;
        if (scanner.errorEnded && this.redirects !== null) from = this.redirects.lineEnded(chunk, from, pos);
        if (this.outstanding < 0) this.unexpectedReplies(chunk, from);
        if (this.redirects?.waiting) return this.startRedirectWait(chunk.subarray(pos));
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
        if (this.redirects?.waiting) return this.startRedirectWait(chunk.subarray(pos));
        continue;
      }
      if (scanner.isPush) continue;
      this.port.writeClient(chunk.subarray(from, frameBegin));
      // A reply that goes on in the next chunk keeps a copy of this part.
      const part = chunk.subarray(frameBegin, pos);
      this.captureParts.push(scanner.atFrameBoundary ? part : Buffer.from(part));
      from = pos;
      if (scanner.atFrameBoundary) this.captured();
    }
    if (from >= chunk.length) return;
    if (scanner.inErrorLine && this.redirects?.holdAtChunkEnd(chunk, from)) return;
    this.port.writeClient(from === 0 ? chunk : chunk.subarray(from));
  }

  /** A redirect line waits for the topology: `rest`, and every chunk after it, waits behind it. */
  private startRedirectWait(rest: Buffer): void {
    const waiting = this.redirects?.waiting;
    this.behindRedirect = [];
    this.bytesBehindRedirect = 0;
    this.port.repliesWaiting(true);
    this.waitBehindRedirect(rest);
    void waiting?.checked.then(() => {
      if (this.redirects?.waiting === waiting) this.endRedirectWait();
    });
  }

  private waitBehindRedirect(chunk: Buffer): void {
    if (chunk.length === 0) return;
    (this.behindRedirect as Buffer[]).push(Buffer.from(chunk));
    this.bytesBehindRedirect += chunk.length;
    if (this.bytesBehindRedirect > MAX_BYTES_BEHIND_REDIRECT) this.endRedirectWait();
  }

  /** The waiting line goes out, then what waited behind it, as if it arrived now (it may wait again at a later redirect). */
  private endRedirectWait(): void {
    const behind = this.behindRedirect as Buffer[];
    const redirects = this.redirects as RedirectLines;
    this.behindRedirect = null;
    if (this.port.clientGone) {
      redirects.drop();
      return;
    }
    redirects.release();
    for (const chunk of behind) this.process(chunk);
    if (this.behindRedirect === null) this.port.repliesWaiting(false);
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
