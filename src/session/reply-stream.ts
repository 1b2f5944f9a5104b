/**
 * The server-to-client side of one connection: replies are counted (not decoded) against what
 * was forwarded, so that the replies to the proxy's own commands (the server's version, the lock
 * script, AUTH/SELECT at connect and after RESET, a cluster reply to rewrite) are found and taken
 * aside, in order, and everything else goes to the client untouched. Replies expected for
 * forwarded frames come first (`outstanding`); then marks (reply-marks.ts), in order, each
 * followed by the replies of frames forwarded after it. After a RESET in a plain pipe, replies
 * pass uncounted until the refusal of the proxy's marker command (reset-marker.ts); the scanner
 * goes on finding frames in such a pipe, as a read from Redis may end anywhere in one.
 *
 * When the count is lost (more replies than requests, a stream that is not RESP), the connection
 * stops being interpreted, unless a reply of the proxy's own is due: then its state is unknown,
 * and the session closes rather than fake it. With --cluster, -MOVED/-ASK lines are rewritten
 * (error-lines.ts); one that names a node not known yet waits for the topology, and the bytes
 * Redis sends after it wait behind it, in order.
 *
 * A reply of the proxy's own is bounded by --own-reply-timeout-ms of Redis's silence once it is
 * due (silence-bound.ts: for the marker, from when it was sent), counted only while the proxy
 * reads from Redis. A chunk is valid only during the process() call that gets it (the upstream
 * connection reads into the same memory again): whatever is kept past it is copied.
 */
import type { LockBlockRef } from '../lock/block-flow.js';
import type { ExpiryRestore } from '../lock/exec-reply.js';
import { ReplyScanner } from '../resp/reply-scanner.js';
import { ErrorLines, type LineWatch } from './error-lines.js';
import { HeldLine } from './held-line.js';
import type { Mark } from './reply-marks.js';
import { SilenceBound } from './silence-bound.js';
import type { ResetMarker, ResetOutcome } from './reset-marker.js';

/**
 * Bytes from Redis that may wait behind a line that waits (reading from Redis pauses
 * meanwhile, but a read may be under way): past this, the wait ends and the line goes on as it is.
 */
const MAX_BYTES_BEHIND_LINE = 1024 * 1024;

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
  /** A reply of the proxy's own did not come within its bound (`what` names it). */
  ownReplyLate(what: string, waitedMs: number): void;
  /** Replies wait behind a line that waits (true), or go on again (false): reading from Redis may pause meanwhile. */
  repliesWaiting(waiting: boolean): void;
  /** An exception on the connection's data path, from a timer or a promise: it ends the session, never the process. */
  fault(error: unknown): void;
}

const EMPTY = Buffer.alloc(0);

export class ReplyStream {
  private readonly scanner = new ReplyScanner();
  /** Replies still expected for forwarded frames, before any mark. */
  private outstanding = 0;
  /** Marks still ahead, in stream order. */
  private marks: Mark[] = [];
  private captureParts: Buffer[] = [];
  /** Replies are no longer counted: bytes go to the client as they come. */
  private passing = false;
  /** Stop counting once the marks due now are passed (the connection became a pipe). */
  private passWhenDone = false;
  /** In a pipe that a RESET may end: frames are still found (not counted), for the marker's refusal. */
  private followFrames = false;
  /** Error lines acted on: -MOVED/-ASK with --cluster, the marker's refusal after a RESET. */
  private readonly lines: ErrorLines;
  /** In front of a cluster: -MOVED/-ASK lines are rewritten, even once replies are no longer counted. */
  private redirectScan: boolean;
  /** The line just ended was a marker's refusal, the last of the proxy's lines ('end') or not ('step'). */
  private markerFound: 'end' | 'step' | null = null;
  /** Chunks from Redis that arrived after a line that waits (ErrorLines.waiting), in order. */
  private behindLine: Buffer[] | null = null;
  private bytesBehindLine = 0;
  /** The bound on the reply of the proxy's own due now (silence-bound.ts). */
  private readonly bound: SilenceBound<Mark>;
  /** The proxy does not read from Redis for now (readsPaused): no bound runs. */
  private paused = false;
  /** A line that may be the proxy's, after a RESET (held-line.ts). */
  private readonly held: HeldLine;

  /** `redirects`: with --cluster, the rewriting of -MOVED/-ASK lines (cluster/node-replies.ts). */
  constructor(
    private readonly port: ReplyStreamPort,
    private readonly redirects: LineWatch | null,
    ownReplyTimeoutMs: number,
  ) {
    this.bound = new SilenceBound<Mark>(ownReplyTimeoutMs, {
      late: (mark, waitedMs) =>
        port.ownReplyLate(mark.kind === 'marker' ? 'the RESET marker' : 'a reply to a command of its own', waitedMs),
      fault: (error) => port.fault(error),
    });
    this.redirectScan = redirects !== null;
    this.scanner.trackErrors = redirects !== null;
    this.held = new HeldLine((bytes) => port.writeClient(bytes), MAX_BYTES_BEHIND_LINE);
    this.lines = new ErrorLines(this.scanner, (bytes) => this.held.out(bytes), {
      couldBe: (head) => (this.markerDue()?.couldStart(head) ?? false) || (redirects?.couldBe(head) ?? false),
      replace: (line) => this.replaceLine(line),
      skipped: () => {
        const marker = this.markerDue();
        marker?.skipped();
        if (marker?.heldAction !== 'keep') this.held.release(true);
      },
    });
  }

  /** Whether chunks can go to the client without being looked at. */
  get passingThrough(): boolean {
    return this.passing && !this.redirectScan && !this.followFrames && this.behindLine === null;
  }

  /**
   * Whether the replies are followed frame by frame: a RESET's marker can be found. Not once the
   * stream held something the scanner cannot read; the session then leaves a RESET in the pipe.
   */
  get framesFollowed(): boolean {
    return this.scanner.error === '';
  }

  /** Whether any reply is still due: for a forwarded frame, or of the proxy's own, or one waiting behind a line. */
  get pending(): boolean {
    return this.outstanding > 0 || this.marks.length > 0 || this.behindLine !== null;
  }

  /** Whether a reply of the proxy's own is still due. */
  get capturing(): boolean {
    return this.marks.length > 0;
  }

  /** Whether more than `n` replies are still due (the last `n` counted may be for commands not yet whole). */
  dueBeyond(n: number): boolean {
    let due = this.outstanding + (this.behindLine === null ? 0 : 1);
    if (due > n) return true;
    for (const mark of this.marks) {
      due += 1 + mark.after;
      if (due > n) return true;
    }
    return false;
  }

  /** The session stops reading from Redis for the client's sake, or reads again: the bound runs only while it reads. */
  readsPaused(paused: boolean): void {
    if (paused === this.paused) return;
    this.paused = paused;
    if (paused) this.bound.stop();
    else this.clockOwnReply();
  }

  /** The lock blocks whose replies are still due, in order: what a close now would keep from the client. */
  lockBlocksDue(): LockBlockRef[] {
    const due: LockBlockRef[] = [];
    for (const mark of this.marks) if ((mark.kind === 'capture' || mark.kind === 'restore') && mark.lock !== undefined) due.push(mark.lock);
    return due;
  }

  /** `count` replies come for frames just forwarded: after the last mark, if any. */
  expect(count: number): void {
    if (this.marks.length === 0) this.outstanding += count;
    else this.marks[this.marks.length - 1].after += count;
  }

  /**
   * The reply to the command just sent is taken aside: it goes to `handle`, not to the client.
   * By default it is a command of the proxy's own, whose reply has a bound. `clients`: it is the
   * client's own command, whose reply the proxy changes (EXEC's array): no bound (Redis answers
   * its client in its own time), and an error in its place is Redis's own, passed on as any reply.
   * `lock`: the reply carries a lock block's replies (lockBlocksDue). `errorPasses`: asked when
   * the reply is a simple error; true passes it on to the client as the answer to one of its own
   * commands (a -MOVED/-ASK rewritten like any other), and `handle` is not called.
   */
  capture(handle: (reply: Buffer) => void, clients = false, lock?: LockBlockRef, errorPasses?: () => boolean): void {
    this.marks.push({ kind: 'capture', handle, timed: !clients, errorsPass: clients || (errorPasses ?? false), lock, after: 0 });
    this.passing = false;
    this.clockOwnReply();
  }

  /** The reply to the EXEC just sent is walked as it streams, its expiries restored (`restore`). */
  restoreExpiries(restore: ExpiryRestore, lock: LockBlockRef): void {
    this.marks.push({ kind: 'restore', restore, lock, after: 0 });
    this.passing = false;
  }

  /** The reply to the frame just forwarded is counted as any other, and its first byte told to `seen`. */
  peek(seen: (first: number) => void): void {
    this.marks.push({ kind: 'peek', seen, after: 0 });
    this.passing = false;
  }

  /**
   * The client sent RESET in a plain pipe, and `marker`'s commands after it: what comes before
   * its refusal passes uncounted, its lines are dropped, `found` is told what became of the
   * RESET, and from there on replies are counted again.
   */
  awaitMarker(marker: ResetMarker, found: (outcome: ResetOutcome) => void): void {
    this.marks.push({ kind: 'marker', marker, found, after: 0 });
    this.passing = false;
    this.passWhenDone = false;
    this.scanner.trackErrors = true;
    this.scanner.trackSimple ||= marker.watchesSimple;
    this.clockOwnReply();
  }

  /** Replies stop being counted, at once or after the marks due; `resettable`: a RESET may end the pipe. */
  stopCounting(resettable: boolean): void {
    this.passWhenDone = true;
    this.followFrames = resettable;
    if (this.marks.length === 0) this.startPassing();
  }

  /** Redis closed: a line that waits, and one held across reads, go to the client now. */
  flush(): void {
    while (this.behindLine !== null) this.endLineWait();
    this.lines.flush();
    this.held.release(true);
  }

  /** The connection is closed: no bound runs any more. */
  stop(): void {
    this.bound.stop();
  }

  /** One chunk from Redis. */
  process(chunk: Buffer): void {
    // Redis is not silent: a bound that runs counts from here.
    this.bound.heard();
    if (this.behindLine !== null) return this.waitBehindLine(chunk);
    const scanner = this.scanner;
    scanner.newChunk();
    let pos = 0;
    /** Start of the bytes of this chunk not yet forwarded or captured. */
    let from = 0;
    while (pos < chunk.length && !this.port.clientGone) {
      if (this.passing) {
        // Replies are no longer counted; in front of a cluster, redirects still name nodes, and
        // where a RESET may end the pipe, frames are still followed.
        if (!this.redirectScan && !this.followFrames) break;
        pos = scanner.scan(chunk, pos, Number.MAX_SAFE_INTEGER);
        if (scanner.error !== '') {
          this.redirectScan = false;
          this.followFrames = false;
          break;
        }
        if (scanner.errorEnded) from = this.lines.lineEnded(chunk, from, pos);
        if (this.lines.waiting) return this.startLineWait(chunk.subarray(pos));
        continue;
      }
      if (this.marks.length === 0 || this.outstanding > 0) {
        const limit = this.marks.length === 0 ? Number.MAX_SAFE_INTEGER : this.outstanding;
        pos = scanner.scan(chunk, pos, limit);
        if (scanner.error !== '') return this.desync(chunk, from, scanner.error);
        this.outstanding -= scanner.replies;
        if (scanner.errorEnded) from = this.lines.lineEnded(chunk, from, pos);
        if (this.outstanding < 0) this.unexpectedReplies(chunk, from);
        if (this.lines.waiting) return this.startLineWait(chunk.subarray(pos));
        continue;
      }
      if (this.marks[0].kind === 'marker') {
        // Replies pass uncounted until the marker's refusal, at whatever depth they seem to leave it.
        pos = scanner.scan(chunk, pos, Number.MAX_SAFE_INTEGER);
        if (scanner.error !== '') return this.desync(chunk, from, scanner.error);
        if (scanner.errorEnded) from = this.lines.lineEnded(chunk, from, pos);
        if (this.markerFound === 'end') this.markerPassed();
        else if (this.markerFound === 'step') this.markerStep();
        else if (this.lines.waiting) return this.startLineWait(chunk.subarray(pos));
        continue;
      }
      // The next frame is the mark's: a reply of the proxy's own (pushes excepted).
      const head = this.marks[0];
      if (head.kind === 'restore') {
        pos = this.walkRestore(head, chunk, pos);
        if (pos < 0) return this.desync(chunk, from, head.restore.error || scanner.error);
        from = this.leaveOut(chunk, from, head.restore.edits);
        continue;
      }
      if (head.kind === 'peek') {
        pos = this.peekAt(head, chunk, pos);
        if (pos < 0) return this.desync(chunk, from, scanner.error);
        continue;
      }
      if (
        head.kind === 'capture' &&
        head.errorsPass !== false &&
        scanner.atFrameBoundary &&
        this.captureParts.length === 0 &&
        chunk[pos] === 0x2d /* - */ &&
        (head.errorsPass === true || head.errorsPass())
      ) {
        // An error where the mark wanted an array (EXEC refused as a whole), or one that answers a
        // client's command: Redis's own, passed on as any counted reply, so that a -MOVED/-ASK is
        // rewritten like any other.
        this.passMark();
        this.outstanding++;
        continue;
      }
      const frameBegin = scanner.atFrameBoundary ? pos : from;
      pos = scanner.scan(chunk, pos, 1, true);
      if (scanner.error !== '') return this.desync(chunk, from, scanner.error);
      if (scanner.isPush) continue;
      this.port.writeClient(chunk.subarray(from, frameBegin));
      // A reply that goes on in the next chunk keeps a copy of this part.
      const part = chunk.subarray(frameBegin, pos);
      this.captureParts.push(scanner.atFrameBoundary ? part : Buffer.from(part));
      from = pos;
      if (scanner.atFrameBoundary) this.captured();
    }
    this.clockOwnReply();
    if (from >= chunk.length) return;
    if (scanner.inErrorLine && this.lines.holdAtChunkEnd(chunk, from)) return;
    this.held.out(from === 0 ? chunk : chunk.subarray(from));
  }

  /**
   * EXEC's reply to restore, from `pos`: pushes before it pass as they are, a reply that is not an
   * array is counted as any other, an array is walked. The mark is passed at the reply's end, or
   * once its last expiry is restored where the connection becomes a pipe after it (what later
   * elements hold may not be countable). Returns the offset reached, -1 when it cannot be read.
   */
  private walkRestore(head: Mark & { kind: 'restore' }, chunk: Buffer, pos: number): number {
    const scanner = this.scanner;
    const restore = head.restore;
    if (!restore.started) {
      if (!scanner.atFrameBoundary || chunk[pos] === 0x3e /* > */) {
        pos = scanner.scan(chunk, pos, 1, true);
        return scanner.error === '' ? pos : -1;
      }
      if (chunk[pos] !== 0x2a /* * */) {
        this.passMark();
        this.outstanding++;
        return pos;
      }
    }
    restore.stopAfterTargets = this.passWhenDone;
    pos = restore.walk(chunk, pos);
    if (restore.error !== '') return -1;
    if (restore.done || (restore.stopAfterTargets && restore.targetsDone)) this.passMark();
    return pos;
  }

  /** What the walk of EXEC's reply cut out of this chunk is left out: the bytes before each cut go to the client. Returns the new `from`. */
  private leaveOut(chunk: Buffer, from: number, edits: readonly { start: number; end: number; insert: Buffer | null }[]): number {
    for (const cut of edits) {
      if (cut.start > from) this.port.writeClient(chunk.subarray(from, cut.start));
      if (cut.insert !== null) this.port.writeClient(cut.insert);
      from = cut.end;
    }
    return from;
  }

  /** The reply to peek at, from `pos`: pushes before it pass as they are; its first byte is told, and it is counted. */
  private peekAt(head: Mark & { kind: 'peek' }, chunk: Buffer, pos: number): number {
    const scanner = this.scanner;
    if (!scanner.atFrameBoundary || chunk[pos] === 0x3e /* > */) {
      pos = scanner.scan(chunk, pos, 1, true);
      return scanner.error === '' ? pos : -1;
    }
    this.passMark();
    this.outstanding++;
    head.seen(chunk[pos]);
    return pos;
  }

  /** The marker due now, when the next reply may be its refusal. */
  private markerDue(): ResetMarker | null {
    const mark = this.marks[0];
    return mark !== undefined && mark.kind === 'marker' && this.outstanding === 0 && !this.passing ? mark.marker : null;
  }

  /**
   * What goes out instead of a whole line (error-lines.ts): the proxy's lines after a RESET are
   * dropped (reset-marker.ts), a redirect is rewritten.
   */
  private replaceLine(line: Buffer): ReturnType<LineWatch['replace']> {
    const marker = this.markerDue();
    if (marker !== null) {
      const verdict = marker.line(line);
      if (marker.heldAction !== 'keep') this.held.release(marker.heldAction === 'send');
      if (verdict === 'hold') return this.held.hold(line);
      if (verdict !== 'pass') {
        if (marker.matches(line)) this.markerFound = 'step';
        if (verdict === 'end') this.markerFound = 'end';
        return EMPTY;
      }
      if (line[0] === 0x2b /* + */) return null;
    }
    return this.redirects === null ? null : this.redirects.replace(line);
  }

  /** A marker's refusal was dropped and more of the proxy's lines follow: it stands on its own. */
  private markerStep(): void {
    this.markerFound = null;
    this.scanner.restartAtTopLevel();
  }

  /** The last marker's refusal was dropped: it stands on its own, and replies are counted again after it. */
  private markerPassed(): void {
    this.markerStep();
    const mark = this.passMark();
    this.scanner.trackErrors = this.redirects !== null;
    this.scanner.trackSimple = false;
    for (const later of this.marks) {
      if (later.kind !== 'marker') continue;
      this.scanner.trackErrors = true;
      this.scanner.trackSimple ||= later.marker.watchesSimple;
    }
    if (mark.kind === 'marker') mark.found(mark.marker.outcome);
  }

  /** A line waits: `rest`, and every chunk after it, waits behind it. */
  private startLineWait(rest: Buffer): void {
    const waiting = this.lines.waiting;
    this.behindLine = [];
    this.bytesBehindLine = 0;
    this.port.repliesWaiting(true);
    this.waitBehindLine(rest);
    void waiting?.checked.then(() => {
      try {
        if (this.lines.waiting === waiting) this.endLineWait();
      } catch (error) {
        this.port.fault(error);
      }
    });
  }

  private waitBehindLine(chunk: Buffer): void {
    if (chunk.length === 0) return;
    (this.behindLine as Buffer[]).push(Buffer.from(chunk));
    this.bytesBehindLine += chunk.length;
    if (this.bytesBehindLine > MAX_BYTES_BEHIND_LINE) this.endLineWait();
  }

  /** The waiting line goes out, then what waited behind it, as if it arrived now (it may wait again at a later line). */
  private endLineWait(): void {
    const behind = this.behindLine as Buffer[];
    this.behindLine = null;
    if (this.port.clientGone) {
      this.lines.drop();
      return;
    }
    this.lines.release();
    for (const chunk of behind) this.process(chunk);
    if (this.behindLine === null) this.port.repliesWaiting(false);
  }

  /** The mark at the head is passed: the replies that follow it are counted. */
  private passMark(): Mark {
    const mark = this.marks.shift() as Mark;
    this.outstanding += mark.after;
    if (this.passWhenDone && this.marks.length === 0) this.startPassing();
    return mark;
  }

  /** Replies are no longer counted: what was still expected no longer matters. */
  private startPassing(): void {
    this.passing = true;
    this.outstanding = 0;
  }

  /** A whole reply of the proxy's own is in: to its handler. */
  private captured(): void {
    const reply = this.captureParts.length === 1 ? this.captureParts[0] : Buffer.concat(this.captureParts);
    this.captureParts = [];
    const mark = this.passMark();
    if (mark.kind === 'capture') mark.handle(reply);
  }

  /** Times the proxy's own reply at the head once it is due (the marker at once), while the proxy reads. */
  private clockOwnReply(): void {
    const head = this.marks[0];
    const timed = head !== undefined && (head.kind === 'marker' || (head.kind === 'capture' && head.timed));
    this.bound.time(timed && !this.passing && !this.paused && (this.outstanding === 0 || head.kind === 'marker') ? head : null);
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
    this.held.release(true);
    if (this.capturing) {
      this.port.lost(reason);
      return;
    }
    this.port.writeClient(chunk.subarray(from));
    this.port.untracked(reason, false);
  }
}
