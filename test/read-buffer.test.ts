/**
 * The memory one upstream connection reads into (src/upstream/read-buffer.ts): its own, replaced
 * whenever the bytes of a read are still referenced after it, and sized by what the connection
 * reads: up when a read fills it, down after a run of small reads.
 */
import { describe, expect, it } from 'vitest';
import { ReadBuffer } from '../src/upstream/read-buffer.js';

describe('ReadBuffer', () => {
  it('gives the same memory again while nothing read stays referenced', () => {
    const reads = new ReadBuffer();
    const first = reads.next();
    reads.afterRead(10, false);
    expect(reads.next()).toBe(first);
  });

  it('gives new memory after a read whose bytes are still referenced (a write in progress)', () => {
    const reads = new ReadBuffer();
    const first = reads.next();
    reads.afterRead(10, true);
    const second = reads.next();
    expect(second).not.toBe(first);
    expect(second.buffer === first.buffer && second.byteOffset === first.byteOffset).toBe(false);
    expect(second.length).toBe(first.length);
  });

  it('grows a size when a read fills it, up to 64 KiB, and shrinks after a run of small reads', () => {
    const reads = new ReadBuffer();
    const sizes = [reads.next().length];
    for (let i = 0; i < 3; i++) {
      reads.afterRead(reads.next().length, false);
      sizes.push(reads.next().length);
    }
    expect(sizes).toEqual([256, 4096, 65536, 65536]);
    for (let i = 0; i < 15; i++) reads.afterRead(100, false);
    expect(reads.next().length).toBe(65536);
    reads.afterRead(100, false);
    expect(reads.next().length).toBe(4096);
    for (let i = 0; i < 15; i++) reads.afterRead(100, false);
    reads.afterRead(1000, false); // not small for 4 KiB: the run starts again
    for (let i = 0; i < 15; i++) reads.afterRead(100, false);
    expect(reads.next().length).toBe(4096);
    reads.afterRead(100, false);
    expect(reads.next().length).toBe(256);
  });
});
