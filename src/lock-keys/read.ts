/**
 * The lock keys the rules name, read from Redis into rows (for `locks` and the proxy's lock
 * scan): counter (or raw value), remaining TTL, what the lock is for (decoded by the rules'
 * `describe:`), and why it looks abandoned, if it does.
 *
 * Safe on a big keyspace: SCAN with MATCH on each rule's prefix (never KEYS), streamed page by
 * page, with the per-key reads pipelined in batches.
 */
import type { Redis } from 'ioredis';
import { describeFields, isoTime } from '../rules/key-description.js';
import { decodeLayout } from '../rules/key-layout.js';
import { ruleMatches } from '../rules/loader.js';
import type { Rule, RuleSet } from '../rules/types.js';
import type { LockNode } from './nodes.js';

/** Keys whose GET and PTTL go out in one pipeline (and keys deleted per pipeline). */
export const READ_BATCH = 500;

/** One lock key as read from Redis. */
export interface LockRow {
  readonly key: Buffer;
  /** The node it was read from (host:port), in a cluster one of the masters. */
  readonly node: string;
  readonly rule: string;
  /** The value as a lock counter (an integer below 10^9), or undefined when it is not one. */
  readonly counter: bigint | undefined;
  /** The value as a SET NX lock's deadline (Unix seconds), or undefined when it is not one. */
  readonly deadline: bigint | undefined;
  /** The raw value; undefined when the key is not a string. */
  readonly value: Buffer | undefined;
  /** As PTTL returns it: -1 no expiry. */
  readonly pttl: number;
  readonly what: string;
  /** Why the lock looks abandoned; empty when it does not. */
  readonly flags: readonly string[];
  /** Others tried to take it while it was held (counter above 1), or a SET NX deadline long passed. */
  readonly abandoned: boolean;
}

/** Whether the row has a flag: it looks abandoned, or it has no expiry (what --release-abandoned deletes). */
export function isFlagged(row: LockRow): boolean {
  return row.flags.length > 0;
}

/** What one read of the lock keys found. */
export interface LockScan {
  readonly rows: LockRow[];
  /** It stopped at `maxKeys` lock keys: there may be more. */
  readonly truncated: boolean;
}

/**
 * The lock keys on every node, node after node, at most `maxKeys` of them in all (the proxy's
 * periodic scan bounds its work per run this way).
 */
export async function scanNodes(
  nodes: readonly LockNode[],
  rules: RuleSet,
  options: { count: number; maxKeys?: number },
): Promise<LockScan> {
  const rows: LockRow[] = [];
  for (const node of nodes) {
    const left = options.maxKeys === undefined ? undefined : options.maxKeys - rows.length;
    const scan = await scanLocks(node.redis, rules, { count: options.count, node: node.name, maxKeys: left });
    rows.push(...scan.rows);
    if (scan.truncated) return { rows, truncated: true };
  }
  return { rows, truncated: false };
}

/**
 * The lock keys on one node, at most `maxKeys` of them: truncated only when one more is found.
 * SCAN with MATCH on each rule's prefix, a page at a time.
 */
export async function scanLocks(
  redis: Redis,
  rules: RuleSet,
  options: { count: number; node: string; maxKeys?: number },
): Promise<LockScan> {
  const maxKeys = options.maxKeys ?? Number.POSITIVE_INFINITY;
  const rows: LockRow[] = [];
  const seen = new Set<string>();
  let batch: Array<{ key: Buffer; rule: Rule }> = [];
  const flush = async () => {
    rows.push(...(await readBatch(redis, rules, batch, options.node)));
    batch = [];
  };
  for (const prefix of scanPrefixes(rules.rules)) {
    for await (const keys of scanPages(redis, globPatternFor(prefix), options.count)) {
      for (const key of keys) {
        const rule = rules.match(key);
        if (rule === undefined) continue;
        const id = key.toString('latin1');
        // SCAN may return a key twice (the table can be rehashed between calls).
        if (seen.has(id)) continue;
        if (seen.size >= maxKeys) {
          if (batch.length > 0) await flush();
          return { rows, truncated: true };
        }
        seen.add(id);
        batch.push({ key, rule });
        if (batch.length >= READ_BATCH) await flush();
      }
    }
  }
  if (batch.length > 0) await flush();
  return { rows, truncated: false };
}

/** The rules' distinct prefixes, without those another listed prefix already covers. */
function scanPrefixes(rules: readonly Rule[]): Buffer[] {
  const sorted = [...rules.map((rule) => rule.prefix)].sort((a, b) => a.length - b.length);
  const kept: Buffer[] = [];
  for (const prefix of sorted) {
    if (!kept.some((shorter) => prefix.subarray(0, shorter.length).equals(shorter))) kept.push(prefix);
  }
  return kept;
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

/** SCAN pages, one call at a time: only one page of keys is in memory at once. */
async function* scanPages(redis: Redis, pattern: Buffer, count: number): AsyncGenerator<Buffer[]> {
  let cursor = '0';
  do {
    const reply = (await redis.callBuffer('SCAN', cursor, 'MATCH', pattern, 'COUNT', String(count))) as unknown;
    if (!Array.isArray(reply) || reply.length !== 2 || !Buffer.isBuffer(reply[0]) || !Array.isArray(reply[1])) {
      throw new Error(`unexpected SCAN reply (not [cursor, keys]): ${JSON.stringify(reply)?.slice(0, 200)}`);
    }
    cursor = reply[0].toString('latin1');
    yield reply[1] as Buffer[];
  } while (cursor !== '0');
}

/** The rows of these keys, read in one pipeline; keys gone since SCAN saw them have none. */
export async function readBatch(
  redis: Redis,
  rules: RuleSet,
  batch: ReadonlyArray<{ key: Buffer; rule: Rule }>,
  node: string,
): Promise<LockRow[]> {
  // TIME first: SET NX deadlines are compared with Redis's clock, not this machine's.
  const pipeline = redis.pipeline().time();
  for (const { key } of batch) pipeline.getBuffer(key).pttl(key);
  const replies = (await pipeline.exec()) ?? [];
  const reply = (i: number): [Error | null, unknown] =>
    replies[i] ?? [new Error(`reply ${i} of the TIME, GET and PTTL pipeline is missing`), null];
  const [timeError, time] = reply(0);
  if (timeError) throw timeError;
  const nowSeconds = BigInt(String((time as unknown[])[0]));
  const rows: LockRow[] = [];
  batch.forEach(({ key, rule }, i) => {
    const [getError, value] = reply(1 + 2 * i);
    const [pttlError, pttl] = reply(2 + 2 * i);
    if (pttlError) throw pttlError;
    if (pttl === -2) return; // gone since SCAN saw it: released or expired
    if (getError && !/^WRONGTYPE/.test(getError.message)) throw getError;
    if (!getError && value === null) return; // gone between the two reads
    rows.push(
      makeRow(key, node, rule.name, describeLockKey(key, rules), getError ? undefined : (value as Buffer), Number(pttl), nowSeconds),
    );
  });
  return rows;
}

/**
 * Stalwart 0.16.16 and later take locks with `SET key <now + secs> NX EX secs`: the value is a Unix
 * time in seconds (and old nodes' INCRBY attempts bump it by one each). Lock counters never get
 * anywhere near this, so an integer at least this big is read as such a deadline, not a counter.
 */
const DEADLINE_MIN = 1_000_000_000n;
/** A deadline this far in the past (seconds) on a key that still exists means its expiry was re-armed. */
const DEADLINE_SLACK_SECONDS = 60n;

/** `nowSeconds`: Redis's clock (TIME), for SET NX deadlines. */
function makeRow(
  key: Buffer,
  node: string,
  rule: string,
  description: string,
  value: Buffer | undefined,
  pttl: number,
  nowSeconds: bigint,
): LockRow {
  const integer = value !== undefined ? integerValue(value) : undefined;
  const flags: string[] = [];
  let what = description;
  let counter: bigint | undefined;
  let deadline: bigint | undefined;
  if (integer !== undefined && integer >= DEADLINE_MIN) {
    deadline = integer;
    what += ` (SET NX lock, deadline ${isoTime(integer)})`;
    if (pttl !== -1 && integer < nowSeconds - DEADLINE_SLACK_SECONDS) {
      flags.push(`likely abandoned (deadline passed ${nowSeconds - integer}s ago but the expiry was re-armed)`);
    }
  } else {
    counter = integer;
    if (counter !== undefined && counter > 1n) {
      flags.push(`likely abandoned (counter ${counter}: other nodes tried to take it)`);
    }
  }
  const abandoned = flags.length > 0;
  if (pttl === -1) flags.push('no expiry: never expires');
  return { key, node, rule, counter, deadline, value, pttl, what, flags, abandoned };
}

/** The value as Redis's INCR reads it, or undefined. */
function integerValue(value: Buffer): bigint | undefined {
  const text = value.toString('latin1');
  if (!/^(0|-?[1-9]\d{0,18})$/.test(text)) return undefined;
  const n = BigInt(text);
  return n >= -(2n ** 63n) && n < 2n ** 63n ? n : undefined;
}

/**
 * What a lock key stands for, from the `describe:` of the rules that match it (task 1234, queue
 * message 42 in queue "local", ...). A key that rules of several release lines match (a 9-byte
 * task lock of 0.16 can also read as a Bayes task of 0.11-0.14) gets each reading, joined by
 * "or"; `--stalwart` narrows it to one. A key no rule describes is named by its rule.
 */
export function describeLockKey(key: Buffer, rules: RuleSet): string {
  const readings: string[] = [];
  let first: Rule | undefined;
  for (const rule of rules.rules) {
    if (!ruleMatches(rule, key)) continue;
    first ??= rule;
    const fields = rule.describe === undefined || rule.key === undefined ? undefined : decodeLayout(rule.key, key);
    if (fields === undefined || rule.describe === undefined) continue;
    const reading = describeFields(rule.describe, fields);
    if (!readings.includes(reading)) readings.push(reading);
  }
  if (readings.length > 0) return readings.join(' or ');
  return first?.name ?? 'no rule names this key';
}
