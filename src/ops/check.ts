/**
 * `redis-lock-proxy check [the proxy's options]`: everything a start would use, checked without
 * starting, as `haproxy -c` or `envoy --mode validate` do: the flags, the REDIS_LOCK_PROXY_*
 * variables, the config file (--config, or REDIS_LOCK_PROXY_CONFIG) and every rule file they
 * name. Run it with what the proxy is run with, before a restart or a reload: a rule file that
 * a reload refuses (the old rules stay) would stop the next start.
 *
 * Output: `check: OK: ...` on stdout and exit 0, with any warning a start would log on stderr;
 * or every problem, each on a line of its own on stderr (a config file's: file, line and key; a
 * rule file's: file, line, rule and field; every rule of every file is checked), and exit 2. It opens
 * no port. It asks the upstream one thing, where the URL names it (not behind --sentinel or
 * --cluster): its version (HELLO, which changes nothing), to say which way lock blocks take, and
 * to refuse --lock-method transaction in front of a server without EXPIRE ... NX, as a start does.
 * An upstream that does not answer is a warning: a port in use or a Redis that is down show only
 * at the start itself.
 */
import { formatAddress } from '../address.js';
import { buildConfig, chooseRules, type Config, type RuleChoice } from '../config.js';
import { problemsFrom } from '../errors.js';
import { loadRules, ruleProblems } from '../rules/loader.js';
import { releasesText } from '../rules/store.js';
import { effectiveMode } from '../rules/types.js';
import { overriddenFileSettings, readFlags, readSettingsAndProblems, type RawSettings } from '../settings.js';
import { HELLO, methodFromHello } from '../lock/lock-method.js';
import { chooseMethod } from '../lock/method-choice.js';
import { UpstreamConnector } from '../upstream/connect.js';
import { askHello } from '../upstream/probe.js';
import type { Io } from './command.js';

export const CHECK_USAGE = `Usage: redis-lock-proxy check [the proxy's options]

Checks everything a start of redis-lock-proxy would use, without starting it:
its flags, its REDIS_LOCK_PROXY_* environment variables, its config file
(--config FILE, or REDIS_LOCK_PROXY_CONFIG) and every rule file these name.
Give it the same options and environment as the proxy. Prints one line,
"check: OK: ..." (exit 0), or every problem on a line of its own, naming the
file, the line and the key, or the file, the line, the rule and the field
(exit 2).
It opens no port. It asks the upstream its version (HELLO, which changes
nothing) where the URL names it, to say which way lock blocks take there,
and refuses --lock-method transaction in front of a server without
EXPIRE ... NX (before Redis 7.0), as a start does.

Use it before a restart or a reload (systemctl reload runs it first in the
example unit): a rule file that a reload refuses would stop the next start.

Options: those of the proxy (redis-lock-proxy --help), and
  -h, --help        show this help
`;

/** What a check found: its problems, and when there are none, what a start would run with. */
export interface CheckOutcome {
  readonly problems: readonly Error[];
  /** Set when there is no problem. */
  readonly ready?: { config: Config; summary: string; warnings: string[] };
}

export async function run(argv: string[], io: Io): Promise<number> {
  const outcome = checkConfiguration(argv, io.env);
  if (outcome === 'help') {
    io.stdout(CHECK_USAGE);
    return 0;
  }
  if (outcome.ready === undefined) {
    for (const problem of outcome.problems) io.stderr(`redis-lock-proxy check: ${indented(problem.message)}\n`);
    const count = outcome.problems.length;
    io.stderr(`redis-lock-proxy check: ${count} problem${count === 1 ? '' : 's'}: the proxy would not start with this configuration\n`);
    return 2;
  }
  const { config } = outcome.ready;
  let method: string;
  try {
    method = await lockMethodOf(config);
  } catch (err) {
    io.stderr(`redis-lock-proxy check: ${(err as Error).message}\n`);
    io.stderr('redis-lock-proxy check: 1 problem: the proxy would not start with this configuration\n');
    return 2;
  }
  for (const warning of outcome.ready.warnings) io.stderr(`redis-lock-proxy check: warning: ${warning}\n`);
  io.stdout(`check: OK: ${outcome.ready.summary}, lock method ${method}\n`);
  return 0;
}

/**
 * Which way lock blocks take, and why, asking a plain upstream its version.
 * @throws ConfigError for --lock-method transaction in front of a server without EXPIRE ... NX.
 */
async function lockMethodOf(config: Config): Promise<string> {
  const setting = config.lockMethod;
  if (setting === 'script' || config.sentinel !== null || config.cluster !== null) {
    return setting === 'script'
      ? 'script (--lock-method script)'
      : `${setting} (the server behind --sentinel or --cluster is asked at the start)`;
  }
  const upstream = new UpstreamConnector(config.upstream, config.upstreamTls);
  const answer = await askHello(upstream, HELLO, Math.min(config.connectTimeoutMs, 3000));
  const choice = chooseMethod(setting, answer === null ? null : methodFromHello(answer.reply), upstream.describe());
  return `${choice.way ?? setting} (${choice.why})`;
}

/** Checks the proxy's options `argv` and the environment `env` as a start reads them. */
export function checkConfiguration(argv: string[], env: NodeJS.ProcessEnv): CheckOutcome | 'help' {
  let flags: Record<string, unknown> = {};
  const unread = problemsFrom([() => (flags = readFlags(argv))]);
  if (unread.length > 0) return { problems: unread };
  if (flags.help) return 'help';
  const notForCheck = ['version', 'print-config'].filter((flag) => flags[flag] === true);
  if (notForCheck.length > 0) {
    return { problems: [new Error(`check takes the proxy's settings; --${notForCheck[0]} is not one (see check --help)`)] };
  }
  const { settings, problems } = readSettingsAndProblems(flags, env);
  let config: Config | undefined;
  problems.push(...problemsFrom([() => (config = buildConfig(settings))]));
  // The rule files the settings name, whether or not the other settings hold (a wrong `rules` or
  // `stalwart` is named above).
  let rules: RuleChoice | undefined;
  problemsFrom([() => (rules = chooseRules(settings))]);
  if (rules !== undefined) problems.push(...ruleProblems(rules.paths, rules.release));
  if (problems.length > 0 || config === undefined) return { problems };
  return { problems, ready: { config, summary: summary(config), warnings: warnings(config, settings) } };
}

/** What a start would run with, in a line: addresses, mode, and the rules with what they are for. */
function summary(config: Config): string {
  const rules = loadRules(config.rulePaths, config.release);
  const enforcing = rules.rules.filter((rule) => effectiveMode(rule, config.mode) === 'enforce').length;
  const releases = releasesText(rules);
  return [
    `listen ${formatAddress(config.listen.host, config.listen.port)}`,
    `upstream ${(config.cluster?.seeds ?? [config.upstream]).map((seed) => seed.display).join(',')}`,
    `admin ${config.adminListen === null ? 'off' : formatAddress(config.adminListen.host, config.adminListen.port)}`,
    `mode ${config.mode}`,
    `${rules.rules.length} rule(s) (${enforcing} enforce, ${rules.rules.length - enforcing} observe) ` +
      `from ${rules.files.length} file(s)${releases === '' ? '' : ` for ${releases}`}`,
  ].join(', ');
}

/** What a start would warn about: settings no longer used, and config file values that a flag or a variable overrides. */
function warnings(config: Config, settings: RawSettings): string[] {
  return [
    ...config.warnings,
    ...overriddenFileSettings(settings).map(
      (o) => `${o.file} does not apply: ${o.by} gives the value in force (config file settings come after flags and variables)`,
    ),
  ];
}

/** A message's first line as it is, the rest (YAML's quote of the line at fault) indented under it. */
function indented(message: string): string {
  const [first, ...rest] = message.trimEnd().split('\n');
  return [first, ...rest.filter((line) => line.trim() !== '').map((line) => `    ${line}`)].join('\n');
}
