/**
 * `redis-lock-proxy verify --via HOST:PORT [--rules PATH]... [--stalwart VERSION] [--timeout-ms N]`
 *
 * Proves, through a running proxy, that each enforce-mode rule's keys get the fix: on a scratch
 * key the rule matches, a first lock attempt sets the expiry, and a second attempt (a "loser")
 * leaves the expiry where it was instead of re-arming it. With `--stalwart VERSION` the rules are
 * that release's, so the scratch keys have its real key shapes, one per lock kind; a release
 * without the bug is said to be so, and nothing is touched. Talks to HOST:PORT exactly as an
 * application would (ioredis, `multi().incrby().expire().exec()`), so it fails when the client is
 * not really going through the proxy, or the proxy does not load the rule in enforce mode.
 *
 * Output: one line, `verify: OK: ...` (stdout, exit 0) or `verify: FAILED: ...` (stderr, exit 1);
 * usage errors exit 2. Nothing else unless `--verbose`, so it fits a readiness probe or CI step.
 *
 * Scratch keys are deleted afterwards (also on failure), and they carry a 60 s expiry from the
 * first attempt, so even a verify killed half-way leaves nothing behind for long. Their integer
 * fields are drawn from the top half of their range, where no real id or time lies. A rule whose
 * key has no variable part (Stalwart's migration core lock) has only the live lock as its key:
 * it is listed, never touched.
 */
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { chooseRulesFromEnv, parseListen, type ListenAddress, type RuleChoice } from '../config.js';
import { describeKey } from '../key-text.js';
import { buildKey, type KeyLayout } from '../rules/key-layout.js';
import { loadRules } from '../rules/loader.js';
import { stalwartRelease } from '../rules/stalwart.js';
import { releasesText } from '../rules/store.js';
import type { Rule, RuleSet } from '../rules/types.js';

/** What a subcommand gets from the CLI dispatcher. */
export interface Io {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
}

export const VERIFY_USAGE = `Usage: redis-lock-proxy verify --via HOST:PORT [options]

Proves that a running redis-lock-proxy applies the fix for every enforce-mode
rule: on a scratch key each rule matches, a second lock attempt
(MULTI / INCRBY / EXPIRE / EXEC) must not re-arm the expiry the first one set.
Prints one line; exit 0 when every enforce rule holds, 1 when one does not,
2 for bad options. Usable as a readiness probe or CI check.

Options:
  --via HOST:PORT       the proxy to test, as applications reach it (required)
  --rules PATH          rule file or directory, as given to the proxy; repeatable
                        [REDIS_LOCK_PROXY_RULES, comma-separated]
                        (default: the shipped rules, every affected Stalwart
                        release)
  --stalwart VERSION    verify with the lock kinds of this Stalwart release,
                        e.g. 0.15.3, on its real key shapes; says so when the
                        release does not have the bug [REDIS_LOCK_PROXY_STALWART]
  --timeout-ms N        give up after N ms in all (default 5000)
  --user NAME           AUTH user, if the Redis behind the proxy wants one from
                        the client [REDIS_LOCK_PROXY_VERIFY_USER]
  --password PASSWORD   AUTH password [REDIS_LOCK_PROXY_VERIFY_PASSWORD]
  --verbose             print each step
  -h, --help            show this help
`;

const DEFAULT_TIMEOUT_MS = 5000;
/** The first attempt's expiry, and the lowered TTL a second attempt must not push forward. */
const FIRST_EXPIRE_SECONDS = 60;
const LOWERED_PTTL_MS = 30_000;
const SCRATCH_TAG = 'rlp-verify';
/** Filler lengths are tried up to this many bytes after the prefix. */
const MAX_FILLER_BYTES = 64;
const KEY_ROUNDS = 3;

interface VerifyOptions {
  via: ListenAddress;
  viaText: string;
  rules: RuleChoice;
  /** --stalwart names a release without the bug: why, and nothing is verified. */
  notAffected: string | undefined;
  timeoutMs: number;
  username: string | undefined;
  password: string | undefined;
  verbose: boolean;
}

class UsageError extends Error {}

/** A rule that did not hold (or could not be tested); the message is the reason. */
class RuleFailure extends Error {
  constructor(
    readonly rule: string,
    message: string,
  ) {
    super(message);
  }
}

export async function run(argv: string[], io: Io): Promise<number> {
  let options: VerifyOptions | 'help';
  try {
    options = parseOptions(argv, io.env);
  } catch (error) {
    io.stderr(`redis-lock-proxy verify: ${(error as Error).message}\n`);
    return 2;
  }
  if (options === 'help') {
    io.stdout(VERIFY_USAGE);
    return 0;
  }
  if (options.notAffected !== undefined) {
    io.stdout(`verify: OK: ${options.notAffected}; nothing to verify\n`);
    return 0;
  }

  let rules: RuleSet;
  try {
    rules = loadRules(options.rules.paths, options.rules.release);
  } catch (error) {
    io.stderr(`redis-lock-proxy verify: ${(error as Error).message}\n`);
    return 2;
  }

  // A fixed key is a live lock: verify never takes it, even for a moment.
  const untouched = rules.rules.filter((rule) => rule.mode === 'enforce' && isFixedKey(rule.key));
  const enforce = rules.rules.filter((rule) => rule.mode === 'enforce' && !untouched.includes(rule));
  const observe = rules.rules.filter((rule) => rule.mode === 'observe');
  const where = options.viaText;
  if (enforce.length === 0) {
    io.stderr(
      `verify: FAILED: no enforce-mode rule to verify in ${rules.files.join(', ')}` +
        (observe.length > 0 ? ` (observe only: ${observe.map((r) => r.name).join(', ')})` : '') +
        '\n',
    );
    return 1;
  }

  const verbose = options.verbose ? (line: string) => io.stdout(`verify: ${line}\n`) : () => {};
  const progress: Progress = { step: 'connecting' };
  const outcome = await withDeadline(options.timeoutMs, progress, (signal) =>
    verifyAll(options, rules, enforce, signal, progress, verbose),
  );
  if (outcome.kind === 'ok') {
    for (const rule of observe) verbose(`rule ${rule.name}: observe (not verified)`);
    for (const rule of untouched) verbose(`rule ${rule.name}: its only key is a live lock (not touched)`);
    const observed =
      observe.length > 0 ? `; observe (not verified): ${observe.map((r) => r.name).join(', ')}` : '';
    const fixed =
      untouched.length > 0 ? `; fixed key, not touched: ${untouched.map((r) => r.name).join(', ')}` : '';
    const releases = releasesText(rules);
    io.stdout(
      `verify: OK: ${enforce.length} rule(s) enforce the fix through ${where}` +
        `${releases === '' ? '' : ` for ${releases}`} (${enforce.map((r) => r.name).join(', ')})${observed}${fixed}\n`,
    );
    return 0;
  }
  io.stderr(`verify: FAILED: ${outcome.message}\n`);
  return 1;
}

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

function parseOptions(argv: string[], env: NodeJS.ProcessEnv): VerifyOptions | 'help' {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        via: { type: 'string' },
        rules: { type: 'string', multiple: true },
        stalwart: { type: 'string' },
        'timeout-ms': { type: 'string' },
        user: { type: 'string' },
        password: { type: 'string' },
        verbose: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (error) {
    throw new UsageError(`${(error as Error).message} (see --help)`);
  }
  if (values.help) return 'help';
  if (values.via === undefined) throw new UsageError('--via HOST:PORT is required (see --help)');
  const via = parseListen(values.via, '--via address');
  if (via.port === 0) throw new UsageError(`--via ${values.via}: port 0 is not a port to connect to`);

  const timeoutText = values['timeout-ms'] ?? String(DEFAULT_TIMEOUT_MS);
  if (!/^\d{1,7}$/.test(timeoutText) || Number(timeoutText) < 1) {
    throw new UsageError(`--timeout-ms must be an integer from 1 to 9999999, got "${timeoutText}"`);
  }
  const username = values.user ?? nonEmpty(env.REDIS_LOCK_PROXY_VERIFY_USER);
  const password = values.password ?? nonEmpty(env.REDIS_LOCK_PROXY_VERIFY_PASSWORD);
  if (username !== undefined && password === undefined) {
    throw new UsageError('--user needs --password (or REDIS_LOCK_PROXY_VERIFY_PASSWORD)');
  }
  const stalwart = values.stalwart ?? nonEmpty(env.REDIS_LOCK_PROXY_STALWART);
  const release = stalwart === undefined ? undefined : stalwartRelease(stalwart);
  const notAffected = release?.kind === 'not-affected' ? release.reason : undefined;
  return {
    via,
    viaText: via.host.includes(':') ? `[${via.host}]:${via.port}` : `${via.host}:${via.port}`,
    rules: notAffected !== undefined ? { paths: [], release: undefined } : chooseRulesFromEnv(values.rules, stalwart, env),
    notAffected,
    timeoutMs: Number(timeoutText),
    username,
    password,
    verbose: values.verbose ?? false,
  };
}

function nonEmpty(text: string | undefined): string | undefined {
  return text === undefined || text === '' ? undefined : text;
}

// ---------------------------------------------------------------------------------------------
// The check
// ---------------------------------------------------------------------------------------------

type Outcome = { kind: 'ok' } | { kind: 'failed'; message: string };

/** What the check is doing, for the message when the deadline passes. */
interface Progress {
  step: string;
}

/** Runs `work` with an overall deadline; `signal` aborts when the deadline passes. */
async function withDeadline(
  timeoutMs: number,
  progress: Progress,
  work: (signal: AbortSignal) => Promise<Outcome>,
): Promise<Outcome> {
  const controller = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<Outcome>((resolve) => {
    timer = setTimeout(() => {
      controller.abort();
      resolve({ kind: 'failed', message: `timed out after ${timeoutMs} ms while ${progress.step}` });
    }, timeoutMs);
  });
  try {
    return await Promise.race([
      work(controller.signal).then(
        (outcome) => outcome,
        (error: unknown) => ({ kind: 'failed' as const, message: describeError(error) }),
      ),
      timedOut,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

async function verifyAll(
  options: VerifyOptions,
  rules: RuleSet,
  enforce: readonly Rule[],
  signal: AbortSignal,
  progress: Progress,
  verbose: (line: string) => void,
): Promise<Outcome> {
  const redis = new Redis({
    host: options.via.host,
    port: options.via.port,
    username: options.username,
    password: options.password,
    lazyConnect: true,
    connectTimeout: options.timeoutMs,
    commandTimeout: options.timeoutMs,
    enableReadyCheck: false,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    // No CLIENT SETINFO or SETNAME: an error reply to one of those (say, the proxy's "upstream
    // unreachable") would be swallowed, and the check would only see the connection close.
    disableClientInfo: true,
  });
  let lastError: Error | undefined;
  redis.on('error', (error: Error) => {
    lastError = error; // failures surface through the commands' promises; keep the cause
  });
  // The deadline closes the connection, which fails whatever command is pending.
  const onAbort = () => redis.disconnect();
  progress.step = `connecting to ${options.viaText}`;
  signal.addEventListener('abort', onAbort, { once: true });
  try {
    try {
      await redis.connect();
    } catch (error) {
      const reason = describeError(lastError ?? error);
      return { kind: 'failed', message: `cannot connect to ${options.viaText}: ${reason}` };
    }
    verbose(`connected to ${options.viaText}`);
    let slots: Promise<SlotRanges | null> | undefined;
    for (const rule of enforce) {
      progress.step = `verifying rule ${rule.name}`;
      try {
        slots ??= servedSlots(redis, verbose);
        await verifyRule(redis, rules, rule, await slots, verbose);
      } catch (error) {
        if (signal.aborted) throw error;
        let message = error instanceof RuleFailure ? error.message : withAuthHint(describeError(error));
        if (!(error instanceof RuleFailure) && lastError !== undefined && (!isReplyError(error) || isReplyError(lastError))) {
          // An error event means the connection itself went wrong, and says why better than the
          // command: a dropped connection fails commands with "Stream isn't writeable" (the cause,
          // say a protocol error from something that is not Redis, is in the event), and a refused
          // AUTH (WRONGPASS) leaves the commands saying only NOAUTH.
          message = `connection to ${options.viaText} failed: ${withAuthHint(describeError(lastError))}`;
        }
        return { kind: 'failed', message: `rule ${rule.name}: ${message}` };
      }
    }
    return { kind: 'ok' };
  } finally {
    signal.removeEventListener('abort', onAbort);
    redis.disconnect();
  }
}

async function verifyRule(
  redis: Redis,
  rules: RuleSet,
  rule: Rule,
  slots: SlotRanges | null,
  verbose: (line: string) => void,
): Promise<void> {
  const key = await unusedScratchKey(redis, rules, rule, slots);
  const shown = describeKey(key);
  verbose(`rule ${rule.name}: scratch key ${shown}`);
  try {
    const first = await lockAttempt(redis, key);
    verbose(`rule ${rule.name}: attempt 1: counter ${first.counter}, expiry applied ${first.expirySet}`);
    if (first.counter !== 1 || first.expirySet !== 1) {
      throw new RuleFailure(
        rule.name,
        `first attempt on scratch key ${shown} returned counter ${first.counter} and expiry flag ` +
          `${first.expirySet} (expected 1 and 1)`,
      );
    }
    const lowered = await redis.pexpire(key, LOWERED_PTTL_MS);
    if (lowered !== 1) {
      throw new RuleFailure(rule.name, `PEXPIRE on scratch key ${shown} returned ${lowered} (expected 1)`);
    }
    const second = await lockAttempt(redis, key);
    const pttl = await redis.pttl(key);
    verbose(
      `rule ${rule.name}: attempt 2: counter ${second.counter}, expiry applied ${second.expirySet}, pttl ${pttl} ms`,
    );
    if (second.expirySet !== 0 || pttl > LOWERED_PTTL_MS) {
      throw new RuleFailure(
        rule.name,
        `second attempt re-armed the expiry (pttl ${pttl} ms): ` +
          'is the client really going through redis-lock-proxy (with this rule in enforce mode)?',
      );
    }
    if (second.counter !== 2) {
      throw new RuleFailure(
        rule.name,
        `second attempt on scratch key ${shown} returned counter ${second.counter} (expected 2): ` +
          'something else wrote to it',
      );
    }
    if (pttl < 0) {
      throw new RuleFailure(rule.name, `scratch key ${shown} lost its expiry (pttl ${pttl}) after the second attempt`);
    }
    verbose(`rule ${rule.name}: OK`);
  } finally {
    // Best effort: the key expires within 60 s anyway.
    await redis.del(key).catch(() => undefined);
  }
}

interface AttemptResult {
  counter: number | string;
  expirySet: number | string;
}

/** Stalwart's lock attempt, as an application sends it. */
async function lockAttempt(redis: Redis, key: Buffer): Promise<AttemptResult> {
  const replies = await redis.multi().incrby(key, 1).expire(key, FIRST_EXPIRE_SECONDS).exec();
  if (replies === null) throw new Error('the transaction was aborted (EXEC returned nil)');
  if (replies.length !== 2) throw new Error(`EXEC returned ${replies.length} replies (expected 2)`);
  const [[incrError, counter], [expireError, expirySet]] = replies;
  if (incrError) throw new Error(`INCRBY failed: ${incrError.message}`);
  if (expireError) throw new Error(`EXPIRE failed: ${expireError.message}`);
  return { counter: replyValue(counter), expirySet: replyValue(expirySet) };
}

function replyValue(value: unknown): number | string {
  return typeof value === 'number' ? value : String(value);
}

// ---------------------------------------------------------------------------------------------
// Scratch keys
// ---------------------------------------------------------------------------------------------

/** Slot ranges, [start, end] each. */
type SlotRanges = ReadonlyArray<readonly [number, number]>;

/**
 * In a Redis Cluster (the proxy in cluster mode), the slots the node behind
 * this connection serves, so that scratch keys are ones it does not redirect;
 * null outside a cluster.
 */
async function servedSlots(redis: Redis, verbose: (line: string) => void): Promise<SlotRanges | null> {
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

/** Scratch keys tried for one whose slot the node serves (a third of them, with three masters). */
const CLUSTER_KEY_CANDIDATES = 200;

/** A scratch key for `rule` that does not exist yet (and, in a cluster, that the node serves). */
async function unusedScratchKey(redis: Redis, rules: RuleSet, rule: Rule, slots: SlotRanges | null): Promise<Buffer> {
  if (slots !== null && slots.length === 0) {
    throw new RuleFailure(rule.name, 'the cluster node behind this address serves no slots (a replica?): verify through the seed listener or a master\'s');
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
      if (!slots.some(([start, end]) => start <= slot && slot <= end)) continue;
    }
    if ((await redis.exists(key)) === 0) return key;
  }
  throw new RuleFailure(rule.name, 'cannot build a scratch key: every candidate key already exists (or, in a cluster, is served elsewhere)');
}

/** A layout without a variable part has one key only: the live lock itself. */
function isFixedKey(layout: KeyLayout | undefined): boolean {
  return layout !== undefined && layout.parts.every((part) => part.type === 'literal');
}

/**
 * A key this rule (and no earlier rule) matches. For a rule with a key layout: the layout with
 * random values far from real ones (see scratchValue). Otherwise the prefix plus filler that says
 * what it is ("rlp-verify" cut to fit) and a random part, or failing that, filler of other kinds
 * and lengths. Exported for tests.
 */
export function scratchKeyFor(rules: RuleSet, rule: Rule): Buffer | undefined {
  const layout = rule.key;
  if (layout !== undefined) {
    for (let round = 0; round < KEY_ROUNDS; round++) {
      const values = new Map(layout.parts.flatMap((part) => (part.type === 'literal' ? [] : [[part.name, scratchValue(part.type, part.length)] as const])));
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
function scratchValue(type: Exclude<KeyLayout['parts'][number]['type'], 'literal'>, length: number): bigint | Buffer {
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
  return Buffer.concat([Buffer.from(SCRATCH_TAG.slice(0, tagLength)), randomFrom('abcdefghijklmnopqrstuvwxyz0123456789', length - tagLength)]);
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

// ---------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------

function describeError(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0) {
    return error.errors.map((e) => describeError(e)).join('; ');
  }
  if (error instanceof Error) return error.message;
  return String(error);
}

/** An error reply from the server (as opposed to a connection problem). */
function isReplyError(error: unknown): boolean {
  return error instanceof Error && error.name === 'ReplyError';
}

function withAuthHint(message: string): string {
  if (/^(NOAUTH|WRONGPASS)\b/.test(message)) {
    return `${message} (give --password, --user, or REDIS_LOCK_PROXY_VERIFY_PASSWORD)`;
  }
  return message;
}
