/**
 * ExpiryRestore: EXEC's reply after lock pairs were fixed, walked as it streams. Each expiry's
 * `:0` becomes `:1` in place, the elements of the copies Redis only checked (the
 * transaction-script way) are cut out with the count said again, however the reply is split,
 * with pushes inside the array that are no element of it; a reply framed wrongly is reported,
 * never read out of bounds.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ExpiryRestore, restoreExpiryReplies, type ExecEdits } from '../src/lock/exec-reply.js';
import { splitAt } from './support/chunks.js';

const restore = (reply: string, indexes: number[]): string =>
  restoreExpiryReplies(Buffer.from(reply, 'latin1'), indexes).toString('latin1');

/**
 * Walks `chunks` in order as the reply stream does, leaving out what the walker cuts; returns what
 * reached the client, where the walk ended and its state.
 */
function stream(
  chunks: Buffer[],
  edits: number[] | ExecEdits,
  rearmed?: () => void,
): { out: string; done: boolean; error: string; rest: string } {
  const walker = new ExpiryRestore(edits, rearmed);
  let out = '';
  let rest = '';
  for (const chunk of chunks) {
    if (walker.done || walker.error !== '') {
      rest += chunk.toString('latin1');
      continue;
    }
    const pos = walker.walk(chunk, 0);
    let from = 0;
    for (const cut of walker.edits) {
      out += chunk.toString('latin1', from, cut.start) + (cut.insert?.toString('latin1') ?? '');
      from = cut.end;
    }
    out += chunk.toString('latin1', from, pos);
    rest += chunk.toString('latin1', pos);
  }
  return { out, done: walker.done, error: walker.error, rest };
}

const INVALIDATE = '>2\r\n$10\r\ninvalidate\r\n*1\r\n$4\r\nlock\r\n';

describe('ExpiryRestore', () => {
  it('gives `:0` at each index back as `:1`, whatever the elements before it', () => {
    expect(restore('*2\r\n:5\r\n:0\r\n', [1])).toBe('*2\r\n:5\r\n:1\r\n');
    expect(restore('*2\r\n:1\r\n:1\r\n', [1])).toBe('*2\r\n:1\r\n:1\r\n');
    const before = '*6\r\n+OK\r\n:5\r\n:0\r\n%1\r\n$1\r\na\r\n*2\r\n$3\r\nfoo\r\n_\r\n:2\r\n:0\r\n';
    expect(restore(before, [2, 5])).toBe(before.replace(':0\r\n%', ':1\r\n%').replace(/:0\r\n$/, ':1\r\n'));
  });

  it('leaves an error element, an error for the whole EXEC, a null and an array too short as they are', () => {
    for (const reply of [
      '*2\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n-ERR invalid expire time\r\n',
      '-EXECABORT Transaction discarded because of previous errors.\r\n',
      '*1\r\n:0\r\n',
      '*-1\r\n',
      '_\r\n',
      '*0\r\n',
    ]) {
      expect(restore(reply, [1])).toBe(reply);
    }
    expect(restore('*2\r\n-WRONGTYPE x\r\n:0\r\n', [1])).toBe('*2\r\n-WRONGTYPE x\r\n:1\r\n');
  });

  it('passes over a push inside the array: it is no element (DEBUG PROTOCOL push, a tracking invalidation on Redis 6)', () => {
    // MULTI / DEBUG PROTOCOL push / INCRBY / EXPIRE NX / EXEC, as Redis 7.0 answers it in RESP3.
    const exec = '*3\r\n>2\r\n$16\r\nserver-cpu-usage\r\n:42\r\n$40\r\nSome real reply following the push reply\r\n:2\r\n:0\r\n';
    expect(restore(exec, [2])).toBe(exec.replace(/:0\r\n$/, ':1\r\n'));
    const invalidated = `*2\r\n${INVALIDATE}:2\r\n${INVALIDATE}:0\r\n`;
    expect(restore(invalidated, [1])).toBe(invalidated.replace(/:0\r\n$/, ':1\r\n'));
  });

  it('restores the same bytes however the reply is split, and stops exactly at its end', () => {
    const reply = `*4\r\n$5\r\nhello\r\n${INVALIDATE}:7\r\n:0\r\n*2\r\n:0\r\n${INVALIDATE}:0\r\n`;
    const after = '+PONG\r\n:0\r\n';
    const bytes = Buffer.from(reply + after, 'latin1');
    const expected = `*4\r\n$5\r\nhello\r\n${INVALIDATE}:7\r\n:1\r\n*2\r\n:0\r\n${INVALIDATE}:0\r\n`;
    fc.assert(
      fc.property(fc.array(fc.nat(), { maxLength: 12 }), (cuts) => {
        const walked = stream(splitAt(bytes, cuts), [2]);
        expect(walked).toEqual({ out: expected, done: true, error: '', rest: after });
      }),
      { numRuns: 500 },
    );
    // Byte by byte: the `:` of the element to restore ends one chunk, its digit starts the next.
    const single = Array.from({ length: bytes.length }, (_, i) => i);
    expect(stream(splitAt(bytes, single), [2]).out).toBe(expected);
  });

  it('keeps nothing of the reply: a large element streams through, chunk by chunk', () => {
    const big = Buffer.alloc(4 * 1024 * 1024, 0x61);
    const head = Buffer.from(`*3\r\n:2\r\n:0\r\n$${big.length}\r\n`, 'latin1');
    const walker = new ExpiryRestore([1]);
    let pos = walker.walk(head, 0);
    expect(pos).toBe(head.length);
    expect(head.toString('latin1')).toContain(':2\r\n:1\r\n');
    for (let offset = 0; offset < big.length; offset += 65536) {
      const chunk = big.subarray(offset, offset + 65536);
      pos = walker.walk(chunk, 0);
      expect(pos).toBe(chunk.length);
      expect(walker.done).toBe(false);
    }
    expect(walker.walk(Buffer.from('\r\n+OK\r\n'), 0)).toBe(2);
    expect(walker.done).toBe(true);
  });

  it('stops right after the last element to restore where the connection becomes a pipe after the EXEC', () => {
    // MULTI / INCRBY / EXPIRE NX / CLIENT REPLY OFF / EXEC: the array counts an element that never comes.
    const bytes = Buffer.from('*3\r\n:2\r\n:0\r\n+PONG\r\n', 'latin1');
    const walker = new ExpiryRestore([1]);
    walker.stopAfterTargets = true;
    expect(walker.walk(bytes, 0)).toBe(12);
    expect(walker.targetsDone).toBe(true);
    expect(walker.done).toBe(false);
    expect(bytes.toString('latin1', 0, 12)).toBe('*3\r\n:2\r\n:1\r\n');
  });

  it('reports a reply framed wrongly, and reads no byte outside the buffer', () => {
    for (const reply of ['*2\r\n:2\r\n@oops\r\n', '*x\r\n', '*2\r\n$99999\r\n', '*9999999999999\r\n', '*--1\r\n']) {
      const walked = stream([Buffer.from(reply, 'latin1')], [1]);
      expect(walked.done).toBe(false);
      if (!reply.startsWith('*2\r\n$')) expect(walked.error).not.toBe('');
    }
    // Random bytes after a valid head: never an exception, whatever they are.
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), fc.array(fc.nat(), { maxLength: 6 }), (junk, cuts) => {
        const bytes = Buffer.concat([Buffer.from('*3\r\n:1\r\n'), Buffer.from(junk)]);
        expect(() => stream(splitAt(bytes, cuts), [1, 2])).not.toThrow();
      }),
      { numRuns: 300 },
    );
  });

  describe("the transaction-script way: the copy of the expiry cut out, the script's answer restored", () => {
    const PROBE = '-ERR value is not an integer or out of range\r\n';
    const edits = (drop: number): ExecEdits => ({ drop: [drop], restore: [drop + 1] });

    it("cuts the copy's element and says the count again; the script's `:0` and `:2` become `:1`", () => {
      const cut = (reply: string, drop = 1): string => restoreExpiryReplies(Buffer.from(reply, 'latin1'), edits(drop)).toString('latin1');
      expect(cut(`*3\r\n:1\r\n${PROBE}:1\r\n`)).toBe('*2\r\n:1\r\n:1\r\n');
      expect(cut(`*3\r\n:2\r\n${PROBE}:0\r\n`)).toBe('*2\r\n:2\r\n:1\r\n');
      let rearmed = 0;
      const reply = Buffer.from(`*3\r\n:2\r\n${PROBE}:2\r\n`, 'latin1');
      expect(restoreExpiryReplies(reply, edits(1), () => rearmed++).toString('latin1')).toBe('*2\r\n:2\r\n:1\r\n');
      expect(rearmed).toBe(1);
      // Ten elements become nine: the count line gets shorter.
      const long = `*11\r\n:2\r\n${PROBE}:0\r\n${'+OK\r\n'.repeat(8)}`;
      expect(cut(long)).toBe(`*10\r\n:2\r\n:1\r\n${'+OK\r\n'.repeat(8)}`);
      // The script's error, and a WATCH abort or EXECABORT, are Redis's own.
      expect(cut(`*3\r\n:2\r\n${PROBE}-NOPERM x\r\n`)).toBe('*2\r\n:2\r\n-NOPERM x\r\n');
      for (const whole of ['*-1\r\n', '-EXECABORT Transaction discarded because of previous errors.\r\n', '_\r\n']) {
        expect(cut(whole)).toBe(whole);
      }
    });

    it('gives the same bytes however the reply is split, with invalidations inside the array, and stops at its end', () => {
      const reply = `*4\r\n${INVALIDATE}:7\r\n${PROBE}${INVALIDATE}:0\r\n$5\r\nhello\r\n`;
      const after = '+PONG\r\n';
      const bytes = Buffer.from(reply + after, 'latin1');
      const expected = `*3\r\n${INVALIDATE}:7\r\n${INVALIDATE}:1\r\n$5\r\nhello\r\n`;
      fc.assert(
        fc.property(fc.array(fc.nat(), { maxLength: 12 }), (cuts) => {
          expect(stream(splitAt(bytes, cuts), edits(1))).toEqual({ out: expected, done: true, error: '', rest: after });
        }),
        { numRuns: 1000 },
      );
      const single = Array.from({ length: bytes.length }, (_, i) => i);
      expect(stream(splitAt(bytes, single), edits(1)).out).toBe(expected);
    });

    it('streams a large element after the pair without keeping it', () => {
      const big = Buffer.alloc(1024 * 1024, 0x62);
      const walker = new ExpiryRestore(edits(1));
      const head = Buffer.from(`*4\r\n:1\r\n${PROBE}:1\r\n$${big.length}\r\n`, 'latin1');
      expect(walker.walk(head, 0)).toBe(head.length);
      expect(walker.edits.map((e) => [e.start, e.end, e.insert?.toString('latin1') ?? null])).toEqual([
        [0, 4, '*3\r\n'],
        [8, 8 + PROBE.length, null],
      ]);
      for (let offset = 0; offset < big.length; offset += 65536) {
        expect(walker.walk(big.subarray(offset, offset + 65536), 0)).toBe(65536);
        expect(walker.edits).toEqual([]);
      }
      expect(walker.walk(Buffer.from('\r\n'), 0)).toBe(2);
      expect(walker.done).toBe(true);
    });
  });
});
