/**
 * A streaming RESP3 frame walker for the integrity stress's RESP3 clients (tracking-client.ts).
 * It follows the frames in the bytes a connection receives, in chunks cut anywhere, and takes
 * every push frame (`>`) out wherever it starts: at the top level between replies, or inside an
 * array, a map, a set, an attribute or another push (Redis 6.x writes an invalidation into EXEC's
 * array the moment a command inside it changes a tracked key). The bytes around the pushes go on
 * in order, to be checked byte for byte against the model; each push goes on whole, on its own.
 *
 * A push is out-of-band data, not an element of the aggregate it sits in; nor is an attribute
 * (`|`), which annotates the element after it: neither counts towards its parent's elements. The
 * walker shares no code with the proxy's scanner (src/resp/), nor with test/support/resp.ts,
 * which only knows whole frames: a stress value of several MiB passes through here as slices of
 * the chunks it came in, never gathered.
 */

export interface WalkerSinks {
  /** Bytes outside push frames, in order (never empty). Returns false once the check failed. */
  bytes(bytes: Buffer): boolean;
  /**
   * A whole push frame, without the pushes nested in it (each comes on its own, first), which
   * started at byte `offset` of the stream; `nested`: inside another frame. False: stop.
   */
  push(frame: Buffer, offset: number, nested: boolean): boolean;
  /** The bytes are not RESP3 at byte `offset` of the stream: the check fails. */
  malformed(offset: number, why: string): void;
}

/** How each type byte's frame goes on after its first line. */
const enum Shape {
  /** The line is the whole frame: `+ - : _ , # (`. */
  Line = 1,
  /** The line is a length, then that many bytes and CRLF: `$ ! =`. */
  Blob,
  /** The line is a count of elements: `* ~ >`. */
  List,
  /** The line is a count of pairs, twice as many elements: `% |`. */
  Pairs,
}

const SHAPES = new Map<number, Shape>([
  ...[...'+-:_,#('].map((type): [number, Shape] => [type.charCodeAt(0), Shape.Line]),
  ...[...'$!='].map((type): [number, Shape] => [type.charCodeAt(0), Shape.Blob]),
  ...[...'*~>'].map((type): [number, Shape] => [type.charCodeAt(0), Shape.List]),
  ...[...'%|'].map((type): [number, Shape] => [type.charCodeAt(0), Shape.Pairs]),
]);

const PUSH = 0x3e; // >
const ATTRIBUTE = 0x7c; // |
const CR = 0x0d;
const LF = 0x0a;
/** A first line longer than this is no reply Redis sends. */
const MAX_LINE = 1024 * 1024;

const enum Mode {
  /** A frame's type byte. */
  Start,
  /** A frame's first line, up to its CR. */
  Line,
  /** The LF after the first line's CR. */
  LineLf,
  /** A blob's payload. */
  Payload,
  /** The CR, then the LF, after a payload. */
  PayloadCr,
  PayloadLf,
}

/** What a frame is to the aggregate it sits in: an element, or not (a push, an attribute). */
type Role = 'element' | 'push' | 'attribute';

/** An aggregate still open: how many of its elements are still to come. */
interface Open {
  remaining: number;
  readonly role: Role;
}

/** A push frame being gathered. */
interface Gathering {
  readonly parts: Buffer[];
  readonly offset: number;
  readonly nested: boolean;
}

export class PushWalker {
  private mode = Mode.Start;
  private type = 0;
  /** Where the frame being read started in the stream. */
  private frameAt = 0;
  private line = '';
  /** Payload bytes still to come. */
  private left = 0;
  private readonly open: Open[] = [];
  /** The pushes open, innermost last: bytes go to the innermost, or on to `sinks.bytes` when none is. */
  private readonly pushes: Gathering[] = [];
  /** Bytes taken before the current chunk. */
  private base = 0;
  private chunk: Buffer = Buffer.alloc(0);
  /** Where in the chunk the bytes not yet handed on start. */
  private runStart = 0;
  private stopped = false;
  /** Push frames taken out, and how many of them were nested in another frame. */
  pushCount = 0;
  nestedPushes = 0;
  /** Bytes of the push frames taken out. */
  pushBytes = 0;

  constructor(private readonly sinks: WalkerSinks) {}

  /** The next bytes of the stream. Returns false once the check failed. */
  take(chunk: Buffer): boolean {
    if (this.stopped) return false;
    this.chunk = chunk;
    this.runStart = 0;
    let i = 0;
    while (i < chunk.length && !this.stopped) i = this.step(i);
    if (!this.stopped) this.handOn(chunk.length);
    this.base += chunk.length;
    return !this.stopped;
  }

  /** Walks on from byte `i` of the chunk; returns where it stopped. */
  private step(i: number): number {
    const chunk = this.chunk;
    switch (this.mode) {
      case Mode.Start: {
        const type = chunk[i];
        if (!SHAPES.has(type)) return this.fail(i, `no RESP3 type byte: 0x${type.toString(16).padStart(2, '0')}`);
        if (type === PUSH) this.startPush(i);
        this.type = type;
        this.frameAt = this.base + i;
        this.line = '';
        this.mode = Mode.Line;
        return i + 1;
      }
      case Mode.Line: {
        const cr = chunk.indexOf(CR, i);
        const end = cr === -1 ? chunk.length : cr;
        this.line += chunk.toString('latin1', i, end);
        if (this.line.includes('\n')) return this.fail(i, `an LF inside the line ${JSON.stringify(this.line)}`);
        if (this.line.length > MAX_LINE) return this.fail(i, `a line of over ${MAX_LINE} bytes`);
        if (cr === -1) return end;
        this.mode = Mode.LineLf;
        return cr + 1;
      }
      case Mode.LineLf:
        if (chunk[i] !== LF) return this.fail(i, 'a CR not followed by LF');
        return this.lineDone(i + 1);
      case Mode.Payload: {
        const n = Math.min(this.left, chunk.length - i);
        this.left -= n;
        if (this.left === 0) this.mode = Mode.PayloadCr;
        return i + n;
      }
      case Mode.PayloadCr:
        if (chunk[i] !== CR) return this.fail(i, 'a payload not followed by CRLF');
        this.mode = Mode.PayloadLf;
        return i + 1;
      case Mode.PayloadLf:
        if (chunk[i] !== LF) return this.fail(i, 'a payload not followed by CRLF');
        this.mode = Mode.Start;
        return this.ended('element', i + 1);
    }
  }

  /** The first line of a frame ended just before byte `at`. */
  private lineDone(at: number): number {
    const type = String.fromCharCode(this.type);
    this.mode = Mode.Start;
    switch (SHAPES.get(this.type)) {
      case Shape.Line: {
        const problem = lineProblem(type, this.line);
        return problem === null ? this.ended('element', at) : this.fail(at, problem, this.frameAt);
      }
      case Shape.Blob: {
        const length = count(this.line, type === '$');
        if (length === null) return this.fail(at, `a bad length: ${type}${this.line}`, this.frameAt);
        if (length === -1) return this.ended('element', at); // RESP2's null bulk string
        this.left = length;
        this.mode = length === 0 ? Mode.PayloadCr : Mode.Payload;
        return at;
      }
      default: {
        const n = count(this.line, type === '*');
        if (n === null) return this.fail(at, `a bad count: ${type}${this.line}`, this.frameAt);
        if (n === -1) return this.ended('element', at); // RESP2's null array
        const role: Role = this.type === PUSH ? 'push' : this.type === ATTRIBUTE ? 'attribute' : 'element';
        const elements = SHAPES.get(this.type) === Shape.Pairs ? 2 * n : n;
        if (elements === 0) return this.ended(role, at);
        this.open.push({ remaining: elements, role });
        return at;
      }
    }
  }

  /**
   * A frame in the role `role` ended just before byte `at`: the aggregates it completes end too.
   * Returns `at`, or the end of the chunk once the check failed.
   */
  private ended(role: Role, at: number): number {
    for (;;) {
      if (role === 'push' && !this.endPush(at)) return this.chunk.length;
      // A push or an attribute is no element of the frame it sits in.
      if (role !== 'element') return at;
      const parent = this.open.at(-1);
      if (parent === undefined || --parent.remaining > 0) return at;
      this.open.pop();
      role = parent.role;
    }
  }

  /** A push frame starts at byte `i`: the bytes before it go where they belong, and it is gathered. */
  private startPush(i: number): void {
    this.handOn(i);
    this.pushes.push({ parts: [], offset: this.base + i, nested: this.open.length > 0 });
  }

  /** The innermost push ended just before byte `at`: it goes on whole. */
  private endPush(at: number): boolean {
    this.handOn(at);
    const push = this.pushes.pop() as Gathering;
    const frame = Buffer.concat(push.parts);
    this.pushCount++;
    if (push.nested) this.nestedPushes++;
    this.pushBytes += frame.length;
    if (!this.sinks.push(frame, push.offset, push.nested)) this.stopped = true;
    return !this.stopped;
  }

  /** Hands on the chunk's bytes up to `at`: to the innermost push open, or on to be checked. */
  private handOn(at: number): void {
    if (at > this.runStart && !this.stopped) {
      const bytes = this.chunk.subarray(this.runStart, at);
      const push = this.pushes.at(-1);
      if (push !== undefined) push.parts.push(Buffer.from(bytes));
      else if (!this.sinks.bytes(bytes)) this.stopped = true;
    }
    this.runStart = at;
  }

  /**
   * The bytes are not RESP3 at byte `at` of the chunk (at byte `offset` of the stream: where the
   * frame with a bad first line started). Outside a push, they go on first, so that the check
   * against the model says how they differ, and whose they are, where it can.
   */
  private fail(at: number, why: string, offset = this.base + at): number {
    const push = this.pushes.at(-1);
    this.handOn(push === undefined ? this.chunk.length : Math.min(this.chunk.length, at + 1));
    if (!this.stopped) {
      const gathered = push === undefined ? '' : JSON.stringify(Buffer.concat(push.parts).toString('latin1'));
      this.sinks.malformed(offset, `not RESP3: ${why}${push === undefined ? '' : ` (in the push from byte ${push.offset}: ${gathered})`}`);
    }
    this.stopped = true;
    return this.chunk.length;
  }
}

/** A length or a count, or null if it is none; -1 (RESP2's null) only where `nullable`. */
function count(line: string, nullable: boolean): number | null {
  if (line === '-1') return nullable ? -1 : null;
  return /^(0|[1-9][0-9]{0,15})$/.test(line) ? Number(line) : null;
}

/** What is wrong with the line of a one-line frame of type `type`, or null. */
function lineProblem(type: string, line: string): string | null {
  const valid =
    type === '+' ||
    type === '-' ||
    ((type === ':' || type === '(') && /^[+-]?[0-9]+$/.test(line)) ||
    (type === '_' && line === '') ||
    (type === '#' && (line === 't' || line === 'f')) ||
    (type === ',' && /^([+-]?([0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|inf)|nan)$/.test(line));
  return valid ? null : `a bad ${type} line: ${JSON.stringify(line)}`;
}
