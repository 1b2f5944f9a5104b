/**
 * Key layouts (`key:` in a rule) and descriptions (`describe:`): what a layout reads, what it
 * refuses, how decoding and building round-trip, and the errors a rule file gets.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { describeFields, parseDescription } from '../src/rules/key-description.js';
import { buildKey, decodeLayout, matchesLayout, parseKeyLayout, type KeyLayout } from '../src/rules/key-layout.js';
import { RuleFileError } from '../src/errors.js';
import { parseRuleFile } from '../src/rules/loader.js';
import { leb128, taskEpoch } from './support/stalwart-releases.js';

const problem = (where: string, text: string) => new Error(`${where}: ${text}`);
const layout = (value: unknown): KeyLayout => parseKeyLayout(value, problem);
const bytes = (...parts: Array<number[] | string | Buffer>) =>
  Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p) : Buffer.from(p))));

/** The error of a one-rule file with these extra lines. */
function ruleError(lines: string): RuleFileError {
  try {
    parseRuleFile(`rules:\n  - name: r\n${lines}`, 'x.yaml');
  } catch (error) {
    expect(error).toBeInstanceOf(RuleFileError);
    return error as RuleFileError;
  }
  throw new Error('expected a RuleFileError');
}

describe('matching', () => {
  it('reads literals and fixed-width integers exactly, and nothing more or less', () => {
    const l = layout([{ hex: '17' }, { u64: 'task' }]);
    expect(l.prefix).toEqual(Buffer.from([0x17]));
    expect(matchesLayout(l, bytes([0x17], Buffer.alloc(8, 0xff)))).toBe(true);
    expect(matchesLayout(l, bytes([0x17], Buffer.alloc(8, 0x0a)))).toBe(true);
    expect(matchesLayout(l, bytes([0x17], Buffer.alloc(7)))).toBe(false);
    expect(matchesLayout(l, bytes([0x17], Buffer.alloc(9)))).toBe(false);
    expect(matchesLayout(l, bytes([0x16], Buffer.alloc(8)))).toBe(false);
  });

  it('reads LEB128 u32 in shortest form only: 1 to 5 bytes, no zero last group, a fifth byte up to 0x0f', () => {
    const l = layout([{ hex: 'aa' }, { leb128: 'n' }]);
    for (const n of [0, 1, 127, 128, 16_383, 16_384, 2 ** 28 - 1, 2 ** 28, 2 ** 32 - 1]) {
      expect(matchesLayout(l, bytes([0xaa], leb128(n))), String(n)).toBe(true);
    }
    expect(matchesLayout(l, bytes([0xaa], [0x80, 0x00]))).toBe(false); // 0 written in two bytes
    expect(matchesLayout(l, bytes([0xaa], [0xff, 0xff, 0xff, 0xff, 0x10]))).toBe(false); // 2^32
    expect(matchesLayout(l, bytes([0xaa], [0x80, 0x80, 0x80, 0x80, 0x80, 0x01]))).toBe(false); // 6 bytes
    expect(matchesLayout(l, bytes([0xaa], [0x80]))).toBe(false); // continues past the end
    expect(matchesLayout(l, bytes([0xaa]))).toBe(false);
  });

  it('reads decimals as a u32 without sign or leading zeros, taking every digit', () => {
    const l = layout([{ text: 'purge:' }, { decimal: 'account' }]);
    for (const text of ['0', '7', '4294967295', '1000000000']) expect(matchesLayout(l, bytes('purge:', text)), text).toBe(true);
    for (const text of ['', '01', '-1', '+1', '4294967296', '99999999999', '1 ', '1a']) {
      expect(matchesLayout(l, bytes('purge:', text)), text).toBe(false);
    }
    const around = layout([{ hex: '18' }, { text: 'migrate_' }, { decimal: 'account' }, { text: '_lock' }]);
    expect(matchesLayout(around, bytes([0x18], 'migrate_42_lock'))).toBe(true);
    expect(matchesLayout(around, bytes([0x18], 'migrate_core_lock'))).toBe(false);
    expect(matchesLayout(around, bytes([0x18], 'migrate_42_done'))).toBe(false);
  });

  it('reads a domain to the end: printable ASCII or UTF-8, never a control byte, NUL or space', () => {
    const l = layout([{ hex: '16 00' }, { u64: 'due' }, { domain: 'domain' }]);
    const head = bytes([0x16, 0x00], Buffer.alloc(8));
    for (const domain of ['example.org', 'xn--bcher-kva.example', 'bücher.example', 'почта.рф', 'MX_1.Example-A.org', 'x']) {
      expect(matchesLayout(l, bytes(head, domain)), domain).toBe(true);
    }
    for (const bad of [
      Buffer.alloc(0),
      bytes('a\0b'),
      bytes('a b'),
      bytes('a\r\n'),
      bytes('a\x7f'),
      bytes([0x61, 0xc3]),
      Buffer.alloc(254, 0x61),
    ]) {
      expect(matchesLayout(l, bytes(head, bad)), bad.toString('hex')).toBe(false);
    }
  });

  it('decodes what it matched, and builds keys that decode to the same values', () => {
    const l = layout([
      { hex: '17 00' },
      { u64: 'due' },
      { leb128: 'account' },
      { leb128: 'document' },
      { u8: 'index' },
      { bytes: 'name', length: 3 },
    ]);
    fc.assert(
      fc.property(
        fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }),
        fc.bigInt({ min: 0n, max: 2n ** 32n - 1n }),
        fc.bigInt({ min: 0n, max: 2n ** 32n - 1n }),
        fc.bigInt({ min: 0n, max: 255n }),
        fc.uint8Array({ minLength: 3, maxLength: 3 }),
        (due, account, document, index, name) => {
          const values = new Map<string, bigint | Buffer>([
            ['due', due],
            ['account', account],
            ['document', document],
            ['index', index],
            ['name', Buffer.from(name)],
          ]);
          const key = buildKey(l, values);
          expect(key).toEqual(
            bytes([0x17, 0x00], bigEndian(due, 8), leb128(account), leb128(document), [Number(index)], Buffer.from(name)),
          );
          expect(decodeLayout(l, key)).toEqual(values);
        },
      ),
    );
    expect(decodeLayout(l, bytes([0x17, 0x01]))).toBeUndefined();
    expect(() => buildKey(l, new Map())).toThrow(/no value for field "due"/);
  });
});

function bigEndian(n: bigint, width: number): Buffer {
  const out = Buffer.alloc(width);
  for (let i = width - 1; i >= 0; i--, n >>= 8n) out[i] = Number(n & 0xffn);
  return out;
}

describe('describe templates', () => {
  const l = layout([{ hex: '17 00' }, { u64: 'due' }, { leb128: 'account' }, { bytes: 'queue', length: 8 }]);
  const say = (template: string, key: Buffer) =>
    describeFields(
      parseDescription(template, l, (t) => new Error(t)),
      decodeLayout(l, key)!,
    );
  const key = (due: bigint, queue: string | Buffer) =>
    bytes([0x17, 0x00], bigEndian(due, 8), leb128(12), Buffer.concat([Buffer.from(queue), Buffer.alloc(8)]).subarray(0, 8));

  it('writes integers, times and padded names', () => {
    expect(say('due {due} account {account} queue "{queue}"', key(5n, 'local'))).toBe('due 5 account 12 queue "local"');
    expect(say('due {due:time}', key(1_777_629_600n, 'x'))).toBe('due 2026-05-01T10:00:00Z');
    expect(say('due {due:time}', key(2n ** 63n, 'x'))).toBe(`due ${2n ** 63n}`);
    // task-time reads both the Unix seconds of 0.12.5-0.14 and the TaskEpoch of 0.15.
    expect(say('{due:task-time}', key(1_777_629_600n, 'x'))).toBe('2026-05-01T10:00:00Z');
    expect(say('{due:task-time}', key(taskEpoch(1_777_629_600, 3, 77), 'x'))).toBe('2026-05-01T10:00:00Z');
    expect(say('"{queue}"', key(0n, bytes([0x61, 0x22, 0x0a, 0x00, 0x5c, 0xff])))).toBe('"a\\x22\\x0a\\x00\\x5c\\xff"');
    expect(say('"{queue}"', key(0n, ''))).toBe('""');
  });

  it('refuses unknown fields, formats and stray braces', () => {
    const bad = (template: string) => () => parseDescription(template, l, (t) => new Error(t));
    expect(bad('{nope}')).toThrow(/"\{nope\}" names no field of the key \(fields: due, account, queue\)/);
    expect(bad('{due:date}')).toThrow(/write \{field\}, \{field:time\} or \{field:task-time\}/);
    expect(bad('{queue:time}')).toThrow(/only an integer field can be written as a time/);
    expect(bad('a } b')).toThrow(/unbalanced/);
    expect(bad('  ')).toThrow(/is empty/);
  });
});

describe('rule file errors for key and describe', () => {
  it('names the part of the key that is wrong', () => {
    expect(ruleError('    key: [{hex: "17"}, {u65: x}]\n').message).toBe(
      'x.yaml, line 3: rule 1 ("r"): field "key[2]": unknown part type "u65": give exactly one of hex, text, u8, u32, u64, leb128, decimal, domain, bytes',
    );
    expect(ruleError('    key: [{hex: "17", u8: x}]\n').message).toMatch(/field "key\[1\]": 2 part types/);
    expect(ruleError('    key: [{hex: 17}]\n').message).toMatch(
      /field "key\[1\]": hex: must be a string, got 17 \(quote hex digits: hex: "17"\)/,
    );
    expect(ruleError('    key: [{hex: "1"}]\n').message).toMatch(/field "key\[1\]": odd number of hex digits/);
    expect(ruleError('    key: [{u64: id}]\n').message).toMatch(/field "key\[1\]": must be literal bytes \(hex or text\)/);
    expect(ruleError('    key: [{hex: "17"}, {u64: Id}]\n').message).toMatch(/field name must be lowercase/);
    expect(ruleError('    key: [{hex: "17"}, {u8: a}, {u8: a}]\n').message).toMatch(/field "key\[3\]": field name "a" is used twice/);
    expect(ruleError('    key: [{hex: "16"}, {domain: d}, {u8: a}]\n').message).toMatch(
      /field "key\[2\]": a domain takes the rest of the key/,
    );
    expect(ruleError('    key: [{text: "a"}, {decimal: n}, {text: "1"}]\n').message).toMatch(
      /field "key\[3\]": cannot start with a digit right after a decimal/,
    );
    expect(ruleError('    key: [{hex: "17"}, {bytes: b}]\n').message).toMatch(/bytes: needs "length"/);
    expect(ruleError('    key: [{hex: "17"}, {u8: b, length: 2}]\n').message).toMatch(/"length" goes only with bytes/);
    expect(ruleError('    key: []\n').message).toMatch(/field "key": must be a non-empty list of parts/);
    expect(ruleError('    key: [{hex: "17"}]\n    prefix_hex: "17"\n').message).toMatch(
      /field "prefix_hex": cannot be combined with "key"/,
    );
    expect(ruleError('    key: [{hex: "17"}]\n    describe: "{x}"\n').message).toMatch(
      /field "describe": "\{x\}" names no field of the key/,
    );
    expect(ruleError('    prefix: "a"\n    describe: "{x}"\n').message).toMatch(/\(the rule has no key: layout\)/);
  });

  it('a rule with a key layout has its literal head as prefix, and a fixed key is allowed', () => {
    const [rule] = parseRuleFile('rules:\n  - name: core\n    key: [{hex: "18"}, {text: "migrate_core_lock"}]\n', 'x.yaml').rules;
    expect(rule.prefix).toEqual(bytes([0x18], 'migrate_core_lock'));
    expect(rule.pattern).toBeUndefined();
  });
});
