/**
 * Streaming framer for the client-to-server direction.
 *
 * It finds where each command frame starts and ends, and reads just enough of
 * its head (command name, first key, one small argument) for the proxy to
 * decide what to do with it. Argument bodies beyond the head are skipped by
 * length, never copied, so a 100 MB SET costs the same as a PING.
 *
 * The grammar mirrors how Redis itself reads requests (networking.c
 * processMultibulkBuffer / processInlineBuffer), so that the proxy and Redis
 * always agree on frame boundaries:
 *   - a frame starting with `*` is a multibulk: `*<n>\r\n` then n times
 *     `$<len>\r\n<len bytes>\r\n`. Counts are parsed like Redis's string2ll
 *     (no `+`, no leading zeros); the two bytes after a body are skipped
 *     without being checked, as Redis does. `*0` and `*-1` are empty frames.
 *   - anything else is an inline command: one line up to `\n`.
 * Input Redis would reject with a protocol error sets `malformed`; the proxy
 * then stops interpreting and lets Redis answer it.
 *
 * The scanner is resumable at any byte: TCP may split a frame anywhere.
 */
import { argsNeeded, classifyCommand, Cmd, MAX_CLASSIFIED_NAME } from './commands.js';
import { isPrefixOfNumber, NumberLine, ShortNumberLine } from './number-line.js';

/** Redis's PROTO_INLINE_MAX_SIZE: longest inline request or count line it accepts. */
export const MAX_LINE = 64 * 1024;
/** Longest key the proxy captures; a longer key is never a rewrite candidate. */
export const MAX_CAPTURED_KEY = 1024;
/** Longest second argument captured (an integer needs at most 20 bytes). */
export const MAX_CAPTURED_VALUE = 32;
/** Longest third to fifth argument captured (an option word such as NX or EX, or an integer of up to 20 bytes). */
export const MAX_CAPTURED_OPTION = 20;

/** Bits of `RequestScanner.event`. HEAD and END may be set together. */
export const HEAD = 1;
export const END = 2;
export const MALFORMED = 4;

/** C's isspace(): space, \t, \n, \v, \f, \r. */
function isSpace(byte: number): boolean {
  return byte === 0x20 || (byte >= 0x09 && byte <= 0x0d);
}

/** Where sdssplitargs ends an unquoted argument: space, \t, \r, \n (NUL is handled apart). */
function isArgumentEnd(byte: number): boolean {
  return byte === 0x20 || byte === 0x09 || byte === 0x0d || byte === 0x0a;
}

const enum State {
  FrameStart,
  CountLine,
  CountLf,
  Dollar,
  BulkLine,
  BulkLf,
  Body,
  BodyCrlf,
  Inline,
}

export class RequestScanner {
  /** What the last `next()` call produced: a bitmask of HEAD, END, MALFORMED, or 0 (needs more bytes). */
  event = 0;
  /** Offset of the current frame's first byte in the current chunk, or -1 if it began in an earlier chunk. */
  frameStart = -1;

  // The current frame's head, valid from its HEAD event until the next frame starts.
  cmd: Cmd = Cmd.Other;
  /** Number of arguments including the name (0 for an empty frame); for inline commands, whitespace-separated words. */
  argc = 0;
  /** True for an inline (telnet-style) command; its arguments are never captured. */
  inline = false;
  /**
   * True for an inline command the proxy does not interpret: one with quotes
   * (Redis unquotes and unescapes them), or with a NUL byte (Redis's C-string
   * line search does not see past it, so it may not even end the line there).
   */
  inlineOpaque = false;
  /**
   * True for an inline command whose name itself the proxy does not read: a quote or a NUL in it
   * or before it. What Redis runs is then unknown (it could be EXEC).
   */
  nameOpaque = false;
  /** True when a captured argument was longer than its capture buffer. */
  oversize = false;
  /** Argument 1 (usually the key), valid for `key.subarray(0, keyLength)`. */
  readonly key = Buffer.allocUnsafe(MAX_CAPTURED_KEY);
  readonly keyStart = 0;
  keyLength = 0;
  /** Argument 2 (a delta or a TTL for the commands the proxy rewrites), valid for `value.subarray(0, valueLength)`. */
  readonly value = Buffer.allocUnsafe(MAX_CAPTURED_VALUE);
  readonly valueStart = 0;
  valueLength = 0;
  /** Arguments 3 to 5, for the commands that need them (SET's NX and EX n, in either order), valid for their lengths. */
  readonly arg3 = Buffer.allocUnsafe(MAX_CAPTURED_OPTION);
  arg3Length = 0;
  readonly arg4 = Buffer.allocUnsafe(MAX_CAPTURED_OPTION);
  arg4Length = 0;
  readonly arg5 = Buffer.allocUnsafe(MAX_CAPTURED_OPTION);
  arg5Length = 0;
  /** Why the stream is not valid RESP, when MALFORMED was reported. */
  malformedReason = '';

  private state = State.FrameStart;
  private readonly line = new NumberLine();
  /** The usual count and length lines, read at once. */
  private readonly shortLine = new ShortNumberLine();
  private readonly name = Buffer.allocUnsafe(MAX_CLASSIFIED_NAME);
  private nameLength = 0;
  private argIndex = 0;
  /** Arguments to read before HEAD can be reported. */
  private headArgs = 1;
  private headReported = false;
  private bodyLeft = 0;
  private bodyLength = 0;
  /** Where the current argument body is copied to, if anywhere. */
  private captureTarget: Buffer | null = null;
  private captured = 0;
  private crlfLeft = 0;
  private inlineLength = 0;
  /** Inside an inline argument (between its first byte and the next whitespace). */
  private inToken = false;
  /** A NUL was seen on this inline line: Redis reads no further. */
  private inlineCut = false;

  /** True when the scanner is between frames. */
  get atFrameBoundary(): boolean {
    return this.state === State.FrameStart;
  }

  /** True inside a frame whose head has not been reported yet. */
  get awaitingHead(): boolean {
    return this.state !== State.FrameStart && !this.headReported;
  }

  /**
   * Whether the frame read so far, its head not complete yet, can still turn out to be the
   * command `name` (upper case) with exactly `argc` arguments, written as a RESP array. Lets
   * the proxy keep back only the bytes of a frame it may have to hold (a MULTI), and forward
   * any other frame's bytes as they arrive.
   */
  couldStillBe(name: Buffer, argc: number): boolean {
    switch (this.state) {
      case State.FrameStart:
        return true;
      case State.Inline:
        return false;
      case State.CountLine:
        return isPrefixOfNumber(this.line, argc);
      case State.CountLf:
        return this.line.result() === argc;
      default:
        if (this.argc !== argc) return false;
        if (this.argIndex > 0) return this.nameLength === name.length && this.nameStartsAs(name, name.length);
    }
    // Reading the name, argument 0.
    switch (this.state) {
      case State.Dollar:
        return true;
      case State.BulkLine:
        return isPrefixOfNumber(this.line, name.length);
      case State.BulkLf:
        return this.line.result() === name.length;
      default:
        return this.bodyLength === name.length && this.nameStartsAs(name, this.captured);
    }
  }

  /** The first `count` bytes of the name read are those of `name` (upper-case letters), in any case. */
  private nameStartsAs(name: Buffer, count: number): boolean {
    for (let i = 0; i < count; i++) {
      if ((this.name[i] & 0xdf) !== name[i]) return false;
    }
    return true;
  }

  /** Call before scanning a new chunk. */
  newChunk(): void {
    this.frameStart = -1;
  }

  /**
   * Scans `buf` from `pos` until an event happens or the chunk ends, and
   * returns the offset just after the last byte consumed.
   */
  next(buf: Buffer, pos: number): number {
    this.event = 0;
    const end = buf.length;
    while (pos < end) {
      switch (this.state) {
        case State.FrameStart:
          this.startFrame(pos);
          if (buf[pos] === 0x2a /* * */) {
            const after = this.shortLine.read(buf, pos + 1);
            if (after > 0) {
              // The usual frame head, read at once.
              pos = after;
              this.argc = this.shortLine.value;
              this.argIndex = 0;
              this.state = State.Dollar;
              break;
            }
            this.state = State.CountLine;
            this.line.reset();
            pos++;
          } else {
            this.inline = true;
            this.state = State.Inline;
          }
          break;

        case State.CountLine:
        case State.BulkLine: {
          const byte = buf[pos++];
          if (byte === 0x0d) {
            this.state = this.state === State.CountLine ? State.CountLf : State.BulkLf;
          } else {
            this.line.push(byte);
            if (this.line.length > MAX_LINE) return this.fail(pos, 'count line too long');
          }
          break;
        }

        case State.CountLf: {
          pos++; // Redis skips the byte after '\r' without checking it.
          const count = this.line.result();
          if (count === undefined || count > 0x7fffffff) return this.fail(pos, 'invalid multibulk length');
          if (count <= 0) {
            this.cmd = Cmd.Empty;
            this.argc = 0;
            return this.finishFrame(pos, HEAD | END);
          }
          this.argc = count;
          this.argIndex = 0;
          this.state = State.Dollar;
          break;
        }

        case State.Dollar: {
          if (buf[pos] !== 0x24 /* $ */) return this.fail(pos, `expected '$', got '${String.fromCharCode(buf[pos])}'`);
          const after = this.shortLine.read(buf, pos + 1);
          if (after > 0) {
            pos = after;
            this.startBody(this.shortLine.value);
            if (this.event !== 0) return pos;
            break;
          }
          pos++;
          this.line.reset();
          this.state = State.BulkLine;
          break;
        }

        case State.BulkLf: {
          pos++;
          // Redis's own limit (proto-max-bulk-len) is Redis's to apply: the body streams to it.
          const length = this.line.result();
          if (length === undefined || length < 0 || length > Number.MAX_SAFE_INTEGER) return this.fail(pos, 'invalid bulk length');
          this.startBody(length);
          if (this.event !== 0) return pos;
          break;
        }

        case State.Body: {
          const n = Math.min(this.bodyLeft, end - pos);
          if (this.captureTarget !== null) {
            // Captures are a few bytes: a plain loop beats Buffer#copy's call overhead.
            const target = this.captureTarget;
            for (let i = 0; i < n; i++) target[this.captured + i] = buf[pos + i];
            this.captured += n;
          }
          this.bodyLeft -= n;
          pos += n;
          if (this.bodyLeft === 0) {
            this.state = State.BodyCrlf;
            this.crlfLeft = 2;
          }
          break;
        }

        case State.BodyCrlf: {
          const n = Math.min(this.crlfLeft, end - pos);
          this.crlfLeft -= n;
          pos += n;
          if (this.crlfLeft === 0) {
            this.finishArgument();
            if (this.argIndex === this.argc) return this.finishFrame(pos, this.headReported ? END : HEAD | END);
            this.state = State.Dollar;
            if (this.event !== 0) return pos;
          }
          break;
        }

        case State.Inline: {
          const newline = buf.indexOf(0x0a, pos);
          const stop = newline === -1 ? end : newline;
          this.readInlineHead(buf, pos, stop);
          this.inlineLength += stop - pos;
          if (newline === -1) {
            if (this.inlineLength > MAX_LINE) return this.fail(end, 'too big inline request');
            return end;
          }
          return this.finishInline(newline + 1);
        }
      }
    }
    return pos;
  }

  private startFrame(pos: number): void {
    this.frameStart = pos;
    this.cmd = Cmd.Other;
    this.argc = 0;
    this.inline = false;
    this.inlineOpaque = false;
    this.nameOpaque = false;
    this.oversize = false;
    this.keyLength = 0;
    this.valueLength = 0;
    this.arg3Length = 0;
    this.arg4Length = 0;
    this.arg5Length = 0;
    this.nameLength = 0;
    this.headArgs = 1;
    this.headReported = false;
    this.inlineLength = 0;
    this.inToken = false;
    this.inlineCut = false;
  }

  /** Sets up reading one argument body of `length` bytes, and reports HEAD early when the head is known. */
  private startBody(length: number): void {
    this.bodyLeft = length;
    this.bodyLength = length;
    this.captured = 0;
    this.captureTarget = null;
    this.state = length === 0 ? State.BodyCrlf : State.Body;
    this.crlfLeft = 2;
    if (this.headReported) return;
    const index = this.argIndex;
    const capacity =
      index === 0 ? MAX_CLASSIFIED_NAME : index === 1 ? MAX_CAPTURED_KEY : index === 2 ? MAX_CAPTURED_VALUE : MAX_CAPTURED_OPTION;
    if (length > capacity) {
      // Too long to be anything the proxy acts on: the head is as known as it will be.
      this.oversize = true;
      if (index === 0) this.nameLength = length;
      this.reportHead();
      return;
    }
    this.captureTarget =
      index === 0
        ? this.name
        : index === 1
          ? this.key
          : index === 2
            ? this.value
            : index === 3
              ? this.arg3
              : index === 4
                ? this.arg4
                : this.arg5;
  }

  private finishArgument(): void {
    if (this.captureTarget !== null) {
      if (this.argIndex === 0) {
        this.nameLength = this.bodyLength;
        this.cmd = classifyCommand(this.name, 0, this.bodyLength);
        this.headArgs = Math.min(argsNeeded(this.cmd, this.argc), this.argc);
      } else if (this.argIndex === 1) {
        this.keyLength = this.bodyLength;
      } else if (this.argIndex === 2) {
        this.valueLength = this.bodyLength;
      } else if (this.argIndex === 3) {
        this.arg3Length = this.bodyLength;
      } else if (this.argIndex === 4) {
        this.arg4Length = this.bodyLength;
      } else {
        this.arg5Length = this.bodyLength;
      }
      this.captureTarget = null;
    }
    this.argIndex++;
    if (!this.headReported && this.argIndex >= this.headArgs && this.argIndex < this.argc) this.reportHead();
  }

  private reportHead(): void {
    this.headReported = true;
    this.event = HEAD;
  }

  private finishFrame(pos: number, event: number): number {
    this.state = State.FrameStart;
    this.headReported = true;
    this.event = event;
    return pos;
  }

  /**
   * Counts the arguments of an inline command and keeps the first (its name),
   * splitting as Redis's sdssplitargs does: whitespace (isspace) is skipped
   * between arguments, an argument ends at space, tab, CR, LF or NUL, and
   * nothing after a NUL is read at all (it works on C strings).
   */
  private readInlineHead(buf: Buffer, from: number, to: number): void {
    for (let i = from; i < to && !this.inlineCut; i++) {
      const byte = buf[i];
      if (byte === 0x22 || byte === 0x27) {
        // " or ': a quote that begins or is inside the first argument hides the name.
        this.inlineOpaque = true;
        if (this.argc === 0 || (this.argc === 1 && this.inToken)) this.nameOpaque = true;
      }
      if (byte === 0x00) {
        this.inlineCut = true;
        this.inlineOpaque = true;
        this.nameOpaque = true;
      } else if (this.inToken ? isArgumentEnd(byte) : isSpace(byte)) {
        this.inToken = false;
      } else {
        if (!this.inToken) {
          this.inToken = true;
          this.argc++;
        }
        if (this.argc === 1) {
          if (this.nameLength < MAX_CLASSIFIED_NAME) this.name[this.nameLength] = byte;
          this.nameLength++;
        }
      }
    }
  }

  private finishInline(pos: number): number {
    // A blank line is ignored by Redis: nothing runs, no reply.
    this.cmd = this.argc === 0 ? Cmd.Empty : classifyCommand(this.name, 0, this.nameLength);
    return this.finishFrame(pos, HEAD | END);
  }

  private fail(pos: number, reason: string): number {
    this.malformedReason = reason;
    this.event = MALFORMED;
    return pos;
  }
}
