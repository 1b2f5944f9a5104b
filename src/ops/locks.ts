/**
 * `redis-lock-proxy locks --upstream URL [--rules PATH]... [--stalwart VERSION]... [--count N]
 *                         [--scan-budget-ms N] [--recheck-ms N] [--json]
 *                         [--release KEY... | --release-hex HEX... [--release-live] [--yes | --dry-run]]
 *                         [--release-abandoned [--yes | --dry-run]]`
 *
 * Lists the lock keys the rules name, straight from Redis: counter (or raw value), remaining
 * TTL, what the lock is for (decoded by the rules' `describe:`), and a flag on the ones that
 * show trouble (lock-keys/read.ts): abandoned (no expiry: it never goes away), or re-armed
 * (its expiry went up between two reads with its counter: traffic that bypasses the proxy).
 * Optionally deletes locks: named ones, or the abandoned ones, each only if it is still as read.
 * A named lock that is live (it has an expiry) is deleted only with --release-live.
 *
 * In front of a Redis Cluster it reads every master itself (lock-keys/nodes.ts). TLS as the proxy
 * takes it: --upstream-ca, --upstream-cert/--upstream-key, --upstream-servername, --upstream-insecure.
 *
 * This file is the command: its options, its connection and its exit codes. The output is in
 * locks-output.ts and locks-progress.ts, the deleting in locks-release.ts and locks-abandoned.ts.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { chooseRules, upstreamTlsFrom, type RuleChoice, type UpstreamTls } from '../config.js';
import { UsageError } from '../errors.js';
import { keyFromHex, unescapeKey } from '../key-text.js';
import { loadRules } from '../rules/loader.js';
import type { RuleSet } from '../rules/types.js';
import { OPTIONS, readCommandSettings, text } from '../settings.js';
import { parseUpstreamUrl, type UpstreamTarget } from '../upstream/target.js';
import {
  connectionFault,
  notRespHint,
  parseCommandLine,
  speaksResp,
  type FlagTable,
  integerOption,
  usageFailed,
  type Io,
} from './command.js';
import { openLockNodes, type LockNodes } from '../lock-keys/nodes.js';
import { recheckRows, scanNodes, type PassEnd, type PassLimits } from '../lock-keys/pass.js';
import { MAX_SCAN_COUNT } from '../lock-keys/scan.js';
import { printRows, summary } from './locks-output.js';
import { clearingProgress, startProgress } from './locks-progress.js';
import { releaseAbandoned } from './locks-abandoned.js';
import { releaseNamed } from './locks-release.js';

/** The proxy's periodic scan's budget: one scan of either kind may take as long. */
const DEFAULT_SCAN_BUDGET_MS = OPTIONS['lock-scan-budget-ms'].default;

export const LOCKS_USAGE = `Usage: redis-lock-proxy locks [options]

Lists the lock keys that the rules name, directly from Redis (one SCAN pass,
never KEYS), with their counter, remaining TTL, what they lock, and a flag on
locks that show trouble: abandoned (no expiry: it never goes away by itself)
or re-armed (its expiry went up between two reads while its counter went up:
traffic bypasses the proxy). A counter above 1 is normal: others tried to take
the lock while it was held. Can delete locks, each only if unchanged.

Options (environment variable in brackets; flags win):
  --upstream URL          the Redis itself, as given to the proxy:
                          redis://[[user]:pass@]host[:port][/db], rediss://...
                          (TLS, system CAs) or
                          unix:///path/redis.sock[?db=N&user=U&password=P]
                          [REDIS_LOCK_PROXY_UPSTREAM] (default redis://127.0.0.1:6379);
                          a node of a Redis Cluster: every master is read
  --upstream-ca FILE      CA certificate (PEM) of a rediss:// upstream
                          [REDIS_LOCK_PROXY_UPSTREAM_CA]
  --upstream-cert FILE, --upstream-key FILE
                          client certificate and key (PEM)
                          [REDIS_LOCK_PROXY_UPSTREAM_CERT, _KEY]
  --upstream-servername NAME
                          TLS server name to send and verify
                          [REDIS_LOCK_PROXY_UPSTREAM_SERVERNAME]
  --upstream-insecure     do not verify the upstream certificate
                          [REDIS_LOCK_PROXY_UPSTREAM_INSECURE]
  --rules PATH            rule file or directory; repeatable
                          [REDIS_LOCK_PROXY_RULES, comma-separated]
                          (default: the shipped rules, every affected Stalwart
                          release)
  --stalwart VERSION      only the rule files for these Stalwart releases, e.g.
                          0.15.3,0.16.9 (repeatable or comma-separated): their
                          lock kinds, decoded as they write them
                          [REDIS_LOCK_PROXY_STALWART]
  --count N               SCAN COUNT hint per call, 1 to ${MAX_SCAN_COUNT} (default 1000)
  --scan-budget-ms N      stop scanning after this long (default ${DEFAULT_SCAN_BUDGET_MS});
                          what was found is still shown, and the exit status is 3
  --recheck-ms N          read the lock keys found again this long after the
                          scan, to see re-armed ones (default 3000; 0: one read)
  --json                  one JSON object per line instead of a table
  --release KEY...        delete these keys, written as the table prints them
                          (in single quotes, as printed: '\\x17\\x00...')
  --release-hex HEX...    delete these keys, given in hex (key_hex in --json)
  --release-live          let --release and --release-hex delete live locks
                          (with an expiry: held, and ending by themselves);
                          without it they are refused, even with --yes, as
                          deleting one while its holder runs the task makes
                          the task run twice
  --release-abandoned     delete the locks without an expiry (abandoned), each
                          only if it still has none; lists them unless --yes
  --yes                   delete without asking (--release, --release-hex,
                          --release-abandoned); without it --release asks when
                          run in a terminal
  --dry-run               show what would be deleted, delete nothing
  -h, --help              show this help

A key is deleted only if it still holds the value read and its expiry has not
gone up (abandoned ones: still none): a lock taken, tried or re-armed in the
meantime stays, and so does one that gained or lost its expiry.

Exit status: 0 done; 1 Redis unreachable, a key not deleted (refused, changed,
an error) or deleting not confirmed; 2 bad options or rule files; 3 the scan
stopped at --scan-budget-ms: what was shown (or deleted) is incomplete.
`;

const DEFAULT_SCAN_COUNT = 1000;
const DEFAULT_RECHECK_MS = 3000;
const CONNECT_TIMEOUT_MS = 5000;
/** Exit status when the scan stopped at its time budget. */
const INCOMPLETE = 3;

interface LocksOptions {
  upstream: UpstreamTarget;
  tls: UpstreamTls | null;
  rules: RuleChoice;
  count: number;
  scanBudgetMs: number;
  recheckMs: number;
  json: boolean;
  /** Keys to delete: escaped text (--release) or hex (--release-hex), checked before Redis is asked. */
  release: Buffer[];
  releaseAbandoned: boolean;
  /** --release and --release-hex may delete live locks (with an expiry). */
  releaseLive: boolean;
  yes: boolean;
  dryRun: boolean;
}

export async function run(argv: string[], io: Io): Promise<number> {
  let options: LocksOptions | 'help';
  let rules: RuleSet;
  try {
    // Named keys are checked here, before anything touches Redis, so a typo deletes nothing.
    options = parseOptions(argv, io.env);
    if (options === 'help') {
      io.stdout(LOCKS_USAGE);
      return 0;
    }
    rules = loadRules(options.rules.paths, options.rules.release);
  } catch (error) {
    return usageFailed(io, 'locks', error);
  }

  let nodes: LockNodes;
  try {
    nodes = await openLockNodes(options.upstream, options.tls, CONNECT_TIMEOUT_MS);
  } catch (error) {
    const message = (error as Error).message;
    const reason = speaksResp(message)
      ? `cannot connect to ${options.upstream.display}: ${explained(message, options.upstream)}`
      : notRespHint(message, options.upstream.display);
    io.stderr(`locks: ${reason}\n`);
    return 1;
  }
  const progress = await startProgress(io, nodes.nodes, options.count).catch(() => undefined);
  try {
    const release = { json: options.json, yes: options.yes, dryRun: options.dryRun };
    if (options.release.length > 0) {
      return await releaseNamed(nodes, rules, options.release, { ...release, releaseLive: options.releaseLive }, io);
    }
    const limits: PassLimits = { count: options.count, deadline: Date.now() + options.scanBudgetMs, onProgress: progress?.onProgress };
    if (options.releaseAbandoned) {
      const { code, end } = await releaseAbandoned(nodes, rules, limits, release, clearingProgress(io, progress));
      progress?.done();
      return incomplete(end, options, io) ?? code;
    }
    const pass = await scanNodes(nodes.nodes, rules, limits);
    let rows = pass.rows;
    if (options.recheckMs > 0 && rows.length > 0) {
      progress?.note(`locks: ${rows.length} lock key(s) found; reading them again in ${options.recheckMs} ms, to see re-armed ones`);
      await sleep(options.recheckMs);
      rows = await recheckRows(nodes.nodes, rules, rows);
    }
    progress?.done();
    printRows(rows, options.json, io, nodes.cluster);
    if (!options.json) {
      io.stdout(summary(rows, { masters: nodes.cluster ? nodes.nodes.length : undefined, rechecked: options.recheckMs > 0 }));
    }
    return incomplete(pass, options, io) ?? 0;
  } catch (error) {
    progress?.done();
    const fault = connectionFault(error, nodes.lastError());
    const reason =
      fault === undefined
        ? explained((error as Error).message, options.upstream)
        : speaksResp(fault.message)
          ? `connection failed: ${explained(fault.message, options.upstream)}`
          : explained(fault.message, options.upstream);
    io.stderr(`locks: ${options.upstream.display}: ${reason}\n`);
    return 1;
  } finally {
    nodes.close();
  }
}

/** When the scan stopped at its time budget: says so, and gives the exit status for it. */
function incomplete(end: PassEnd, options: LocksOptions, io: Io): number | undefined {
  if (end.stoppedEarly !== 'time-budget') return undefined;
  io.stderr(
    `locks: the scan stopped after --scan-budget-ms ${options.scanBudgetMs} with ${end.keys} lock key(s) read: ` +
      'the keyspace was not gone through, so this is not every lock (give more time, or a larger --count)\n',
  );
  return INCOMPLETE;
}

/** The proxy's settings that `locks` takes too, as flags and as the same variables. */
const PROXY_SETTINGS = [
  'upstream',
  'upstream-ca',
  'upstream-cert',
  'upstream-key',
  'upstream-servername',
  'upstream-insecure',
  'rules',
  'stalwart',
] as const;

/** The flags of `locks`. */
export const LOCKS_FLAGS = {
  upstream: { type: 'string' },
  'upstream-ca': { type: 'string' },
  'upstream-cert': { type: 'string' },
  'upstream-key': { type: 'string' },
  'upstream-servername': { type: 'string' },
  'upstream-insecure': { type: 'boolean' },
  rules: { type: 'string', multiple: true },
  stalwart: { type: 'string', multiple: true },
  count: { type: 'string' },
  'scan-budget-ms': { type: 'string' },
  'recheck-ms': { type: 'string' },
  json: { type: 'boolean' },
  release: { type: 'string', multiple: true },
  'release-hex': { type: 'string', multiple: true },
  'release-abandoned': { type: 'boolean' },
  'release-live': { type: 'boolean' },
  yes: { type: 'boolean' },
  'dry-run': { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} satisfies FlagTable;

function parseOptions(argv: string[], env: NodeJS.ProcessEnv): LocksOptions | 'help' {
  const { values, tokens } = parseCommandLine({
    args: argv,
    strict: true,
    allowPositionals: true,
    tokens: true,
    options: LOCKS_FLAGS,
  });
  if (values.help) return 'help';

  // `--release A B C` and `--release A --release B` both work (likewise --release-hex): keys
  // after the first are positionals, of the kind of the last of the two flags before them.
  // Kept in command-line order.
  const release: Buffer[] = [];
  let kind: 'release' | 'release-hex' | undefined;
  for (const token of tokens) {
    if (token.kind === 'option' && (token.name === 'release' || token.name === 'release-hex')) {
      kind = token.name;
      if (token.value !== undefined) release.push(keyOption(kind, token.value));
    } else if (token.kind === 'positional') {
      if (kind === undefined) throw new UsageError(`unexpected argument "${token.value}" (keys to delete go after --release; see --help)`);
      release.push(keyOption(kind, token.value));
    }
  }
  const releaseAbandoned = values['release-abandoned'] ?? false;
  const releaseLive = values['release-live'] ?? false;
  const yes = values.yes ?? false;
  const dryRun = values['dry-run'] ?? false;
  const releasing = release.length > 0 || releaseAbandoned;
  if (release.length > 0 && releaseAbandoned) throw new UsageError('--release and --release-abandoned cannot be combined');
  if (releaseLive && release.length === 0) {
    throw new UsageError('--release-live only goes with --release or --release-hex: it lets them delete the live locks they name');
  }
  if (yes && !releasing) throw new UsageError('--yes only goes with --release, --release-hex or --release-abandoned');
  if (dryRun && !releasing) throw new UsageError('--dry-run only goes with --release, --release-hex or --release-abandoned');
  if (yes && dryRun) throw new UsageError('--yes and --dry-run cannot be combined');
  if (values['recheck-ms'] !== undefined && releasing) throw new UsageError('--recheck-ms only goes with the listing, not with deleting');

  const count = integerOption(
    '--count',
    values.count ?? String(DEFAULT_SCAN_COUNT),
    1,
    MAX_SCAN_COUNT,
    ' (a larger SCAN call holds Redis up for every other client)',
  );
  const scanBudgetMs = integerOption('--scan-budget-ms', values['scan-budget-ms'] ?? String(DEFAULT_SCAN_BUDGET_MS), 1, 86_400_000);
  const recheckMs = integerOption('--recheck-ms', values['recheck-ms'] ?? String(DEFAULT_RECHECK_MS), 0, 600_000);
  // The proxy's own upstream, TLS and rule settings, with their checks.
  const settings = readCommandSettings(PROXY_SETTINGS, values, env);
  const upstream = parseUpstreamUrl(text(settings, 'upstream') as string);
  return {
    upstream,
    tls: upstreamTlsFrom(settings, upstream),
    rules: chooseRules(settings),
    count,
    scanBudgetMs,
    recheckMs,
    json: values.json ?? false,
    release,
    releaseAbandoned,
    releaseLive,
    yes,
    dryRun,
  };
}

/** An error from Redis or the connection, with what to do where it is the operator's to fix. */
function explained(message: string, upstream: UpstreamTarget): string {
  if (/^(NOAUTH|WRONGPASS)\b/.test(message)) {
    const form = upstream.path !== undefined ? 'unix:///path/redis.sock?password=PASSWORD' : 'redis://:PASSWORD@HOST:PORT';
    return `${message} (give the password in the --upstream URL, ${form}, or in REDIS_LOCK_PROXY_UPSTREAM)`;
  }
  return notRespHint(message, upstream.display);
}

/** A key to delete, written as the table prints it (--release) or in hex (--release-hex). */
function keyOption(kind: 'release' | 'release-hex', text: string): Buffer {
  if (text === '') throw new UsageError(`--${kind}: empty key`);
  try {
    return kind === 'release' ? unescapeKey(text) : keyFromHex(text);
  } catch (error) {
    throw new UsageError(`--${kind} ${text}: ${(error as Error).message}`, { cause: error });
  }
}
