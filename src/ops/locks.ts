/**
 * `redis-lock-proxy locks --upstream URL [--rules PATH]... [--stalwart VERSION] [--count N]
 *                         [--json] [--release KEY...] [--release-abandoned [--yes]]`
 *
 * Lists the lock keys the rules name, straight from Redis: counter (or raw value), remaining
 * TTL, what the lock is for (decoded by the rules' `describe:`), and a flag on the ones
 * that look abandoned: a counter above 1 (other nodes tried to take the lock while it was held)
 * or no expiry at all (it would never go away). Optionally deletes locks: named ones, or every
 * flagged one after re-checking, atomically, that it has not changed since it was read.
 *
 * Safe on a big keyspace: SCAN with MATCH on each rule's prefix (never KEYS), streamed page by
 * page, with the per-key reads pipelined in batches.
 */
import { parseArgs } from 'node:util';
import { Redis, type RedisOptions } from 'ioredis';
import { chooseRulesFromEnv, type RuleChoice } from '../config.js';
import { describeKey, escapeKey, unescapeKey } from '../key-text.js';
import { describeFields, isoTime } from '../rules/key-description.js';
import { decodeLayout } from '../rules/key-layout.js';
import { loadRules, ruleMatches } from '../rules/loader.js';
import type { Rule, RuleSet } from '../rules/types.js';
import { parseUpstreamUrl, type UpstreamTarget } from '../upstream/target.js';

/** What a subcommand gets from the CLI dispatcher. */
export interface Io {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
}

export const LOCKS_USAGE = `Usage: redis-lock-proxy locks [options]

Lists the lock keys that the rules name, directly from Redis (SCAN, never
KEYS), with their counter, remaining TTL, what they lock, and a flag on locks
that look abandoned: counter above 1 (other nodes tried to take it) or no
expiry (it never goes away). Can delete locks.

Options (environment variable in brackets; flags win):
  --upstream URL          the Redis itself, as given to the proxy:
                          redis://[[user]:pass@]host[:port][/db], rediss://...
                          (TLS, system CAs) or
                          unix:///path/redis.sock[?db=N&user=U&password=P]
                          [REDIS_LOCK_PROXY_UPSTREAM] (default redis://127.0.0.1:6379)
  --rules PATH            rule file or directory; repeatable
                          [REDIS_LOCK_PROXY_RULES, comma-separated]
                          (default: the shipped rules, every affected Stalwart
                          release)
  --stalwart VERSION      only the rule files for this Stalwart release, e.g.
                          0.15.3: its lock kinds, decoded as it writes them
                          [REDIS_LOCK_PROXY_STALWART]
  --count N               SCAN COUNT hint per call (default 1000)
  --json                  one JSON object per line instead of a table
  --release KEY...        delete these keys, written as the table prints them
                          (\\x17\\x00...; quote them for the shell)
  --release-abandoned     delete every flagged lock that is unchanged since it
                          was read; lists them and exits 1 unless --yes is given
  --yes                   confirm --release-abandoned
  -h, --help              show this help

Exit status: 0 done, 1 Redis unreachable, a key not released, or
--release-abandoned without --yes, 2 bad options or rule files.
`;

const DEFAULT_UPSTREAM = 'redis://127.0.0.1:6379';
const DEFAULT_SCAN_COUNT = 1000;
/** Keys whose GET and PTTL go out in one pipeline. */
const READ_BATCH = 500;
const CONNECT_TIMEOUT_MS = 5000;

/**
 * Deletes KEYS[1] only if it still holds ARGV[1] and its PTTL has not gone up from ARGV[2]
 * (-1: it must still have no expiry). Every lock attempt changes the counter and a new lock
 * starts with a fresh expiry, so an unchanged key is the one that was read, not a lock someone
 * took in the meantime. Returns 1 deleted, 0 changed (left alone), -1 already gone.
 */
const DELETE_IF_UNCHANGED = `
local value = redis.call('GET', KEYS[1])
if value == false then return -1 end
if value ~= ARGV[1] then return 0 end
local pttl = redis.call('PTTL', KEYS[1])
local seen = tonumber(ARGV[2])
if seen == -1 then
  if pttl ~= -1 then return 0 end
elseif pttl == -1 or pttl > seen then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
`;

class UsageError extends Error {}

interface LocksOptions {
  upstream: UpstreamTarget;
  rules: RuleChoice;
  count: number;
  json: boolean;
  release: string[];
  releaseAbandoned: boolean;
  yes: boolean;
}

/** One lock key as read from Redis. */
export interface LockRow {
  readonly key: Buffer;
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
}

export async function run(argv: string[], io: Io): Promise<number> {
  let options: LocksOptions | 'help';
  let rules: RuleSet;
  try {
    options = parseOptions(argv, io.env);
    if (options === 'help') {
      io.stdout(LOCKS_USAGE);
      return 0;
    }
    rules = loadRules(options.rules.paths, options.rules.release);
  } catch (error) {
    io.stderr(`redis-lock-proxy locks: ${(error as Error).message}\n`);
    return 2;
  }

  // Named keys are checked before anything touches Redis, so a typo deletes nothing.
  let releaseKeys: Buffer[] = [];
  try {
    releaseKeys = options.release.map((text) => unescapeKeyArgument(text));
  } catch (error) {
    io.stderr(`redis-lock-proxy locks: ${(error as Error).message}\n`);
    return 2;
  }

  const redis = new Redis(connectionOptions(options.upstream));
  let lastError: Error | undefined;
  redis.on('error', (error: Error) => {
    lastError = error;
  });
  try {
    try {
      await redis.connect();
    } catch (error) {
      io.stderr(`locks: cannot connect to ${options.upstream.display}: ${(lastError ?? (error as Error)).message}\n`);
      return 1;
    }
    if (releaseKeys.length > 0) return await releaseNamed(redis, rules, releaseKeys, options, io);
    const rows = await listLocks(redis, rules, options.count);
    if (options.releaseAbandoned) return await releaseAbandoned(redis, rows, options, io);
    printRows(rows, options.json, io);
    if (!options.json) io.stdout(summary(rows));
    return 0;
  } catch (error) {
    // A dropped connection fails commands with "Stream isn't writeable"; the cause is in the error event.
    // A refused AUTH comes as an error event, and the commands then only say NOAUTH.
    const lost = lastError !== undefined && ((error as Error).name !== 'ReplyError' || lastError.name === 'ReplyError');
    const reason = lost ? `connection failed: ${lastError?.message}` : (error as Error).message;
    io.stderr(`locks: ${options.upstream.display}: ${reason}\n`);
    return 1;
  } finally {
    redis.disconnect();
  }
}

// ---------------------------------------------------------------------------------------------
// Options and connection
// ---------------------------------------------------------------------------------------------

function parseOptions(argv: string[], env: NodeJS.ProcessEnv): LocksOptions | 'help' {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: true,
      tokens: true,
      options: {
        upstream: { type: 'string' },
        rules: { type: 'string', multiple: true },
        stalwart: { type: 'string' },
        count: { type: 'string' },
        json: { type: 'boolean' },
        release: { type: 'string', multiple: true },
        'release-abandoned': { type: 'boolean' },
        yes: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    });
  } catch (error) {
    throw new UsageError(`${(error as Error).message} (see --help)`);
  }
  const { values, positionals, tokens } = parsed;
  if (values.help) return 'help';

  // `--release A B C` and `--release A --release B` both work: keys after the first are
  // positionals. Kept in command-line order.
  if (positionals.length > 0 && values.release === undefined) {
    throw new UsageError(`unexpected argument "${positionals[0]}" (keys to delete go after --release; see --help)`);
  }
  const release: string[] = [];
  for (const token of tokens) {
    if (token.kind === 'positional') release.push(token.value);
    else if (token.kind === 'option' && token.name === 'release' && token.value !== undefined) release.push(token.value);
  }
  const releaseAbandoned = values['release-abandoned'] ?? false;
  if (release.length > 0 && releaseAbandoned) {
    throw new UsageError('--release and --release-abandoned cannot be combined');
  }
  if (values.yes && !releaseAbandoned) throw new UsageError('--yes only goes with --release-abandoned');

  const countText = values.count ?? String(DEFAULT_SCAN_COUNT);
  if (!/^\d{1,7}$/.test(countText) || Number(countText) < 1) {
    throw new UsageError(`--count must be an integer from 1 to 9999999, got "${countText}"`);
  }
  return {
    upstream: parseUpstreamUrl(values.upstream ?? env.REDIS_LOCK_PROXY_UPSTREAM ?? DEFAULT_UPSTREAM),
    rules: chooseRulesFromEnv(values.rules, values.stalwart, env),
    count: Number(countText),
    json: values.json ?? false,
    release,
    releaseAbandoned,
    yes: values.yes ?? false,
  };
}

/** ioredis options for an upstream URL as the proxy takes it; no retries, nothing queued offline. */
export function connectionOptions(target: UpstreamTarget): RedisOptions {
  const where: RedisOptions = target.path !== undefined ? { path: target.path } : { host: target.host, port: target.port };
  return {
    ...where,
    username: target.username,
    password: target.password,
    db: target.db,
    // rediss://: TLS with the system's CAs (add one with NODE_EXTRA_CA_CERTS).
    ...(target.tls ? { tls: { servername: target.host } } : {}),
    lazyConnect: true,
    connectTimeout: CONNECT_TIMEOUT_MS,
    enableReadyCheck: false,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    disableClientInfo: true,
  };
}

// ---------------------------------------------------------------------------------------------
// Listing
// ---------------------------------------------------------------------------------------------

/** Every key a rule matches, with its value and TTL, in the order SCAN found them. */
export async function listLocks(redis: Redis, rules: RuleSet, count: number): Promise<LockRow[]> {
  const rows: LockRow[] = [];
  const seen = new Set<string>();
  let batch: Array<{ key: Buffer; rule: Rule }> = [];
  for (const prefix of scanPrefixes(rules.rules)) {
    for await (const keys of scanPages(redis, globPatternFor(prefix), count)) {
      for (const key of keys) {
        const rule = rules.match(key);
        if (rule === undefined) continue;
        const id = key.toString('latin1');
        // SCAN may return a key twice (the table can be rehashed between calls).
        if (seen.has(id)) continue;
        seen.add(id);
        batch.push({ key, rule });
        if (batch.length >= READ_BATCH) {
          rows.push(...(await readBatch(redis, rules, batch)));
          batch = [];
        }
      }
    }
  }
  if (batch.length > 0) rows.push(...(await readBatch(redis, rules, batch)));
  return rows;
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
      throw new Error('unexpected SCAN reply');
    }
    cursor = reply[0].toString('latin1');
    yield reply[1] as Buffer[];
  } while (cursor !== '0');
}

async function readBatch(redis: Redis, rules: RuleSet, batch: ReadonlyArray<{ key: Buffer; rule: Rule }>): Promise<LockRow[]> {
  // TIME first: SET NX deadlines are compared with Redis's clock, not this machine's.
  const pipeline = redis.pipeline().time();
  for (const { key } of batch) pipeline.getBuffer(key).pttl(key);
  const replies = (await pipeline.exec()) ?? [];
  const reply = (i: number): [Error | null, unknown] => replies[i] ?? [new Error('no reply'), null];
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
    rows.push(makeRow(key, rule.name, describeLockKey(key, rules), getError ? undefined : (value as Buffer), Number(pttl), nowSeconds));
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
function makeRow(key: Buffer, rule: string, description: string, value: Buffer | undefined, pttl: number, nowSeconds: bigint): LockRow {
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
  if (pttl === -1) flags.push('no expiry: never expires');
  return { key, rule, counter, deadline, value, pttl, what, flags };
}

/** The value as Redis's INCR reads it, or undefined. */
function integerValue(value: Buffer): bigint | undefined {
  const text = value.toString('latin1');
  if (!/^(0|-?[1-9]\d{0,18})$/.test(text)) return undefined;
  const n = BigInt(text);
  return n >= -(2n ** 63n) && n < 2n ** 63n ? n : undefined;
}

// ---------------------------------------------------------------------------------------------
// What a key is
// ---------------------------------------------------------------------------------------------

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

function unescapeKeyArgument(text: string): Buffer {
  if (text === '') throw new UsageError('--release: empty key');
  try {
    return unescapeKey(text);
  } catch (error) {
    throw new UsageError(`--release ${text}: ${(error as Error).message}`);
  }
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

const COLUMNS = ['KEY', 'RULE', 'COUNTER', 'TTL', 'WHAT', 'FLAG'] as const;

function printRows(rows: readonly LockRow[], json: boolean, io: Io): void {
  if (json) {
    for (const row of rows) io.stdout(`${JSON.stringify(rowJson(row))}\n`);
    return;
  }
  if (rows.length === 0) return;
  io.stdout(table(rows.map(rowCells)));
}

function rowCells(row: LockRow): string[] {
  return [escapeKey(row.key), row.rule, counterText(row), ttlText(row.pttl), row.what, row.flags.join('; ')];
}

function table(cells: string[][]): string {
  const all = [[...COLUMNS], ...cells];
  const widths = COLUMNS.map((_, c) => Math.max(...all.map((line) => line[c].length)));
  return all
    .map((line) => line.map((cell, c) => (c === line.length - 1 ? cell : cell.padEnd(widths[c]))).join('  ').trimEnd())
    .join('\n')
    .concat('\n');
}

function counterText(row: LockRow): string {
  if (row.counter !== undefined) return String(row.counter);
  if (row.value === undefined) return '(not a string)';
  return describeKey(row.value);
}

function ttlText(pttl: number): string {
  if (pttl === -1) return 'none';
  return `${(pttl / 1000).toFixed(1)}s`;
}

/** A row as JSON: keys escaped as the table prints them, plus hex. */
export function rowJson(row: LockRow): Record<string, unknown> {
  const counter =
    row.counter === undefined ? null : row.counter <= BigInt(Number.MAX_SAFE_INTEGER) && row.counter >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(row.counter) : String(row.counter);
  return {
    key: escapeKey(row.key),
    key_hex: row.key.toString('hex'),
    rule: row.rule,
    counter,
    deadline: row.deadline === undefined ? null : Number(row.deadline),
    value: row.counter === undefined && row.value !== undefined ? escapeKey(row.value) : null,
    pttl_ms: row.pttl,
    what: row.what,
    flagged: row.flags.length > 0,
    flags: row.flags,
  };
}

function summary(rows: readonly LockRow[]): string {
  if (rows.length === 0) return 'no lock keys found\n';
  const flagged = rows.filter((row) => row.flags.length > 0).length;
  return `${rows.length} lock key(s), ${flagged} flagged\n`;
}

// ---------------------------------------------------------------------------------------------
// Releasing
// ---------------------------------------------------------------------------------------------

/** --release KEY...: says what each key is, then deletes it. */
async function releaseNamed(redis: Redis, rules: RuleSet, keys: Buffer[], options: LocksOptions, io: Io): Promise<number> {
  const out = (text: string, json: Record<string, unknown>) =>
    io.stdout(options.json ? `${JSON.stringify(json)}\n` : `${text}\n`);
  let failed = 0;
  const targets: Buffer[] = [];
  for (const key of keys) {
    const shown = escapeKey(key);
    const rule = rules.match(key);
    if (rule === undefined) {
      failed++;
      out(`refused ${shown}: no rule names this key, so it is not a lock; not deleted`, {
        action: 'refused',
        key: shown,
        reason: 'no rule names this key',
      });
      continue;
    }
    const [row] = await readBatch(redis, rules, [{ key, rule }]);
    if (row === undefined) {
      const what = describeLockKey(key, rules);
      out(`not found ${shown} (${what}): nothing to delete`, { action: 'not-found', key: shown, rule: rule.name, what });
      continue;
    }
    out(`will delete ${shown}: ${rowSummary(row)}`, { action: 'will-delete', ...rowJson(row) });
    targets.push(key);
  }
  for (const key of targets) {
    const shown = escapeKey(key);
    const deleted = await redis.del(key);
    out(deleted === 1 ? `deleted ${shown}` : `not found ${shown}: already gone`, {
      action: deleted === 1 ? 'deleted' : 'not-found',
      key: shown,
    });
  }
  return failed > 0 ? 1 : 0;
}

/** --release-abandoned [--yes]: lists the flagged locks; with --yes deletes those unchanged since. */
async function releaseAbandoned(redis: Redis, rows: readonly LockRow[], options: LocksOptions, io: Io): Promise<number> {
  const flagged = rows.filter((row) => row.flags.length > 0);
  if (flagged.length === 0) {
    if (!options.json) io.stdout(`no abandoned locks (${rows.length} lock key(s) checked)\n`);
    return 0;
  }
  if (!options.yes) {
    if (options.json) {
      for (const row of flagged) io.stdout(`${JSON.stringify({ action: 'would-delete', ...rowJson(row) })}\n`);
    } else {
      io.stdout(`would delete ${flagged.length} lock key(s):\n`);
      io.stdout(table(flagged.map(rowCells)));
    }
    io.stderr(`locks: nothing deleted: add --yes to delete these ${flagged.length} key(s)\n`);
    return 1;
  }

  const results = await deleteUnchanged(redis, flagged);
  let errors = 0;
  flagged.forEach((row, i) => {
    const result = results[i];
    const shown = escapeKey(row.key);
    let text: string;
    let json: Record<string, unknown>;
    if (result instanceof Error) {
      errors++;
      text = `error ${shown}: ${result.message}`;
      json = { action: 'error', ...rowJson(row), error: result.message };
    } else {
      text = {
        deleted: `deleted ${shown}: ${rowSummary(row)}`,
        changed: `skipped ${shown}: changed since it was read (someone took or tried the lock); left alone`,
        gone: `not found ${shown}: already gone`,
      }[result];
      json = { action: result === 'changed' ? 'skipped' : result === 'gone' ? 'not-found' : 'deleted', ...rowJson(row) };
    }
    io.stdout(options.json ? `${JSON.stringify(json)}\n` : `${text}\n`);
  });
  return errors > 0 ? 1 : 0;
}

/**
 * Deletes each row's key only if it is still exactly as read: same value, and an expiry that has
 * not gone up (or still none). Atomic per key (one Lua script), pipelined in batches.
 */
export async function deleteUnchanged(
  redis: Redis,
  rows: readonly LockRow[],
): Promise<Array<'deleted' | 'changed' | 'gone' | Error>> {
  const results: Array<'deleted' | 'changed' | 'gone' | Error> = [];
  for (let start = 0; start < rows.length; start += READ_BATCH) {
    const batch = rows.slice(start, start + READ_BATCH);
    const pipeline = redis.pipeline();
    for (const row of batch) {
      if (row.value === undefined) continue;
      pipeline.eval(DELETE_IF_UNCHANGED, 1, row.key, row.value, String(row.pttl));
    }
    const replies = (await pipeline.exec()) ?? [];
    let next = 0;
    for (const row of batch) {
      if (row.value === undefined) {
        results.push(new Error('not a string value: delete it with --release'));
        continue;
      }
      const [error, result] = replies[next++] ?? [new Error('no reply'), null];
      if (error) results.push(error);
      else results.push(result === 1 ? 'deleted' : result === -1 ? 'gone' : 'changed');
    }
  }
  return results;
}

function rowSummary(row: LockRow): string {
  const parts = [row.rule, row.what, `counter ${counterText(row)}`, `ttl ${ttlText(row.pttl)}`];
  if (row.flags.length > 0) parts.push(row.flags.join('; '));
  return parts.join(', ');
}
