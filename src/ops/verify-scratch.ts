/**
 * `verify`: the scratch keys it tests each rule on. A scratch key is one the rule (and no
 * earlier rule) matches and that does not exist yet; in a cluster, one the node behind the
 * connection serves. Its integer fields are drawn from the top half of their range, where no
 * real id or time lies, and its text says "rlp-verify".
 */
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { servesSlot, type SlotRanges } from '../cluster/topology.js';
import { RuleFailure } from '../errors.js';
import { describeKey } from '../key-text.js';
import { buildKey, type FieldType, type KeyLayout } from '../rules/key-layout.js';
import type { Rule, RuleSet } from '../rules/types.js';
import { isReplyError } from '../upstream/redis-client.js';

const SCRATCH_TAG = 'rlp-verify';
/** Filler lengths are tried up to this many bytes after the prefix. */
const MAX_FILLER_BYTES = 64;
const KEY_ROUNDS = 3;
/** Scratch keys tried for one whose slot the node serves (a third of them, with three masters). */
const CLUSTER_KEY_CANDIDATES = 200;

/**
 * In a Redis Cluster (the proxy started with --cluster), the slots the node behind this
 * connection serves, so that scratch keys are ones it does not redirect; null outside a cluster.
 */
export async function servedSlots(redis: Redis, verbose: (line: string) => void): Promise<SlotRanges | null> {
  let id: string;
  try {
    id = String(await redis.call('CLUSTER', 'MYID'));
  } catch (error) {
    // Not a cluster ("cluster support disabled"), or CLUSTER not allowed: a key anywhere will do.
    // The proxy's own errors (its upstream unreachable, say) and lost connections are failures.
    if (isReplyError(error) && !/^ERR redis-lock-proxy:/.test((error as Error).message)) return null;
    throw error;
  }
  const ranges = (await redis.call('CLUSTER', 'SLOTS')) as Array<[number, number, [unknown, unknown, unknown]]>;
  const served = ranges.filter(([, , master]) => String(master[2]) === id).map(([start, end]) => [Number(start), Number(end)] as const);
  verbose(`cluster node ${id} serves ${served.length} slot range(s)`);
  return served;
}

/** What verify's own probe runs on a scratch key, beside the lock block's commands: what a --user needs for it. */
export const PROBE_ACL = '+exists +pexpire +pttl +del';

/**
 * A command of verify's own (not the lock block's) that Redis refused, the user lacking it: the
 * probe failed, not the rule, and the message says so and what the user needs.
 */
export class ProbeRefused extends Error {}

/** `run`, a command of verify's own probe named `command`; Redis's refusal of it becomes a ProbeRefused. */
export async function probe<T>(command: string, run: Promise<T>): Promise<T> {
  try {
    return await run;
  } catch (error) {
    // An ACL refusal only: NOAUTH, WRONGPASS and the proxy's own errors say what they say.
    if (!isReplyError(error) || !/^NOPERM\b/.test((error as Error).message)) throw error;
    throw new ProbeRefused(
      `verify's own probe failed, not the rule: ${command} on its scratch key was refused (${(error as Error).message}). ` +
        `A --user needs, for verify itself, ${PROBE_ACL} besides the lock block's commands`,
      { cause: error },
    );
  }
}

/** A scratch key for `rule` that does not exist yet (and, in a cluster, that the node serves). */
export async function unusedScratchKey(redis: Redis, rules: RuleSet, rule: Rule, slots: SlotRanges | null): Promise<Buffer> {
  if (slots !== null && slots.length === 0) {
    throw new RuleFailure(
      rule.name,
      "the cluster node behind this address serves no slots (a replica?): verify through the seed listener or a master's",
    );
  }
  for (let round = 0; round < (slots === null ? KEY_ROUNDS : CLUSTER_KEY_CANDIDATES); round++) {
    const key = scratchKeyFor(rules, rule);
    if (key === undefined) {
      throw new RuleFailure(
        rule.name,
        `cannot build a scratch key: no key of the prefix ${describeKey(rule.prefix)} plus up to ` +
          `${MAX_FILLER_BYTES} filler bytes matches ${rule.pattern === undefined ? 'the rule' : `the pattern ${rule.pattern.source}`}` +
          ' (or an earlier rule takes it)',
      );
    }
    if (slots !== null) {
      const slot = Number(await redis.call('CLUSTER', 'KEYSLOT', key));
      if (!servesSlot(slots, slot)) continue;
    }
    if ((await probe('EXISTS', redis.exists(key))) === 0) return key;
  }
  throw new RuleFailure(
    rule.name,
    'cannot build a scratch key: every candidate key already exists (or, in a cluster, is served elsewhere)',
  );
}

/** A layout without a variable part has one key only: the live lock itself. */
export function isFixedKey(layout: KeyLayout | undefined): boolean {
  return layout !== undefined && layout.parts.every((part) => part.type === 'literal');
}

/**
 * A key this rule (and no earlier rule) matches. For a rule with a key layout: the layout with
 * random values far from real ones (see scratchValue). Otherwise the prefix plus filler that says
 * what it is ("rlp-verify" cut to fit) and a random part, or failing that, filler of other kinds
 * and lengths.
 */
function scratchKeyFor(rules: RuleSet, rule: Rule): Buffer | undefined {
  const layout = rule.key;
  if (layout !== undefined) {
    for (let round = 0; round < KEY_ROUNDS; round++) {
      const values = new Map(
        layout.parts.flatMap((part) => (part.type === 'literal' ? [] : [[part.name, scratchValue(part.type, part.length)] as const])),
      );
      const key = buildKey(layout, values);
      if (rules.match(key) === rule) return key;
    }
    return undefined;
  }
  const lengths = [16, ...Array.from({ length: MAX_FILLER_BYTES }, (_, i) => i + 1).filter((n) => n !== 16)];
  for (let round = 0; round < KEY_ROUNDS; round++) {
    for (const fill of [taggedFiller, digitFiller, letterFiller, byteFiller]) {
      for (const length of lengths) {
        const key = Buffer.concat([rule.prefix, fill(length)]);
        if (rules.match(key) === rule) return key;
      }
    }
  }
  return undefined;
}

/**
 * A field value for a scratch key: integers in the top half of their range (no real id, account
 * number or time is there), a domain under .invalid (RFC 2606), bytes saying "rlp-verify".
 */
function scratchValue(type: FieldType, length: number): bigint | Buffer {
  const random = (bits: number) => BigInt(`0x${randomBytes(bits / 8).toString('hex')}`);
  switch (type) {
    case 'u8':
      return 0x80n | random(8);
    case 'u32':
    case 'leb128':
    case 'decimal':
      return (1n << 31n) | random(32);
    case 'u64':
      return (1n << 63n) | random(64);
    case 'domain':
      return Buffer.from(`${SCRATCH_TAG}-${randomBytes(4).toString('hex')}.invalid`);
    case 'bytes':
      return taggedFiller(length);
  }
}

/** "rlp-verify" (cut so at least 4 bytes stay random) + random lowercase letters and digits. */
function taggedFiller(length: number): Buffer {
  const tagLength = Math.min(SCRATCH_TAG.length, Math.max(0, length - 4));
  return Buffer.concat([
    Buffer.from(SCRATCH_TAG.slice(0, tagLength)),
    randomFrom('abcdefghijklmnopqrstuvwxyz0123456789', length - tagLength),
  ]);
}

function digitFiller(length: number): Buffer {
  return randomFrom('0123456789', length);
}

function letterFiller(length: number): Buffer {
  return randomFrom('abcdefghijklmnopqrstuvwxyz', length);
}

function byteFiller(length: number): Buffer {
  return randomBytes(length);
}

function randomFrom(alphabet: string, length: number): Buffer {
  const random = randomBytes(length);
  const out = Buffer.alloc(length);
  for (let i = 0; i < length; i++) out[i] = alphabet.charCodeAt(random[i] % alphabet.length);
  return out;
}
