/**
 * EXEC's reply after a transaction whose lock pairs went with NX (expire-nx.ts), walked as it
 * streams from Redis: each expiry's element that NX answered `:0` is given back as `:1`, as Redis
 * alone answers an expiry right after the increment made sure the key exists. `:0` and `:1` have
 * the same length, so the byte is changed where it lies, in the chunk on its way to the client:
 * nothing of the reply is kept, and a 200 MB GET queued after the pair streams as any reply,
 * with a slow client's backpressure reaching Redis.
 *
 * The array's own count says how many elements it has; a push inside it (Redis 6 sends a tracking
 * invalidation in the middle of EXEC's array, and so does DEBUG PROTOCOL push) is no element of
 * it, and the scanner passes over it. What is kept between chunks is the walker's place: the
 * element it is in, and whether the element to restore began with `:` as the last byte of the
 * chunk before (its digit then comes first in the next one).
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
const PUSH = 0x3e;
/** Longer than any count Redis can send: past it the count line is not one. */
const MAX_COUNT = 2 ** 32;

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
  /** The element after which no element is to be restored. */
  private readonly lastIndex: number;

  /** `indexes`: the elements to restore, ascending (the expiries' places among the queued commands). */
  constructor(private readonly indexes: readonly number[]) {
    this.lastIndex = indexes.length === 0 ? -1 : indexes[indexes.length - 1];
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
    while (pos < end && !this.done && this.error === '' && !(this.stopAfterTargets && this.targetsDone)) {
      switch (this.step) {
        case Step.Type:
          if (buf[pos] !== 0x2a /* * */) return this.fail(pos, 'the reply is not an array');
          pos++;
          this.step = Step.Count;
          break;
        case Step.Count:
          pos = this.readCount(buf, pos, end);
          break;
        case Step.CountLf:
          pos++; // the LF, unchecked, as Redis and the reply scanner skip it
          if (this.negative || this.count === 0)
            this.done = true; // a null array (a WATCH abort), or nothing queued
          else this.step = Step.Elements;
          break;
        case Step.Elements:
          pos = this.walkElements(buf, pos, end);
          break;
      }
    }
    return pos;
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
      if (buf[pos] === ZERO) buf[pos] = ONE;
    }
    while (pos < end) {
      if (elements.atFrameBoundary && buf[pos] !== PUSH && this.indexes[this.next] === this.element) {
        // An integer from Redis has no leading zero: one whose first digit is 0 is `:0`.
        this.next++;
        if (buf[pos] === COLON) {
          if (pos + 1 === end) this.digitNext = true;
          else if (buf[pos + 1] === ZERO) buf[pos + 1] = ONE;
        }
      }
      pos = elements.scan(buf, pos, 1, true);
      if (elements.error !== '') return this.fail(pos, elements.error);
      if (!elements.atFrameBoundary) return pos; // the element goes on in the next chunk
      if (elements.isPush) continue; // out of band: no element of the array
      this.element++;
      if (this.element === this.count) {
        this.done = true;
        return pos;
      }
      if (this.stopAfterTargets && this.element > this.lastIndex) return pos;
    }
    return pos;
  }

  private fail(pos: number, reason: string): number {
    this.error = reason;
    return pos;
  }
}

/**
 * A whole EXEC reply (captured with --cluster, where the topology in it is rewritten too) with
 * each of `indexes` restored in place; anything that is not an array (EXECABORT, an error at EXEC,
 * a null) is left as it is.
 */
export function restoreExpiryReplies(reply: Buffer, indexes: readonly number[]): Buffer {
  new ExpiryRestore(indexes).walk(reply, 0);
  return reply;
}
