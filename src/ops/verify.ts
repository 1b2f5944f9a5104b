/**
 * `redis-lock-proxy verify --via HOST:PORT [--rules PATH]... [--stalwart VERSION]... [--timeout-ms N]`
 *
 * Proves, through a running proxy, that each enforce-mode rule's keys get the fix: on a scratch
 * key the rule matches, a first lock attempt sets the expiry, and a second attempt (a "loser")
 * leaves the expiry where it was instead of re-arming it. The rules are the running proxy's, as
 * its admin endpoint lists them (`--admin`; verify-rules.ts), or verify's own where it cannot ask.
 * With `--stalwart VERSION` (a list for a mixed fleet) the rules are those releases', so the
 * scratch keys have their real key shapes, one per lock kind, and the proxy must enforce each;
 * releases without the bug are said to be so, and nothing is touched. Talks to HOST:PORT exactly as an application would (ioredis,
 * `multi().incrby().expire().exec()`), so it fails when the client is not really going through
 * the proxy, or the proxy does not load the rule in enforce mode, and says which it knows.
 *
 * The admin endpoint's rules are used only once it is known to be the same proxy as --via's: the
 * run names its connection with a nonce of its own, and the admin endpoint must say that it saw
 * that name pass (verify-connection.ts). When it did not, verify says the two are not the same
 * proxy and fails, rather than judge one proxy by another's rules or mode.
 *
 * Output: one line, `verify: OK: ...` (stdout, exit 0) or `verify: FAILED: ...` (stderr, exit 1);
 * usage errors exit 2. Nothing else unless `--verbose`, so it fits a readiness probe or CI step.
 *
 * Scratch keys are deleted afterwards (also on failure), and they carry a 60 s expiry from the
 * first attempt, so even a verify killed half-way leaves nothing behind for long. Their integer
 * fields are drawn from the top half of their range, where no real id or time lies. A rule whose
 * key has no variable part (Stalwart's migration core lock) has only the live lock as its key:
 * it is listed, never touched.
 *
 * This file is the command: its options and its one line of output. The rules it checks are
 * picked in verify-rules.ts (asked of the proxy in proxy-rules.ts), the check is in
 * verify-check.ts, the scratch keys in verify-scratch.ts.
 */
import { formatAddress, parseAddress, type Address } from '../address.js';
import { chooseRules, type RuleChoice } from '../config.js';
import { UsageError } from '../errors.js';
import { stalwartRelease } from '../rules/stalwart.js';
import { list, readCommandSettings } from '../settings.js';
import { nonEmpty, parseCommandLine, type FlagTable, integerOption, usageFailed, type Io } from './command.js';
import { newVerifyNonce, verifyClientName } from '../verify-connection.js';
import { adminAddress, askProxyRules, confirmSameProxy, type ProxyRules } from './proxy-rules.js';
import { checkAnswers, verifyRules, type ProxyEndpoint } from './verify-check.js';
import { selectRules, type RuleSelection } from './verify-rules.js';
import { PROBE_ACL } from './verify-scratch.js';

export const VERIFY_USAGE = `Usage: redis-lock-proxy verify --via HOST:PORT [options]

Proves that a running redis-lock-proxy applies the fix for every enforce-mode
rule: on a scratch key each rule matches, a second lock attempt
(MULTI / INCRBY / EXPIRE / EXEC) must not re-arm the expiry the first one set.
The rules are the running proxy's, as its admin endpoint lists them (GET
/rules); where it cannot be asked, verify's own (--rules, --stalwart).
Prints one line; exit 0 when every enforce rule holds, 1 when one does not
or HOST:PORT does not answer, 2 for bad options. Usable as a readiness probe
or CI check. For a Stalwart release without the bug there is nothing to
verify: it then only checks that HOST:PORT answers PING.

Options:
  --via HOST:PORT       the proxy to test, as applications reach it (required)
  --admin HOST:PORT     the proxy's admin endpoint, asked for the rules it runs,
                        or "off" [default: REDIS_LOCK_PROXY_ADMIN_LISTEN as the
                        proxy reads it, a wildcard address on --via's host;
                        else --via's host, port 9180]
  --rules PATH          rule file or directory, as given to the proxy; repeatable
                        [REDIS_LOCK_PROXY_RULES, comma-separated]
                        (default: the shipped rules, every affected Stalwart
                        release)
  --stalwart VERSION    verify with the lock kinds of these Stalwart releases,
                        e.g. 0.15.3,0.16.9 (repeatable or comma-separated), on
                        their real key shapes; says so when none has the bug
                        [REDIS_LOCK_PROXY_STALWART]
  --timeout-ms N        give up after N ms in all (default 5000)
  --user NAME           AUTH user, if the Redis behind the proxy wants one from
                        the client [REDIS_LOCK_PROXY_VERIFY_USER]; it needs the
                        lock block's commands and, for verify's own probe,
                        ${PROBE_ACL}
  --password PASSWORD   AUTH password [REDIS_LOCK_PROXY_VERIFY_PASSWORD]
  --verbose             print each step
  -h, --help            show this help
`;

const DEFAULT_TIMEOUT_MS = 5000;

interface VerifyOptions extends ProxyEndpoint {
  /** This run's nonce, in its connection's name. */
  nonce: string;
  rules: RuleChoice;
  /** Whether the rules were asked for (the --rules flag, or --stalwart), rather than the proxy's to be learnt. */
  scoped: boolean;
  /** The proxy's admin endpoint, or null: not to be asked. */
  admin: Address | null;
  /** --stalwart names a release without the bug: why, and nothing is verified. */
  notAffected: string | undefined;
  verbose: boolean;
}

export async function run(argv: string[], io: Io): Promise<number> {
  let options: VerifyOptions | 'help';
  try {
    options = parseOptions(argv, io.env);
  } catch (error) {
    return usageFailed(io, 'verify', error);
  }
  if (options === 'help') {
    io.stdout(VERIFY_USAGE);
    return 0;
  }
  const verbose = options.verbose ? (line: string) => io.stdout(`verify: ${line}\n`) : () => {};
  if (options.notAffected !== undefined) {
    // Nothing to verify, but the address must still be a Redis or a redis-lock-proxy that answers.
    const answer = await checkAnswers(options, verbose);
    if (answer.kind === 'failed') {
      io.stderr(`verify: FAILED: ${answer.message}\n`);
      return 1;
    }
    io.stdout(`verify: OK: ${options.notAffected}; nothing to verify (${options.viaText} answers)\n`);
    return 0;
  }

  const started = Date.now();
  const remaining = () => Math.max(1, options.timeoutMs - (Date.now() - started));
  let proxyRules = await askProxyRules(options.admin, options.timeoutMs);
  // A proxy without rules passes every byte on unread, its connection's name included: it has
  // nothing to verify, and says so whichever proxy it is.
  if (proxyRules.kind === 'known' && proxyRules.view.rules.length > 0) {
    // Before judging --via by these rules: its proxy must be the admin endpoint's. This run's
    // connection name goes through --via first, then the admin endpoint is asked whether it saw it.
    const answered = await checkAnswers({ ...options, timeoutMs: remaining() }, verbose);
    if (answered.kind === 'failed') {
      io.stderr(`verify: FAILED: ${answered.message}\n`);
      return 1;
    }
    proxyRules = await confirmSameProxy(proxyRules, options.nonce, remaining());
  }
  if (proxyRules.kind === 'known')
    verbose(`the proxy's rules, from its admin endpoint ${proxyRules.where} (instance ${proxyRules.view.instance})`);
  else if (proxyRules.kind === 'unknown') verbose(`verify's own rules: cannot ask the proxy for its own, ${proxyRules.reason}`);
  else {
    // Another proxy's rules and mode say nothing of the one at --via: nothing is judged, or touched.
    io.stderr(`verify: FAILED: ${notSameProxy(options.viaText, proxyRules.where)}\n`);
    return 1;
  }
  let selection: RuleSelection;
  try {
    selection = selectRules(options.rules, options.scoped, proxyRules);
  } catch (error) {
    return usageFailed(io, 'verify', error);
  }
  if (selection.failure !== undefined) {
    io.stderr(`verify: FAILED: ${selection.failure}\n`);
    return 1;
  }

  const { enforce, observe, untouched } = selection;
  const where = options.viaText;
  if (enforce.length === 0) {
    const files = selection.from ?? selection.rules.files.join(', ');
    io.stderr(
      `verify: FAILED: no enforce-mode rule to verify in ${files}` +
        (observe.length > 0 ? ` (observe only: ${observe.join(', ')})` : '') +
        '\n',
    );
    return 1;
  }

  const outcome = await verifyRules(options, selection.rules, enforce, selection.rearmed(where), remaining(), verbose);
  if (outcome.kind === 'ok') {
    for (const rule of observe) verbose(`rule ${rule}: observe (not verified)`);
    for (const rule of untouched) verbose(`rule ${rule.name}: its only key is a live lock (not touched)`);
    const observed = observe.length > 0 ? `; observe (not verified): ${observe.join(', ')}` : '';
    const fixed = untouched.length > 0 ? `; fixed key, not touched: ${untouched.map((r) => r.name).join(', ')}` : '';
    io.stdout(
      `verify: OK: ${enforce.length} rule(s) enforce the fix through ${where}` +
        `${selection.releases === '' ? '' : ` for ${selection.releases}`} (${enforce.map((r) => r.name).join(', ')})${observed}${fixed}` +
        `; ${rulesSource(proxyRules)}\n`,
    );
    return 0;
  }
  io.stderr(`verify: FAILED: ${outcome.message}\n`);
  return 1;
}

/** Where the rules verified came from, for the OK line. */
function rulesSource(proxy: Exclude<ProxyRules, { kind: 'elsewhere' }>): string {
  if (proxy.kind === 'known') return `the proxy's rules, from its admin endpoint ${proxy.where}`;
  return `verify's own rules, as it could not ask the proxy for its own: ${proxy.reason}`;
}

/** The failure when the admin endpoint at `admin` is not the proxy at `via`. */
function notSameProxy(via: string, admin: string): string {
  return (
    `${via} and the admin endpoint ${admin} are not the same proxy: the proxy at ${admin} did not see this run's connection, ` +
    `which went through ${via}; ${via} is another redis-lock-proxy, or no proxy at all (Redis itself?); verify does not ` +
    `judge it by another proxy's rules or mode: give --admin the admin endpoint of the proxy at ${via} (its --admin-listen)`
  );
}

/** The flags of `verify`. */
export const VERIFY_FLAGS = {
  via: { type: 'string' },
  admin: { type: 'string' },
  rules: { type: 'string', multiple: true },
  stalwart: { type: 'string', multiple: true },
  'timeout-ms': { type: 'string' },
  user: { type: 'string' },
  password: { type: 'string' },
  verbose: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} satisfies FlagTable;

function parseOptions(argv: string[], env: NodeJS.ProcessEnv): VerifyOptions | 'help' {
  const { values } = parseCommandLine({
    args: argv,
    strict: true,
    allowPositionals: false,
    options: VERIFY_FLAGS,
  });
  if (values.help) return 'help';
  if (values.via === undefined) throw new UsageError('--via HOST:PORT is required (see --help)');
  const via = parseAddress(values.via, '--via address');
  if (via.port === 0) throw new UsageError(`--via ${values.via}: port 0 is not a port to connect to`);

  const timeoutMs = integerOption('--timeout-ms', values['timeout-ms'] ?? String(DEFAULT_TIMEOUT_MS));
  const username = values.user ?? nonEmpty(env.REDIS_LOCK_PROXY_VERIFY_USER);
  const password = values.password ?? nonEmpty(env.REDIS_LOCK_PROXY_VERIFY_PASSWORD);
  if (username !== undefined && password === undefined) {
    throw new UsageError('--user needs --password (or REDIS_LOCK_PROXY_VERIFY_PASSWORD)');
  }
  const settings = readCommandSettings(['rules', 'stalwart'], values, env);
  const stalwart = list(settings, 'stalwart') ?? [];
  // Only releases without the bug: nothing to verify (said, not refused). A list with an affected
  // release, or with a mistake in it, is chooseRules' to read and to refuse.
  const releases = stalwart.map(stalwartRelease);
  const notAffected =
    releases.length > 0 && releases.every((release) => release.kind === 'not-affected')
      ? releases.map((release) => (release as { reason: string }).reason).join('; ')
      : undefined;
  const nonce = newVerifyNonce();
  return {
    nonce,
    clientName: verifyClientName(nonce),
    via,
    viaText: formatAddress(via.host, via.port),
    rules: notAffected !== undefined ? { paths: [], release: undefined } : chooseRules(settings),
    scoped: values.rules !== undefined || stalwart.length > 0,
    admin: adminAddress(values.admin, env, via),
    notAffected,
    timeoutMs,
    username,
    password,
    verbose: values.verbose ?? false,
  };
}
