/**
 * Finding the lock keys on one node: one SCAN pass over the keyspace for every rule at once
 * (never KEYS, never a pass per prefix), a page at a time, within a key count and a time
 * budget. SCAN's MATCH narrows each page on the server to keys that start with a byte some rule's
 * prefix starts with; the rules decide the rest here.
 *
 * One SCAN call does about COUNT steps of work inside Redis, which answers no other client
 * meanwhile (`scanGenericCommand`, db.c), so COUNT is capped (see MAX_SCAN_COUNT) and the calls
 * go one at a time: between two of them Redis serves everyone else.
 */
import type { Redis } from 'ioredis';
import type { Rule, RuleSet } from '../rules/types.js';

/**
 * The largest SCAN COUNT a caller may ask for. Redis's own advice for SCAN (and for commands that
 * walk many elements at once) keeps a call to about a thousand to ten thousand elements: a call
 * of 9,999,999 on two million keys held Redis for seconds, long enough for Sentinel to fail it over.
 */
export const MAX_SCAN_COUNT = 10_000;

/** A lock key found, and the first rule that names it. */
export interface FoundKey {
  readonly key: Buffer;
  readonly rule: Rule;
}

/** Why a pass stopped before SCAN's cursor came back to 0. */
export type StopReason = 'max-keys' | 'time-budget';

/** How far a pass got, for progress lines. */
export interface ScanProgress {
  /** SCAN calls made so far on this node. */
  readonly calls: number;
  /** Lock keys found so far on this node. */
  readonly found: number;
}

export interface ScanLimits {
  /** SCAN COUNT hint per call, 1 to MAX_SCAN_COUNT. */
  readonly count: number;
  /** Lock keys to find at most; one more found stops the pass ('max-keys'). */
  readonly maxKeys?: number;
  /** Date.now() after which no further SCAN call is made ('time-budget'). */
  readonly deadline?: number;
  /** Called after each SCAN call. */
  readonly onProgress?: (progress: ScanProgress) => void;
}

/** The outcome of one pass: undefined when it went through the whole keyspace. */
export interface ScanEnd {
  readonly stoppedEarly: StopReason | undefined;
}

/**
 * The lock keys of one node, in batches of at most `batchSize`, each yielded as soon as it is
 * full (so that the caller reads, and may delete, the keys of a batch right after SCAN returned
 * them). Each key is yielded once, though SCAN may return a key twice (the table can be rehashed
 * between calls). Returns how the pass ended.
 */
export async function* lockKeyBatches(
  redis: Redis,
  rules: RuleSet,
  limits: ScanLimits,
  batchSize: number,
): AsyncGenerator<FoundKey[], ScanEnd> {
  if (!Number.isInteger(limits.count) || limits.count < 1 || limits.count > MAX_SCAN_COUNT) {
    throw new RangeError(`SCAN COUNT must be an integer from 1 to ${MAX_SCAN_COUNT}, got ${limits.count}`);
  }
  const maxKeys = limits.maxKeys ?? Number.POSITIVE_INFINITY;
  const pattern = matchPatternFor(rules.rules.map((rule) => rule.prefix));
  const seen = new Set<string>();
  let batch: FoundKey[] = [];
  let calls = 0;
  let cursor = '0';
  do {
    if (limits.deadline !== undefined && Date.now() >= limits.deadline) {
      if (batch.length > 0) yield batch;
      return { stoppedEarly: 'time-budget' };
    }
    const page = await scanPage(redis, cursor, pattern, limits.count);
    cursor = page.cursor;
    calls++;
    for (const key of page.keys) {
      const rule = rules.match(key);
      if (rule === undefined) continue;
      const id = key.toString('latin1');
      if (seen.has(id)) continue;
      if (seen.size >= maxKeys) {
        if (batch.length > 0) yield batch;
        return { stoppedEarly: 'max-keys' };
      }
      seen.add(id);
      batch.push({ key, rule });
      if (batch.length >= batchSize) {
        yield batch;
        batch = [];
      }
    }
    limits.onProgress?.({ calls, found: seen.size });
  } while (cursor !== '0');
  if (batch.length > 0) yield batch;
  return { stoppedEarly: undefined };
}

/**
 * The MATCH pattern of one pass for keys with any of these prefixes: none when a prefix is empty
 * (every key may match), the escaped prefix itself when there is one, else a class of the
 * prefixes' first bytes (`[\x14\x15\x17\p]*` for Stalwart's). In Redis's glob
 * (`stringmatchlen`, util.c) a backslash inside `[...]` makes the next byte literal, so every
 * byte of the class is written after one and none reads as `^`, `-` or `]`.
 */
export function matchPatternFor(prefixes: readonly Uint8Array[]): Buffer | undefined {
  if (prefixes.length === 0 || prefixes.some((prefix) => prefix.length === 0)) return undefined;
  const distinct = [...new Map(prefixes.map((prefix) => [Buffer.from(prefix).toString('latin1'), prefix])).values()];
  if (distinct.length === 1) return globPatternFor(distinct[0]);
  const firstBytes = [...new Set(distinct.map((prefix) => prefix[0]))].sort((a, b) => a - b);
  return Buffer.from([0x5b, ...firstBytes.flatMap((byte) => [0x5c, byte]), 0x5d, 0x2a]);
}

/** A SCAN MATCH pattern for keys starting with `prefix`: its bytes with `*?[]\` escaped, then `*`. */
export function globPatternFor(prefix: Uint8Array): Buffer {
  const out: number[] = [];
  for (const byte of prefix) {
    // * ? [ ] \
    if (byte === 0x2a || byte === 0x3f || byte === 0x5b || byte === 0x5d || byte === 0x5c) out.push(0x5c);
    out.push(byte);
  }
  out.push(0x2a);
  return Buffer.from(out);
}

/** One SCAN call. */
async function scanPage(
  redis: Redis,
  cursor: string,
  pattern: Buffer | undefined,
  count: number,
): Promise<{ cursor: string; keys: Buffer[] }> {
  const match = pattern === undefined ? [] : ['MATCH', pattern];
  const reply = (await redis.callBuffer('SCAN', cursor, ...match, 'COUNT', String(count))) as unknown;
  if (!Array.isArray(reply) || reply.length !== 2 || !Buffer.isBuffer(reply[0]) || !Array.isArray(reply[1])) {
    throw new Error(`unexpected SCAN reply (not [cursor, keys]): ${JSON.stringify(reply)?.slice(0, 200)}`);
  }
  return { cursor: reply[0].toString('latin1'), keys: reply[1] as Buffer[] };
}
