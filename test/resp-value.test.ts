/**
 * The RESP reply tree of src/resp/value.ts: decoding and encoding give back
 * the same bytes for every RESP2 and RESP3 type, and the accessors the
 * cluster rewriting uses read and edit string, integer and map replies.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  decodeReply,
  encodeReply,
  integerOf,
  pairsOf,
  RespDecodeError,
  setInteger,
  setText,
  textOf,
  type RespValue,
} from '../src/resp/value.js';

/** Replies are written as latin1 strings, so that every byte value can appear in them. */
const latin1 = (text: string): Buffer => Buffer.from(text, 'latin1');

/** The decoded tree of a complete reply. */
const parse = (text: string): RespValue => decodeReply(latin1(text)).value;

/** A tree encoded back into a latin1 string. */
const encoded = (value: RespValue): string => encodeReply(value).toString('latin1');

/** The tree after `edit`, encoded. */
function edited(text: string, edit: (value: RespValue) => void): string {
  const value = parse(text);
  edit(value);
  return encoded(value);
}

/** `decodeReply` of each prefix that is not the whole reply (also one that stops between CR and LF): each must throw. */
function expectPrefixesRefused(bytes: Buffer): void {
  for (let length = 0; length < bytes.length; length++) {
    expect(() => decodeReply(bytes.subarray(0, length)), `prefix of ${length} bytes`).toThrow(RespDecodeError);
  }
}

// Every reply type, as Redis writes it.
const REPLIES: Array<[string, string]> = [
  ['simple string', '+OK\r\n'],
  ['simple error', '-MOVED 3999 127.0.0.1:6381\r\n'],
  ['integer', ':-42\r\n'],
  ['bulk string holding CR LF', '$6\r\nab\r\ncd\r\n'],
  ['empty bulk string', '$0\r\n\r\n'],
  ['binary bulk string', '$5\r\n\xff\x00\r\x80\xe9\r\n'],
  ['null bulk string', '$-1\r\n'],
  ['array', '*3\r\n$3\r\nfoo\r\n:1\r\n$-1\r\n'],
  ['empty array', '*0\r\n'],
  ['null array', '*-1\r\n'],
  ['null', '_\r\n'],
  ['double', ',1.23e-5\r\n'],
  ['boolean', '#f\r\n'],
  ['big number', '(3492890328409238509324850943850943825024385\r\n'],
  ['bulk error', '!21\r\nSYNTAX invalid syntax\r\n'],
  ['verbatim string', '=15\r\ntxt:Some string\r\n'],
  ['map', '%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n'],
  ['empty map', '%0\r\n'],
  ['nested maps', '%2\r\n$5\r\nouter\r\n%1\r\n$5\r\ninner\r\n%1\r\n+k\r\n*2\r\n_\r\n#t\r\n+n\r\n:0\r\n'],
  ['set', '~3\r\n+a\r\n+b\r\n+c\r\n'],
  ['push', '>3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n'],
  ['arrays nested in arrays', '*2\r\n*1\r\n*0\r\n*2\r\n-ERR a\r\n(1\r\n'],
  // HELLO 3 to redis-server 7.0.15 in cluster mode, as it was received.
  [
    'HELLO 3 reply of Redis 7.0',
    '%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:5\r\n$4\r\nmode\r\n$7\r\ncluster\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n',
  ],
];

describe('decodeReply and encodeReply', () => {
  it.each(REPLIES)('give back the same bytes: %s', (_name, text) => {
    const bytes = latin1(text);
    const { value, end } = decodeReply(bytes);
    expect(end).toBe(bytes.length);
    expect(encodeReply(value).equals(bytes)).toBe(true);
  });

  it.each(REPLIES)('refuse an incomplete reply with RespDecodeError: %s', (_name, text) => {
    expectPrefixesRefused(latin1(text));
  });

  it('decode from an offset and end where the reply ends, before whatever follows', () => {
    const bytes = latin1('+OK\r\n*2\r\n:1\r\n$1\r\nx\r\n:7\r\n');
    const { value, end } = decodeReply(bytes, 5);
    expect(end).toBe(bytes.length - 4);
    expect(encoded(value)).toBe('*2\r\n:1\r\n$1\r\nx\r\n');
  });

  it('tell nulls from empty values', () => {
    expect(parse('$-1\r\n')).toEqual({ type: 0x24, data: null, kind: 'bulk' });
    expect(parse('*-1\r\n')).toEqual({ type: 0x2a, items: null, kind: 'aggregate' });
    expect(parse('$0\r\n\r\n')).toEqual({ type: 0x24, data: Buffer.alloc(0), kind: 'bulk' });
    expect(parse('*0\r\n')).toEqual({ type: 0x2a, items: [], kind: 'aggregate' });
    expect(parse('_\r\n')).toEqual({ type: 0x5f, line: '', kind: 'line' });
  });

  it('keep the keys and values of a map in order, alternating', () => {
    const value = parse('%2\r\n+first\r\n:1\r\n+second\r\n$3\r\ntwo\r\n');
    expect(value.kind === 'aggregate' && value.items?.map(textOrInteger)).toEqual(['first', 1, 'second', 'two']);
  });

  it('decode an attribute on its own: the value it annotates starts at its end', () => {
    const text = '|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.1923\r\n*2\r\n:2039123\r\n:9543892\r\n';
    const bytes = latin1(text);
    const attribute = decodeReply(bytes);
    const annotated = decodeReply(bytes, attribute.end);
    expect(annotated.end).toBe(bytes.length);
    expect(encoded(attribute.value) + encoded(annotated.value)).toBe(text);
    expect(encoded(annotated.value)).toBe('*2\r\n:2039123\r\n:9543892\r\n');
  });

  it('refuse an unknown type byte and an empty buffer', () => {
    expect(() => decodeReply(latin1('@x\r\n'))).toThrow(new RespDecodeError('unexpected reply type byte 0x40'));
    expect(() => decodeReply(latin1('*1\r\n?\r\n'))).toThrow(RespDecodeError);
    expect(() => decodeReply(Buffer.alloc(0))).toThrow(RespDecodeError);
    expect(() => decodeReply(latin1('+OK\r\n'), 5)).toThrow(RespDecodeError);
  });
});

function textOrInteger(value: RespValue): string | number | null {
  return value.kind === 'line' && value.type === 0x3a ? integerOf(value) : textOf(value);
}

// ---------------------------------------------------------------------------
// Random replies
// ---------------------------------------------------------------------------

const lineText = fc.string({ maxLength: 12 }).map((s) => s.replace(/[\r\n]/g, '.'));
const body = fc.uint8Array({ maxLength: 40 }).map((b) => Buffer.from(b).toString('latin1'));
const blob = (type: string, data: string): string => `${type}${Buffer.byteLength(data, 'latin1')}\r\n${data}\r\n`;

const leafReply: fc.Arbitrary<string> = fc.oneof(
  fc.tuple(fc.constantFrom('+', '-'), lineText).map(([type, text]) => `${type}${text}\r\n`),
  fc.integer().map((n) => `:${n}\r\n`),
  fc.bigInt().map((n) => `(${n}\r\n`),
  fc.double({ noNaN: true }).map((d) => `,${d}\r\n`),
  fc.constantFrom('_\r\n', '#t\r\n', '#f\r\n', ',inf\r\n', ',nan\r\n', '$-1\r\n', '*-1\r\n'),
  fc.tuple(fc.constantFrom('$', '!'), body).map(([type, data]) => blob(type, data)),
  body.map((data) => blob('=', `txt:${data}`)),
);

const { reply: replyArb } = fc.letrec<{ reply: string }>((tie) => ({
  reply: fc.oneof(
    { depthSize: 'small', maxDepth: 4 },
    leafReply,
    fc
      .tuple(fc.constantFrom('*', '~', '>'), fc.array(tie('reply'), { maxLength: 4 }))
      .map(([type, items]) => `${type}${items.length}\r\n${items.join('')}`),
    fc.array(fc.tuple(tie('reply'), tie('reply')), { maxLength: 3 }).map((pairs) => `%${pairs.length}\r\n${pairs.flat().join('')}`),
  ),
}));

describe('decodeReply and encodeReply on random replies', () => {
  it('encode(decode(x)) is x, byte for byte, and decoding ends where x ends', () => {
    fc.assert(
      fc.property(replyArb, leafReply, (text, next) => {
        const bytes = latin1(text);
        const { value, end } = decodeReply(latin1(next + text + next), Buffer.byteLength(next, 'latin1'));
        expect(end).toBe(Buffer.byteLength(next + text, 'latin1'));
        expect(encodeReply(value).equals(bytes)).toBe(true);
      }),
      { numRuns: 500 },
    );
  });

  it('refuses every incomplete prefix', () => {
    fc.assert(
      fc.property(replyArb, (text) => expectPrefixesRefused(latin1(text))),
      { numRuns: 200 },
    );
  });
});

// ---------------------------------------------------------------------------
// Accessors
// ---------------------------------------------------------------------------

describe('textOf', () => {
  it.each([
    ['+OK\r\n', 'OK'],
    ['$5\r\nhello\r\n', 'hello'],
    ['$0\r\n\r\n', ''],
    ['$3\r\n\xe9\x00\xff\r\n', '\xe9\x00\xff'],
    ['=15\r\ntxt:Some string\r\n', 'Some string'],
    ['=7\r\nmkd:# x\r\n', '# x'],
  ])('reads the text of %j', (text, expected) => {
    expect(textOf(parse(text))).toBe(expected);
  });

  it.each(['$-1\r\n', '!3\r\nERR\r\n', '-ERR x\r\n', ':1\r\n', '_\r\n', ',1.5\r\n', '*1\r\n+a\r\n', '%0\r\n'])('is null for %j', (text) => {
    expect(textOf(parse(text))).toBeNull();
  });

  it('is null for no value', () => {
    expect(textOf(undefined)).toBeNull();
  });
});

describe('setText', () => {
  it.each([
    ['+OK\r\n', 'changed', '+changed\r\n'],
    ['$9\r\n127.0.0.1\r\n', 'px.example', '$10\r\npx.example\r\n'],
    ['$1\r\n?\r\n', '', '$0\r\n\r\n'],
    ['=8\r\ntxt:a b\n\r\n', 'longer text\n', '=16\r\ntxt:longer text\n\r\n'],
    ['=7\r\nmkd:# x\r\n', '# y', '=7\r\nmkd:# y\r\n'],
    ['$-1\r\n', 'ignored', '$-1\r\n'],
  ])('sets the text of %j, keeping its type', (text, replacement, expected) => {
    const value = parse(text);
    setText(value, replacement);
    expect(encoded(value)).toBe(expected);
    if (textOf(parse(expected)) !== null) expect(textOf(value)).toBe(replacement);
  });

  it('leaves an aggregate alone', () => {
    expect(edited('*1\r\n+a\r\n', (value) => setText(value, 'x'))).toBe('*1\r\n+a\r\n');
  });
});

describe('integerOf and setInteger', () => {
  it.each([
    [':32001\r\n', 32001],
    [':-1\r\n', -1],
    [':0\r\n', 0],
    ['$5\r\n32001\r\n', 32001],
    ['+17\r\n', 17],
    ['=6\r\ntxt:12\r\n', 12],
  ])('reads %j as %d', (text, expected) => {
    expect(integerOf(parse(text))).toBe(expected);
  });

  it.each(['$3\r\nabc\r\n', '$0\r\n\r\n', '$4\r\n1.50\r\n', ',1.5\r\n', '(12\r\n', '#t\r\n', '_\r\n', '$-1\r\n', '-1\r\n', '*1\r\n:1\r\n'])(
    'is null for %j',
    (text) => {
      expect(integerOf(parse(text))).toBeNull();
    },
  );

  it('is null for no value', () => {
    expect(integerOf(undefined)).toBeNull();
  });

  it.each([
    [':32001\r\n', 7001, ':7001\r\n'],
    [':0\r\n', 65535, ':65535\r\n'],
    ['$5\r\n32001\r\n', 7, '$1\r\n7\r\n'],
    ['+32001\r\n', 7001, '+7001\r\n'],
  ])('sets %j to %d, keeping its type', (text, n, expected) => {
    expect(edited(text, (value) => setInteger(value, n))).toBe(expected);
  });
});

describe('pairsOf', () => {
  /** The pairs of a reply, values encoded back to text. */
  function pairs(text: string): Array<[string, string]> | null {
    return pairsOf(parse(text))?.map(([key, value]) => [key, encoded(value)]) ?? null;
  }

  it.each([
    ['a RESP3 map', '%2\r\n$2\r\nid\r\n$3\r\nabc\r\n$4\r\nport\r\n:32001\r\n'],
    ['a RESP2 flat array of alternating keys and values', '*4\r\n$2\r\nid\r\n$3\r\nabc\r\n+port\r\n:32001\r\n'],
  ])('reads %s', (_name, text) => {
    expect(pairs(text)).toEqual([
      ['id', '$3\r\nabc\r\n'],
      ['port', ':32001\r\n'],
    ]);
  });

  it('gives the values themselves, so that they can be edited in place', () => {
    const value = parse('%1\r\n$8\r\nhostname\r\n$14\r\nnode-1.example\r\n');
    const [[, hostname]] = pairsOf(value) ?? [];
    setText(hostname, 'px');
    expect(encoded(value)).toBe('%1\r\n$8\r\nhostname\r\n$2\r\npx\r\n');
  });

  it('reads an empty map or array as no pairs', () => {
    expect(pairs('%0\r\n')).toEqual([]);
    expect(pairs('*0\r\n')).toEqual([]);
  });

  it.each([
    ['an odd-length array', '*3\r\n+a\r\n:1\r\n+b\r\n'],
    ['a key that is not a string', '*2\r\n:1\r\n+a\r\n'],
    ['a null key', '%1\r\n$-1\r\n+a\r\n'],
    ['a null array', '*-1\r\n'],
    ['a bulk string', '$2\r\nid\r\n'],
    ['an integer', ':1\r\n'],
  ])('is null for %s', (_name, text) => {
    expect(pairsOf(parse(text))).toBeNull();
  });

  it('is null for no value', () => {
    expect(pairsOf(undefined)).toBeNull();
  });
});
