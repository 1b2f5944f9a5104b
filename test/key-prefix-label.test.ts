/**
 * keyPrefixLabel: what a key starts with, as a metric label of bounded variety and with nothing
 * of the key past its namespace; and Stats' bound on how many such labels it keeps apart.
 */
import { describe, expect, it } from 'vitest';
import { keyPrefixLabel } from '../src/key-text.js';
import { MAX_UNCOVERED_PREFIXES, OTHER_PREFIX, Stats } from '../src/stats.js';
import { taskLockKey } from './support/stalwart.js';

const label = (key: string | Buffer) => keyPrefixLabel(typeof key === 'string' ? Buffer.from(key, 'latin1') : key);

describe('keyPrefixLabel', () => {
  it('names a text namespace up to its colon, and otherwise the first byte in hex', () => {
    expect(label('lock:42')).toBe('lock:');
    expect(label('purge:12')).toBe('purge:');
    expect(label('b:\x00\x00\x00\x00\x00\x00\x00\x01')).toBe('b:'); // 0.8-0.10 rate limits: text, then the window
    expect(label(taskLockKey(7n))).toBe('0x17');
    expect(label('\x02abc:1')).toBe('0x02'); // not text before its colon
    expect(label('user 1:x')).toBe('0x75'); // a space: not a namespace
    expect(label(':x')).toBe('0x3a');
    expect(label('counter')).toBe('0x63'); // no colon
    expect(label(`${'a'.repeat(33)}:x`)).toBe('0x61'); // too long to be a namespace
    expect(label(`${'a'.repeat(32)}:x`)).toBe(`${'a'.repeat(32)}:`);
    expect(label('')).toBe('empty');
  });

  it('reads only the key it is given, not the rest of the buffer it lies in', () => {
    const buffer = Buffer.from('xxlock:1', 'latin1');
    expect(keyPrefixLabel(buffer.subarray(2))).toBe('lock:');
    expect(keyPrefixLabel(buffer.subarray(2, 5))).toBe('0x6c');
  });
});

describe('Stats: lock-shaped blocks no rule covers', () => {
  it('keeps at most MAX_UNCOVERED_PREFIXES prefixes apart, the rest together', () => {
    const stats = new Stats();
    for (let i = 0; i < MAX_UNCOVERED_PREFIXES + 10; i++) stats.blockUncovered(`p${i}:`);
    stats.blockUncovered('p0:');
    expect(stats.uncovered.size).toBe(MAX_UNCOVERED_PREFIXES + 1);
    expect(stats.uncovered.get('p0:')).toBe(2);
    expect(stats.uncovered.get(OTHER_PREFIX)).toBe(10);
  });
});
