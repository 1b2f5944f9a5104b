/**
 * RequestScanner: the client-to-server framer.
 *
 * Example tests pin the documented behaviour on hand-written input; property
 * tests check, over random command streams split at random points, that the
 * events do not depend on how TCP chunked the bytes and that they agree with
 * an independent model of Redis's own request parser (networking.c
 * processMultibulkBuffer / processInlineBuffer, sdssplitargs).
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Cmd } from '../src/resp/commands.js';
import { seededBytes, splitAt } from './support/chunks.js';
import {
  END,
  HEAD,
  MALFORMED,
  MAX_CAPTURED_KEY,
  MAX_CAPTURED_OPTION,
  MAX_CAPTURED_VALUE,
  MAX_LINE,
  RequestScanner,
} from '../src/resp/request-scanner.js';
import { cmd } from './support/resp.js';
import { frameHeads } from './support/scan.js';

// ---------------------------------------------------------------------------
// Independent model
// ---------------------------------------------------------------------------

/** Capture capacities the proxy documents: name 12 bytes, key 1024, value 32, option words 8. */
const NAME_CAPACITY = 12;
const KEY_CAPACITY = 1024;
const VALUE_CAPACITY = 32;
const OPTION_CAPACITY = 20;

const ORACLE_NAMES = new Map<string, Cmd>([
  ['multi', Cmd.Multi],
  ['exec', Cmd.Exec],
  ['discard', Cmd.Discard],
  ['watch', Cmd.Watch],
  ['unwatch', Cmd.Unwatch],
  ['reset', Cmd.Reset],
  ['incr', Cmd.Incr],
  ['incrby', Cmd.Incrby],
  ['set', Cmd.Set],
  ['expire', Cmd.Expire],
  ['pexpire', Cmd.Pexpire],
  ['client', Cmd.Client],
  ['subscribe', Cmd.Uncountable],
  ['psubscribe', Cmd.Uncountable],
  ['ssubscribe', Cmd.Uncountable],
  ['unsubscribe', Cmd.Uncountable],
  ['punsubscribe', Cmd.Uncountable],
  ['sunsubscribe', Cmd.Uncountable],
  ['monitor', Cmd.Uncountable],
  ['replconf', Cmd.Uncountable],
  ['quit', Cmd.Quit],
  ['sync', Cmd.Replication],
  ['psync', Cmd.Replication],
  ['cluster', Cmd.Cluster],
  ['asking', Cmd.Asking],
]);

/** Classification by the test's own table: ASCII letters only are case-folded. */
function oracleClassify(name: Uint8Array): Cmd {
  let s = '';
  for (const b of name) s += String.fromCharCode(b >= 0x41 && b <= 0x5a ? b + 0x20 : b);
  return ORACLE_NAMES.get(s) ?? Cmd.Other;
}

/** Arguments (name included) the proxy must see before the head is known. */
function oracleHeadArgs(cmd: Cmd, argc: number): number {
  switch (cmd) {
    case Cmd.Set:
      return argc === 6 ? 6 : 1; // SET key value NX EX n, the options in any order: key and options
    case Cmd.Client:
      return argc === 3 ? 3 : 2; // CLIENT SETNAME name: the name too
    case Cmd.Incr:
    case Cmd.Cluster:
      return 2;
    case Cmd.Incrby:
    case Cmd.Expire:
    case Cmd.Pexpire:
      return 3;
    default:
      return 1;
  }
}

/** C isspace() in the C locale. */
function isCSpace(b: number): boolean {
  return b === 0x20 || b === 0x09 || b === 0x0a || b === 0x0b || b === 0x0c || b === 0x0d;
}

/**
 * Arguments of an unquoted inline line, as sdssplitargs splits it: isspace()
 * bytes are skipped between arguments, and an unquoted argument ends at ' ',
 * '\n', '\r', '\t' or NUL (not at '\v' or '\f'); nothing after a NUL is read.
 */
function oracleInlineArgs(line: Uint8Array): Uint8Array[] {
  const args: Uint8Array[] = [];
  let i = 0;
  for (;;) {
    while (i < line.length && line[i] !== 0x00 && isCSpace(line[i])) i++;
    if (i === line.length || line[i] === 0x00) return args;
    let j = i;
    while (j < line.length && ![0x20, 0x0a, 0x0d, 0x09, 0x00].includes(line[j])) j++;
    args.push(line.subarray(i, j));
    if (j < line.length && line[j] !== 0x00) j++; // the byte that ended the argument
    i = j;
  }
}

const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const latin1 = (s: string): Uint8Array => new Uint8Array(Buffer.from(s, 'latin1'));
const fromLatin1 = (bytes: Uint8Array): string => Buffer.from(bytes).toString('latin1');

/** What the scanner reports about one frame. Offsets are absolute in the stream. */
interface FrameRecord {
  start: number;
  /** Offset returned by the `next()` call that reported HEAD. */
  head: number;
  /** Offset returned by the `next()` call that reported END (just after the frame). */
  end: number;
  cmd: Cmd;
  argc: number;
  inline: boolean;
  inlineOpaque: boolean;
  oversize: boolean;
  /** Captured key bytes (`key.subarray(0, keyLength)`), hex. */
  key: string;
  /** Captured value bytes, hex. */
  value: string;
}

type FrameSpec = { kind: 'bulk'; args: string[]; junk: string | null } | { kind: 'inline'; text: string } | { kind: 'empty'; text: string };

/** Encodes the frames and computes, independently of the scanner, what it must report. */
function model(frames: FrameSpec[]): { bytes: Buffer; records: FrameRecord[] } {
  const parts: Buffer[] = [];
  const records: FrameRecord[] = [];
  let off = 0;
  const push = (b: Uint8Array | string): void => {
    const buf = typeof b === 'string' ? Buffer.from(b, 'latin1') : Buffer.from(b);
    parts.push(buf);
    off += buf.length;
  };
  for (const f of frames) {
    const start = off;
    if (f.kind === 'bulk') {
      // `junk` replaces the bytes Redis skips unchecked: the one after each
      // line's '\r' and the two after each body.
      const lf = f.junk === null ? '\n' : f.junk[0];
      const crlf = f.junk ?? '\r\n';
      const args = f.args.map(latin1);
      const argc = args.length;
      const cmd = args[0].length > NAME_CAPACITY ? Cmd.Other : oracleClassify(args[0]);
      const headArgs = Math.min(oracleHeadArgs(cmd, argc), argc);
      let head = -1;
      let oversize = false;
      let key = '';
      let value = '';
      push(`*${argc}\r${lf}`);
      args.forEach((arg, i) => {
        push(`$${arg.length}\r${lf}`);
        if (head < 0 && i < headArgs) {
          const capacity = i === 0 ? NAME_CAPACITY : i === 1 ? KEY_CAPACITY : i === 2 ? VALUE_CAPACITY : OPTION_CAPACITY;
          if (arg.length > capacity) {
            // Too long to matter: the head is known right after the length line.
            oversize = true;
            head = off;
          } else if (i === 1) {
            key = hex(arg);
          } else if (i === 2) {
            value = hex(arg);
          }
        }
        push(arg);
        push(crlf);
        if (head < 0 && i === headArgs - 1 && argc > headArgs) head = off;
      });
      records.push({
        start,
        head: head < 0 ? off : head,
        end: off,
        cmd,
        argc,
        inline: false,
        inlineOpaque: false,
        oversize,
        key,
        value,
      });
    } else if (f.kind === 'inline') {
      push(f.text);
      const bytes = latin1(f.text);
      // Redis drops the '\n' and one '\r' before it, then splits the rest.
      let lineEnd = bytes.length - 1;
      if (lineEnd > 0 && bytes[lineEnd - 1] === 0x0d) lineEnd--;
      const args = oracleInlineArgs(bytes.subarray(0, lineEnd));
      records.push({
        start,
        head: off,
        end: off,
        cmd: args.length === 0 ? Cmd.Empty : oracleClassify(args[0]),
        argc: args.length,
        inline: true,
        inlineOpaque: false,
        oversize: false,
        key: '',
        value: '',
      });
    } else {
      push(f.text);
      records.push({
        start,
        head: off,
        end: off,
        cmd: Cmd.Empty,
        argc: 0,
        inline: !f.text.startsWith('*'),
        inlineOpaque: false,
        oversize: false,
        key: '',
        value: '',
      });
    }
  }
  return { bytes: Buffer.concat(parts), records };
}

// ---------------------------------------------------------------------------
// Driving the scanner
// ---------------------------------------------------------------------------

function snapshot(s: RequestScanner): Omit<FrameRecord, 'start' | 'head' | 'end'> {
  return {
    cmd: s.cmd,
    argc: s.argc,
    inline: s.inline,
    inlineOpaque: s.inlineOpaque,
    oversize: s.oversize,
    key: hex(s.key.subarray(0, s.keyLength)),
    value: hex(s.value.subarray(0, s.valueLength)),
  };
}

/**
 * Feeds `chunks` with the documented caller loop and records every frame.
 * Also checks the invariants that hold whatever the split: one HEAD then one
 * END per frame, the head unchanged between them, `frameStart` pointing at the
 * frame's first byte (or -1 when that byte was in an earlier chunk), and no
 * MALFORMED.
 */
function scanChunks(chunks: Buffer[]): FrameRecord[] {
  const scanner = new RequestScanner();
  const records: FrameRecord[] = [];
  let base = 0;
  let frameBegin = 0;
  let pending: FrameRecord | null = null;
  let pendingHead: ReturnType<typeof snapshot> | null = null;
  let total = 0;
  for (const c of chunks) total += c.length;
  let budget = 4 * total + 100; // guards against an event loop that makes no progress
  for (const chunk of chunks) {
    scanner.newChunk();
    let pos = 0;
    while (pos < chunk.length) {
      if (--budget < 0) throw new Error('scanner loops without progress');
      pos = scanner.next(chunk, pos);
      const event = scanner.event;
      if (event === 0) {
        if (pos !== chunk.length) throw new Error(`no event but stopped at ${pos} of ${chunk.length}`);
        break;
      }
      if (event & MALFORMED) throw new Error(`unexpected MALFORMED at ${base + pos}: ${scanner.malformedReason}`);
      if (scanner.frameStart >= 0) {
        if (base + scanner.frameStart !== frameBegin) {
          throw new Error(`frameStart ${base + scanner.frameStart}, frame began at ${frameBegin}`);
        }
      } else if (frameBegin >= base) {
        throw new Error(`frameStart -1 but the frame began in this chunk (at ${frameBegin})`);
      }
      if (event & HEAD) {
        if (pending !== null) throw new Error(`second HEAD for the frame at ${frameBegin}`);
        pendingHead = snapshot(scanner);
        pending = { start: frameBegin, head: base + pos, end: -1, ...pendingHead };
      }
      if (event & END) {
        if (pending === null) throw new Error(`END without HEAD for the frame at ${frameBegin}`);
        // The head stays valid until the next frame starts.
        expect(snapshot(scanner)).toEqual(pendingHead);
        pending.end = base + pos;
        records.push(pending);
        pending = null;
        frameBegin = base + pos;
      }
    }
    base += chunk.length;
  }
  if (pending !== null) throw new Error('stream ended after HEAD without END');
  if (!scanner.atFrameBoundary) throw new Error('stream ended inside a frame');
  return records;
}

function oneByteChunks(buf: Buffer): Buffer[] {
  const chunks: Buffer[] = [];
  for (let i = 0; i < buf.length; i++) chunks.push(buf.subarray(i, i + 1));
  return chunks;
}

function fixedChunks(buf: Buffer, size: number): Buffer[] {
  const chunks: Buffer[] = [];
  for (let i = 0; i < buf.length; i += size) chunks.push(buf.subarray(i, i + size));
  return chunks;
}

// ---------------------------------------------------------------------------
// Helpers for example tests
// ---------------------------------------------------------------------------

function bulk(...args: Array<string | Uint8Array>): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)];
  for (const a of args) {
    const b = typeof a === 'string' ? Buffer.from(a, 'latin1') : Buffer.from(a);
    parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from('\r\n'));
  }
  return Buffer.concat(parts);
}

/** Scans `bytes` whole, and also as 1-byte chunks, and returns the records (which must agree). */
function scanBoth(bytes: Buffer): FrameRecord[] {
  const whole = scanChunks([bytes]);
  expect(scanChunks(oneByteChunks(bytes))).toEqual(whole);
  return whole;
}

interface MalformedOutcome {
  /** Absolute offset returned with MALFORMED, or -1 if it never came. */
  at: number;
  reason: string;
  /** Frames completed before it. */
  frames: number;
}

function scanForMalformed(chunks: Buffer[]): MalformedOutcome {
  const scanner = new RequestScanner();
  let base = 0;
  let frames = 0;
  for (const chunk of chunks) {
    scanner.newChunk();
    let pos = 0;
    while (pos < chunk.length) {
      pos = scanner.next(chunk, pos);
      if (scanner.event === 0) break;
      if (scanner.event & MALFORMED) return { at: base + pos, reason: scanner.malformedReason, frames };
      if (scanner.event & END) frames++;
    }
    base += chunk.length;
  }
  return { at: -1, reason: '', frames };
}

const b = (s: string): Buffer => Buffer.from(s, 'latin1');

// ---------------------------------------------------------------------------
// Example tests
// ---------------------------------------------------------------------------

describe('RequestScanner examples', () => {
  it('exports the capacities the model assumes', () => {
    expect(MAX_CAPTURED_KEY).toBe(KEY_CAPACITY);
    expect(MAX_CAPTURED_VALUE).toBe(VALUE_CAPACITY);
    expect(MAX_CAPTURED_OPTION).toBe(OPTION_CAPACITY);
    expect(MAX_LINE).toBe(64 * 1024);
  });

  it('captures the key and options of SET key value NX EX n, and of no other SET', () => {
    const bytes = Buffer.concat([
      cmd('SET', 'k', '1796000000', 'NX', 'EX', '3600'),
      cmd('SET', 'k', '1', 'PX', '86400000000', 'NX'),
      cmd('SET', 'a', 'b'),
    ]);
    const heads: Array<[number, string, string, string, string]> = [];
    const text = (buf: Buffer, length: number) => buf.toString('latin1', 0, length);
    for (const { scanner } of frameHeads(bytes)) {
      heads.push([
        scanner.argc,
        text(scanner.key, scanner.keyLength),
        text(scanner.arg3, scanner.arg3Length),
        text(scanner.arg4, scanner.arg4Length),
        text(scanner.arg5, scanner.arg5Length),
      ]);
    }
    expect(heads).toEqual([
      [6, 'k', 'NX', 'EX', '3600'],
      [6, 'k', 'PX', '86400000000', 'NX'],
      [3, '', '', '', ''], // HEAD right after the name: nothing else is looked at
    ]);
  });

  it('frames a Stalwart lock block with a binary key', () => {
    // 9 bytes: 0x17 prefix, then CR LF and NUL inside.
    const key = Buffer.from([0x17, 0x6c, 0x0d, 0x0a, 0x00, 0x6b, 0x0d, 0x0a, 0x01]);
    expect(key.length).toBe(9);
    const frames = [bulk('MULTI'), bulk('INCRBY', key, '1'), bulk('EXPIRE', key, '3600'), bulk('EXEC')];
    const bytes = Buffer.concat(frames);
    const ends = frames.reduce<number[]>((acc, f) => [...acc, (acc.at(-1) ?? 0) + f.length], []);
    const records = scanBoth(bytes);
    // Split exactly between frames too.
    expect(scanChunks(frames.map((f) => Buffer.from(f)))).toEqual(records);

    const common = { inline: false, inlineOpaque: false, oversize: false };
    expect(records).toEqual([
      { start: 0, head: ends[0], end: ends[0], cmd: Cmd.Multi, argc: 1, key: '', value: '', ...common },
      {
        start: ends[0],
        head: ends[1],
        end: ends[1],
        cmd: Cmd.Incrby,
        argc: 3,
        key: key.toString('hex'),
        value: b('1').toString('hex'),
        ...common,
      },
      {
        start: ends[1],
        head: ends[2],
        end: ends[2],
        cmd: Cmd.Expire,
        argc: 3,
        key: key.toString('hex'),
        value: b('3600').toString('hex'),
        ...common,
      },
      { start: ends[2], head: ends[3], end: ends[3], cmd: Cmd.Exec, argc: 1, key: '', value: '', ...common },
    ]);
  });

  it('reports HEAD and END together for a frame whose head needs all its arguments', () => {
    const scanner = new RequestScanner();
    const bytes = bulk('INCRBY', 'k', '5');
    scanner.newChunk();
    const pos = scanner.next(bytes, 0);
    expect(pos).toBe(bytes.length);
    expect(scanner.event).toBe(HEAD | END);
    expect(scanner.frameStart).toBe(0);
    expect(scanner.atFrameBoundary).toBe(true);
  });

  it('classifies command names case-insensitively, and nothing else', () => {
    const cases: Array<[string, Cmd]> = [
      ['incrby', Cmd.Incrby],
      ['InCrBy', Cmd.Incrby],
      ['INCRBY', Cmd.Incrby],
      ['iNcR', Cmd.Incr],
      ['Multi', Cmd.Multi],
      ['pExPiRe', Cmd.Pexpire],
      ['Subscribe', Cmd.Uncountable],
      ['sunsubscribe', Cmd.Uncountable],
      ['INCRB', Cmd.Other],
      ['INCRBYX', Cmd.Other],
      ['INCRBYFLOAT', Cmd.Other],
      ['MULT\x09', Cmd.Other], // 0x09 | 0x20 is not 'i'
      ['MULT@', Cmd.Other],
      ['', Cmd.Other],
    ];
    for (const [name, cmd] of cases) {
      const [rec] = scanBoth(bulk(name, 'k', '1'));
      expect({ name, cmd: rec.cmd }).toEqual({ name, cmd });
    }
  });

  it('frames inline commands and blank lines', () => {
    const records = scanBoth(b('PING\r\n  multi  \r\n\r\n\nGET k\n \t\r\nexec\r\n'));
    expect(records.map((r) => [r.start, r.end, r.cmd, r.argc, r.inline, r.inlineOpaque])).toEqual([
      [0, 6, Cmd.Other, 1, true, false],
      [6, 17, Cmd.Multi, 1, true, false],
      [17, 19, Cmd.Empty, 0, true, false],
      [19, 20, Cmd.Empty, 0, true, false],
      [20, 26, Cmd.Other, 2, true, false],
      [26, 30, Cmd.Empty, 0, true, false],
      [30, 36, Cmd.Exec, 1, true, false],
    ]);
    for (const r of records) expect(r.head).toBe(r.end);
  });

  it('flags inline commands with quotes', () => {
    const records = scanBoth(b('SET "a b" c\r\nGET \'k\'\r\nPING\r\nECHO x"\n'));
    expect(records.map((r) => r.inlineOpaque)).toEqual([true, true, false, true]);
    expect(records.map((r) => r.cmd)).toEqual([Cmd.Set, Cmd.Other, Cmd.Other, Cmd.Other]);
  });

  it('treats *0, *-1 and other non-positive counts as empty frames', () => {
    const records = scanBoth(b('*0\r\n*-1\r\n*-5\r\n'));
    expect(records.map((r) => [r.start, r.head, r.end, r.cmd, r.argc, r.inline])).toEqual([
      [0, 4, 4, Cmd.Empty, 0, false],
      [4, 9, 9, Cmd.Empty, 0, false],
      [9, 14, 14, Cmd.Empty, 0, false],
    ]);
  });

  it('skips the byte after a line CR and the two bytes after a body unchecked, like Redis', () => {
    // Redis 7 answers this with two +PONG.
    const records = scanBoth(b('*1\rX$4\rYPINGxy*1\r\n$4\r\nPING\r\n'));
    expect(records.map((r) => [r.start, r.end, r.argc])).toEqual([
      [0, 14, 1],
      [14, 28, 1],
    ]);
  });

  it('streams a 10 MB SET value: HEAD after the name, END once at the end, the value never held', () => {
    const valueLength = 10 * 1024 * 1024;
    const head = b(`*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$${valueLength}\r\n`);
    const stream = Buffer.alloc(head.length + valueLength + 2 + 6, 0x76);
    head.copy(stream, 0);
    stream.write('\r\nPING\r\n', head.length + valueLength, 'latin1');
    const setEnd = head.length + valueLength + 2;
    const nameEnd = b('*3\r\n$3\r\nSET\r\n').length;

    const scanner = new RequestScanner();
    const events: Array<[number, number]> = [];
    let base = 0;
    let headSeen: { cmd: Cmd; argc: number; keyLength: number; chunk: number } | null = null;
    let chunkIndex = 0;
    for (const chunk of fixedChunks(stream, 64 * 1024)) {
      scanner.newChunk();
      let pos = 0;
      while (pos < chunk.length) {
        pos = scanner.next(chunk, pos);
        if (scanner.event === 0) break;
        if (scanner.event & MALFORMED) throw new Error(`MALFORMED at ${base + pos}: ${scanner.malformedReason}`);
        events.push([scanner.event, base + pos]);
        if (scanner.event & HEAD && headSeen === null) {
          headSeen = { cmd: scanner.cmd, argc: scanner.argc, keyLength: scanner.keyLength, chunk: chunkIndex };
        }
      }
      base += chunk.length;
      chunkIndex++;
    }
    expect(events).toEqual([
      [HEAD, nameEnd],
      [END, setEnd],
      [HEAD | END, setEnd + 6],
    ]);
    expect(headSeen).toEqual({ cmd: Cmd.Set, argc: 3, keyLength: 0, chunk: 0 });

    // Nothing the scanner keeps refers to the stream's memory, and all it owns is small.
    const owned: unknown[] = [];
    const walk = (v: unknown, depth: number): void => {
      if (v instanceof Uint8Array) owned.push(v);
      else if (v !== null && typeof v === 'object' && depth < 3) for (const x of Object.values(v)) walk(x, depth + 1);
    };
    walk(scanner, 0);
    expect(owned.length).toBeGreaterThan(0);
    for (const buf of owned as Uint8Array[]) {
      expect(buf.buffer).not.toBe(stream.buffer);
      expect(buf.length).toBeLessThanOrEqual(KEY_CAPACITY);
    }
  });

  it('marks an oversize key and reports HEAD right after its length line', () => {
    const bigKey = Buffer.alloc(KEY_CAPACITY + 1, 0x6b);
    const bytes = bulk('INCRBY', bigKey, '1');
    const lineEnd = b(`*3\r\n$6\r\nINCRBY\r\n$${KEY_CAPACITY + 1}\r\n`).length;
    const [rec] = scanBoth(bytes);
    expect(rec).toMatchObject({ cmd: Cmd.Incrby, argc: 3, oversize: true, head: lineEnd, end: bytes.length });
    expect(rec.key).toBe('');
    expect(rec.value).toBe('');
  });

  it('gives up on a name longer than any classified one as soon as its length is known', () => {
    const bytes = bulk('PUNSUBSCRIBES', 'x');
    const [rec] = scanBoth(bytes);
    expect(rec).toMatchObject({ cmd: Cmd.Other, argc: 2, oversize: true, key: '', end: bytes.length });
    expect(rec.head).toBe(b('*2\r\n$13\r\n').length);
    const [twelve] = scanBoth(bulk('PUNSUBSCRIBE', 'x'));
    expect(twelve).toMatchObject({ cmd: Cmd.Uncountable, oversize: false });
  });

  it('captures a key of exactly 1024 bytes, and marks a value over 32 bytes oversize', () => {
    const key = Buffer.alloc(KEY_CAPACITY, 0x6b);
    const [exact] = scanBoth(bulk('EXPIRE', key, '3600'));
    expect(exact).toMatchObject({ cmd: Cmd.Expire, oversize: false, key: key.toString('hex'), value: b('3600').toString('hex') });

    const longValue = '1'.repeat(VALUE_CAPACITY + 1);
    const [over] = scanBoth(bulk('PEXPIRE', 'k', longValue));
    expect(over).toMatchObject({ cmd: Cmd.Pexpire, oversize: true, key: b('k').toString('hex'), value: '' });

    const fits = '1'.repeat(VALUE_CAPACITY);
    const [exactValue] = scanBoth(bulk('PEXPIRE', 'k', fits));
    expect(exactValue).toMatchObject({ oversize: false, value: b(fits).toString('hex') });
  });

  it('exposes the CLIENT subcommand as the key (CLIENT REPLY OFF)', () => {
    const bytes = bulk('CLIENT', 'REPLY', 'OFF');
    const [rec] = scanBoth(bytes);
    expect(rec).toMatchObject({ cmd: Cmd.Client, argc: 3, key: b('REPLY').toString('hex'), oversize: false });
    // With three arguments the third is part of the head (CLIENT SETNAME's name), so HEAD comes with the end.
    expect(rec.head).toBe(bytes.length);
    expect(rec.end).toBe(bytes.length);
    const [named] = scanBoth(bulk('CLIENT', 'SETNAME', 'redis-lock-proxy-verify'));
    expect(named).toMatchObject({ key: b('SETNAME').toString('hex'), value: b('redis-lock-proxy-verify').toString('hex') });
    const [four] = scanBoth(bulk('CLIENT', 'KILL', 'ID', '7'));
    expect(four.head).toBe(b('*4\r\n$6\r\nCLIENT\r\n$4\r\nKILL\r\n').length);
  });
});

describe('RequestScanner malformed input', () => {
  const cases: Array<[string, Buffer, RegExp]> = [
    ["'+' where '$' is expected", b('*1\r\n+PING\r\n'), /expected '\$'/],
    ['a non-numeric count', b('*abc\r\n'), /multibulk length/],
    ['a count with a leading zero', b('*01\r\n$4\r\nPING\r\n'), /multibulk length/],
    ['a count with a plus sign', b('*+1\r\n$4\r\nPING\r\n'), /multibulk length/],
    ['a count of -0', b('*-0\r\n'), /multibulk length/],
    ['an empty count', b('*\r\n'), /multibulk length/],
    ['a count over INT_MAX', b('*2147483648\r\n'), /multibulk length/],
    ['$-1 as an argument length', b('*1\r\n$-1\r\n'), /bulk length/],
    ['an argument length with a leading zero', b('*1\r\n$01\r\nx\r\n'), /bulk length/],
    ['an argument length with a plus sign', b('*1\r\n$+1\r\nx\r\n'), /bulk length/],
    ['an empty argument length', b('*1\r\n$\r\n\r\n'), /bulk length/],
    ['a count line over 64 KiB without CR', b('*' + '1'.repeat(70_000)), /too long/],
    ['an argument length line over 64 KiB without CR', b('*1\r\n$' + '1'.repeat(70_000)), /too long/],
    ['an inline line over 64 KiB without LF', b('A'.repeat(70_000)), /inline/],
  ];

  for (const [title, bytes, reason] of cases) {
    it(`reports ${title}`, () => {
      for (const chunks of [[bytes], fixedChunks(bytes, 4096), fixedChunks(bytes, 7)]) {
        const outcome = scanForMalformed(chunks);
        expect(outcome.at).toBeGreaterThan(0);
        expect(outcome.at).toBeLessThanOrEqual(bytes.length);
        expect(outcome.frames).toBe(0);
        expect(outcome.reason).toMatch(reason);
      }
    });
  }

  it('reports MALFORMED after the valid frames before it', () => {
    const bytes = b('PING\r\n*1\r\n$4\r\nPING\r\n*abc\r\n');
    const outcome = scanForMalformed(oneByteChunks(bytes));
    expect(outcome.frames).toBe(2);
    expect(outcome.at).toBe(bytes.length);
  });

  it('does not report a long inline line that ends in time', () => {
    const bytes = b('A'.repeat(1000) + '\r\n');
    expect(scanForMalformed([bytes])).toEqual({ at: -1, reason: '', frames: 1 });
  });
});

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

/** Bytes that matter to a RESP parser show up often. */
const SPECIAL_BYTES = [0x0d, 0x0a, 0x00, 0x24, 0x2a, 0x17, 0x20];

/** Lengths at the capture capacities. */
const EDGE_LENGTHS = [0, 1, 11, 12, 13, 31, 32, 33, 1023, 1024, 1025];

function argArb(maxLength: number, bigLength: number): fc.Arbitrary<string> {
  const bytes: fc.Arbitrary<Uint8Array> = fc.oneof(
    { weight: 4, arbitrary: fc.uint8Array({ maxLength: Math.min(40, maxLength) }) },
    {
      weight: 6,
      arbitrary: fc
        .record({ len: fc.integer({ min: 0, max: maxLength }), seed: fc.integer() })
        .map(({ len, seed }) => seededBytes(len, seed, SPECIAL_BYTES)),
    },
    {
      weight: 2,
      arbitrary: fc
        .record({ len: fc.constantFrom(...EDGE_LENGTHS), seed: fc.integer() })
        .map(({ len, seed }) => seededBytes(len, seed, SPECIAL_BYTES)),
    },
    // Deltas and TTLs.
    { weight: 2, arbitrary: fc.integer({ min: -1_000_000, max: 1_000_000 }).map((n) => latin1(String(n))) },
    { weight: 1, arbitrary: fc.integer().map((seed) => seededBytes(bigLength, seed, SPECIAL_BYTES)) },
  );
  // As latin1 strings, so that counterexamples print readably.
  return bytes.map(fromLatin1);
}

const KNOWN_NAMES = [
  'MULTI',
  'EXEC',
  'INCR',
  'INCRBY',
  'EXPIRE',
  'PEXPIRE',
  'CLIENT',
  'GET',
  'SET',
  'SUBSCRIBE',
  'DISCARD',
  'WATCH',
  'UNWATCH',
  'RESET',
  'PSUBSCRIBE',
  'SUNSUBSCRIBE',
  'PUNSUBSCRIBE',
  'MONITOR',
  'SYNC',
  'PSYNC',
  // Near misses.
  'INCRBYFLOAT',
  'EXPIREAT',
  'MULTIX',
  'EXE',
  'CLIENTS',
  'SUBSCRIBERS',
  'PUNSUBSCRIBES',
  'CLIENTTRACKING',
];

const randomCase = (name: string): fc.Arbitrary<string> =>
  fc
    .array(fc.boolean(), { minLength: name.length, maxLength: name.length })
    .map((lower) => [...name].map((c, i) => (lower[i] ? c.toLowerCase() : c)).join(''));

const knownNameArb = fc.constantFrom(...KNOWN_NAMES).chain(randomCase);

const bulkNameArb: fc.Arbitrary<string> = fc.oneof(
  { weight: 6, arbitrary: knownNameArb },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 16 }).map(fromLatin1) },
  { weight: 1, arbitrary: fc.string({ maxLength: 14 }) },
  // Around the 12 bytes a name is classified from.
  {
    weight: 1,
    arbitrary: fc
      .record({ len: fc.constantFrom(12, 13, 14, 100), seed: fc.integer() })
      .map(({ len, seed }) => fromLatin1(seededBytes(len, seed, SPECIAL_BYTES))),
  },
);

/**
 * Token bytes of an unquoted inline command: printable, no quotes, and '\v'
 * and '\f', which sdssplitargs skips between arguments but keeps inside one.
 * No NUL: Redis never finds the end of a line holding one (strchr).
 */
const TOKEN_CHARS = [
  ...Array.from({ length: 0x7e - 0x21 + 1 }, (_, i) => String.fromCharCode(0x21 + i)).filter((c) => c !== '"' && c !== "'"),
  '\xe9',
  '\xff',
  '\v',
  '\f',
];
const tokenArb = fc.string({ unit: fc.constantFrom(...TOKEN_CHARS), minLength: 1, maxLength: 16 });

/** Unquoted inline commands, with every kind of whitespace around and between the words. */
const inlineArb: fc.Arbitrary<FrameSpec> = fc
  .record({
    lead: fc.constantFrom('', '', ' ', '  ', '\t', '\v', '\f ', '\r'),
    name: fc.oneof({ weight: 3, arbitrary: knownNameArb }, { weight: 1, arbitrary: tokenArb }),
    args: fc.array(tokenArb, { maxLength: 3 }),
    sep: fc.constantFrom(' ', '  ', '\t', '\r', ' \v', '\t\f', ' \f\v ', '\v', '\f'),
    trail: fc.constantFrom('', '', ' ', '\t', ' \v', '\r', '\v'),
    eol: fc.constantFrom('\r\n', '\n'),
  })
  .map(({ lead, name, args, sep, trail, eol }) => {
    let text = lead + [name, ...args].join(sep) + trail + eol;
    if (text.startsWith('*')) text = ' ' + text; // would be a multibulk
    return { kind: 'inline' as const, text };
  });

const emptyArb: fc.Arbitrary<FrameSpec> = fc
  .constantFrom('*0\r\n', '*-1\r\n', '*-7\r\n', '\r\n', '\n', ' \r\n', '\t \n', '\v\f\r\n')
  .map((text) => ({ kind: 'empty' as const, text }));

function frameArb(maxArgLength: number, bigArgLength: number): fc.Arbitrary<FrameSpec> {
  const bulkArb: fc.Arbitrary<FrameSpec> = fc
    .record({
      name: bulkNameArb,
      rest: fc.array(argArb(maxArgLength, bigArgLength), { maxLength: 6 }),
      junk: fc.oneof(
        { weight: 5, arbitrary: fc.constant(null) },
        { weight: 1, arbitrary: fc.constantFrom('xy', '\n\r', '\0\0', '**', '$$') },
      ),
    })
    .map(({ name, rest, junk }) => ({ kind: 'bulk' as const, args: [name, ...rest], junk }));
  // Commands whose key and value are captured, shaped like a lock block's.
  const capturingArb: fc.Arbitrary<FrameSpec> = fc
    .record({
      name: fc.constantFrom('INCR', 'INCRBY', 'EXPIRE', 'PEXPIRE', 'CLIENT').chain(randomCase),
      rest: fc.array(argArb(maxArgLength, bigArgLength), { maxLength: 4 }),
    })
    .map(({ name, rest }) => ({ kind: 'bulk' as const, args: [name, ...rest], junk: null }));
  return fc.oneof(
    { weight: 6, arbitrary: bulkArb },
    { weight: 3, arbitrary: capturingArb },
    { weight: 2, arbitrary: inlineArb },
    { weight: 1, arbitrary: emptyArb },
  );
}

describe('RequestScanner properties', () => {
  it('reports the same frames however the stream is split, and what the model predicts', () => {
    fc.assert(
      fc.property(fc.array(frameArb(2000, 5000), { maxLength: 10 }), fc.array(fc.nat(), { maxLength: 24 }), (frames, cuts) => {
        const { bytes, records } = model(frames);
        const whole = scanChunks([bytes]);
        expect(whole).toEqual(records);
        expect(scanChunks(splitAt(bytes, cuts))).toEqual(whole);
      }),
      { numRuns: 300 },
    );
  });

  it('reports the same frames when every byte is its own chunk', () => {
    fc.assert(
      fc.property(fc.array(frameArb(60, KEY_CAPACITY + 1), { maxLength: 6 }), (frames) => {
        const { bytes, records } = model(frames);
        const whole = scanChunks([bytes]);
        expect(whole).toEqual(records);
        expect(scanChunks(oneByteChunks(bytes))).toEqual(whole);
      }),
      { numRuns: 120 },
    );
  });
});

// ---------------------------------------------------------------------------
// Corners where Redis 7.0.15 was checked by hand.
// ---------------------------------------------------------------------------

describe('RequestScanner agrees with Redis', () => {
  it("does not end an inline command name at '\\v' or '\\f' (sdssplitargs does not)", () => {
    // Redis answers `MULTI\v\r\n` with "-ERR unknown command 'MULTI\v'", and
    // `EXEC\f\r\n` likewise: the name includes the byte. Taking them for
    // MULTI / EXEC would make the session believe a transaction started or ended.
    const records = scanBoth(b('MULTI\x0b\r\nEXEC\x0c\r\nINCR\x0bk\r\n\x0b\x0cPING \x0bx\r\n'));
    expect(records.map((r) => [r.cmd, r.argc])).toEqual([
      [Cmd.Other, 1],
      [Cmd.Other, 1],
      [Cmd.Other, 1],
      [Cmd.Other, 2],
    ]);
  });

  it('treats any multibulk count string2ll accepts and that is <= 0 as an empty frame', () => {
    // Redis answers `*-9007199254740993\r\nPING\r\n` with a single +PONG.
    const bytes = b('*-9007199254740993\r\n*-9223372036854775808\r\nPING\r\n');
    expect(scanForMalformed([bytes])).toEqual({ at: -1, reason: '', frames: 3 });
    expect(scanBoth(bytes).map((r) => r.cmd)).toEqual([Cmd.Empty, Cmd.Empty, Cmd.Other]);
  });

  it('refuses a count string2ll refuses (beyond the int64 range)', () => {
    for (const text of ['*-9223372036854775809\r\n', '*-10000000000000000000\r\n', '*99999999999999999999\r\n']) {
      expect({ text, malformed: scanForMalformed([b(text)]).at > 0 }).toEqual({ text, malformed: true });
    }
  });
});

describe('RequestScanner.couldStillBe (which unfinished frames may be kept back)', () => {
  const MULTI = Buffer.from('MULTI');

  /** Feeds `bytes` in one chunk and asks, with the frame's head not complete yet. */
  function askAfter(bytes: Buffer | string, name = MULTI, argc = 1): boolean {
    const scanner = new RequestScanner();
    scanner.newChunk();
    const buf = Buffer.from(bytes);
    let pos = 0;
    while (pos < buf.length) pos = scanner.next(buf, pos);
    expect(scanner.awaitingHead || scanner.atFrameBoundary).toBe(true);
    return scanner.couldStillBe(name, argc);
  }

  /**
   * The model: the bytes so far begin `*1\r\n$5\r\n` + MULTI in any case. Like Redis, the byte
   * after each `\r` is not checked (networking.c skips it), nor are the two after the name.
   */
  function modelMultiPrefix(bytes: Buffer): boolean {
    const template = Buffer.from('*1\r\n$5\r\nmulti');
    for (let i = 0; i < bytes.length && i < template.length; i++) {
      if (i === 3 || i === 7) continue;
      const a = i >= 8 ? bytes[i] | 0x20 : bytes[i];
      if (a !== template[i] || (i >= 8 && !/[a-zA-Z]/.test(String.fromCharCode(bytes[i])))) return false;
    }
    return true;
  }

  it('is true for every proper prefix of a MULTI frame, in any letter case', () => {
    for (const frame of ['*1\r\n$5\r\nMULTI\r\n', '*1\r\n$5\r\nmulti\r\n', '*1\r\n$5\r\nMuLtI\r\n']) {
      for (let cut = 0; cut < frame.length; cut++) expect(askAfter(frame.slice(0, cut)), JSON.stringify(frame.slice(0, cut))).toBe(true);
    }
  });

  it('turns false at the first byte that rules MULTI out', () => {
    for (const bytes of [
      '*10',
      '*2',
      '*1\r\n$4',
      '*1\r\n$50',
      '*1\r\n$5\r\nMULX',
      '*-',
      '*01',
      'M',
      'MULTI',
      '*1\r\n$5\r\nMULT1',
      '*1\r\n$5\r\nMU\x00',
    ]) {
      expect(askAfter(bytes), JSON.stringify(bytes)).toBe(false);
    }
  });

  it('agrees with the model on random prefixes of MULTI-like frames', () => {
    const alphabet = ['*', '1', '2', '\r', '\n', '$', '5', '4', 'M', 'm', 'U', 'u', 'L', 'T', 't', 'I', 'i', 'X', '0'];
    fc.assert(
      fc.property(fc.array(fc.constantFrom(...alphabet), { maxLength: 13 }), (chars) => {
        const bytes = Buffer.from(chars.join(''), 'latin1');
        const scanner = new RequestScanner();
        scanner.newChunk();
        let pos = 0;
        let ended = false;
        while (pos < bytes.length && !ended) {
          pos = scanner.next(bytes, pos);
          ended = scanner.event !== 0; // a head, an end or malformed: not the unfinished case
        }
        if (ended) return;
        expect(scanner.couldStillBe(MULTI, 1), JSON.stringify(chars.join(''))).toBe(modelMultiPrefix(bytes));
      }),
      { numRuns: 3000 },
    );
  });

  it('answers for other names and counts too (the commands of a lock block)', () => {
    expect(askAfter('*3\r\n$6\r\nINCR', Buffer.from('INCRBY'), 3)).toBe(true);
    expect(askAfter('*3\r\n$6\r\nINCR', Buffer.from('INCR'), 2)).toBe(false);
    expect(askAfter('*2\r\n$4\r\nin', Buffer.from('INCR'), 2)).toBe(true);
    expect(askAfter('*3\r\n$7\r\nPEX', Buffer.from('EXPIRE'), 3)).toBe(false);
    expect(askAfter('*1\r\n$4\r\nEX', Buffer.from('EXEC'), 1)).toBe(true);
  });
});
