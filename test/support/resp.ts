/**
 * A tiny raw-socket RESP client for byte-exact tests.
 *
 * It never interprets replies beyond finding where each one ends, so a test can
 * compare exactly what the proxy sent with what Redis itself sends. The frame
 * scanner below is the test-oracle side: it is written for obviousness, not
 * speed, and shares no code with the proxy's own parser.
 */
import net from 'node:net';

// ---------------------------------------------------------------------------
// Frame scanner
// ---------------------------------------------------------------------------

const CRLF = '\r\n';

/** Types whose whole frame is one header line: `+OK\r\n`, `:42\r\n`, ... */
const LINE_TYPES = new Set(['+', '-', ':', '_', ',', '#', '(']);
/** Types with a length header followed by that many bytes and CRLF. */
const BLOB_TYPES = new Set(['$', '!', '=']);
/** Aggregates of N elements (`*` array, `~` set, `>` push). */
const LIST_TYPES = new Set(['*', '~', '>']);
/** Aggregates of N key/value pairs, i.e. 2N elements (`%` map, `|` attribute). */
const PAIR_TYPES = new Set(['%', '|']);

/** Thrown when the bytes cannot be RESP at all (as opposed to "not complete yet"). */
export class RespProtocolError extends Error {
  override name = 'RespProtocolError';
}

/**
 * Length in bytes of the complete top-level reply starting at `offset`, or
 * `undefined` if `buf` ends before that reply does.
 *
 * Understands RESP2 and RESP3. An attribute (`|`) is a prefix of the reply it
 * annotates, so the returned length covers the attribute and that reply. A
 * push (`>`) is a frame like any other. Streamed RESP3 types (`$?`, `*?`) are
 * rejected: Redis never sends them.
 *
 * @throws RespProtocolError on bytes that are not valid RESP.
 */
export function frameLength(buf: Buffer, offset = 0): number | undefined {
  const end = frameEnd(buf, offset);
  return end === undefined ? undefined : end - offset;
}

/**
 * Splits `buf` into complete top-level frames. Trailing bytes of an unfinished
 * frame are returned as `rest`.
 */
export function splitFrames(buf: Buffer): { frames: Buffer[]; rest: Buffer } {
  const frames: Buffer[] = [];
  let pos = 0;
  for (;;) {
    const end = frameEnd(buf, pos);
    if (end === undefined) return { frames, rest: buf.subarray(pos) };
    frames.push(buf.subarray(pos, end));
    pos = end;
  }
}

/** Index just past the frame that starts at `start`, or undefined if incomplete. */
function frameEnd(buf: Buffer, start: number): number | undefined {
  if (start >= buf.length) return undefined;
  const type = String.fromCharCode(buf[start]);
  const cr = buf.indexOf(CRLF, start + 1);
  if (cr === -1) return undefined;
  const header = buf.toString('latin1', start + 1, cr);
  const afterHeader = cr + 2;

  if (LINE_TYPES.has(type)) {
    checkLine(type, header, start);
    return afterHeader;
  }
  if (BLOB_TYPES.has(type)) return blobEnd(buf, type, header, start, afterHeader);
  if (LIST_TYPES.has(type) || PAIR_TYPES.has(type)) {
    const count = parseLength(type, header, start);
    if (count === -1) return afterHeader; // RESP2 null array `*-1`
    const elements = PAIR_TYPES.has(type) ? 2 * count : count;
    const end = elementsEnd(buf, afterHeader, elements);
    if (end === undefined || type !== '|') return end;
    // An attribute only decorates the reply after it: the frame goes on.
    return frameEnd(buf, end);
  }
  throw new RespProtocolError(`unknown RESP type byte 0x${buf[start].toString(16).padStart(2, '0')} at offset ${start}`);
}

/**
 * Index just past `count` consecutive frames starting at `pos`, or undefined. A push among them
 * (Redis 6 sends a tracking invalidation in the middle of EXEC's array) is no element: the count is
 * Redis's, and the pushes before each element are part of the aggregate's bytes.
 */
function elementsEnd(buf: Buffer, pos: number, count: number): number | undefined {
  let end: number | undefined = pos;
  for (let i = 0; i < count && end !== undefined; i++) {
    while (end !== undefined && buf[end] === 0x3e /* > */) end = frameEnd(buf, end);
    if (end !== undefined) end = frameEnd(buf, end);
  }
  return end;
}

function blobEnd(buf: Buffer, type: string, header: string, start: number, afterHeader: number): number | undefined {
  const length = parseLength(type, header, start);
  if (length === -1) return afterHeader; // RESP2 null bulk `$-1`
  const end = afterHeader + length + 2;
  if (buf.length < end) return undefined;
  if (buf[end - 2] !== 0x0d || buf[end - 1] !== 0x0a) {
    throw new RespProtocolError(`${type} payload at offset ${start} is not followed by CRLF`);
  }
  return end;
}

/** Parses an element count or byte length; -1 (null) is allowed only for `$` and `*`. */
function parseLength(type: string, header: string, start: number): number {
  if (header === '?') {
    throw new RespProtocolError(`streamed RESP3 ${type}? at offset ${start} is not supported`);
  }
  if (!/^(-1|0|[1-9][0-9]*)$/.test(header) || (header === '-1' && type !== '$' && type !== '*')) {
    throw new RespProtocolError(`bad ${type} length ${JSON.stringify(header)} at offset ${start}`);
  }
  return Number(header);
}

/** Light validation of one-line frames, enough to notice garbage. */
function checkLine(type: string, header: string, start: number): void {
  const valid =
    (type === ':' && /^[+-]?[0-9]+$/.test(header)) ||
    (type === '(' && /^[+-]?[0-9]+$/.test(header)) ||
    (type === '_' && header === '') ||
    (type === '#' && (header === 't' || header === 'f')) ||
    (type === ',' && header !== '') ||
    ((type === '+' || type === '-') && !header.includes('\n'));
  if (!valid) {
    throw new RespProtocolError(`bad ${type} frame ${JSON.stringify(header)} at offset ${start}`);
  }
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

/** Encodes one command as a RESP2 multibulk (`*N\r\n$len\r\narg\r\n...`). Strings are UTF-8. */
export function cmd(...args: (string | Buffer)[]): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)];
  for (const arg of args) {
    const bytes = typeof arg === 'string' ? Buffer.from(arg, 'utf8') : arg;
    parts.push(Buffer.from(`$${bytes.length}\r\n`), bytes, Buffer.from(CRLF));
  }
  return Buffer.concat(parts);
}

// ---------------------------------------------------------------------------
// RawClient
// ---------------------------------------------------------------------------

/**
 * One TCP connection that writes raw bytes and reads raw reply frames.
 *
 * Reads are counted in top-level frames, and a RESP3 push (`>`) counts as one
 * frame like any reply: a test subscribed to pushes must include them in `n`.
 * Only one read may be pending at a time.
 */
/**
 * A script that keeps the server busy for `seconds` (a whole-second clock, so between
 * `seconds - 1` and `seconds`): nothing else runs meanwhile, as under a slow command.
 */
export function busyScript(seconds: number): Buffer {
  return cmd('EVAL', `local s = redis.call('TIME')[1] while redis.call('TIME')[1] - s < ${seconds} do end return 1`, '0');
}

export class RawClient {
  /** Received bytes not yet handed out by a read. */
  private buffered: Buffer = Buffer.alloc(0);
  private closed = false;
  private socketError: Error | undefined;
  /** Wakes the pending read when bytes arrive or the socket closes. */
  private wake: (() => void) | undefined;
  private reading = false;

  private constructor(private readonly socket: net.Socket) {
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => {
      this.buffered = Buffer.concat([this.buffered, chunk]);
      this.notify();
    });
    // Errors (e.g. ECONNRESET) are kept and reported by the next read; 'close' always follows.
    socket.on('error', (err) => {
      this.socketError = err;
    });
    socket.on('close', () => {
      this.closed = true;
      this.notify();
    });
  }

  static connect(port: number, host = '127.0.0.1'): Promise<RawClient> {
    return new Promise((resolve, reject) => {
      const socket = net.connect({ port, host });
      const onError = (err: Error) => reject(err);
      socket.once('error', onError);
      socket.once('connect', () => {
        socket.off('error', onError);
        resolve(new RawClient(socket));
      });
    });
  }

  /** True once the connection is fully closed (by either side). */
  get isClosed(): boolean {
    return this.closed;
  }

  /** Sends one command and returns its reply as text (latin1, byte for byte). */
  async call(...args: (string | Buffer)[]): Promise<string> {
    this.write(cmd(...args));
    return (await this.readReplies(1)).toString('latin1');
  }

  /** The key's PTTL in milliseconds (-1: no expiry, -2: no key). */
  async pttl(key: string | Buffer): Promise<number> {
    return Number(/^:(-?\d+)/.exec(await this.call('PTTL', key))?.[1]);
  }

  /** Queues bytes; write errors surface in the next read. */
  write(bytes: Buffer | string): void {
    this.socket.write(bytes);
  }

  /**
   * Writes `bytes` in pieces, each handed to the kernel before the next one is
   * written, with a `setImmediate` (or `delayMs`) gap in between, so that they
   * leave as separate TCP segments. Whether the peer *reads* them separately is
   * still up to the peer; a few ms of `delayMs` makes that very likely.
   *
   * `chunkSizes` lists piece sizes; bytes left over after them go in one final
   * piece, and sizes past the end are ignored. `'bytewise'` sends one byte per piece.
   */
  async writeSplit(bytes: Buffer, chunkSizes: number[] | 'bytewise', opts: { delayMs?: number } = {}): Promise<void> {
    const pieces = splitIntoPieces(bytes, chunkSizes);
    for (let i = 0; i < pieces.length; i++) {
      if (i > 0) await pause(opts.delayMs ?? 0);
      await this.writeFlushed(pieces[i]);
    }
  }

  /**
   * Resolves with the exact bytes of the next `n` complete top-level replies
   * (attributes included with the reply they annotate, pushes counted as
   * replies). Extra bytes stay buffered for the next read.
   */
  async readReplies(n: number, timeoutMs = 5000): Promise<Buffer> {
    return this.exclusiveRead(
      timeoutMs,
      () => {
        const end = endOfFrames(this.buffered, n);
        if (end === undefined) return undefined;
        const replies = this.buffered.subarray(0, end);
        this.buffered = this.buffered.subarray(end);
        return replies;
      },
      () => `${n} replies (${splitFrames(this.buffered).frames.length} complete so far)`,
    );
  }

  /** Resolves with every remaining byte once the server has closed the connection. */
  async readUntilClosed(timeoutMs = 5000): Promise<Buffer> {
    return this.exclusiveRead(
      timeoutMs,
      () => {
        if (!this.closed) return undefined;
        const rest = this.buffered;
        this.buffered = Buffer.alloc(0);
        return rest;
      },
      () => 'the server to close the connection',
    );
  }

  /** Half-closes our side (the server may still answer what was sent). */
  end(): void {
    this.socket.end();
  }

  /** Half-closes our side and waits for the server to close; destroys after `timeoutMs`. */
  async close(timeoutMs = 2000): Promise<void> {
    if (this.closed) return;
    const closed = new Promise<void>((resolve) => this.socket.once('close', () => resolve()));
    this.socket.end();
    const timer = setTimeout(() => this.socket.destroy(), timeoutMs);
    await closed;
    clearTimeout(timer);
  }

  /** Drops the connection at once (RST if unread data is pending). */
  destroy(): void {
    this.socket.destroy();
  }

  /**
   * Runs `take` whenever the buffer or socket state changes until it returns
   * bytes. Fails on timeout, or on close when `take` still has nothing.
   */
  private async exclusiveRead(timeoutMs: number, take: () => Buffer | undefined, describeWanted: () => string): Promise<Buffer> {
    if (this.reading) throw new Error('RawClient: another read is already pending');
    this.reading = true;
    try {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const result = take();
        if (result !== undefined) return result;
        if (this.closed) {
          const cause = this.socketError ? ` (${this.socketError.message})` : '';
          throw new Error(`connection closed${cause} while waiting for ${describeWanted()}; ${this.preview()}`);
        }
        if (!(await this.changeBefore(deadline))) {
          throw new Error(`timed out after ${timeoutMs} ms waiting for ${describeWanted()}; ${this.preview()}`);
        }
      }
    } finally {
      this.reading = false;
    }
  }

  /** Waits for new bytes or close; false if the deadline passes first. */
  private changeBefore(deadline: number): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = setTimeout(
        () => {
          this.wake = undefined;
          resolve(false);
        },
        Math.max(0, deadline - Date.now()),
      );
      this.wake = () => {
        clearTimeout(timer);
        resolve(true);
      };
    });
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  private writeFlushed(piece: Buffer): Promise<void> {
    return new Promise((resolve, reject) => {
      this.socket.write(piece, (err) => (err ? reject(err) : resolve()));
    });
  }

  /** The buffered bytes, shortened, for error messages. */
  private preview(): string {
    const limit = 300;
    const text = this.buffered.toString('latin1', 0, limit);
    const more = this.buffered.length > limit ? `... (${this.buffered.length} bytes)` : '';
    return `buffered: ${JSON.stringify(text)}${more}`;
  }
}

/** Offset just past the first `n` frames of `buf`, or undefined if they are not all there. */
function endOfFrames(buf: Buffer, n: number): number | undefined {
  let end: number | undefined = 0;
  for (let i = 0; i < n && end !== undefined; i++) end = frameEnd(buf, end);
  return end;
}

function splitIntoPieces(bytes: Buffer, chunkSizes: number[] | 'bytewise'): Buffer[] {
  const sizes = chunkSizes === 'bytewise' ? Array<number>(bytes.length).fill(1) : chunkSizes;
  const pieces: Buffer[] = [];
  let pos = 0;
  for (const size of sizes) {
    if (!Number.isInteger(size) || size <= 0) throw new Error(`writeSplit: bad chunk size ${size}`);
    if (pos >= bytes.length) break;
    pieces.push(bytes.subarray(pos, pos + size));
    pos += size;
  }
  if (pos < bytes.length) pieces.push(bytes.subarray(pos));
  return pieces;
}

function pause(delayMs: number): Promise<void> {
  return new Promise((resolve) => (delayMs > 0 ? setTimeout(resolve, delayMs) : setImmediate(resolve)));
}

/** Sends `bytes` on a fresh connection to `port` and returns exactly `replies` replies as text. */
export async function exchange(port: number, bytes: Buffer, replies: number): Promise<string> {
  const client = await RawClient.connect(port);
  try {
    client.write(bytes);
    return (await client.readReplies(replies)).toString('latin1');
  } finally {
    await client.close();
  }
}
