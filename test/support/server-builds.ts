/**
 * Redis source trees that .ci/redis-servers.sh fetched (Debian's source
 * packages, upstream tarballs unpacked) and, where a line has no Debian
 * binary on this machine, built: the server lines the tests and Redis's own
 * suite run against besides the local `redis-server`.
 *
 * Whether they must be there is REDIS_SERVERS's to say, as CONTAINER_TESTS
 * says it for images:
 * - `auto` (the default): what is there runs; what is missing is skipped,
 *   with the reason;
 * - `required` (CI): a missing tree fails the run;
 * - `off`: none run.
 */
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export type ServerBuildsMode = 'auto' | 'required' | 'off';

/** REDIS_SERVERS, checked. */
export function serverBuildsMode(): ServerBuildsMode {
  const value = process.env.REDIS_SERVERS ?? 'auto';
  if (value === 'auto' || value === 'required' || value === 'off') return value;
  throw new Error(`REDIS_SERVERS=${value}: expected auto, required or off`);
}

/** Where .ci/redis-servers.sh puts the trees (its default, or REDIS_SERVERS_DIR). */
export function serverBuildsDir(): string {
  const cache = process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache');
  return process.env.REDIS_SERVERS_DIR || path.join(cache, 'redis-lock-proxy-test', 'servers');
}

export interface ServerTree {
  /** `redis-6.0.16`: also the directory's name. */
  name: string;
  /** The server's version, `6.0.16`. */
  version: string;
  /** The source tree: its suite is `tests/`, its own build (if any) `src/`. */
  dir: string;
  /** `src/redis-server` when the tree was built, else undefined. */
  builtServer: string | undefined;
}

/** The trees .ci/redis-servers.sh makes, in the order it makes them. */
export const SERVER_TREES = ['redis-7.0.15', 'redis-6.0.16'] as const;

/** The tree `name`, or why it is not there. */
export function serverTree(name: string): { tree: ServerTree; missing?: undefined } | { tree?: undefined; missing: string } {
  const dir = path.join(serverBuildsDir(), name);
  if (!existsSync(path.join(dir, 'tests', 'test_helper.tcl')))
    return { missing: `${name}: no source tree at ${dir} (run .ci/redis-servers.sh)` };
  const server = path.join(dir, 'src', 'redis-server');
  return {
    tree: { name, version: name.replace(/^[a-z]+-/, ''), dir, builtServer: existsSync(server) ? server : undefined },
  };
}
