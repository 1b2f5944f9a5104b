/**
 * Which way lock blocks go to a server, and why, in the words the start-up line, `check` and
 * /rules use: the --lock-method setting, and what the server said its version is (HELLO,
 * lock-method.ts).
 *
 * `--lock-method transaction` sends `EXPIRE ... NX`, which a server before Redis 7.0 refuses as a
 * wrong number of arguments: every lock block would come back `-EXECABORT`, no node could take any
 * lock, and nothing else would look wrong. So a start, and `check`, refuse it in front of such a
 * server, naming the server's version and the way that works there; a server found later to lack
 * NX (a failover to an older replica) gets the transaction-script way, as auto gives it, and an
 * error line.
 */
import { ConfigError } from '../errors.js';
import type { LockMethod, LockMethodSetting, ServerVersion } from './lock-method.js';

export interface MethodChoice {
  /** The way lock blocks go to this server; null while it is not known (auto, and the server did not say). */
  readonly way: LockMethod | null;
  /** Why, in a few words. */
  readonly why: string;
}

/**
 * The way for `setting` on the server that answered `version` (null: it did not answer).
 * @throws ConfigError for --lock-method transaction on a server without EXPIRE ... NX.
 */
export function chooseMethod(setting: LockMethodSetting, version: ServerVersion | null, upstream: string): MethodChoice {
  if (setting === 'script') return { way: 'script', why: '--lock-method script' };
  const given = setting === 'auto' ? 'auto' : '--lock-method transaction';
  if (version === null || version.method === null) {
    const silent = version === null ? 'did not answer' : `refused HELLO (${version.detail})`;
    return { way: null, why: `${given}; the upstream ${silent}: asked again by each connection` };
  }
  if (version.method === 'transaction') return { way: 'transaction', why: `${given}: ${version.detail} has EXPIRE ... NX` };
  if (setting === 'transaction') {
    throw new ConfigError(
      `--lock-method transaction needs EXPIRE ... NX (Redis 7.0 and later, Valkey), which the upstream ${upstream} has not ` +
        `(it answered HELLO: ${version.detail}): every lock block would be refused with EXECABORT. ` +
        'Use --lock-method auto, which takes the transaction-script way on this server',
    );
  }
  return {
    way: 'transaction-script',
    why: `auto: ${version.detail} has no EXPIRE ... NX (before Redis 7.0): the expiry as a script in the client's transaction`,
  };
}
