/**
 * mulberry32: a small seeded generator with 32 bits of state, good enough
 * for orders and test input, and the same on every machine, so that runs
 * repeat. (The bench compiles on its own, so this lives here; tests import it too.)
 */
export function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
