/**
 * Streaming reply counter for the server-to-client direction.
 *
 * It walks RESP2 and RESP3 replies to find where each top-level reply ends,
 * without decoding values: bulk bodies are skipped by length, so a 256 MiB
 * value costs one length line. Push frames (`>`) are out-of-band data, not
 * replies to commands, and are reported separately; one nested inside an aggregate (Redis 6
 * sends a tracking invalidation in the middle of EXEC's array) is no element of it, as the
 * aggregate's count says. An attribute (`|`) is a prefix of the reply it annotates.
 *
 * Resumable at any byte, and allocation-free.
 */

const enum State {
  Type,
  Line,
  LineLf,
  Body,
}

/** What kind of line is being read. */
const enum LineKind {
  /** Simple string, error, integer, null, double, boolean, big number: nothing to keep. */
  Simple,
  /** `$ ! =`: a length, then that many bytes and CRLF. */
  Length,
  /** `* ~ > `: element count. */
  Array,
  /** `%`: pair count. */
  Map,
  /** `|`: pair count, and then the annotated value follows. */
  Attribute,
}

/** The kind of line each type byte starts; -1 for a byte that starts no reply. */
const LINE_KINDS = new Int8Array(256).fill(-1);
for (const type of '+-:_,#(') LINE_KINDS[type.charCodeAt(0)] = LineKind.Simple; // string, error, integer, null, double, boolean, big number
for (const type of '$!=') LINE_KINDS[type.charCodeAt(0)] = LineKind.Length; // bulk string, bulk error, verbatim string
for (const type of '*~>') LINE_KINDS[type.charCodeAt(0)] = LineKind.Array; // array, set, push
LINE_KINDS[0x25] = LineKind.Map; // %
LINE_KINDS[0x7c] = LineKind.Attribute; // |

/** Whether `byte` can start a reply (RESP2 or RESP3): the first byte of a stream that is not RESP cannot. */
export function isReplyTypeByte(byte: number): boolean {
  return LINE_KINDS[byte] >= 0;
}

export class ReplyScanner {
  /** Top-level non-push replies completed by the last `scan()` call. */
  replies = 0;
  /** Set when the stream holds something this scanner cannot follow (for example RESP3 streamed types). */
  error = '';
  /** Offset in the current chunk where the reply in progress (or last completed) began, -1 if in an earlier chunk. */
  frameStart = -1;
  /** Whether the top-level frame in progress (or last completed) is a push. */
  isPush = false;
  /**
   * Stop after every simple error line, at any depth (with --cluster: `-MOVED`
   * and `-ASK` carry node addresses, also inside EXEC arrays).
   */
  trackErrors = false;
  /**
   * With `trackErrors`, simple string lines (`+...`) are stopped after and reported as error
   * lines are (errorEnded, errorStart, inErrorLine): a RESET's answer judged in a pipe
   * (session/reset-marker.ts).
   */
  trackSimple = false;
  /** Set when the last `scan()` stopped right after a simple error line (with `trackErrors`). */
  errorEnded = false;
  /** Offset in the current chunk of the `-` of the error line in progress (or just ended), -1 if in an earlier chunk. */
  errorStart = -1;
  /** Inside a simple error line (with `trackErrors`). */
  inErrorLine = false;

  private state = State.Type;
  private kind = LineKind.Simple;
  /** Values still to be read to complete the current top-level frame; 0 between frames. */
  private need = 0;
  private number = 0;
  private negative = false;
  private bodyLeft = 0;
  /** True until the top-level value's type byte (not an attribute's) has been read. */
  private topLevelTypePending = false;
  /** The line being read is the header of a push nested inside an aggregate: it takes no element's place. */
  private nestedPush = false;

  /** True when the scanner is between top-level frames. */
  get atFrameBoundary(): boolean {
    return this.need === 0 && this.state === State.Type;
  }

  newChunk(): void {
    this.frameStart = -1;
    this.errorStart = -1;
  }

  /**
   * The reply that just ended is known to be a top-level one, whatever came before it: the next
   * byte starts a new top-level frame. Redis can send an aggregate header whose elements never
   * come (an EXEC array counting a queued CLIENT REPLY OFF or SKIP, which answers nothing), so
   * a reply known from elsewhere to stand on its own puts the scanner back in step.
   */
  restartAtTopLevel(): void {
    this.state = State.Type;
    this.need = 0;
    this.inErrorLine = false;
    this.topLevelTypePending = false;
    this.nestedPush = false;
  }

  /**
   * Scans from `pos` and stops after `maxReplies` complete non-push replies,
   * after one complete top-level frame of any kind when `stopAtAnyFrame`, or at
   * the end of the chunk. Returns the offset reached.
   */
  scan(buf: Buffer, pos: number, maxReplies: number, stopAtAnyFrame = false): number {
    this.replies = 0;
    this.errorEnded = false;
    const end = buf.length;
    while (pos < end) {
      if (this.need === 0 && !this.trackErrors) {
        // Between frames: whole simple replies and bulk strings, the usual case, are taken at once.
        let replies = this.replies;
        let start = pos;
        for (;;) {
          const after = this.wholeReply(buf, pos, end);
          if (after < 0) break;
          start = pos;
          pos = after;
          replies++;
          if (stopAtAnyFrame || replies === maxReplies || pos === end) break;
        }
        if (replies !== this.replies) {
          this.replies = replies;
          this.frameStart = start;
          this.isPush = false;
          if (stopAtAnyFrame || replies === maxReplies) return pos;
          continue;
        }
      }
      switch (this.state) {
        case State.Type: {
          if (this.need === 0) {
            this.need = 1;
            this.frameStart = pos;
            this.isPush = false;
            this.topLevelTypePending = true;
          }
          if (this.topLevelTypePending && this.need === 1 && buf[pos] !== 0x7c /* | */) {
            // The frame's own type, after any attributes in front of it.
            this.isPush = buf[pos] === 0x3e; /* > */
            this.topLevelTypePending = false;
            this.nestedPush = false;
          } else {
            this.nestedPush = buf[pos] === 0x3e; /* > */
          }
          if (this.trackErrors && (buf[pos] === 0x2d /* - */ || (this.trackSimple && buf[pos] === 0x2b)) /* + */) {
            this.inErrorLine = true;
            this.errorStart = pos;
          }
          const ok = this.readType(buf[pos++]);
          if (!ok) return pos - 1;
          break;
        }

        case State.Line: {
          // Lines are short: a loop beats indexOf's call into C++.
          if (this.kind === LineKind.Simple) {
            while (pos < end && buf[pos] !== 0x0d) pos++;
          } else {
            for (; pos < end; pos++) {
              const byte = buf[pos];
              if (byte === 0x0d) break;
              if (byte === 0x2d) this.negative = true;
              else this.number = this.number * 10 + (byte - 0x30);
            }
          }
          if (pos === end) return end;
          pos++;
          this.state = State.LineLf;
          break;
        }

        case State.LineLf: {
          pos++;
          const errorLine = this.inErrorLine;
          if (errorLine) {
            // scan() stops right after this line, so errorEnded is false until then.
            this.inErrorLine = false;
            this.errorEnded = true;
          }
          if (this.endLine()) {
            this.replies += this.isPush ? 0 : 1;
            if (stopAtAnyFrame || this.replies === maxReplies) return pos;
          }
          if (errorLine) return pos;
          break;
        }

        case State.Body: {
          const n = Math.min(this.bodyLeft, end - pos);
          pos += n;
          this.bodyLeft -= n;
          if (this.bodyLeft === 0) {
            this.state = State.Type;
            if (this.valueDone()) {
              this.replies += this.isPush ? 0 : 1;
              if (stopAtAnyFrame || this.replies === maxReplies) return pos;
            }
          }
          break;
        }
      }
    }
    return pos;
  }

  /**
   * The offset after the reply at `pos` when it is a simple line or a length-prefixed string
   * with its body, all in `buf`; otherwise -1, and scan() reads it a byte at a time. The byte
   * after each CR is skipped unchecked, as the byte-wise path does.
   */
  private wholeReply(buf: Buffer, pos: number, end: number): number {
    const kind = LINE_KINDS[buf[pos]];
    let i = pos + 1;
    if (kind === LineKind.Simple) {
      while (i < end && buf[i] !== 0x0d) i++;
      return i + 1 < end ? i + 2 : -1;
    }
    if (kind !== LineKind.Length) return -1;
    let length = 0;
    for (; i < end; i++) {
      const d = buf[i] - 0x30;
      if (d < 0 || d > 9) break;
      length = length * 10 + d;
    }
    if (i === pos + 1 || i >= end || buf[i] !== 0x0d) return -1; // a null (-1), or the line goes on in the next chunk
    const after = i + 2 + length + 2;
    return after <= end ? after : -1;
  }

  private readType(type: number): boolean {
    const kind = LINE_KINDS[type];
    if (kind < 0) {
      this.error = `unexpected reply type byte 0x${type.toString(16).padStart(2, '0')}`;
      return false;
    }
    this.kind = kind;
    this.state = State.Line;
    this.number = 0;
    this.negative = false;
    return true;
  }

  /** Called after a type line's LF. Returns true when a top-level frame completed. */
  private endLine(): boolean {
    this.state = State.Type;
    const count = this.negative ? -1 : this.number;
    switch (this.kind) {
      case LineKind.Simple:
        return this.valueDone();
      case LineKind.Length:
        if (count < 0) return this.valueDone(); // $-1: null bulk
        this.bodyLeft = count + 2;
        this.state = State.Body;
        return false;
      case LineKind.Array:
        if (this.nestedPush) {
          // Out of band: its elements are read, but it fills no place of the aggregate around it.
          this.nestedPush = false;
          this.need += Math.max(count, 0);
          return false;
        }
        if (count > 0) {
          this.need += count - 1; // the aggregate itself is replaced by its elements
          return false;
        }
        return this.valueDone();
      case LineKind.Map:
        if (count > 0) {
          this.need += 2 * count - 1;
          return false;
        }
        return this.valueDone();
      case LineKind.Attribute:
        // An attribute is metadata in front of the value it annotates: that value still counts.
        this.need += 2 * Math.max(count, 0);
        return false;
    }
  }

  private valueDone(): boolean {
    this.need--;
    return this.need === 0;
  }
}
