/**
 * The lock keys the rules name, read from Redis into rows (for `locks` and the proxy's lock
 * scan): counter (or raw value), expiry, what the lock is for (decoded by the rules'
 * `describe:`), and the evidence of trouble only an unhealthy lock shows:
 *
 * - **abandoned**: no expiry. Behind the proxy every lock expires within its lease (the fix sets
 *   the expiry when the lock is created, and heals a lock that lost it), so a lock without one
 *   never goes away by itself. This is what `--release-abandoned` deletes.
 * - **re-armed: traffic bypasses the proxy**: the expiry went up between two reads while the
 *   counter went up too (an attempt that re-armed a held lock: a client that does not go
 *   through the proxy, or a proxy in observe mode), or a fixed node's SET NX lock still exists
 *   long after the deadline it holds.
 *
 * A counter above 1 is no such evidence: it is every contended lock's normal state (a contender
 * that tried once), and such a lock expires at its owner's deadline all the same.
 */
import type { Redis } from 'ioredis';
import { describeFields, isoTime } from '../rules/key-description.js';
import { decodeLayout } from '../rules/key-layout.js';
import { ruleMatches } from '../rules/loader.js';
import type { Rule, RuleSet } from '../rules/types.js';
import type { FoundKey } from './scan.js';

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
  /**
   * When it expires, in ms of Redis's clock, or undefined without an expiry: TIME taken after the
   * PTTL, plus the PTTL, so never earlier than the true expiry (and later by the few ms the
   * pipeline took).
   */
  readonly expiresAt: number | undefined;
  readonly what: string;
  /** No expiry: it never goes away by itself. */
  readonly abandoned: boolean;
  /** The evidence that its expiry was re-armed by traffic that bypasses the proxy, or undefined. */
  readonly rearmed: string | undefined;
}

/** What a later read is compared with (compareReads): the value as an integer, and the expiry. */
export type ReadSample = Pick<LockRow, 'counter' | 'deadline' | 'expiresAt'>;

/** What the row's FLAG column says; empty for a healthy lock. */
export function flagsOf(row: LockRow): string[] {
  const flags: string[] = [];
  if (row.abandoned) flags.push('abandoned: no expiry, never expires');
  if (row.rearmed !== undefined) flags.push(`re-armed: traffic bypasses the proxy (${row.rearmed})`);
  return flags;
}

/** Whether the row shows trouble: abandoned, or re-armed. */
export function isFlagged(row: LockRow): boolean {
  return row.abandoned || row.rearmed !== undefined;
}

/** The rows of these keys, read in one pipeline; keys gone since SCAN saw them have none. */
export async function readBatch(redis: Redis, rules: RuleSet, batch: readonly FoundKey[], node: string): Promise<LockRow[]> {
  // TIME last: the expiry of each key is placed on Redis's clock no earlier than it really is,
  // and SET NX deadlines are compared with Redis's clock, not this machine's.
  const pipeline = redis.pipeline();
  for (const { key } of batch) pipeline.getBuffer(key).pttl(key);
  pipeline.time();
  const replies = (await pipeline.exec()) ?? [];
  const reply = (i: number): [Error | null, unknown] =>
    replies[i] ?? [new Error(`reply ${i} of the GET, PTTL and TIME pipeline is missing`), null];
  const [timeError, time] = reply(2 * batch.length);
  if (timeError) throw timeError;
  const [seconds, micros] = (time as unknown[]).map((part) => Number(part));
  const nowMs = seconds * 1000 + Math.floor(micros / 1000);
  const rows: LockRow[] = [];
  batch.forEach(({ key, rule }, i) => {
    const [getError, value] = reply(2 * i);
    const [pttlError, pttl] = reply(2 * i + 1);
    if (pttlError) throw pttlError;
    if (pttl === -2) return; // gone since SCAN saw it: released or expired
    if (getError && !/^WRONGTYPE/.test(getError.message)) throw getError;
    if (!getError && value === null) return; // gone between the two reads
    const read = { value: getError ? undefined : (value as Buffer), pttl: Number(pttl), nowMs };
    rows.push(makeRow(key, node, rule.name, describeLockKey(key, rules), read));
  });
  return rows;
}

/** The same keys read again: their rows as they are now (keys gone since are left out). */
export function rereadRows(redis: Redis, rules: RuleSet, rows: readonly LockRow[], node: string): Promise<LockRow[]> {
  const batch = rows.flatMap((row) => {
    const rule = rules.match(row.key);
    return rule === undefined ? [] : [{ key: row.key, rule }];
  });
  return readBatch(redis, rules, batch, node);
}

/**
 * How far the expiry must have gone up between two reads to count as re-armed: far above what
 * reading costs (expiresAt is late by the few ms a pipeline takes), and below the interval
 * between two attempts of any lock that matters.
 */
const REARM_MIN_RAISE_MS = 1000;

/**
 * The row read later, with the evidence of a re-arm if the two reads show one: the expiry went
 * up while the counter (or a SET NX lock's value, which old nodes' attempts increment) went up
 * too. Through the proxy an attempt on a held lock moves the counter but never the expiry.
 * (A lock released and taken again between the reads, then tried, shows the same; the alert
 * waits for re-arms to recur.)
 */
export function compareReads(earlier: ReadSample, later: LockRow): LockRow {
  if (later.rearmed !== undefined || earlier.expiresAt === undefined || later.expiresAt === undefined) return later;
  const before = earlier.counter ?? earlier.deadline;
  const after = later.counter ?? later.deadline;
  if (before === undefined || after === undefined || after <= before) return later;
  const raisedMs = later.expiresAt - earlier.expiresAt;
  if (raisedMs <= REARM_MIN_RAISE_MS) return later;
  return { ...later, rearmed: `expiry raised ${(raisedMs / 1000).toFixed(1)}s while the counter went from ${before} to ${after}` };
}

/**
 * Stalwart 0.16.16 and later take locks with `SET key <now + secs> NX EX secs`: the value is a Unix
 * time in seconds (and old nodes' INCRBY attempts bump it by one each). Lock counters never get
 * anywhere near this, so an integer at least this big is read as such a deadline, not a counter.
 */
const DEADLINE_MIN = 1_000_000_000n;
/**
 * A deadline this far in the past (seconds) on a key that still exists means its expiry was
 * re-armed: set with EX at the deadline, the key would be gone, and through the proxy an old
 * node's attempt raises the value, never the expiry. (The slack covers clocks of Stalwart's
 * nodes that run behind Redis's.)
 */
const DEADLINE_SLACK_SECONDS = 60n;

function makeRow(
  key: Buffer,
  node: string,
  rule: string,
  description: string,
  read: { value: Buffer | undefined; pttl: number; nowMs: number },
): LockRow {
  const { value, pttl, nowMs } = read;
  const integer = value !== undefined ? integerValue(value) : undefined;
  const nowSeconds = BigInt(Math.floor(nowMs / 1000));
  let what = description;
  let counter: bigint | undefined;
  let deadline: bigint | undefined;
  let rearmed: string | undefined;
  if (integer !== undefined && integer >= DEADLINE_MIN) {
    deadline = integer;
    what += ` (SET NX lock, deadline ${isoTime(integer)})`;
    if (pttl !== -1 && integer < nowSeconds - DEADLINE_SLACK_SECONDS) rearmed = `SET NX deadline passed ${nowSeconds - integer}s ago`;
  } else {
    counter = integer;
  }
  const expiresAt = pttl >= 0 ? nowMs + pttl : undefined;
  return { key, node, rule, counter, deadline, value, pttl, expiresAt, what, abandoned: pttl === -1, rearmed };
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
