/**
 * Splitting a byte stream into chunks the way TCP may deliver it, for the
 * scanners' property tests.
 */

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
