/**
 * The proxy's settings as given, from four sources with this precedence: command-line flags,
 * then REDIS_LOCK_PROXY_* environment variables, then a YAML config file (--config), then
 * defaults. One table (OPTIONS) names every setting once and drives the flags, the variables,
 * the file keys and the help, so that they can never drift apart. config.ts turns the merged
 * settings into a Config.
 */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { readConfigFile, type FileEntry } from './config-file.js';
import { ConfigError, problemsFrom, throwProblems } from './errors.js';
import { nearestName } from './nearest-name.js';

type Kind = 'string' | 'integer' | 'boolean' | 'list';

export interface OptionSpec {
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
  rules: {
    kind: 'list',
    help: 'rule file or directory of *.yaml files; repeatable (default: the shipped rules/stalwart/, every affected Stalwart release)',
  },
  stalwart: {
    kind: 'list',
    help: 'the Stalwart releases the clients run, e.g. 0.15.3,0.16.9 (repeatable or comma-separated): load only the rule files for them (default: every affected release)',
  },
  mode: { kind: 'string', default: 'enforce', help: 'enforce (rules decide) or observe (every rule only observes)' },
  'hold-ms': {
    kind: 'integer',
    default: 10,
    min: 1,
    max: 60_000,
    help: 'with --lock-method script: how long an incomplete MULTI block waits for more bytes (auto and transaction hold nothing)',
  },
  'connect-timeout-ms': { kind: 'integer', default: 5000, min: 1, max: 600_000, help: 'upstream connect timeout' },
  'admin-listen': {
    kind: 'string',
    default: '127.0.0.1:9180',
    help: 'admin HTTP address (/metrics, /healthz, /readyz, /rules), or "off"',
  },
  'watch-rules': { kind: 'boolean', default: false, help: 'reload the rules when a rule file changes (SIGHUP always reloads)' },
  'shutdown-timeout-ms': {
    kind: 'integer',
    default: 10_000,
    min: 0,
    max: 3_600_000,
    help: 'on SIGTERM/SIGINT, how long to wait for busy connections',
  },
  'max-connections': {
    kind: 'integer',
    default: 10_000,
    min: 1,
    max: 1_000_000,
    help: 'client connections at once; more are refused as Redis does',
  },
  'lock-attempt-report-ms': {
    kind: 'integer',
    default: 3_600_000,
    min: 0,
    max: 86_400_000,
    help: 'how often to log which lock attempts came: old-shape ones (MULTI/INCRBY/EXPIRE/EXEC), only fixed-shape ones (SET NX EX), or none (0: never)',
  },
  'lock-scan-interval-ms': {
    kind: 'integer',
    default: 0,
    min: 0,
    max: 86_400_000,
    help: 'scan Redis for lock keys this often, for the lock-key metrics: abandoned (no expiry) and re-armed locks (0: never)',
  },
  'lock-scan-max-keys': {
    kind: 'integer',
    default: 100_000,
    min: 1,
    max: 100_000_000,
    help: 'lock keys read per scan at most (the work of one scan is bounded)',
  },
  'lock-scan-budget-ms': {
    kind: 'integer',
    // Tens of millions of keys at Redis's pace, a SCAN page at a time (300,000 take about 0.25 s); `locks` has the same default.
    default: 30_000,
    min: 1,
    max: 3_600_000,
    help: 'how long one lock scan may take; one that stops early says so (lock_scan_truncated, and the log)',
  },
  'max-frame-bytes': {
    kind: 'integer',
    help: 'no longer used: requests stream to Redis, whose own limits apply',
    deprecated:
      'max-frame-bytes no longer applies: requests stream to Redis, whose own limits (proto-max-bulk-len, ' +
      'client-query-buffer-limit) decide and answer; the proxy holds only lock blocks, a few KiB at most',
  },
  'lock-pipelining': {
    kind: 'boolean',
    help: "no longer used: lock blocks go inside the client's own transaction, and nothing waits behind them",
    deprecated:
      'lock-pipelining no longer applies: where the server has EXPIRE NX (Redis 7.0+, Valkey) a lock block goes inside ' +
      "the client's own transaction and nothing waits behind it; the script path (older servers) keeps commands in order",
  },
  'lock-method': {
    kind: 'string',
    default: 'auto',
    help: "how lock blocks are fixed: transaction (NX on the client's own EXPIRE; Redis 7.0+, Valkey), script (the whole block as a Lua script, held until whole), or auto (from the server version: transaction, else the EXPIRE as a script inside the client's transaction)",
  },
  'idle-timeout-ms': {
    kind: 'integer',
    default: 0,
    min: 0,
    max: 2_147_483_647,
    help: 'close client connections idle this long (0: never)',
  },
  'upstream-timeout-ms': {
    kind: 'integer',
    default: 0,
    min: 0,
    max: 2_147_483_647,
    help: 'close a client connection when Redis has sent nothing for this long while a reply is due (0: never; blocking commands and subscriptions are exempt)',
  },
  'own-reply-timeout-ms': {
    kind: 'integer',
    default: 30_000,
    min: 1,
    max: 2_147_483_647,
    help: "how long Redis may take to answer a command of the proxy's own (the URL's AUTH/SELECT, the server version, the lock script, the marker after a RESET) once everything before it is answered (the marker: from when it is sent); past it the connection is closed",
  },
  'upstream-ca': { kind: 'string', help: 'CA certificate file (PEM) to verify a rediss:// upstream' },
  'upstream-cert': { kind: 'string', help: 'client certificate file (PEM) for a rediss:// upstream' },
  'upstream-key': { kind: 'string', help: 'client key file (PEM) for a rediss:// upstream' },
  'upstream-servername': { kind: 'string', help: 'TLS server name (SNI) to send and verify (default: the URL host)' },
  'upstream-insecure': { kind: 'boolean', default: false, help: 'do not verify the upstream certificate (logged as a warning)' },
  'tls-cert': { kind: 'string', help: 'serve clients over TLS with this certificate file (PEM)' },
  'tls-key': { kind: 'string', help: 'key file (PEM) for --tls-cert' },
  'tls-client-ca': { kind: 'string', help: 'require client certificates signed by this CA (PEM)' },
  sentinel: {
    kind: 'list',
    help: 'Sentinel addresses HOST:PORT (repeatable or comma-separated), each once: the master is the one a majority of them names',
  },
  'sentinel-master': { kind: 'string', help: 'master name the sentinels monitor' },
  'sentinel-username': { kind: 'string', help: 'user name for the sentinels themselves' },
  'sentinel-password': { kind: 'string', secret: true, help: 'password for the sentinels themselves' },
  cluster: {
    kind: 'boolean',
    default: false,
    help: 'run in front of a Redis Cluster: a listener per node, node addresses in replies rewritten',
  },
  'cluster-base-port': { kind: 'integer', default: 0, min: 0, max: 65535, help: 'first node listener port (0: the --listen port + 1)' },
  'cluster-port-map': { kind: 'list', help: 'fixed node listener ports, NODEHOST:NODEPORT=PORT (repeatable or comma-separated)' },
  'cluster-announce-host': { kind: 'string', help: 'host written into cluster replies (default: the address the client connected to)' },
  'cluster-refresh-ms': {
    kind: 'integer',
    default: 10_000,
    min: 100,
    max: 3_600_000,
    help: 'how often the cluster topology is asked again',
  },
  'log-level': { kind: 'string', default: 'info', help: 'fatal|error|warn|info|debug|trace|silent' },
  'log-time': {
    kind: 'string',
    default: 'epoch',
    help: "how log lines give their time: epoch (milliseconds since 1970, pino's own) or iso (ISO 8601 in UTC, as 2026-05-01T10:00:00.000Z)",
  },
} as const satisfies Record<string, OptionSpec>;

export type OptionName = keyof typeof OPTIONS;
type RawValue = string | number | boolean | string[];
/** Where each setting given by a variable or a config file came from (flags and defaults: not listed). */
const SOURCES = Symbol('sources');
/** Config file values that a flag or a variable overrode, by setting. */
const OVERRIDDEN = Symbol('overridden');
/** Each setting's value as given (or its default), not yet checked, and where it came from. */
export type RawSettings = Partial<Record<OptionName, RawValue>> & {
  [SOURCES]?: Partial<Record<OptionName, string>>;
  [OVERRIDDEN]?: Overridden[];
};

/** A setting the config file gives, whose value there does not apply: a flag or a variable gives another. */
export interface Overridden {
  readonly name: OptionName;
  /** What gave the value in force: `flag --mode`, or the variable's name. */
  readonly by: string;
  readonly value: RawValue;
  /** Where the file gives it (file, line, key), and what it says there. */
  readonly file: string;
  readonly fileValue: RawValue;
}

export function envName(option: string): string {
  return `REDIS_LOCK_PROXY_${option.toUpperCase().replace(/-/g, '_')}`;
}

/** The environment variables the package reads that are not settings of the proxy, and why. */
export const OTHER_VARIABLES: Readonly<Record<string, string>> = {
  REDIS_LOCK_PROXY_CONFIG: 'the config file, when --config is not given',
  REDIS_LOCK_PROXY_VERIFY_USER: "verify's AUTH user",
  REDIS_LOCK_PROXY_VERIFY_PASSWORD: "verify's AUTH password",
};

/**
 * Every REDIS_LOCK_PROXY_* variable that is none of the proxy's, each an error naming the known
 * one nearest to it: a misspelt variable would otherwise be ignored without a word.
 */
export function unknownVariables(env: NodeJS.ProcessEnv): ConfigError[] {
  const known = [...Object.keys(OPTIONS).map(envName), ...Object.keys(OTHER_VARIABLES)];
  return Object.keys(env)
    .filter((name) => name.startsWith('REDIS_LOCK_PROXY_') && !known.includes(name))
    .sort()
    .map((name) => new ConfigError(`${name} is not a variable of redis-lock-proxy (did you mean ${nearestName(name, known)}?)`));
}

export const USAGE = `Usage: redis-lock-proxy [options]
       redis-lock-proxy check [options]             check what a start would use, without starting
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
      YAML file with any of the settings above as keys (rules, stalwart and sentinel as lists)
  --print-config
      print the effective configuration (secrets masked) and exit; fails, as check does, on any problem
  -h, --help        show this help
  -v, --version     show the version
`;

/** Flags of the proxy that are not settings: --config, --print-config, --help, --version. */
export const COMMAND_LINE_ONLY_FLAGS = {
  config: { type: 'string' },
  'print-config': { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean', short: 'v' },
} satisfies NonNullable<ParseArgsConfig['options']>;

/** The command line: every setting's flag, and the flags above. */
export function readFlags(argv: string[]): Record<string, unknown> {
  const options: NonNullable<ParseArgsConfig['options']> = { ...COMMAND_LINE_ONLY_FLAGS };
  for (const [name, spec] of Object.entries(OPTIONS) as Array<[string, OptionSpec]>) {
    options[name] =
      spec.kind === 'boolean' ? { type: 'boolean' } : spec.kind === 'list' ? { type: 'string', multiple: true } : { type: 'string' };
  }
  try {
    return parseArgs({ args: argv, strict: true, allowPositionals: false, options }).values;
  } catch (err) {
    throw new ConfigError(`${flagProblem(err as Error & { code?: string }, Object.keys(options))} (see --help)`, { cause: err });
  }
}

/** parseArgs's complaint; for an unknown flag, said shortly with the known flag nearest to it. */
export function flagProblem(err: Error & { code?: string }, known: readonly string[]): string {
  const unknown = err.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION' ? /'(-[^']*)'/.exec(err.message)?.[1] : undefined;
  if (unknown === undefined) return err.message;
  const name = unknown.replace(/^-+/, '').replace(/=.*$/, '');
  return `unknown flag ${unknown} (did you mean --${nearestName(name, known)}?)`;
}

/**
 * The settings from every source, merged: flags > env > file (--config, else
 * REDIS_LOCK_PROXY_CONFIG) > defaults. An unknown variable and every problem of the file are
 * refused, all of them named.
 */
export function readSettings(flags: Record<string, unknown>, env: NodeJS.ProcessEnv): RawSettings {
  const { settings, problems } = readSettingsAndProblems(flags, env);
  throwProblems(problems);
  return settings;
}

/**
 * The settings as readSettings reads them, and its problems instead of an error, for `check`:
 * unknown variables are left out, and a config file that does not read gives nothing.
 */
export function readSettingsAndProblems(
  flags: Record<string, unknown>,
  env: NodeJS.ProcessEnv,
): { settings: RawSettings; problems: Error[] } {
  const configFile = (flags.config as string | undefined) ?? env.REDIS_LOCK_PROXY_CONFIG;
  const file: RawSettings = { [SOURCES]: {} };
  const problems = [...unknownVariables(env), ...(configFile ? fromFile(configFile, file) : [])];
  return { settings: merge(flags, fromEnv(env), file), problems };
}

/**
 * The proxy's settings `names` as an operator command (verify, locks) takes them: its flags of
 * the same names, else the proxy's environment variables, else the defaults (no config file).
 */
export function readCommandSettings(names: readonly OptionName[], flags: Record<string, unknown>, env: NodeJS.ProcessEnv): RawSettings {
  const all = merge(flags, fromEnv(env), {});
  const sources: Partial<Record<OptionName, string>> = {};
  const picked: RawSettings = { [SOURCES]: sources };
  for (const name of names) {
    if (all[name] !== undefined) picked[name] = all[name];
    if (all[SOURCES]?.[name] !== undefined) sources[name] = all[SOURCES][name];
  }
  return picked;
}

function fromEnv(env: NodeJS.ProcessEnv): RawSettings {
  const settings: RawSettings = { [SOURCES]: {} };
  for (const [name, spec] of Object.entries(OPTIONS) as Array<[OptionName, OptionSpec]>) {
    const value = env[envName(name)];
    if (value === undefined || value === '') continue;
    if (spec.kind === 'list') {
      const items = splitList(value);
      if (items.length === 0) continue; // an empty list means "not set": the default applies
      settings[name] = items;
    } else {
      settings[name] = value;
    }
    (settings[SOURCES] as Record<string, string>)[name] = envName(name);
  }
  return settings;
}

/** `a, b,,c` → `['a', 'b', 'c']`. */
export function splitList(value: string): string[] {
  return value
    .split(',')
    .map((part) => part.trim())
    .filter((part) => part !== '');
}

/** Reads the config file's settings into `settings`; returns its problems: every unknown key and wrong value, with its line. */
function fromFile(file: string, settings: RawSettings): Error[] {
  const known = Object.keys(OPTIONS);
  let entries: FileEntry[] = [];
  const unread = problemsFrom([() => (entries = readConfigFile(file))]);
  return [
    ...unread,
    ...problemsFrom(
      entries.map(({ key, value, line }) => () => {
        const where = `config file ${file}, line ${line}, setting "${key}"`;
        if (!known.includes(key)) {
          throw new ConfigError(`${where}: unknown setting (did you mean ${nearestName(key, known)}? settings are named like the flags)`);
        }
        const spec: OptionSpec = OPTIONS[key as OptionName];
        settings[key as OptionName] = fileValue(where, spec, value);
        (settings[SOURCES] as Record<string, string>)[key] = where;
      }),
    ),
  ];
}

function fileValue(where: string, spec: OptionSpec, value: unknown): RawValue {
  const wrong = (expected: string): never => {
    throw new ConfigError(`${where}: must be ${expected}, got ${JSON.stringify(value)}`);
  };
  switch (spec.kind) {
    case 'list':
      if (typeof value === 'string') return splitList(value);
      // A number is kept as text, so that its own check says what is wrong with it (`stalwart: 0.16`).
      if (typeof value === 'number') return [String(value)];
      if (!Array.isArray(value) || !value.every((v) => typeof v === 'string' || typeof v === 'number')) return wrong('a list of strings');
      return value.map(String);
    case 'boolean':
      return typeof value === 'boolean' ? value : wrong('true or false');
    case 'integer':
      return typeof value === 'number' || typeof value === 'string' ? value : wrong('an integer');
    case 'string':
      return typeof value === 'string' ? value : typeof value === 'number' ? String(value) : wrong('a string');
  }
}

function merge(flags: Record<string, unknown>, env: RawSettings, file: RawSettings): RawSettings {
  const sources: Partial<Record<OptionName, string>> = {};
  const overridden: Overridden[] = [];
  const merged: RawSettings = { [SOURCES]: sources, [OVERRIDDEN]: overridden };
  for (const name of Object.keys(OPTIONS) as OptionName[]) {
    const flag = flags[name] as RawValue | undefined;
    const value = flag ?? env[name] ?? file[name] ?? (OPTIONS[name] as OptionSpec).default;
    if (value !== undefined) merged[name] = value;
    const source = flag !== undefined ? undefined : env[name] !== undefined ? env[SOURCES]?.[name] : file[SOURCES]?.[name];
    if (source !== undefined && value !== undefined) sources[name] = source;
    const fileValue = file[name];
    if (fileValue !== undefined && value !== undefined && (flag !== undefined || env[name] !== undefined) && !same(fileValue, value)) {
      const by = flag !== undefined ? `flag --${name}` : envName(name);
      overridden.push({ name, by, value, file: file[SOURCES]?.[name] ?? 'config file', fileValue });
    }
  }
  return merged;
}

/** Whether two values of a setting say the same (a file's 25 and a flag's "25" do). */
function same(a: RawValue, b: RawValue): boolean {
  return Array.isArray(a) || Array.isArray(b) ? JSON.stringify(a) === JSON.stringify(b) : String(a) === String(b);
}

/** The config file's values that a flag or a variable overrode, in table order. */
export function overriddenFileSettings(settings: RawSettings): readonly Overridden[] {
  return settings[OVERRIDDEN] ?? [];
}

/** The settings whose values differ between two readings (a reload's), in table order. */
export function changedSettings(before: RawSettings, after: RawSettings): OptionName[] {
  return (Object.keys(OPTIONS) as OptionName[]).filter((name) => JSON.stringify(before[name]) !== JSON.stringify(after[name]));
}

/**
 * A setting's value is wrong: the error names where the value came from when that was a variable
 * (`REDIS_LOCK_PROXY_HOLD_MS: ...`) or a config file (`config file F, setting "hold-ms": ...`); a
 * flag is named by the problem itself.
 */
export function settingError(settings: RawSettings, name: OptionName, problem: string, cause?: unknown): ConfigError {
  const source = settings[SOURCES]?.[name];
  return new ConfigError(source === undefined ? problem : `${source}: ${problem}`, cause === undefined ? undefined : { cause });
}

/** Runs a check of setting `name`; a ConfigError it throws names where the value came from (settingError). */
export function checkSetting<T>(settings: RawSettings, name: OptionName, check: () => T): T {
  try {
    return check();
  } catch (err) {
    if (err instanceof ConfigError) throw settingError(settings, name, err.message, err);
    throw err;
  }
}

// ---------------------------------------------------------------------------------------------
// One setting, checked against its kind
// ---------------------------------------------------------------------------------------------

export function integer(settings: RawSettings, name: OptionName): number {
  const spec: OptionSpec = OPTIONS[name];
  const raw = settings[name];
  const text = String(raw);
  const min = spec.min ?? 0;
  const max = spec.max ?? Number.MAX_SAFE_INTEGER;
  if (!/^\d+$/.test(text) || Number(text) < min || Number(text) > max) {
    throw settingError(settings, name, `${name} must be an integer from ${min} to ${max}, got "${text}"`);
  }
  return Number(text);
}

export function boolean(settings: RawSettings, name: OptionName): boolean {
  const raw = settings[name];
  if (typeof raw === 'boolean') return raw;
  if (raw === 'true' || raw === '1' || raw === 'yes') return true;
  if (raw === 'false' || raw === '0' || raw === 'no') return false;
  throw settingError(settings, name, `${name} must be true or false, got "${String(raw)}"`);
}

export function text(settings: RawSettings, name: OptionName): string | undefined {
  const raw = settings[name];
  return raw === undefined ? undefined : String(raw);
}

export function list(settings: RawSettings, name: OptionName): string[] | undefined {
  const raw = settings[name];
  if (raw === undefined) return undefined;
  return Array.isArray(raw) ? raw.flatMap(splitList) : splitList(String(raw));
}
