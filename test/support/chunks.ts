/**
 * Byte streams for the scanners' property tests: cheap binary content, and
 * splitting a stream into chunks the way TCP may deliver it.
 */

/**
 * Cheap deterministic binary content (xorshift), one byte in four taken from
 * `special`, the bytes that matter to the scanner under test: a generated
 * array of thousands of bytes costs far more than this.
 */
export function seededBytes(len: number, seed: number, special: readonly number[]): Uint8Array {
  const out = new Uint8Array(len);
  let x = seed | 1;
  for (let i = 0; i < len; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const r = x >>> 0;
    out[i] = (r & 3) === 0 ? special[(r >>> 2) % special.length] : (r >>> 8) & 0xff;
  }
  return out;
}

/** Splits at the given cut points (taken modulo length+1); empty chunks are dropped. Chunks are copies. */
export function splitAt(buf: Buffer, cuts: number[]): Buffer[] {
  const points = [...new Set(cuts.map((c) => c % (buf.length + 1)))].sort((a, b) => a - b);
  const chunks: Buffer[] = [];
  let prev = 0;
  for (const p of [...points, buf.length]) {
    if (p > prev) chunks.push(Buffer.from(buf.subarray(prev, p)));
    prev = Math.max(prev, p);
  }
  return chunks;
}
