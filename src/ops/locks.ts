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
 * In front of a Redis Cluster it reads every master itself (lock-nodes.ts). TLS as the proxy
 * takes it: --upstream-ca, --upstream-cert/--upstream-key, --upstream-servername, --upstream-insecure.
 *
 * This file is the command: its options, its connection and its exit codes. The listing is in
 * locks-list.ts, the output in locks-output.ts, the deleting in locks-release.ts.
 */
import { chooseRules, upstreamTlsFrom, type RuleChoice, type UpstreamTls } from '../config.js';
import { UsageError } from '../errors.js';
import { unescapeKey } from '../key-text.js';
import { loadRules } from '../rules/loader.js';
import type { RuleSet } from '../rules/types.js';
import { readCommandSettings, text } from '../settings.js';
import { parseUpstreamUrl, type UpstreamTarget } from '../upstream/target.js';
import {
  connectionFault,
  notRespHint,
  parseCommandLine,
  speaksResp,
  type FlagTable,
  positiveInteger,
  usageFailed,
  type Io,
} from './command.js';
import { openLockNodes, type LockNodes } from '../lock-keys/nodes.js';
import { scanNodes } from '../lock-keys/read.js';
import { printRows, summary } from './locks-output.js';
import { releaseAbandoned, releaseNamed } from './locks-release.js';

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

const DEFAULT_SCAN_COUNT = 1000;
const CONNECT_TIMEOUT_MS = 5000;

interface LocksOptions {
  upstream: UpstreamTarget;
  tls: UpstreamTls | null;
  rules: RuleChoice;
  count: number;
  json: boolean;
  release: string[];
  releaseAbandoned: boolean;
  yes: boolean;
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
    return usageFailed(io, 'locks', error);
  }

  // Named keys are checked before anything touches Redis, so a typo deletes nothing.
  let releaseKeys: Buffer[] = [];
  try {
    releaseKeys = options.release.map((text) => unescapeKeyArgument(text));
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
  try {
    if (releaseKeys.length > 0) return await releaseNamed(nodes, rules, releaseKeys, options, io);
    const { rows } = await scanNodes(nodes.nodes, rules, { count: options.count });
    if (options.releaseAbandoned) return await releaseAbandoned(nodes, rows, options, io);
    printRows(rows, options.json, io, nodes.cluster);
    if (!options.json) io.stdout(summary(rows, nodes.cluster ? nodes.nodes.length : undefined));
    return 0;
  } catch (error) {
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
  stalwart: { type: 'string' },
  count: { type: 'string' },
  json: { type: 'boolean' },
  release: { type: 'string', multiple: true },
  'release-abandoned': { type: 'boolean' },
  yes: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} satisfies FlagTable;

function parseOptions(argv: string[], env: NodeJS.ProcessEnv): LocksOptions | 'help' {
  const { values, positionals, tokens } = parseCommandLine({
    args: argv,
    strict: true,
    allowPositionals: true,
    tokens: true,
    options: LOCKS_FLAGS,
  });
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

  const count = positiveInteger('--count', values.count ?? String(DEFAULT_SCAN_COUNT));
  // The proxy's own upstream, TLS and rule settings, with their checks.
  const settings = readCommandSettings(PROXY_SETTINGS, values, env);
  const upstream = parseUpstreamUrl(text(settings, 'upstream') as string);
  return {
    upstream,
    tls: upstreamTlsFrom(settings, upstream),
    rules: chooseRules(settings),
    count,
    json: values.json ?? false,
    release,
    releaseAbandoned,
    yes: values.yes ?? false,
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

/** A key to delete, written as the table prints it. */
function unescapeKeyArgument(text: string): Buffer {
  if (text === '') throw new UsageError('--release: empty key');
  try {
    return unescapeKey(text);
  } catch (error) {
    throw new UsageError(`--release ${text}: ${(error as Error).message}`, { cause: error });
  }
}
