/**
 * Settings, from four sources with this precedence: command-line flags, then
 * REDIS_LOCK_PROXY_* environment variables, then a YAML config file
 * (--config), then defaults. One table (OPTIONS) names every setting once, so
 * the flag, the variable and the file key can never drift apart.
 */
import fs from 'node:fs';
import net from 'node:net';
import { parseArgs } from 'node:util';
import { parse as parseYaml, stringify as toYaml } from 'yaml';
import { ConfigError } from './errors.js';
import type { ReleaseFilter } from './rules/loader.js';
import { STALWART_RULES_DIR, stalwartRelease } from './rules/stalwart.js';
import { parseUpstreamUrl, type UpstreamTarget } from './upstream/target.js';

export interface ListenAddress {
  readonly host: string;
  readonly port: number;
}

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

export type GlobalMode = 'enforce' | 'observe';

export interface ClusterConfig {
  /** Nodes the topology is first asked of; their credentials and TLS apply to every node. */
  readonly seeds: readonly UpstreamTarget[];
  /** First port for node listeners (those not in portMap). */
  readonly basePort: number;
  /** Fixed listener port by node address as the cluster announces it (`host:port`). */
  readonly portMap: ReadonlyMap<string, number>;
  /** Host written into cluster replies; null: the address each client connected to. */
  readonly announceHost: string | null;
  readonly refreshMs: number;
}

export interface Config {
  readonly listen: ListenAddress;
  readonly upstream: UpstreamTarget;
  readonly rulePaths: readonly string[];
  /** --stalwart: load only the rule files for this release (and those that name no release). */
  readonly release: ReleaseFilter | undefined;
  readonly holdMs: number;
  readonly connectTimeoutMs: number;
  readonly logLevel: string;
  /** `observe` makes every rule observe-only; `enforce` leaves each rule's own mode. */
  readonly mode: GlobalMode;
  /** Admin HTTP address, or null when disabled. */
  readonly adminListen: ListenAddress | null;
  readonly watchRules: boolean;
  readonly shutdownTimeoutMs: number;
  readonly maxConnections: number;
  /** Settings given that no longer do anything, with why: logged at start-up. */
  readonly warnings: readonly string[];
  /** Close client connections idle this long; 0: never. */
  readonly idleTimeoutMs: number;
  readonly lockPipelining: boolean;
  /** TLS towards Redis, set for rediss:// upstreams. */
  readonly upstreamTls: UpstreamTls | null;
  /** TLS for clients, when --tls-cert is set. */
  readonly listenerTls: ListenerTls | null;
  readonly sentinel: SentinelConfig | null;
  /** Set in cluster mode (--cluster). */
  readonly cluster: ClusterConfig | null;
}

/** The rules shipped with the package: every affected Stalwart release line (rules/stalwart/). */
export const DEFAULT_RULES_DIR = STALWART_RULES_DIR;

type Kind = 'string' | 'integer' | 'boolean' | 'list';

interface OptionSpec {
  readonly kind: Kind;
  readonly default?: string | number | boolean;
  readonly help: string;
  readonly short?: string;
  /** Masked by --print-config. */
  readonly secret?: boolean;
  /** Accepted, so that existing configurations keep working, but no longer used: why. */
  readonly deprecated?: string;
  readonly min?: number;
  readonly max?: number;
}

/** Every setting: flag `--name`, variable `REDIS_LOCK_PROXY_NAME`, config file key `name`. */
export const OPTIONS = {
  listen: { kind: 'string', default: '127.0.0.1:6380', help: 'address clients connect to, HOST:PORT' },
  upstream: {
    kind: 'string',
    default: 'redis://127.0.0.1:6379',
    help: 'Redis URL: redis://, rediss:// (TLS) or unix://; with --cluster, seed node URLs, comma-separated',
    secret: true,
  },
  rules: { kind: 'list', help: 'rule file or directory of *.yaml files; repeatable (default: the shipped rules/stalwart/, every affected Stalwart release)' },
  stalwart: { kind: 'string', help: 'the Stalwart release the clients run, e.g. 0.15.3: load only the rule files for it (default: every affected release)' },
  mode: { kind: 'string', default: 'enforce', help: 'enforce (rules decide) or observe (every rule only observes)' },
  'hold-ms': { kind: 'integer', default: 10, min: 1, max: 60_000, help: 'how long an incomplete MULTI block waits for more bytes' },
  'connect-timeout-ms': { kind: 'integer', default: 5000, min: 1, max: 600_000, help: 'upstream connect timeout' },
  'admin-listen': { kind: 'string', default: '127.0.0.1:9180', help: 'admin HTTP address (/metrics, /healthz, /readyz), or "off"' },
  'watch-rules': { kind: 'boolean', default: false, help: 'reload the rules when a rule file changes (SIGHUP always reloads)' },
  'shutdown-timeout-ms': { kind: 'integer', default: 10_000, min: 0, max: 3_600_000, help: 'on SIGTERM/SIGINT, how long to wait for busy connections' },
  'max-connections': { kind: 'integer', default: 10_000, min: 1, max: 1_000_000, help: 'client connections at once; more are refused as Redis does' },
  'max-frame-bytes': {
    kind: 'integer',
    help: 'no longer used: requests stream to Redis, whose own limits apply',
    deprecated:
      'max-frame-bytes no longer applies: requests stream to Redis, whose own limits (proto-max-bulk-len, ' +
      'client-query-buffer-limit) decide and answer; the proxy holds only lock blocks, a few KiB at most',
  },
  'lock-pipelining': { kind: 'boolean', default: false, help: 'forward what follows a lock block without waiting for its script, once the script has worked on the connection' },
  'idle-timeout-ms': { kind: 'integer', default: 0, min: 0, max: 2_147_483_647, help: 'close client connections idle this long (0: never)' },
  'upstream-ca': { kind: 'string', help: 'CA certificate file (PEM) to verify a rediss:// upstream' },
  'upstream-cert': { kind: 'string', help: 'client certificate file (PEM) for a rediss:// upstream' },
  'upstream-key': { kind: 'string', help: 'client key file (PEM) for a rediss:// upstream' },
  'upstream-servername': { kind: 'string', help: 'TLS server name (SNI) to send and verify (default: the URL host)' },
  'upstream-insecure': { kind: 'boolean', default: false, help: 'do not verify the upstream certificate (logged as a warning)' },
  'tls-cert': { kind: 'string', help: 'serve clients over TLS with this certificate file (PEM)' },
  'tls-key': { kind: 'string', help: 'key file (PEM) for --tls-cert' },
  'tls-client-ca': { kind: 'string', help: 'require client certificates signed by this CA (PEM)' },
  sentinel: { kind: 'list', help: 'Sentinel addresses HOST:PORT (repeatable or comma-separated): find the master through them' },
  'sentinel-master': { kind: 'string', help: 'master name the sentinels monitor' },
  'sentinel-username': { kind: 'string', help: 'user name for the sentinels themselves' },
  'sentinel-password': { kind: 'string', secret: true, help: 'password for the sentinels themselves' },
  cluster: { kind: 'boolean', default: false, help: 'run in front of a Redis Cluster: a listener per node, node addresses in replies rewritten' },
  'cluster-base-port': { kind: 'integer', default: 0, min: 0, max: 65535, help: 'first node listener port (0: the --listen port + 1)' },
  'cluster-port-map': { kind: 'list', help: 'fixed node listener ports, NODEHOST:NODEPORT=PORT (repeatable or comma-separated)' },
  'cluster-announce-host': { kind: 'string', help: 'host written into cluster replies (default: the address the client connected to)' },
  'cluster-refresh-ms': { kind: 'integer', default: 10_000, min: 100, max: 3_600_000, help: 'how often the cluster topology is asked again' },
  'log-level': { kind: 'string', default: 'info', help: 'fatal|error|warn|info|debug|trace|silent' },
} as const satisfies Record<string, OptionSpec>;

type OptionName = keyof typeof OPTIONS;
type RawValue = string | number | boolean | string[];
type RawSettings = Partial<Record<OptionName, RawValue>>;

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

export function envName(option: string): string {
  return `REDIS_LOCK_PROXY_${option.toUpperCase().replace(/-/g, '_')}`;
}

export const USAGE = `Usage: redis-lock-proxy [options]
       redis-lock-proxy verify --via HOST:PORT      prove the fix through a running proxy
       redis-lock-proxy locks --upstream URL        list (and release) lock keys

A transparent Redis proxy that makes lock transactions
(MULTI / INCR|INCRBY / EXPIRE|PEXPIRE / EXEC) on keys named by rules apply
their expiry only when the lock is created.

Options (flags win over REDIS_LOCK_PROXY_* variables, which win over --config):
${(Object.entries(OPTIONS) as Array<[string, OptionSpec]>)
  .map(([name, spec]) => {
    const arg = spec.kind === 'boolean' ? '' : spec.kind === 'integer' ? ' N' : ' VALUE';
    const def = spec.default !== undefined && spec.default !== false ? ` (default ${spec.default})` : '';
    return `  --${name}${arg}\n      ${spec.help}${def} [${envName(name)}]`;
  })
  .join('\n')}
  --config FILE
      YAML file with any of the settings above as keys (rules and sentinel as lists)
  --print-config
      print the effective configuration (secrets masked) and exit
  -h, --help        show this help
  -v, --version     show the version
`;

export type CliRequest =
  | { kind: 'run'; config: Config }
  | { kind: 'print-config'; text: string }
  | { kind: 'help' }
  | { kind: 'version' };

export function parseListen(text: string, what = 'listen address'): ListenAddress {
  const match = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(text) ?? /^()()(\d+)$/.exec(text);
  const port = match ? Number(match[3]) : NaN;
  if (!match || !(port >= 0 && port <= 65535)) {
    throw new ConfigError(`${what} "${text}" is not HOST:PORT (for example 127.0.0.1:6380 or [::1]:6380)`);
  }
  const host = match[1] ?? match[2];
  return { host: host === '' ? '127.0.0.1' : host, port };
}

function readFlags(argv: string[]): { values: Record<string, unknown> } {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean; short?: string }> = {
    config: { type: 'string' },
    'print-config': { type: 'boolean' },
    help: { type: 'boolean', short: 'h' },
    version: { type: 'boolean', short: 'v' },
  };
  for (const [name, spec] of Object.entries(OPTIONS) as Array<[string, OptionSpec]>) {
    options[name] = spec.kind === 'boolean' ? { type: 'boolean' } : spec.kind === 'list' ? { type: 'string', multiple: true } : { type: 'string' };
  }
  try {
    return parseArgs({ args: argv, strict: true, allowPositionals: false, options });
  } catch (err) {
    throw new ConfigError(`${(err as Error).message} (see --help)`);
  }
}

function fromEnv(env: NodeJS.ProcessEnv): RawSettings {
  const settings: RawSettings = {};
  for (const [name, spec] of Object.entries(OPTIONS) as Array<[OptionName, OptionSpec]>) {
    const value = env[envName(name)];
    if (value === undefined || value === '') continue;
    if (spec.kind === 'list') {
      const items = splitList(value);
      if (items.length > 0) settings[name] = items; // an empty list means "not set": the default applies
    } else {
      settings[name] = value;
    }
  }
  return settings;
}

function splitList(value: string): string[] {
  return value.split(',').map((part) => part.trim()).filter((part) => part !== '');
}

function fromFile(file: string): RawSettings {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`config file ${file}: cannot read: ${(err as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    throw new ConfigError(`config file ${file}: not valid YAML: ${(err as Error).message}`);
  }
  if (doc === null || doc === undefined) return {};
  if (typeof doc !== 'object' || Array.isArray(doc)) throw new ConfigError(`config file ${file}: must be a mapping of setting: value`);
  const settings: RawSettings = {};
  for (const [key, value] of Object.entries(doc as Record<string, unknown>)) {
    if (!(key in OPTIONS)) {
      throw new ConfigError(`config file ${file}: unknown setting "${key}" (settings are named like the flags, e.g. listen, upstream, hold-ms)`);
    }
    const spec: OptionSpec = OPTIONS[key as OptionName];
    settings[key as OptionName] = fileValue(file, key, spec, value);
  }
  return settings;
}

function fileValue(file: string, key: string, spec: OptionSpec, value: unknown): RawValue {
  const wrong = (expected: string): never => {
    throw new ConfigError(`config file ${file}: setting "${key}" must be ${expected}, got ${JSON.stringify(value)}`);
  };
  switch (spec.kind) {
    case 'list':
      if (typeof value === 'string') return splitList(value);
      if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) return wrong('a list of strings');
      return value as string[];
    case 'boolean':
      return typeof value === 'boolean' ? value : wrong('true or false');
    case 'integer':
      return typeof value === 'number' || typeof value === 'string' ? value : wrong('an integer');
    case 'string':
      return typeof value === 'string' ? value : typeof value === 'number' ? String(value) : wrong('a string');
  }
}

/** Which rule files to load: --rules (default: the shipped ones), narrowed by --stalwart. */
export interface RuleChoice {
  readonly paths: string[];
  readonly release: ReleaseFilter | undefined;
}

/**
 * --rules and --stalwart, as the proxy and its operator commands take them. A Stalwart release
 * that does not have the bug is refused, saying so: there is nothing to load for it.
 */
export function chooseRules(rules: string[] | undefined, stalwart: string | undefined): RuleChoice {
  const paths = rules !== undefined && rules.length > 0 ? rules : [DEFAULT_RULES_DIR];
  if (stalwart === undefined || stalwart === '') return { paths, release: undefined };
  const release = stalwartRelease(stalwart);
  if (release.kind === 'invalid') throw new ConfigError(`stalwart: ${release.reason}`);
  if (release.kind === 'not-affected') {
    throw new ConfigError(`stalwart: ${release.reason}; there are no lock rules to load for it (give the release of the oldest node still running)`);
  }
  return { paths, release: { product: 'Stalwart', version: release.version } };
}

/** The rule settings of the operator commands: their flags, else the proxy's environment variables. */
export function chooseRulesFromEnv(rules: string[] | undefined, stalwart: string | undefined, env: NodeJS.ProcessEnv): RuleChoice {
  return chooseRules(rules ?? splitList(env[envName('rules')] ?? ''), stalwart ?? nonEmpty(env[envName('stalwart')]));
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === '' ? undefined : value;
}

/** Merges sources: flags > env > file > defaults. */
function merge(flags: Record<string, unknown>, env: RawSettings, file: RawSettings): RawSettings {
  const merged: RawSettings = {};
  for (const name of Object.keys(OPTIONS) as OptionName[]) {
    const value = (flags[name] as RawValue | undefined) ?? env[name] ?? file[name] ?? (OPTIONS[name] as OptionSpec).default;
    if (value !== undefined) merged[name] = value;
  }
  return merged;
}

function integer(settings: RawSettings, name: OptionName): number {
  const spec: OptionSpec = OPTIONS[name];
  const raw = settings[name];
  const text = String(raw);
  const min = spec.min ?? 0;
  const max = spec.max ?? Number.MAX_SAFE_INTEGER;
  if (!/^\d+$/.test(text) || Number(text) < min || Number(text) > max) {
    throw new ConfigError(`${name} must be an integer from ${min} to ${max}, got "${text}"`);
  }
  return Number(text);
}

function boolean(settings: RawSettings, name: OptionName): boolean {
  const raw = settings[name];
  if (typeof raw === 'boolean') return raw;
  if (raw === 'true' || raw === '1' || raw === 'yes') return true;
  if (raw === 'false' || raw === '0' || raw === 'no') return false;
  throw new ConfigError(`${name} must be true or false, got "${String(raw)}"`);
}

function text(settings: RawSettings, name: OptionName): string | undefined {
  const raw = settings[name];
  return raw === undefined ? undefined : String(raw);
}

function list(settings: RawSettings, name: OptionName): string[] | undefined {
  const raw = settings[name];
  if (raw === undefined) return undefined;
  return Array.isArray(raw) ? raw.flatMap(splitList) : splitList(String(raw));
}

function readPem(file: string | undefined, what: string): Buffer | undefined {
  if (file === undefined) return undefined;
  try {
    return fs.readFileSync(file);
  } catch (err) {
    throw new ConfigError(`${what} ${file}: cannot read: ${(err as Error).message}`);
  }
}

function buildConfig(settings: RawSettings): Config {
  const logLevel = text(settings, 'log-level') ?? 'info';
  if (!LOG_LEVELS.includes(logLevel)) throw new ConfigError(`log-level must be one of ${LOG_LEVELS.join(', ')}, got "${logLevel}"`);
  const mode = text(settings, 'mode');
  if (mode !== 'enforce' && mode !== 'observe') throw new ConfigError(`mode must be enforce or observe, got "${mode}"`);
  const adminText = text(settings, 'admin-listen') ?? 'off';
  const clusterMode = boolean(settings, 'cluster');
  const upstreamText = text(settings, 'upstream') ?? 'redis://127.0.0.1:6379';
  // A comma separates seed URLs in cluster mode only (a password may hold a comma: write it %2C).
  const upstreams = (clusterMode ? splitList(upstreamText) : [upstreamText]).map(parseUpstreamUrl);
  if (upstreams.length === 0) throw new ConfigError('upstream: no URL given');
  const upstream = upstreams[0];

  const tlsFlags = ['upstream-ca', 'upstream-cert', 'upstream-key', 'upstream-servername'] as const;
  if (!upstream.tls && (tlsFlags.some((f) => settings[f] !== undefined) || boolean(settings, 'upstream-insecure'))) {
    throw new ConfigError(`--${tlsFlags.find((f) => settings[f] !== undefined) ?? 'upstream-insecure'} needs a rediss:// upstream URL`);
  }
  if ((settings['upstream-cert'] === undefined) !== (settings['upstream-key'] === undefined)) {
    throw new ConfigError('upstream-cert and upstream-key go together');
  }
  const upstreamTls: UpstreamTls | null = upstream.tls
    ? {
        ca: readPem(text(settings, 'upstream-ca'), 'upstream-ca'),
        cert: readPem(text(settings, 'upstream-cert'), 'upstream-cert'),
        key: readPem(text(settings, 'upstream-key'), 'upstream-key'),
        servername: text(settings, 'upstream-servername'),
        insecure: boolean(settings, 'upstream-insecure'),
      }
    : null;

  if ((settings['tls-cert'] === undefined) !== (settings['tls-key'] === undefined)) throw new ConfigError('tls-cert and tls-key go together');
  if (settings['tls-client-ca'] !== undefined && settings['tls-cert'] === undefined) throw new ConfigError('tls-client-ca needs tls-cert and tls-key');
  const listenerTls: ListenerTls | null =
    settings['tls-cert'] === undefined
      ? null
      : {
          cert: readPem(text(settings, 'tls-cert'), 'tls-cert') as Buffer,
          key: readPem(text(settings, 'tls-key'), 'tls-key') as Buffer,
          clientCa: readPem(text(settings, 'tls-client-ca'), 'tls-client-ca'),
        };

  const sentinels = list(settings, 'sentinel');
  const masterName = text(settings, 'sentinel-master');
  if ((sentinels === undefined) !== (masterName === undefined)) throw new ConfigError('sentinel and sentinel-master go together');
  const sentinel: SentinelConfig | null =
    sentinels === undefined || masterName === undefined
      ? null
      : {
          sentinels: sentinels.map((address) => parseListen(address, 'sentinel address')),
          masterName,
          username: text(settings, 'sentinel-username'),
          password: text(settings, 'sentinel-password'),
        };
  if (sentinel !== null && upstream.path !== undefined) throw new ConfigError('with sentinel, the upstream URL must be redis:// or rediss:// (its host is replaced by the master)');

  const listen = parseListen(text(settings, 'listen') ?? '');
  const cluster = clusterMode ? buildClusterConfig(settings, upstreams, listen, sentinel !== null) : null;
  if (!clusterMode) {
    for (const name of ['cluster-base-port', 'cluster-port-map', 'cluster-announce-host', 'cluster-refresh-ms'] as const) {
      const spec: OptionSpec = OPTIONS[name];
      if (settings[name] !== undefined && String(settings[name]) !== String(spec.default)) throw new ConfigError(`${name} needs --cluster`);
    }
  }

  const rules = chooseRules(list(settings, 'rules'), text(settings, 'stalwart'));
  return {
    listen,
    upstream,
    rulePaths: rules.paths,
    release: rules.release,
    holdMs: integer(settings, 'hold-ms'),
    connectTimeoutMs: integer(settings, 'connect-timeout-ms'),
    logLevel,
    mode,
    adminListen: adminText === 'off' ? null : parseListen(adminText, 'admin-listen address'),
    watchRules: boolean(settings, 'watch-rules'),
    shutdownTimeoutMs: integer(settings, 'shutdown-timeout-ms'),
    maxConnections: integer(settings, 'max-connections'),
    warnings: deprecatedGiven(settings),
    idleTimeoutMs: integer(settings, 'idle-timeout-ms'),
    lockPipelining: boolean(settings, 'lock-pipelining'),
    upstreamTls,
    listenerTls,
    sentinel,
    cluster,
  };
}

/** Why each deprecated setting that was given does nothing. */
function deprecatedGiven(settings: RawSettings): string[] {
  return (Object.entries(OPTIONS) as Array<[OptionName, OptionSpec]>).flatMap(([name, spec]) =>
    spec.deprecated !== undefined && settings[name] !== undefined ? [spec.deprecated] : [],
  );
}

function buildClusterConfig(settings: RawSettings, seeds: UpstreamTarget[], listen: ListenAddress, withSentinel: boolean): ClusterConfig {
  if (withSentinel) throw new ConfigError('cluster and sentinel cannot be combined (a cluster finds its own masters)');
  for (const seed of seeds) {
    if (seed.path !== undefined) throw new ConfigError(`cluster: seed ${seed.display} must be redis:// or rediss:// (cluster nodes are reached over TCP)`);
    if (seed.db !== 0) throw new ConfigError(`cluster: seed ${seed.display} selects database ${seed.db}; Redis Cluster has database 0 only`);
    if (seed.tls !== seeds[0].tls) throw new ConfigError('cluster: seed URLs must all be redis:// or all rediss://');
  }
  const portMap = new Map<string, number>();
  for (const entry of list(settings, 'cluster-port-map') ?? []) {
    const match = /^(.+:\d+)=(\d+)$/.exec(entry);
    const port = match ? Number(match[2]) : NaN;
    if (!match || !(port >= 1 && port <= 65535)) {
      throw new ConfigError(`cluster-port-map entry "${entry}" is not NODEHOST:NODEPORT=PORT (for example 10.0.0.5:6379=7001)`);
    }
    const node = parseListen(match[1], 'cluster-port-map node address');
    if ([...portMap.values()].includes(port) || port === listen.port) throw new ConfigError(`cluster-port-map: port ${port} is given twice (or is the --listen port)`);
    portMap.set(`${node.host}:${node.port}`, port);
  }
  const base = integer(settings, 'cluster-base-port');
  if (listen.port === 0 && base === 0) throw new ConfigError('cluster: with --listen port 0, set --cluster-base-port');
  if (base === 0 && listen.port === 65535) throw new ConfigError('cluster: --listen port 65535 leaves no port above it; set --cluster-base-port');
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

export function resolveConfig(argv: string[], env: NodeJS.ProcessEnv): CliRequest {
  const { values } = readFlags(argv);
  if (values.help) return { kind: 'help' };
  if (values.version) return { kind: 'version' };
  const configFile = (values.config as string | undefined) ?? env.REDIS_LOCK_PROXY_CONFIG;
  const settings = merge(values, fromEnv(env), configFile ? fromFile(configFile) : {});
  const config = buildConfig(settings);
  if (values['print-config']) return { kind: 'print-config', text: describeSettings(settings, config) };
  return { kind: 'run', config };
}
