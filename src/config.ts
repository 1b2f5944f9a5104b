/**
 * The Config the proxy runs with, built from the settings as given (settings.ts) and checked:
 * every value against its kind, and the settings against each other (TLS files that go
 * together, Sentinel or cluster but not both, ...). Also the choice of rule files, which the
 * operator commands share.
 */
import fs from 'node:fs';
import net from 'node:net';
import { stringify as toYaml } from 'yaml';
import { formatAddress, parseAddress, type Address } from './address.js';
import { allChecked, ConfigError, throwProblems } from './errors.js';
import { LOG_TIMES, type LogTime } from './log.js';
import { LOCK_METHOD_SETTINGS, type LockMethodSetting } from './lock/lock-method.js';
import { ruleProblems, type ReleaseFilter } from './rules/loader.js';
import { STALWART_RULES_DIR, stalwartFleet } from './rules/stalwart.js';
import type { RuleMode } from './rules/types.js';
import {
  boolean,
  checkSetting,
  integer,
  list,
  OPTIONS,
  readFlags,
  readSettings,
  settingError,
  splitList,
  text,
  type OptionName,
  type OptionSpec,
  type RawSettings,
} from './settings.js';
import { parseUpstreamUrl, type UpstreamTarget } from './upstream/target.js';

export interface UpstreamTls {
  readonly ca?: Buffer;
  readonly cert?: Buffer;
  readonly key?: Buffer;
  readonly servername?: string;
  /** Skip certificate verification (logged as a warning). */
  readonly insecure: boolean;
}

export interface ListenerTls {
  readonly cert: Buffer;
  readonly key: Buffer;
  /** When set, clients must present a certificate signed by this CA. */
  readonly clientCa?: Buffer;
}

export interface SentinelConfig {
  readonly sentinels: ReadonlyArray<{ host: string; port: number }>;
  readonly masterName: string;
  readonly username?: string;
  readonly password?: string;
}

export interface ClusterConfig {
  /** Nodes the topology is first asked of; their credentials and TLS apply to every node. */
  readonly seeds: readonly UpstreamTarget[];
  /** First port for node listeners (those not in portMap). */
  readonly basePort: number;
  /** Fixed listener port by node address (`host:port`, as formatAddress writes it). */
  readonly portMap: ReadonlyMap<string, number>;
  /** Host written into cluster replies; null: the address each client connected to. */
  readonly announceHost: string | null;
  readonly refreshMs: number;
}

export interface Config {
  readonly listen: Address;
  readonly upstream: UpstreamTarget;
  readonly rulePaths: readonly string[];
  /** --stalwart: load only the rule files for these releases (and those that name no release). */
  readonly release: ReleaseFilter | undefined;
  readonly holdMs: number;
  readonly connectTimeoutMs: number;
  readonly logLevel: string;
  /** How log lines give their time. */
  readonly logTime: LogTime;
  /** `observe` makes every rule observe-only; `enforce` leaves each rule's own mode. */
  readonly mode: RuleMode;
  /** Admin HTTP address, or null when disabled. */
  readonly adminListen: Address | null;
  readonly watchRules: boolean;
  readonly shutdownTimeoutMs: number;
  readonly maxConnections: number;
  /** Settings given that no longer do anything, with why: logged at start-up. */
  readonly warnings: readonly string[];
  /** Close client connections idle this long; 0: never. */
  readonly idleTimeoutMs: number;
  /** How long a reply to a command of the proxy's own may take once it is due; past it the connection is closed. */
  readonly ownReplyTimeoutMs: number;
  /** Close a client connection when Redis has sent nothing for this long while a reply is due; 0: never. */
  readonly upstreamTimeoutMs: number;
  /** How lock blocks are fixed: inside the client's own transaction, as a script, or chosen per connection from the server version. */
  readonly lockMethod: LockMethodSetting;
  /** How often the old-shape attempt report is logged; 0: never. */
  readonly lockAttemptReportMs: number;
  /** How often the lock keys are scanned for the lock-key metrics; 0: never. */
  readonly lockScanIntervalMs: number;
  readonly lockScanMaxKeys: number;
  /** How long one lock scan may take. */
  readonly lockScanBudgetMs: number;
  /** TLS towards Redis, set for rediss:// upstreams. */
  readonly upstreamTls: UpstreamTls | null;
  /** The settings as given (flags, variables, config file, defaults): what a reload compares. */
  readonly given: RawSettings;
  /** TLS for clients, when --tls-cert is set. */
  readonly listenerTls: ListenerTls | null;
  readonly sentinel: SentinelConfig | null;
  /** Set with --cluster (the proxy in front of a Redis Cluster). */
  readonly cluster: ClusterConfig | null;
}

/** The rules shipped with the package: every affected Stalwart release line (rules/stalwart/). */
export const DEFAULT_RULES_DIR = STALWART_RULES_DIR;

export type CliRequest = { kind: 'run'; config: Config } | { kind: 'print-config'; text: string } | { kind: 'help' } | { kind: 'version' };

/** Which rule files to load: --rules (default: the shipped ones), narrowed by --stalwart. */
export interface RuleChoice {
  readonly paths: string[];
  readonly release: ReleaseFilter | undefined;
}

/**
 * The `rules` and `stalwart` settings, as the proxy and its operator commands take them.
 * `stalwart` lists the releases the fleet runs: the rules in force are those of each. A list
 * with no affected release is refused, saying so: there is nothing to load for it.
 */
export function chooseRules(settings: RawSettings): RuleChoice {
  const rules = list(settings, 'rules');
  const paths = rules !== undefined && rules.length > 0 ? rules : [DEFAULT_RULES_DIR];
  const stalwart = list(settings, 'stalwart') ?? [];
  if (stalwart.length === 0) return { paths, release: undefined };
  const fleet = stalwartFleet(stalwart);
  throwProblems(fleet.problems.map((problem) => settingError(settings, 'stalwart', `stalwart: ${problem}`)));
  return { paths, release: { product: 'Stalwart', versions: fleet.versions } };
}

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

/**
 * The configuration read again as at start (the same flags and environment, the config file as
 * it is now), for a reload; throws a ConfigError naming what is wrong.
 */
export function rereadConfig(argv: string[], env: NodeJS.ProcessEnv): Config {
  const request = resolveConfig(argv, env);
  if (request.kind !== 'run') throw new ConfigError(`the command line asks for ${request.kind}, not to run the proxy`);
  return request.config;
}

export function resolveConfig(argv: string[], env: NodeJS.ProcessEnv): CliRequest {
  const flags = readFlags(argv);
  if (flags.help) return { kind: 'help' };
  if (flags.version) return { kind: 'version' };
  const settings = readSettings(flags, env);
  const config = buildConfig(settings);
  if (flags['print-config']) {
    // It prints what a start would run with, so it fails where a start (and `check`) would: on the rules too.
    throwProblems(ruleProblems(config.rulePaths, config.release));
    return { kind: 'print-config', text: describeSettings(settings, config) };
  }
  return { kind: 'run', config };
}

/**
 * The settings checked: first each on its own, every wrong one named at once (ConfigProblems);
 * then those that go together, in the order their errors are reported.
 */
export function buildConfig(settings: RawSettings): Config {
  checkEachSetting(settings);
  const logLevel = logLevelFrom(settings);
  const mode = modeFrom(settings);
  const adminText = text(settings, 'admin-listen') ?? 'off';
  const clustered = boolean(settings, 'cluster');
  const upstreams = checkSetting(settings, 'upstream', () => upstreamsFrom(settings, clustered));
  const upstream = upstreams[0];
  const upstreamTls = upstreamTlsFrom(settings, upstream);
  const listenerTls = listenerTlsFrom(settings);
  const sentinel = sentinelFrom(settings, upstream);
  const listen = checkSetting(settings, 'listen', () => parseAddress(text(settings, 'listen') ?? ''));
  const cluster = clustered ? buildClusterConfig(settings, upstreams, listen, sentinel !== null) : null;
  if (!clustered) refuseClusterSettings(settings);

  const rules = chooseRules(settings);
  return {
    listen,
    upstream,
    rulePaths: rules.paths,
    release: rules.release,
    holdMs: integer(settings, 'hold-ms'),
    connectTimeoutMs: integer(settings, 'connect-timeout-ms'),
    logLevel,
    logTime: logTimeFrom(settings),
    mode,
    adminListen: adminText === 'off' ? null : checkSetting(settings, 'admin-listen', () => parseAddress(adminText, 'admin-listen address')),
    watchRules: boolean(settings, 'watch-rules'),
    shutdownTimeoutMs: integer(settings, 'shutdown-timeout-ms'),
    maxConnections: integer(settings, 'max-connections'),
    warnings: deprecatedGiven(settings),
    idleTimeoutMs: integer(settings, 'idle-timeout-ms'),
    ownReplyTimeoutMs: integer(settings, 'own-reply-timeout-ms'),
    upstreamTimeoutMs: integer(settings, 'upstream-timeout-ms'),
    lockMethod: lockMethodFrom(settings),
    lockAttemptReportMs: integer(settings, 'lock-attempt-report-ms'),
    lockScanIntervalMs: integer(settings, 'lock-scan-interval-ms'),
    lockScanMaxKeys: integer(settings, 'lock-scan-max-keys'),
    lockScanBudgetMs: integer(settings, 'lock-scan-budget-ms'),
    upstreamTls,
    listenerTls,
    sentinel,
    cluster,
    given: settings,
  };
}

/** Every setting that can be checked on its own: its kind, its choices, its syntax. */
function checkEachSetting(settings: RawSettings): void {
  const byKind = (Object.entries(OPTIONS) as Array<[OptionName, OptionSpec]>).flatMap(([name, spec]): Array<() => unknown> => {
    if (settings[name] === undefined || spec.deprecated !== undefined) return [];
    if (spec.kind === 'integer') return [() => integer(settings, name)];
    if (spec.kind === 'boolean') return [() => boolean(settings, name)];
    return [];
  });
  allChecked([
    ...byKind,
    () => logLevelFrom(settings),
    () => logTimeFrom(settings),
    () => modeFrom(settings),
    () => lockMethodFrom(settings),
    () => checkSetting(settings, 'listen', () => parseAddress(text(settings, 'listen') ?? '')),
    () => {
      const admin = text(settings, 'admin-listen') ?? 'off';
      if (admin !== 'off') checkSetting(settings, 'admin-listen', () => parseAddress(admin, 'admin-listen address'));
    },
    // A wrong --cluster is named by its own check; the URLs are read as it most likely means.
    () => checkSetting(settings, 'upstream', () => upstreamsFrom(settings, settings.cluster === true || settings.cluster === 'true')),
    () => chooseRules(settings),
  ]);
}

function logLevelFrom(settings: RawSettings): string {
  const logLevel = text(settings, 'log-level') ?? 'info';
  if (!LOG_LEVELS.includes(logLevel)) {
    throw settingError(settings, 'log-level', `log-level must be one of ${LOG_LEVELS.join(', ')}, got "${logLevel}"`);
  }
  return logLevel;
}

function logTimeFrom(settings: RawSettings): LogTime {
  const logTime = text(settings, 'log-time');
  const known = LOG_TIMES.find((choice) => choice === logTime);
  if (known === undefined) throw settingError(settings, 'log-time', `log-time must be one of ${LOG_TIMES.join(', ')}, got "${logTime}"`);
  return known;
}

function modeFrom(settings: RawSettings): RuleMode {
  const mode = text(settings, 'mode');
  if (mode !== 'enforce' && mode !== 'observe') throw settingError(settings, 'mode', `mode must be enforce or observe, got "${mode}"`);
  return mode;
}

function lockMethodFrom(settings: RawSettings): LockMethodSetting {
  const method = text(settings, 'lock-method') ?? 'auto';
  const known = LOCK_METHOD_SETTINGS.find((setting) => setting === method);
  if (known === undefined)
    throw settingError(settings, 'lock-method', `lock-method must be one of ${LOCK_METHOD_SETTINGS.join(', ')}, got "${method}"`);
  return known;
}

/** The upstream URL, or with --cluster the seed URLs; never none. */
function upstreamsFrom(settings: RawSettings, clustered: boolean): UpstreamTarget[] {
  const upstreamText = text(settings, 'upstream') ?? 'redis://127.0.0.1:6379';
  // A comma separates seed URLs with --cluster only (a password may hold a comma: write it %2C).
  const upstreams = (clustered ? splitList(upstreamText) : [upstreamText]).map(parseUpstreamUrl);
  if (upstreams.length === 0) throw new ConfigError('upstream: no URL given');
  return upstreams;
}

/** TLS towards a rediss:// upstream; its settings are refused for any other. */
export function upstreamTlsFrom(settings: RawSettings, upstream: UpstreamTarget): UpstreamTls | null {
  const tlsFlags = ['upstream-ca', 'upstream-cert', 'upstream-key', 'upstream-servername'] as const;
  if (!upstream.tls && (tlsFlags.some((f) => settings[f] !== undefined) || boolean(settings, 'upstream-insecure'))) {
    throw new ConfigError(`--${tlsFlags.find((f) => settings[f] !== undefined) ?? 'upstream-insecure'} needs a rediss:// upstream URL`);
  }
  if ((settings['upstream-cert'] === undefined) !== (settings['upstream-key'] === undefined)) {
    throw new ConfigError('upstream-cert and upstream-key go together');
  }
  if (!upstream.tls) return null;
  return {
    ca: readPem(text(settings, 'upstream-ca'), 'upstream-ca'),
    cert: readPem(text(settings, 'upstream-cert'), 'upstream-cert'),
    key: readPem(text(settings, 'upstream-key'), 'upstream-key'),
    servername: text(settings, 'upstream-servername'),
    insecure: boolean(settings, 'upstream-insecure'),
  };
}

/** TLS for clients, with --tls-cert and --tls-key. */
function listenerTlsFrom(settings: RawSettings): ListenerTls | null {
  if ((settings['tls-cert'] === undefined) !== (settings['tls-key'] === undefined))
    throw new ConfigError('tls-cert and tls-key go together');
  if (settings['tls-client-ca'] !== undefined && settings['tls-cert'] === undefined)
    throw new ConfigError('tls-client-ca needs tls-cert and tls-key');
  if (settings['tls-cert'] === undefined) return null;
  return {
    cert: readPem(text(settings, 'tls-cert'), 'tls-cert') as Buffer,
    key: readPem(text(settings, 'tls-key'), 'tls-key') as Buffer,
    clientCa: readPem(text(settings, 'tls-client-ca'), 'tls-client-ca'),
  };
}

function readPem(file: string | undefined, what: string): Buffer | undefined {
  if (file === undefined) return undefined;
  try {
    return fs.readFileSync(file);
  } catch (err) {
    throw new ConfigError(`${what} ${file}: cannot read: ${(err as Error).message}`, { cause: err });
  }
}

/** The sentinels and the master name, given together. */
function sentinelFrom(settings: RawSettings, upstream: UpstreamTarget): SentinelConfig | null {
  const sentinels = list(settings, 'sentinel');
  const masterName = text(settings, 'sentinel-master');
  if ((sentinels === undefined) !== (masterName === undefined)) throw new ConfigError('sentinel and sentinel-master go together');
  if (sentinels === undefined || masterName === undefined) return null;
  const addresses = checkSetting(settings, 'sentinel', () => sentinels.map((address) => parseAddress(address, 'sentinel address')));
  // A master is believed when a majority of the sentinels name it: one listed twice would vote twice.
  const seen = new Set<string>();
  for (const address of addresses) {
    const shown = formatAddress(address.host, address.port);
    if (seen.has(shown)) {
      throw settingError(settings, 'sentinel', `sentinel ${shown} is listed twice: list each sentinel once (each has one vote)`);
    }
    seen.add(shown);
  }
  const sentinel: SentinelConfig = {
    sentinels: addresses,
    masterName,
    username: text(settings, 'sentinel-username'),
    password: text(settings, 'sentinel-password'),
  };
  if (upstream.path !== undefined)
    throw new ConfigError('with sentinel, the upstream URL must be redis:// or rediss:// (its host is replaced by the master)');
  return sentinel;
}

/** The cluster settings mean nothing without --cluster: given anyway (not as their defaults), they are refused. */
function refuseClusterSettings(settings: RawSettings): void {
  for (const name of ['cluster-base-port', 'cluster-port-map', 'cluster-announce-host', 'cluster-refresh-ms'] as const) {
    const spec: OptionSpec = OPTIONS[name];
    if (settings[name] !== undefined && String(settings[name]) !== String(spec.default)) throw new ConfigError(`${name} needs --cluster`);
  }
}

/** Why each deprecated setting that was given does nothing. */
function deprecatedGiven(settings: RawSettings): string[] {
  return (Object.entries(OPTIONS) as Array<[OptionName, OptionSpec]>).flatMap(([name, spec]) =>
    spec.deprecated !== undefined && settings[name] !== undefined ? [spec.deprecated] : [],
  );
}

function buildClusterConfig(settings: RawSettings, seeds: UpstreamTarget[], listen: Address, withSentinel: boolean): ClusterConfig {
  if (withSentinel) throw new ConfigError('cluster and sentinel cannot be combined (a cluster finds its own masters)');
  for (const seed of seeds) {
    if (seed.path !== undefined)
      throw new ConfigError(`cluster: seed ${seed.display} must be redis:// or rediss:// (cluster nodes are reached over TCP)`);
    if (seed.db !== 0)
      throw new ConfigError(`cluster: seed ${seed.display} selects database ${seed.db}; Redis Cluster has database 0 only`);
    if (seed.tls !== seeds[0].tls) throw new ConfigError('cluster: seed URLs must all be redis:// or all rediss://');
  }
  const portMap = clusterPortMap(settings, listen);
  const base = integer(settings, 'cluster-base-port');
  if (listen.port === 0 && base === 0) throw new ConfigError('cluster: with --listen port 0, set --cluster-base-port');
  if (base === 0 && listen.port === 65535)
    throw new ConfigError('cluster: --listen port 65535 leaves no port above it; set --cluster-base-port');
  const announce = text(settings, 'cluster-announce-host');
  if (announce !== undefined && net.isIP(announce) === 0 && !/^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$/.test(announce)) {
    throw new ConfigError(`cluster-announce-host "${announce}" is not a host name or IP address (no port: the ports are the listeners')`);
  }
  return {
    seeds,
    basePort: base === 0 ? listen.port + 1 : base,
    portMap,
    announceHost: announce ?? null,
    refreshMs: integer(settings, 'cluster-refresh-ms'),
  };
}

/** --cluster-port-map NODEHOST:NODEPORT=PORT entries, by node address as formatAddress writes it. */
function clusterPortMap(settings: RawSettings, listen: Address): Map<string, number> {
  const portMap = new Map<string, number>();
  for (const entry of list(settings, 'cluster-port-map') ?? []) {
    const match = /^(.+:\d+)=(\d+)$/.exec(entry);
    const port = match ? Number(match[2]) : NaN;
    if (!match || !(port >= 1 && port <= 65535)) {
      throw new ConfigError(`cluster-port-map entry "${entry}" is not NODEHOST:NODEPORT=PORT (for example 10.0.0.5:6379=7001)`);
    }
    const node = parseAddress(match[1], 'cluster-port-map node address');
    if ([...portMap.values()].includes(port) || port === listen.port)
      throw new ConfigError(`cluster-port-map: port ${port} is given twice (or is the --listen port)`);
    portMap.set(formatAddress(node.host, node.port), port);
  }
  return portMap;
}

/** The effective settings as YAML, with secrets masked. */
function describeSettings(settings: RawSettings, config: Config): string {
  const shown: Record<string, unknown> = {};
  for (const name of Object.keys(OPTIONS) as OptionName[]) {
    const value = settings[name];
    if (value === undefined) continue;
    const spec: OptionSpec = OPTIONS[name];
    if (name === 'upstream') shown[name] = (config.cluster?.seeds ?? [config.upstream]).map((seed) => seed.display).join(',');
    else if (spec.secret) shown[name] = '***';
    else if (spec.kind === 'integer') shown[name] = Number(value);
    else if (spec.kind === 'list') shown[name] = list(settings, name);
    else if (spec.kind === 'boolean') shown[name] = boolean(settings, name);
    else shown[name] = value;
  }
  if (shown.rules === undefined) shown.rules = [...config.rulePaths];
  return toYaml(shown);
}
