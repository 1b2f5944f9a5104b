/**
 * `verify`: the running proxy's rules, asked of its admin endpoint (`GET /rules`), so that verify
 * checks what the proxy runs (its --stalwart, --rules and --mode) rather than guessing it. Where
 * it cannot ask (the admin server is off, elsewhere, or does not answer), it says why, so that a
 * failure can say what verify could not know instead of blaming the traffic.
 *
 * The rules are the proxy's at --via only when the admin endpoint's proxy saw verify's connection
 * through --via (confirmSameProxy): two proxies on one host each have an admin endpoint, and the
 * default address may well be the other's.
 */
import { formatAddress, parseAddress, type Address } from '../address.js';
import { readRulesView, type RulesView } from '../admin/rules-view.js';
import { UsageError } from '../errors.js';
import { OPTIONS, readCommandSettings, text } from '../settings.js';

export type ProxyRules =
  | { readonly kind: 'known'; readonly view: RulesView; readonly where: string }
  | { readonly kind: 'unknown'; readonly reason: string }
  /** The admin endpoint at `where` answered, but its proxy did not see this run's connection through --via. */
  | { readonly kind: 'elsewhere'; readonly where: string };

type KnownRules = Extract<ProxyRules, { kind: 'known' }>;

/** Hosts that mean "every address": asked where the proxy is, --via's host. */
const WILDCARD_HOSTS = new Set(['0.0.0.0', '::', '']);

/**
 * Where to ask: `--admin HOST:PORT` (or `off`), else the proxy's own admin-listen setting as its
 * variable gives it (a wildcard address asked on --via's host), else the proxy's default port on
 * --via's host. Null: not to be asked.
 */
export function adminAddress(option: string | undefined, env: NodeJS.ProcessEnv, via: Address): Address | null {
  if (option !== undefined) {
    if (option === 'off') return null;
    const address = parseAddress(option, '--admin address');
    if (address.port === 0) throw new UsageError(`--admin ${option}: port 0 is not a port to connect to`);
    return address;
  }
  const setting = text(readCommandSettings(['admin-listen'], {}, env), 'admin-listen');
  if (setting === 'off') return null;
  if (setting === undefined || setting === OPTIONS['admin-listen'].default) {
    // The proxy's default, loopback: on the host --via names, since that is where the proxy is.
    return { host: via.host, port: parseAddress(OPTIONS['admin-listen'].default).port };
  }
  const address = parseAddress(setting, 'REDIS_LOCK_PROXY_ADMIN_LISTEN address');
  return WILDCARD_HOSTS.has(address.host) ? { host: via.host, port: address.port } : address;
}

/** Asks the admin endpoint at `admin` for the rules in force, within `timeoutMs`. */
export async function askProxyRules(admin: Address | null, timeoutMs: number): Promise<ProxyRules> {
  if (admin === null) return { kind: 'unknown', reason: 'the admin endpoint is off (--admin off, or REDIS_LOCK_PROXY_ADMIN_LISTEN=off)' };
  const where = formatAddress(admin.host, admin.port);
  let response: Response;
  try {
    response = await fetch(`http://${where}/rules`, { signal: AbortSignal.timeout(timeoutMs) });
  } catch (error) {
    return { kind: 'unknown', reason: `its admin endpoint ${where} did not answer (${fetchFailure(error)})` };
  }
  if (response.status !== 200) {
    await response.body?.cancel();
    return {
      kind: 'unknown',
      reason: `${where} answered /rules with HTTP ${response.status}: not the admin endpoint of a redis-lock-proxy that lists its rules`,
    };
  }
  try {
    return { kind: 'known', view: readRulesView(await response.json()), where };
  } catch (error) {
    return { kind: 'unknown', reason: `${where}/rules: ${(error as Error).message}` };
  }
}

/**
 * Whether the proxy that listed `known` is the one this run's connection went through: its admin
 * endpoint is asked whether it saw the connection named with `nonce` (GET /verify/<nonce>, see
 * verify-connection.ts). Its rules stay known only if it did; a 404 means another proxy (or none)
 * is at --via; an endpoint that cannot say leaves them unknown.
 */
export async function confirmSameProxy(known: KnownRules, nonce: string, timeoutMs: number): Promise<ProxyRules> {
  const { where } = known;
  const cannotSay = (why: string): ProxyRules => ({
    kind: 'unknown',
    reason: `its admin endpoint ${where} did not say whether this run's connection came through it (${why})`,
  });
  let response: Response;
  try {
    response = await fetch(`http://${where}/verify/${nonce}`, { signal: AbortSignal.timeout(timeoutMs) });
  } catch (error) {
    return cannotSay(fetchFailure(error));
  }
  if (response.status !== 200) {
    await response.body?.cancel();
    return response.status === 404 ? { kind: 'elsewhere', where } : cannotSay(`HTTP ${response.status}`);
  }
  let instance: unknown;
  try {
    instance = ((await response.json()) as { instance?: unknown } | null)?.instance;
  } catch (error) {
    return cannotSay((error as Error).message);
  }
  if (instance !== known.view.instance) {
    return cannotSay(`it answered as instance ${String(instance)}, its rules as ${known.view.instance}: restarted in between?`);
  }
  return known;
}

/** Why a request to the admin endpoint got no answer: the network's cause, not fetch's "fetch failed". */
function fetchFailure(error: unknown): string {
  return (error as Error & { cause?: Error }).cause?.message ?? (error as Error).message;
}
