/**
 * `verify`'s own connections. verify names its connection with CLIENT SETNAME, and the session
 * that carries it recognises the name: the lock blocks of such a connection are counted apart
 * (Stats.verify), so that a readiness probe running `verify` does not look like a node still
 * taking locks the old way. lock_attempts_total, blocks_total and the old-shape report count the
 * application's blocks only; verify_blocks_total counts verify's.
 */
import { Cmd, equalsIgnoreCase } from './resp/commands.js';
import type { RequestScanner } from './resp/request-scanner.js';
import type { Stats } from './stats.js';

/** The client name verify gives its connection. */
export const VERIFY_CLIENT_NAME = 'redis-lock-proxy-verify';

const NAME = Buffer.from(VERIFY_CLIENT_NAME);
const SETNAME = Buffer.from('setname');

/**
 * For the frame whose head the scanner holds: true when it is `CLIENT SETNAME
 * redis-lock-proxy-verify`, false when it is CLIENT SETNAME with another name (the connection
 * is renamed), undefined for any other frame.
 */
export function namesVerifyConnection(scanner: RequestScanner): boolean | undefined {
  if (scanner.cmd !== Cmd.Client || scanner.argc !== 3 || scanner.inline) return undefined;
  if (scanner.keyLength !== SETNAME.length || !equalsIgnoreCase(scanner.key, 0, SETNAME)) return undefined;
  return !scanner.oversize && scanner.valueLength === NAME.length && NAME.equals(scanner.value.subarray(0, NAME.length));
}

/**
 * One connection's view of the settings its lock blocks run with: the listener's own, read
 * through (a reload's changes included), except that the counters are Stats.verify while
 * `isVerify()` says the connection is verify's.
 */
export function countedApart<T extends { readonly stats: Stats }>(settings: T, isVerify: () => boolean): T {
  return Object.create(settings, {
    stats: { get: () => (isVerify() ? settings.stats.verify : settings.stats) },
  }) as T;
}
