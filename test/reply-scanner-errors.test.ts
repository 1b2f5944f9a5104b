/**
 * ReplyScanner with `trackErrors` (cluster mode): it stops right after every
 * simple error line at any depth, so that a -MOVED or -ASK inside an EXEC
 * reply can be rewritten, and says where that line began. Reply counting must
 * not change: the same streams are scanned with and without it, split at
 * random points as TCP may split them.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ReplyScanner } from '../src/resp/reply-scanner.js';
import { splitAt } from './support/chunks.js';

// ---------------------------------------------------------------------------
// Generators: latin1 text, and where each simple error line in it begins.
// ---------------------------------------------------------------------------

interface Piece {
  text: string;
  /** Offsets of the `-` of every simple error line in `text`. */
  errors: number[];
}

const plain = (text: string): Piece => ({ text, errors: [] });

/** `head` followed by `parts`, error offsets moved along. */
function join(head: string, parts: Piece[]): Piece {
  const errors: number[] = [];
  let offset = head.length;
  for (const part of parts) {
    errors.push(...part.errors.map((start) => start + offset));
    offset += part.text.length;
  }
  return { text: head + parts.map((part) => part.text).join(''), errors };
}

const blob = (type: string, body: string): string => `${type}${body.length}\r\n${body}\r\n`;

/** Bodies, some of them holding what would be an error line outside a bulk string. */
const bodyArb = fc.oneof(
  fc.constantFrom('', '-ERR x\r\n', '\r\n-MOVED 1 h:1\r\n', '-', 'a-b'),
  fc.uint8Array({ maxLength: 30 }).map((bytes) => Buffer.from(bytes).toString('latin1')),
);

const errorLineArb: fc.Arbitrary<Piece> = fc
  .constantFrom('MOVED 3999 127.0.0.1:6381', 'ASK 3999 :6381', 'MOVED 1 ::1:7000', 'ERR unknown command', 'TRYAGAIN', '', '-')
  .map((text) => ({ text: `-${text}\r\n`, errors: [0] }));

/** Everything else that is not an aggregate, '-' bytes included where RESP allows them. */
const otherLeafArb: fc.Arbitrary<Piece> = fc.oneof(
  fc
    .constantFrom('+OK\r\n', '+-x\r\n', ':-1\r\n', '$-1\r\n', '*-1\r\n', '_\r\n', ',-1.5\r\n', '#f\r\n', '(-12\r\n', '%0\r\n', '*0\r\n')
    .map(plain),
  fc.tuple(fc.constantFrom('$', '!'), bodyArb).map(([type, body]) => plain(blob(type, body))),
  bodyArb.map((body) => plain(blob('=', `txt:${body}`))),
);

const { value: valueArb } = fc.letrec<{ value: Piece }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', maxDepth: 3 },
    otherLeafArb,
    errorLineArb,
    fc
      .tuple(fc.constantFrom('*', '~'), fc.array(tie('value'), { maxLength: 4 }))
      .map(([type, items]) => join(`${type}${items.length}\r\n`, items)),
    fc.array(fc.tuple(tie('value'), tie('value')), { maxLength: 3 }).map((pairs) => join(`%${pairs.length}\r\n`, pairs.flat())),
    fc
      .tuple(fc.array(fc.tuple(tie('value'), tie('value')), { minLength: 1, maxLength: 2 }), tie('value'))
      .map(([pairs, annotated]) => join(`|${pairs.length}\r\n`, [...pairs.flat(), annotated])),
  ),
}));

interface Frame {
  piece: Piece;
  push: boolean;
}

const pushArb: fc.Arbitrary<Frame> = fc
  .array(valueArb, { maxLength: 3 })
  .map((items) => ({ piece: join(`>${items.length + 1}\r\n`, [plain(blob('$', 'message')), ...items]), push: true }));

const streamArb = fc.array(
  fc.oneof({ weight: 4, arbitrary: valueArb.map((piece) => ({ piece, push: false })) }, { weight: 1, arbitrary: pushArb }),
  {
    maxLength: 10,
  },
);

const cutsArb = fc.array(fc.nat(), { maxLength: 24 });

// ---------------------------------------------------------------------------
// Driving the scanner
// ---------------------------------------------------------------------------

interface Stream {
  bytes: Buffer;
  /** Each error line's end offset → its start offset. */
  errorStarts: Map<number, number>;
  /** Offsets strictly inside an error line: after its `-`, before the end of its LF. */
  insideError: Set<number>;
  replies: number;
}

function stream(frames: Frame[]): Stream {
  const { text, errors } = join(
    '',
    frames.map((frame) => frame.piece),
  );
  const errorStarts = new Map<number, number>();
  const insideError = new Set<number>();
  for (const start of errors) {
    const end = text.indexOf('\r\n', start) + 2;
    errorStarts.set(end, start);
    for (let at = start + 1; at < end; at++) insideError.add(at);
  }
  return { bytes: Buffer.from(text, 'latin1'), errorStarts, insideError, replies: frames.filter((frame) => !frame.push).length };
}

interface Trace {
  /** Where each run of `limit` replies ended. */
  replyEnds: number[];
  /** Where each stop after an error line was. */
  errorEnds: number[];
  replies: number;
}

/**
 * Scans `chunks` with `maxReplies` = `limit`, checking on the way that the
 * scanner stops only at a reply limit, after an error line or at the end of
 * a chunk, and that errorStart and inErrorLine tell the truth.
 */
function trace(chunks: Buffer[], s: Stream, trackErrors: boolean, limit: number): Trace {
  const scanner = new ReplyScanner();
  scanner.trackErrors = trackErrors;
  const out: Trace = { replyEnds: [], errorEnds: [], replies: 0 };
  let base = 0;
  let counted = 0; // replies since the limit was last reached
  for (const chunk of chunks) {
    scanner.newChunk();
    let pos = 0;
    while (pos < chunk.length) {
      pos = scanner.scan(chunk, pos, limit - counted);
      const at = base + pos;
      if (scanner.error !== '') throw new Error(`scanner error: ${scanner.error}`);
      out.replies += scanner.replies;
      counted += scanner.replies;
      const limitReached = counted === limit;
      if (limitReached) {
        out.replyEnds.push(at);
        counted = 0;
      }
      if (scanner.errorEnded) {
        out.errorEnds.push(at);
        checkErrorStart(scanner.errorStart, base, s.errorStarts.get(at), at);
      } else if (!limitReached && pos !== chunk.length) {
        throw new Error(`stopped at ${at}: no reply limit, no error line, not the end of a chunk`);
      }
      if (scanner.inErrorLine !== (trackErrors && s.insideError.has(at))) throw new Error(`inErrorLine ${scanner.inErrorLine} at ${at}`);
    }
    base += chunk.length;
  }
  if (!scanner.atFrameBoundary) throw new Error('stream ended inside a frame');
  return out;
}

function checkErrorStart(errorStart: number, base: number, start: number | undefined, at: number): void {
  if (start === undefined) throw new Error(`errorEnded at ${at}, where no error line ends`);
  if (errorStart >= 0 ? base + errorStart !== start : start >= base) {
    throw new Error(`errorStart ${errorStart} in the chunk at ${base}; the error line at ${at} began at ${start}`);
  }
}

const ALL = Number.MAX_SAFE_INTEGER;

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

describe('ReplyScanner trackErrors on random streams', () => {
  it('stops after every error line at any depth, and counts replies as without trackErrors', () => {
    fc.assert(
      fc.property(streamArb, cutsArb, (frames, cuts) => {
        const s = stream(frames);
        const errorEnds = [...s.errorStarts.keys()];
        for (const chunks of [[s.bytes], splitAt(s.bytes, cuts)]) {
          for (const limit of [1, 2, ALL]) {
            const untracked = trace(chunks, s, false, limit);
            expect(untracked.errorEnds).toEqual([]);
            expect(untracked.replies).toBe(s.replies);
            expect(trace(chunks, s, true, limit)).toEqual({ ...untracked, errorEnds });
          }
        }
      }),
      { numRuns: 300 },
    );
  });

  it('says where an error line began when it is cut at every byte', () => {
    fc.assert(
      fc.property(valueArb, (piece) => {
        const s = stream([{ piece, push: false }]);
        const everyByte = splitAt(
          s.bytes,
          Array.from({ length: s.bytes.length }, (_, i) => i),
        );
        expect(trace(everyByte, s, true, 1).errorEnds).toEqual([...s.errorStarts.keys()]);
      }),
      { numRuns: 100 },
    );
  });
});

/** One scan of `text` (all of it one chunk) from `pos`, and what the scanner says after it. */
function scanOnce(scanner: ReplyScanner, chunk: Buffer, pos: number, maxReplies = ALL) {
  const end = scanner.scan(chunk, pos, maxReplies);
  const { replies, errorEnded, errorStart, inErrorLine } = scanner;
  return { end, replies, errorEnded, errorStart, inErrorLine };
}

function tracking(): ReplyScanner {
  const scanner = new ReplyScanner();
  scanner.trackErrors = true;
  scanner.newChunk();
  return scanner;
}

const MOVED = '-MOVED 12182 127.0.0.1:32003\r\n';

describe('ReplyScanner trackErrors, step by step', () => {
  it('stops after a -MOVED inside an EXEC reply, before the reply is complete', () => {
    const exec = Buffer.from(`*3\r\n+OK\r\n${MOVED}:1\r\n`, 'latin1');
    const scanner = tracking();
    const first = scanOnce(scanner, exec, 0);
    expect(first).toEqual({ end: 9 + MOVED.length, replies: 0, errorEnded: true, errorStart: 9, inErrorLine: false });
    expect(scanner.atFrameBoundary).toBe(false);
    expect(scanOnce(scanner, exec, first.end)).toMatchObject({ end: exec.length, replies: 1, errorEnded: false });
    expect(scanner.atFrameBoundary).toBe(true);
  });

  it('does not stop inside the EXEC reply without trackErrors', () => {
    const scanner = new ReplyScanner();
    const exec = Buffer.from(`*2\r\n${MOVED}-ASK 1 h:2\r\n`, 'latin1');
    expect(scanOnce(scanner, exec, 0)).toMatchObject({ end: exec.length, replies: 1, errorEnded: false, inErrorLine: false });
  });

  it.each([
    ['a map value', `%1\r\n+key\r\n${MOVED}`],
    ['a map key', `%1\r\n${MOVED}:1\r\n`],
    ['a nested array', `*1\r\n*1\r\n${MOVED}`],
    ['a set', `~1\r\n${MOVED}`],
    ['an attribute', `|1\r\n+k\r\n${MOVED}:1\r\n`],
    ['a push', `>2\r\n$7\r\nmessage\r\n${MOVED}`],
  ])('stops after an error line in %s', (_name, text) => {
    const scanner = tracking();
    const start = text.indexOf(MOVED);
    expect(scanOnce(scanner, Buffer.from(text, 'latin1'), 0)).toMatchObject({
      end: start + MOVED.length,
      errorEnded: true,
      errorStart: start,
    });
  });

  it('counts a top-level error as a reply at the same stop', () => {
    const bytes = Buffer.from(`${MOVED}+OK\r\n`, 'latin1');
    for (const maxReplies of [1, ALL]) {
      expect(scanOnce(tracking(), bytes, 0, maxReplies)).toEqual({
        end: MOVED.length,
        replies: 1,
        errorEnded: true,
        errorStart: 0,
        inErrorLine: false,
      });
    }
  });

  it('does not take a "-" in a length, a number or a body for an error', () => {
    const bytes = Buffer.from('*7\r\n$-1\r\n*-1\r\n:-1\r\n,-1.5\r\n(-1\r\n$6\r\n-ERR x\r\n+-\r\n', 'latin1');
    expect(scanOnce(tracking(), bytes, 0)).toMatchObject({ end: bytes.length, replies: 1, errorEnded: false, inErrorLine: false });
  });

  it('follows an error line across chunks: errorStart -1 once it began in an earlier chunk', () => {
    const scanner = tracking();
    const chunks = ['*2\r\n-', 'MOVED 1 h', ':1\r', '\n:1\r\n'].map((text) => Buffer.from(text, 'latin1'));
    const stops = chunks.map((chunk, i) => {
      if (i > 0) scanner.newChunk();
      return scanOnce(scanner, chunk, 0);
    });
    expect(stops).toEqual([
      { end: 5, replies: 0, errorEnded: false, errorStart: 4, inErrorLine: true },
      { end: 9, replies: 0, errorEnded: false, errorStart: -1, inErrorLine: true },
      { end: 3, replies: 0, errorEnded: false, errorStart: -1, inErrorLine: true },
      { end: 1, replies: 0, errorEnded: true, errorStart: -1, inErrorLine: false },
    ]);
    expect(scanOnce(scanner, chunks[3], 1)).toMatchObject({ end: 5, replies: 1, errorEnded: false });
  });

  it('keeps errorStart for the line just ended until the next one begins', () => {
    const scanner = tracking();
    const bytes = Buffer.from(`*3\r\n${MOVED}+OK\r\n-ERR x\r\n`, 'latin1');
    const first = scanOnce(scanner, bytes, 0);
    expect(first.errorStart).toBe(4);
    const second = scanOnce(scanner, bytes, first.end);
    expect(second).toEqual({ end: bytes.length, replies: 1, errorEnded: true, errorStart: first.end + 5, inErrorLine: false });
  });
});
