/**
 * The vitest projects that run the suite's version-dependent tests against a server line built
 * from source (.ci/redis-servers.sh, found by server-builds.ts), as the per-image projects of
 * test/containers/support/plan.ts do against images: `redis-6.0`, the line before 7.0, which
 * has no `EXPIRE ... NX`, so that `--lock-method auto` takes the transaction-script way there.
 *
 * A project puts the tree's `src/` (its redis-server and redis-cli) first on the PATH of its
 * test processes, so that every server a test starts is of that line; server-line-setup.ts
 * checks, in each of them, that it is. REDIS_SERVERS decides what a missing tree means:
 * - `auto`: the project is left out, and the run's first lines say why;
 * - `required`: the project runs one test (server-line-missing.check.ts), which fails naming
 *   what is missing;
 * - `off`: the project is left out.
 */
import path from 'node:path';
import { serverBuildsMode, serverTree } from './server-builds.js';

/**
 * The test files a server line runs, each with why: the tests whose outcome depends on the lock
 * method (auto takes the script way before 7.0), on the server's version or on its ACLs. They
 * compare what comes through the proxy with the same server's own replies, and ask the server
 * what it can do (server-facts.ts) where a part cannot exist before 7.0 (or 6.2).
 *
 * Left out, as they test nothing the line changes, or what it cannot run: Sentinel (a 6.0
 * sentinel has no `resolve-hostnames`, which the tests' sentinels are given; the proxy's
 * Sentinel logic does not depend on the server's version), TLS (the tree is built without it:
 * cluster-tls, tls-reload-shutdown-limits), cluster-endpoints (`cluster-announce-hostname` and
 * `cluster-preferred-endpoint-type` came in 7.0), and the files that test the proxy's own
 * process, admin server, installation or buffers rather than what it sends Redis.
 */
export const SERVER_LINE_TEST_FILES: ReadonlyArray<readonly [file: string, why: string]> = [
  ['test/lock.test.ts', "the script's branch without redis.acl_check_cmd, the only one it runs before 7.0"],
  [
    'test/e2e/lock-differential.test.ts',
    'the script way against Redis itself: users refused each command of the block, EVAL or PTTL; increment errors; OOM',
  ],
  [
    'test/e2e/lock-rewrite.test.ts',
    "auto's choice of the script way, in every key state, split writes, RESP3, ACL users, a READONLY replica",
  ],
  ['test/e2e/not-rearming.test.ts', 'keyspace events, WATCH and tracking as the script way leaves them'],
  [
    'test/e2e/integrity-stress.test.ts',
    'every byte right with auto (the script way here) and script, over TCP, a unix socket and a cluster',
  ],
  [
    'test/e2e/verify-and-locks.test.ts',
    'verify proves the fix through the proxy on this server; locks reads and deletes its keys (scripts, PTTL)',
  ],
  ['test/e2e/verify-and-locks-stalwart-releases.test.ts', 'verify and locks for every Stalwart line, on this server'],
  ['test/e2e/verify-proxy-rules.test.ts', "verify of the running proxy's rules, through the script way"],
  ['test/e2e/locks-release.test.ts', "locks --release: the conditional delete script (replicate_commands, TIME) on this server's Lua"],
  ['test/e2e/locks-evidence.test.ts', 'what locks and the lock scan call trouble, from locks the script way took'],
  ['test/e2e/locks-hostile-names.test.ts', 'locks on keys of any bytes, read from this server'],
  [
    'test/e2e/locks-scan-bounds.test.ts',
    "the lock scan's SCAN passes on this server (DEBUG POPULATE without enable-debug-command before 7.0)",
  ],
  ['test/e2e/lock-attempts-and-scan.test.ts', 'lock attempts counted in both shapes, and the admin lock scan, with the script way'],
  ['test/e2e/stalwart-incident.test.ts', 'the incident, fixed by the script way'],
  [
    'test/e2e/slow-clients.test.ts',
    "the bounds on Redis and the closes with slow clients, the script way's reply among them, against this server's own bytes",
  ],
  ['test/e2e/stalwart-releases.test.ts', "every Stalwart line's exact blocks through auto (the script way here)"],
  ['test/e2e/removal-signal.test.ts', 'the "can the proxy go?" signal from blocks the script way fixed and SET NX EX'],
  ['test/e2e/passthrough.test.ts', 'ACL users in the upstream URL, CLIENT TRACKING and MONITOR around the script, RESET (none before 6.2)'],
  ['test/e2e/reply-counting.test.ts', 'RESET (none before 6.2), REPLCONF, and a transaction this server does or does not end on -BUSY'],
  ['test/e2e/closed-sessions.test.ts', 'sessions freed whatever this server answers (RESET, HELLO)'],
  ['test/e2e/least-privilege.test.ts', "the README's least-privilege user for the script way"],
  ['test/e2e/lock-method-choice.test.ts', '--lock-method transaction refused, and the script way said, before EXPIRE ... NX'],
  [
    'test/e2e/fixed-transaction-replies.test.ts',
    "a fixed transaction's EXEC reply, streamed with the expiry script's elements cut and restored; WATCH ended by a refused EXEC",
  ],
  ['test/e2e/in-transaction.test.ts', 'nothing waits and typed blocks are fixed with the expiry script; users refused EVAL or EXPIRE'],
  ['test/e2e/transparency.test.ts', "this server's own replies, to commands it lacks too (GETDEL, RESET), byte for byte"],
  ['test/e2e/no-waiting.test.ts', "this server's own limits on unfinished and oversized requests"],
  ['test/e2e/ioredis-and-redis-cli.test.ts', "ioredis's and this line's redis-cli's traffic, lock blocks included"],
  ['test/e2e/readme-demo.test.ts', "the README's demo, fixed by the script way"],
  [
    'test/e2e/cluster-mode.test.ts',
    'a cluster of this line: nodes found with CLUSTER NODES (no SHARDS), the script way on every master, ACLs',
  ],
];

/** The server lines: a project name, the tree of .ci/redis-servers.sh it runs with. */
export const SERVER_LINES = [{ project: 'redis-6.0', tree: 'redis-6.0.16' }] as const;

/** What server-line-setup.ts and server-line-missing.check.ts are told. */
export const LINE_VERSION_ENV = 'REDIS_SERVER_LINE_VERSION';
export const LINE_MISSING_ENV = 'REDIS_SERVER_LINE_MISSING';

export interface ServerLineProject {
  name: string;
  include: string[];
  env: Record<string, string>;
  setupFiles: string[];
}

export interface ServerLinePlan {
  projects: ServerLineProject[];
  /** One line for the run's output: what runs, and why anything does not. */
  summary: string;
}

const SUPPORT = path.relative(path.resolve(import.meta.dirname, '../..'), import.meta.dirname);

/** Decided once per vitest process (it loads its config for each project), and said once. */
export function serverLinePlan(): ServerLinePlan {
  const memo = globalThis as { serverLinePlan?: ServerLinePlan };
  if (memo.serverLinePlan) return memo.serverLinePlan;
  const plan = decide();
  console.log(plan.summary);
  return (memo.serverLinePlan = plan);
}

function decide(): ServerLinePlan {
  const mode = serverBuildsMode();
  if (mode === 'off') return { projects: [], summary: 'server lines: off (REDIS_SERVERS=off)' };
  const projects: ServerLineProject[] = [];
  const running: string[] = [];
  const missing: string[] = [];
  for (const line of SERVER_LINES) {
    const found = serverTree(line.tree);
    const server = found.tree?.builtServer;
    if (found.tree && server) {
      projects.push({
        name: line.project,
        include: SERVER_LINE_TEST_FILES.map(([file]) => file),
        env: {
          PATH: `${path.dirname(server)}${path.delimiter}${process.env.PATH ?? ''}`,
          // Every server a test starts is this line's process, never an image's container.
          REDIS_TEST_IMAGE: '',
          [LINE_VERSION_ENV]: found.tree.version,
        },
        setupFiles: [path.join(SUPPORT, 'server-line-setup.ts')],
      });
      running.push(`${line.project} (${path.dirname(server)})`);
      continue;
    }
    const why =
      found.missing ?? `${line.tree}: the tree at ${found.tree?.dir} is not built: no src/redis-server (run .ci/redis-servers.sh)`;
    missing.push(`${line.project}: ${why}`);
    if (mode === 'required') {
      projects.push({
        name: line.project,
        include: [path.join(SUPPORT, 'server-line-missing.check.ts')],
        env: { [LINE_MISSING_ENV]: `REDIS_SERVERS=required, but ${why}` },
        setupFiles: [],
      });
    }
  }
  const runs = running.length ? `; the version-dependent tests also run against ${running.join(', ')}` : '';
  const verdict = mode === 'required' ? 'REQUIRED but missing' : 'skipped';
  const notRun = missing.length ? `; ${verdict}: ${missing.join('; ')}` : '';
  return { projects, summary: `server lines: REDIS_SERVERS=${mode}${runs}${notRun}` };
}
