/**
 * What one connection of the integrity stress must receive, byte for byte, and the check of
 * what it does receive: a queue of segments (fixed bytes, a range of a stress value made on
 * demand, pattern.ts, or one whole frame that only Redis can know all of, checked once it is
 * complete), compared with each chunk as it arrives. The first difference ends the check with a
 * report that says where it is, what was expected, what came, and whose bytes those are.
 */
import { frameLength, RespProtocolError } from '../support/resp.js';
import { describeOrigins, fillValue, type ValueId } from './pattern.js';

export type Segment =
  | { readonly kind: 'bytes'; readonly bytes: Buffer; readonly what: string; readonly endsReply: boolean }
  | {
      readonly kind: 'value';
      readonly id: ValueId;
      /** The part of the value: `length` bytes from `from`. */
      readonly from: number;
      readonly length: number;
      readonly what: string;
      readonly endsReply: boolean;
    }
  | {
      /**
       * One whole RESP frame with a part only Redis knows (HELLO's reply names the connection's
       * id): gathered until complete, then `check` says what is wrong with it (null: nothing).
       */
      readonly kind: 'frame';
      readonly check: (frame: Buffer) => string | null;
      readonly what: string;
      readonly endsReply: boolean;
    };

export interface Mismatch {
  /** The connection: `client 17`, `subscriber 3`. */
  readonly connection: string;
  /** The reply expected, as the workload described it. */
  readonly expected: string;
  /** Offset of the first differing byte in the connection's stream. */
  readonly streamOffset: number;
  readonly detail: string;
}

/** Bytes shown on each side of a difference. */
const SHOWN = 40;

export class ExpectedStream {
  private readonly queue: Segment[] = [];
  private head = 0;
  /** Bytes of the head segment already matched. */
  private into = 0;
  private scratch = Buffer.allocUnsafe(64 * 1024);
  /** The bytes of a `frame` segment so far. */
  private framing = Buffer.alloc(0);
  /** Bytes received and matched. */
  received = 0;
  /**
   * Bytes of the connection's stream taken out before they came here (a RESP3 client's pushes,
   * tracking-client.ts): counted in the offsets reports give, so that those are the stream's own.
   */
  private skipped = 0;
  /** Replies received whole and matched. */
  replies = 0;
  failure: Mismatch | null = null;

  constructor(readonly connection: string) {}

  /** The segments the connection must receive next, after those already expected. */
  expect(...segments: Segment[]): void {
    this.queue.push(...segments);
  }

  /** Whether bytes are still expected. */
  get pending(): boolean {
    return this.head < this.queue.length;
  }

  /** What the next expected bytes belong to ('' when nothing is expected). */
  get waitingFor(): string {
    return this.pending ? this.queue[this.head].what : '';
  }

  /** Checks the next bytes the connection received. Returns false once they differ (see `failure`). */
  take(chunk: Buffer): boolean {
    if (this.failure !== null) return false;
    let pos = 0;
    while (pos < chunk.length) {
      if (!this.pending) return this.fail(chunk, pos, this.offset, 'bytes arrived where nothing was expected', '(nothing)');
      const segment = this.queue[this.head];
      if (segment.kind === 'frame') {
        const n = this.takeFrame(segment, chunk, pos);
        if (n < 0) return false;
        pos += n;
        continue;
      }
      const length = segment.kind === 'bytes' ? segment.bytes.length : segment.length;
      const n = Math.min(length - this.into, chunk.length - pos);
      const expected = this.expectedRange(segment, this.into, n);
      if (!expected.equals(chunk.subarray(pos, pos + n))) {
        const at = firstDifference(expected, chunk.subarray(pos, pos + n));
        return this.fail(
          chunk,
          pos + at,
          this.offset + at,
          `differs at byte ${this.into + at} of it`,
          show(expected.subarray(at, at + SHOWN)),
        );
      }
      pos += n;
      this.into += n;
      this.received += n;
      if (this.into === length) this.next(segment);
    }
    return true;
  }

  /** `n` bytes of the stream, taken out before they came here, lie before the next ones. */
  skip(n: number): void {
    this.skipped += n;
  }

  /**
   * Fails the check for something wrong at byte `streamOffset` of the stream that is not a
   * difference from the model (an invalidation that names another client's key, say).
   */
  wrong(streamOffset: number, detail: string): false {
    this.failure ??= { connection: this.connection, expected: this.waitingFor || '(nothing)', streamOffset, detail };
    return false;
  }

  /** Where the next byte lies in the connection's stream. */
  private get offset(): number {
    return this.received + this.skipped;
  }

  /** The head segment is done: on to the next. */
  private next(segment: Segment): void {
    if (segment.endsReply) this.replies++;
    this.queue[this.head] = EMPTY_SEGMENT; // let a large expected value go
    this.head++;
    this.into = 0;
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue.splice(0, this.head);
      this.head = 0;
    }
  }

  /**
   * Gathers the bytes of a `frame` segment from `chunk` at `pos`, and checks the frame once it is
   * whole. Returns how many bytes of the chunk were its, or -1 once the check failed.
   */
  private takeFrame(segment: Extract<Segment, { kind: 'frame' }>, chunk: Buffer, pos: number): number {
    const before = this.framing.length;
    const start = this.offset - before;
    this.framing = Buffer.concat([this.framing, chunk.subarray(pos)]);
    let length: number | undefined;
    try {
      length = frameLength(this.framing);
    } catch (error) {
      if (!(error instanceof RespProtocolError)) throw error;
      this.fail(this.framing, 0, start, `is not RESP (${error.message})`, '(one whole frame)');
      return -1;
    }
    const n = (length ?? this.framing.length) - before;
    this.received += n;
    this.into += n;
    if (length === undefined) return n;
    const frame = this.framing.subarray(0, length);
    this.framing = Buffer.alloc(0);
    const problem = segment.check(frame);
    if (problem !== null) {
      this.wrong(start, `${problem}: got ${show(frame)}`);
      return -1;
    }
    this.next(segment);
    return n;
  }

  /** The connection ended or stalled with bytes still expected. */
  incomplete(why: string): void {
    if (this.failure !== null || !this.pending) return;
    this.failure = {
      connection: this.connection,
      expected: this.waitingFor,
      streamOffset: this.offset,
      detail: `${why}, ${this.offset} bytes in, at byte ${this.into} of this reply`,
    };
  }

  private expectedRange(segment: Exclude<Segment, { kind: 'frame' }>, from: number, length: number): Buffer {
    if (segment.kind === 'bytes') return segment.bytes.subarray(from, from + length);
    if (this.scratch.length < length) this.scratch = Buffer.allocUnsafe(length);
    return fillValue(this.scratch, 0, segment.id, segment.from + from, length).subarray(0, length);
  }

  private fail(chunk: Buffer, at: number, streamOffset: number, where: string, expected: string): false {
    const came = chunk.subarray(at, at + SHOWN);
    const origins = describeOrigins(chunk.subarray(Math.max(0, at - 64), at + 256));
    this.failure = {
      connection: this.connection,
      expected: this.waitingFor || '(nothing)',
      streamOffset,
      detail: `${where}: expected ${expected}, got ${show(came)}${origins ? ` (value bytes there: ${origins})` : ''}`,
    };
    return false;
  }
}

const EMPTY_SEGMENT: Segment = { kind: 'bytes', bytes: Buffer.alloc(0), what: '', endsReply: false };

function firstDifference(a: Buffer, b: Buffer): number {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return a.length;
}

/** Bytes as a JSON string (escaped), for reports. */
export function show(bytes: Buffer): string {
  return JSON.stringify(bytes.toString('latin1'));
}
