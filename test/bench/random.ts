/**
 * mulberry32: a small seeded generator with 32 bits of state, good enough
 * for orders and test input, and the same on every machine, so that runs
 * repeat. (The bench compiles on its own, so this lives here; tests and the
 * integrity stress import it too.)
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

/** A seeded generator with the picks tests need: integers, chances, choices, weighted choices. */
export class Rng {
  private readonly next: () => number;

  constructor(seed: number) {
    this.next = mulberry32(seed);
  }

  /** Integer in [min, max]. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  chance(p: number): boolean {
    return this.next() < p;
  }

  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)];
  }

  /** Picks by weight: `[[weight, value], ...]`. */
  weighted<T>(table: ReadonlyArray<readonly [number, T]>): T {
    const total = table.reduce((sum, [w]) => sum + w, 0);
    let r = this.next() * total;
    for (const [w, value] of table) {
      r -= w;
      if (r < 0) return value;
    }
    return table[table.length - 1][1];
  }
}
