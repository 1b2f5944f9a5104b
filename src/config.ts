/**
 * Settings from command-line flags and REDIS_LOCK_PROXY_* environment
 * variables (flags win), validated into one Config.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { ConfigError, parseUpstreamUrl, type UpstreamTarget } from './upstream/target.js';

export interface ListenAddress {
  readonly host: string;
  readonly port: number;
}

export interface Config {
  readonly listen: ListenAddress;
  readonly upstream: UpstreamTarget;
  readonly rulePaths: readonly string[];
  readonly holdMs: number;
  readonly connectTimeoutMs: number;
  readonly logLevel: string;
}

/** The rules shipped with the package (rules/ next to src/ and dist/). */
export const DEFAULT_RULES_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'rules');

export const DEFAULTS = {
  listen: '127.0.0.1:6380',
  upstream: 'redis://127.0.0.1:6379',
  holdMs: 10,
  connectTimeoutMs: 5000,
  logLevel: 'info',
} as const;

export const USAGE = `Usage: redis-lock-proxy [options]

A transparent Redis proxy that makes lock transactions
(MULTI / INCR|INCRBY / EXPIRE|PEXPIRE / EXEC) on keys named by rules apply
their expiry only when the lock is created.

Options (environment variable in brackets; flags win):
  --listen HOST:PORT        address to accept clients on
                            [REDIS_LOCK_PROXY_LISTEN] (default ${DEFAULTS.listen})
  --upstream URL            Redis to forward to: redis://[[user]:pass@]host[:port][/db]
                            or unix:///path/redis.sock[?db=N]
                            [REDIS_LOCK_PROXY_UPSTREAM] (default ${DEFAULTS.upstream})
  --rules PATH              rule file or directory of *.yaml files; repeatable
                            [REDIS_LOCK_PROXY_RULES, comma-separated]
                            (default: the rules/ directory shipped with the proxy)
  --hold-ms N               how long an incomplete MULTI block is held after the
                            client's last byte before it is forwarded unchanged
                            [REDIS_LOCK_PROXY_HOLD_MS] (default ${DEFAULTS.holdMs})
  --connect-timeout-ms N    upstream connect timeout
                            [REDIS_LOCK_PROXY_CONNECT_TIMEOUT_MS] (default ${DEFAULTS.connectTimeoutMs})
  --log-level LEVEL         fatal|error|warn|info|debug|trace|silent
                            [REDIS_LOCK_PROXY_LOG_LEVEL] (default ${DEFAULTS.logLevel})
  -h, --help                show this help
  -v, --version             show the version
`;

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

export function parseListen(text: string): ListenAddress {
  const match = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(text) ?? /^()()(\d+)$/.exec(text);
  const port = match ? Number(match[3]) : NaN;
  if (!match || !(port >= 0 && port <= 65535)) {
    throw new ConfigError(`listen address "${text}" is not HOST:PORT (for example 127.0.0.1:6380 or [::1]:6380)`);
  }
  const host = match[1] ?? match[2];
  return { host: host === '' ? '127.0.0.1' : host, port };
}

function parseInteger(text: string, name: string, min: number, max: number): number {
  if (!/^\d+$/.test(text) || Number(text) < min || Number(text) > max) {
    throw new ConfigError(`${name} must be an integer from ${min} to ${max}, got "${text}"`);
  }
  return Number(text);
}

export type CliRequest = { kind: 'run'; config: Config } | { kind: 'help' } | { kind: 'version' };

export function resolveConfig(argv: string[], env: NodeJS.ProcessEnv): CliRequest {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        listen: { type: 'string' },
        upstream: { type: 'string' },
        rules: { type: 'string', multiple: true },
        'hold-ms': { type: 'string' },
        'connect-timeout-ms': { type: 'string' },
        'log-level': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
        version: { type: 'boolean', short: 'v' },
      },
    }));
  } catch (err) {
    throw new ConfigError(`${(err as Error).message} (see --help)`);
  }
  if (values.help) return { kind: 'help' };
  if (values.version) return { kind: 'version' };

  const envRules = env.REDIS_LOCK_PROXY_RULES?.split(',').map((p) => p.trim()).filter((p) => p !== '');
  const logLevel = values['log-level'] ?? env.REDIS_LOCK_PROXY_LOG_LEVEL ?? DEFAULTS.logLevel;
  if (!LOG_LEVELS.includes(logLevel)) throw new ConfigError(`log level must be one of ${LOG_LEVELS.join(', ')}, got "${logLevel}"`);

  const config: Config = {
    listen: parseListen(values.listen ?? env.REDIS_LOCK_PROXY_LISTEN ?? DEFAULTS.listen),
    upstream: parseUpstreamUrl(values.upstream ?? env.REDIS_LOCK_PROXY_UPSTREAM ?? DEFAULTS.upstream),
    rulePaths: values.rules ?? (envRules && envRules.length > 0 ? envRules : [DEFAULT_RULES_DIR]),
    holdMs: parseInteger(values['hold-ms'] ?? env.REDIS_LOCK_PROXY_HOLD_MS ?? String(DEFAULTS.holdMs), 'hold-ms', 1, 60_000),
    connectTimeoutMs: parseInteger(
      values['connect-timeout-ms'] ?? env.REDIS_LOCK_PROXY_CONNECT_TIMEOUT_MS ?? String(DEFAULTS.connectTimeoutMs),
      'connect-timeout-ms',
      1,
      600_000,
    ),
    logLevel,
  };
  return { kind: 'run', config };
}
