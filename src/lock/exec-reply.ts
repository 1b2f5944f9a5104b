/**
 * EXEC's reply after a transaction whose lock pairs were fixed, walked as it streams from Redis:
 * - each expiry's element that NX (expire-nx.ts) or the conditional-expiry script
 *   (expiry-script.ts) answered `:0` is given back as `:1`, as Redis alone answers an expiry
 *   right after the increment made sure the key exists; the script's `:2` (it did what the client
 *   asked, the user may not read the expiry) is given as `:1` too, and reported (`rearmed`);
 * - the element of each copy of an expiry that the transaction-script way queued only for Redis
 *   to check (`EXPIRE k x`, which fails when run) is cut out, and the array's count says one
 *   element less for each.
 *
 * `:0`, `:1` and `:2` have the same length, so a digit is changed where it lies, in the chunk on
 * its way to the client; a cut is reported as a range of the chunk (`edits`) for the reply side
 * to leave out, with the new count line put where the old one was. Nothing of the reply is kept,
 * and a 200 MB GET queued after the pair streams as any reply, with a slow client's backpressure
 * reaching Redis.
 *
 * The array's own count says how many elements it has; a push inside it (Redis 6 sends a tracking
 * invalidation in the middle of EXEC's array, and so does DEBUG PROTOCOL push) is no element of
 * it, and the scanner passes over it. What is kept between chunks is the walker's place: the
 * element it is in, whether it is cutting, and whether the element to restore began with `:` as
 * the last byte of the chunk before (its digit then comes first in the next one).
 */
import { ReplyScanner } from '../resp/reply-scanner.js';

const enum Step {
  /** Before the reply's type byte. */
  Type,
  /** In the array's count line. */
  Count,
  /** After the count line's CR: the LF. */
  CountLf,
  /** Among the array's elements. */
  Elements,
}

const COLON = 0x3a;
const ZERO = 0x30;
const ONE = 0x31;
const TWO = 0x32;
const PUSH = 0x3e;
/** Longer than any count Redis can send: past it the count line is not one. */
const MAX_COUNT = 2 ** 32;

/** A range of the chunk just walked to leave out of what the client gets, and what goes in its place. */
export interface ReplyCut {
  start: number;
  end: number;
  insert: Buffer | null;
}

/** Which elements of EXEC's reply to change: places among the queued commands, ascending. */
export interface ExecEdits {
  /** Elements whose `:0` (or `:2`) is given as `:1`. */
  readonly restore: readonly number[];
  /** Elements cut out. */
  readonly drop: readonly number[];
}

export class ExpiryRestore {
  /** The whole reply has been walked. */
  done = false;
  /**
   * Stop right after the last element to restore (targetsDone): the connection becomes a plain
   * pipe after this EXEC, and what its later elements hold may not be countable.
   */
  stopAfterTargets = false;
  /** Set when the reply cannot be read as an array: what it says. */
  error = '';
  private step = Step.Type;
  private count = 0;
  private negative = false;
  /** The element being read (0-based). */
  private element = 0;
  /** Position in `indexes` of the next element to restore. */
  private next = 0;
  /** The element to restore began with `:` as the last byte of the chunk before: its digit comes next. */
  private digitNext = false;
  private readonly elements = new ReplyScanner();
  /** The element after which nothing is to be changed. */
  private readonly lastIndex: number;
  private readonly indexes: readonly number[];
  private readonly drop: readonly number[];
  /** Position in `drop` of the next element to cut. */
  private nextDrop = 0;
  /** The count line, or an element, is being cut: since `cutStart` in this chunk (0 when it began before). */
  private cutting = false;
  private cutStart = 0;
  /** The ranges of the chunk last walked to leave out (when elements are cut). */
  readonly edits: ReplyCut[] = [];

  /**
   * `edits`: the elements to restore and to cut (or only those to restore, as an array).
   * `rearmed`: told each `:2` given as `:1` (the lock was re-armed as the client asked).
   */
  constructor(
    edits: ExecEdits | readonly number[],
    private readonly rearmed: () => void = () => {},
  ) {
    this.indexes = 'restore' in edits ? edits.restore : edits;
    this.drop = 'restore' in edits ? edits.drop : [];
    const last = (list: readonly number[]): number => (list.length === 0 ? -1 : list[list.length - 1]);
    this.lastIndex = Math.max(last(this.indexes), last(this.drop));
  }

  /** Whether the walk has begun: the reply's first byte was read. */
  get started(): boolean {
    return this.step !== Step.Type;
  }

  /** Whether every element to restore has been passed, and the walk stands between elements. */
  get targetsDone(): boolean {
    return this.done || (this.step === Step.Elements && this.element > this.lastIndex && this.elements.atFrameBoundary);
  }

  /**
   * Walks `buf` from `pos`, restoring in place, until the reply's end or the buffer's; returns the
   * offset reached. On a reply that is not an array (`error` is set) it stops where it could not go on.
   */
  walk(buf: Buffer, pos: number): number {
    const end = buf.length;
    this.elements.newChunk();
    this.edits.length = 0;
    if (this.cutting) this.cutStart = pos;
    while (pos < end && !this.done && this.error === '' && !(this.stopAfterTargets && this.targetsDone)) {
      switch (this.step) {
        case Step.Type:
          if (buf[pos] !== 0x2a /* * */) return this.fail(pos, 'the reply is not an array');
          if (this.drop.length > 0) {
            // The count line changes: it is cut, and said again once read.
            this.cutting = true;
            this.cutStart = pos;
          }
          pos++;
          this.step = Step.Count;
          break;
        case Step.Count:
          pos = this.readCount(buf, pos, end);
          break;
        case Step.CountLf:
          pos++; // the LF, unchecked, as Redis and the reply scanner skip it
          if (this.cutting) this.cutCountLine(pos);
          if (this.negative || this.count === 0)
            this.done = true; // a null array (a WATCH abort), or nothing queued
          else this.step = Step.Elements;
          break;
        case Step.Elements:
          pos = this.walkElements(buf, pos, end);
          break;
      }
    }
    if (this.cutting && pos > this.cutStart) this.edits.push({ start: this.cutStart, end: pos, insert: null });
    return pos;
  }

  /** The count line, cut, ends before `pos`: the count Redis's array would have without the cut elements takes its place. */
  private cutCountLine(pos: number): void {
    this.cutting = false;
    const count = this.negative ? -this.count : this.count >= this.drop.length ? this.count - this.drop.length : this.count;
    this.edits.push({ start: this.cutStart, end: pos, insert: Buffer.from(`*${count}\r\n`) });
  }

  private readCount(buf: Buffer, pos: number, end: number): number {
    for (; pos < end; pos++) {
      const byte = buf[pos];
      if (byte === 0x0d) {
        this.step = Step.CountLf;
        return pos + 1;
      }
      if (byte === 0x2d /* - */ && !this.negative && this.count === 0) {
        this.negative = true;
        continue;
      }
      const digit = byte - ZERO;
      if (digit < 0 || digit > 9) return this.fail(pos, `unexpected byte 0x${byte.toString(16).padStart(2, '0')} in the array's count`);
      this.count = this.count * 10 + digit;
      if (this.count > MAX_COUNT) return this.fail(pos, "the array's count is too long");
    }
    return pos;
  }

  private walkElements(buf: Buffer, pos: number, end: number): number {
    const elements = this.elements;
    if (this.digitNext) {
      this.digitNext = false;
      this.restoreDigit(buf, pos);
    }
    while (pos < end) {
      if (elements.atFrameBoundary && buf[pos] !== PUSH) {
        if (this.indexes[this.next] === this.element) {
          this.next++;
          if (buf[pos] === COLON) {
            if (pos + 1 === end) this.digitNext = true;
            else this.restoreDigit(buf, pos + 1);
          }
        } else if (this.drop[this.nextDrop] === this.element) {
          this.nextDrop++;
          this.cutting = true;
          this.cutStart = pos;
        }
      }
      pos = elements.scan(buf, pos, 1, true);
      if (elements.error !== '') return this.fail(pos, elements.error);
      if (!elements.atFrameBoundary) return pos; // the element goes on in the next chunk
      if (elements.isPush) continue; // out of band: no element of the array
      if (this.cutting) {
        this.cutting = false;
        this.edits.push({ start: this.cutStart, end: pos, insert: null });
      }
      this.element++;
      if (this.element === this.count) {
        this.done = true;
        return pos;
      }
      if (this.stopAfterTargets && this.element > this.lastIndex) return pos;
    }
    return pos;
  }

  /**
   * The digit of an integer element to restore: an integer from Redis has no leading zero, so one
   * whose first digit is 0 is `:0`; the expiry script answers only 0, 1 or 2, so its 2 is `:2`.
   */
  private restoreDigit(buf: Buffer, pos: number): void {
    if (buf[pos] === ZERO) buf[pos] = ONE;
    else if (buf[pos] === TWO && buf[pos + 1] === 0x0d) {
      buf[pos] = ONE;
      this.rearmed();
    }
  }

  private fail(pos: number, reason: string): number {
    this.error = reason;
    return pos;
  }
}

/**
 * A whole EXEC reply (captured with --cluster, where the topology in it is rewritten too) with
 * its elements restored and cut; anything that is not an array (EXECABORT, an error at EXEC, a
 * null) is left as it is.
 */
export function restoreExpiryReplies(reply: Buffer, edits: ExecEdits | readonly number[], rearmed?: () => void): Buffer {
  const restore = new ExpiryRestore(edits, rearmed);
  restore.walk(reply, 0);
  if (restore.edits.length === 0 || restore.error !== '') return reply;
  const parts: Buffer[] = [];
  let from = 0;
  for (const cut of restore.edits) {
    parts.push(reply.subarray(from, cut.start));
    if (cut.insert !== null) parts.push(cut.insert);
    from = cut.end;
  }
  parts.push(reply.subarray(from));
  return Buffer.concat(parts);
}
