/**
 * One local `redis-server` process for tests, whatever it is for: a plain
 * Redis (redis.ts), a sentinel (sentinel.ts), a cluster node (cluster.ts).
 * The callers say which arguments it gets; this module does the rest the same
 * way for all of them:
 *
 * - a free port, and a port taken between picking and binding it
 *   (EADDRINUSE) retried with another;
 * - a throwaway working directory of its own;
 * - ready once it answers PING (over TLS, after AUTH, when asked) as itself:
 *   INFO's process_id must be its pid, so another test's server on a
 *   recycled port is never mistaken for it;
 * - its output kept, capped;
 * - killed should the test process end without stopping it;
 * - stop(): SIGTERM, SIGKILL after a grace period, directory removed.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants as fsConstants, rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { freePort } from './ports.js';

export const HOST = '127.0.0.1';

/** How a connection reaches a server: over TLS trusting `ca`, and with AUTH `password`. */
export interface ServerAccess {
  tls?: { ca: Buffer };
  password?: string;
}

export interface ServerProcessOptions extends ServerAccess {
  /** What errors call it: `redis-server`, `sentinel 2`, `cluster node`. */
  name: string;
  /**
   * The `redis-server` arguments for listening on `port` with `dir` (empty,
   * its own) as working directory. Called again for each port tried.
   */
  args(port: number, dir: string): string[] | Promise<string[]>;
  /** Picks the port to try; default freePort(). */
  pickPort?: () => Promise<number>;
  /** Cap on the output kept, so a chatty --loglevel cannot eat memory; default 1,000,000 characters. */
  maxLogChars?: number;
}

export interface ServerProcess {
  readonly host: typeof HOST;
  readonly port: number;
  /** Everything it printed so far (the last maxLogChars of it). */
  logs(): string;
  /** Stops it and removes its directory; safe to call twice. */
  stop(): Promise<void>;
}

/** From spawn to the first PONG; a redis-server takes milliseconds, a busy CI machine much longer. */
export const READY_TIMEOUT_MS = 10_000;
const POLL_INTERVAL_MS = 20;
/** Between SIGTERM and SIGKILL. */
const STOP_GRACE_MS = 3_000;
const MAX_PORT_ATTEMPTS = 5;
const DEFAULT_MAX_LOG_CHARS = 1_000_000;

/** Starts `redis-server` with `opts.args(port, dir)` and resolves once it answers as itself. */
export async function startServerProcess(opts: ServerProcessOptions): Promise<ServerProcess> {
  const binary = findOnPath('redis-server');
  let lastLogs = '';
  for (let attempt = 1; attempt <= MAX_PORT_ATTEMPTS; attempt++) {
    const port = await (opts.pickPort ?? freePort)();
    const server = await spawnServer(binary, port, opts);
    if (await waitUntilReady(server, opts)) return server.handle;
    lastLogs = server.handle.logs();
    await server.handle.stop();
    if (!/Address already in use|EADDRINUSE/i.test(lastLogs)) {
      throw new Error(`${opts.name} exited early (${server.exitDescription()}). Output:\n${lastLogs}`);
    }
  }
  throw new Error(`${opts.name} could not bind a free port in ${MAX_PORT_ATTEMPTS} attempts. Last output:\n${lastLogs}`);
}

/**
 * A client for one short exchange: it connects when asked, never retries or
 * queues, and reports every failure through connect() and its calls.
 */
export function shortLivedClient(server: { host: string; port: number } & ServerAccess, commandTimeout: number): Redis {
  const client = new Redis({
    host: server.host,
    port: server.port,
    password: server.password,
    tls: server.tls,
    lazyConnect: true,
    enableOfflineQueue: false,
    enableReadyCheck: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 1_000,
    commandTimeout,
  });
  client.on('error', () => {}); // surfaces through connect() and the calls
  return client;
}

/**
 * One probe: [AUTH], PING and, when `pid` is given, INFO server. True only for
 * PONG from the expected process; any failure means "not yet". QUIT at the
 * end, so the probe is gone from the server's CLIENT LIST before the caller
 * goes on.
 */
export async function answersPing(server: { host: string; port: number } & ServerAccess, pid?: number): Promise<boolean> {
  const client = shortLivedClient(server, 1_000);
  let answered = false;
  try {
    await client.connect();
    answered = (await client.call('PING')) === 'PONG';
    return answered && (pid === undefined || String(await client.call('INFO', 'server')).includes(`\r\nprocess_id:${pid}\r\n`));
  } catch {
    return false;
  } finally {
    // Something that never answered would not answer QUIT either.
    if (answered) await client.quit().catch(() => client.disconnect());
    else client.disconnect();
  }
}

// ---------------------------------------------------------------------------
// One process
// ---------------------------------------------------------------------------

interface Spawned {
  handle: ServerProcess;
  child: ChildProcess;
  hasExited(): boolean;
  exitDescription(): string;
}

async function spawnServer(binary: string, port: number, opts: ServerProcessOptions): Promise<Spawned> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'redis-test-'));
  const args = await Promise.resolve(opts.args(port, dir)).catch(async (err: unknown) => {
    await rm(dir, { recursive: true, force: true });
    throw err;
  });
  const child = spawn(binary, args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  trackForExitCleanup(child, dir);

  const maxLogChars = opts.maxLogChars ?? DEFAULT_MAX_LOG_CHARS;
  let output = '';
  const capture = (chunk: Buffer) => {
    output = (output + chunk.toString('utf8')).slice(-maxLogChars);
  };
  child.stdout?.on('data', capture);
  child.stderr?.on('data', capture);

  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  const exited = new Promise<void>((resolve) => {
    child.once('exit', (code, signal) => {
      exit = { code, signal };
      resolve();
    });
    // spawn failures (EACCES, ENOENT) arrive as 'error' without 'exit'.
    child.once('error', (err) => {
      output += `\n[spawn error] ${err.message}\n`;
      exit ??= { code: null, signal: null };
      resolve();
    });
  });
  const hasExited = () => exit !== undefined;

  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      if (!hasExited()) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
        await exited;
        clearTimeout(timer);
      }
      untrack(child);
      await rm(dir, { recursive: true, force: true });
    })());

  return {
    child,
    hasExited,
    exitDescription: () => (exit?.signal ? `signal ${exit.signal}` : `code ${exit?.code}`),
    handle: { host: HOST, port, logs: () => output, stop },
  };
}

/** True once it answers as itself; false if it exited first. Throws (having stopped it) on timeout. */
async function waitUntilReady(server: Spawned, opts: ServerProcessOptions): Promise<boolean> {
  const { port } = server.handle;
  const target = { host: HOST, port, tls: opts.tls, password: opts.password };
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (server.hasExited()) return false;
    // No pid: spawn failed, and its 'error' event is on the way.
    const pid = server.child.pid;
    if (pid !== undefined && (await answersPing(target, pid))) {
      // It may have died between the probe and now.
      return !server.hasExited();
    }
    await sleep(POLL_INTERVAL_MS);
  }
  const logs = server.handle.logs();
  await server.handle.stop();
  throw new Error(`${opts.name} on port ${port} did not answer PING within ${READY_TIMEOUT_MS} ms. Output:\n${logs}`);
}

function findOnPath(name: string): string {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (!dir) continue;
    const candidate = path.join(dir, name);
    try {
      accessSync(candidate, fsConstants.X_OK);
      return candidate;
    } catch {
      // not here; keep looking
    }
  }
  throw new Error(
    `${name} not found on PATH. Install it (Debian/Ubuntu: \`apt-get install redis-server\`), ` +
      'or set REDIS_TEST_IMAGE to run Redis in a container.',
  );
}

// ---------------------------------------------------------------------------
// Exit cleanup
// ---------------------------------------------------------------------------

// If a test file ends without calling stop(), its redis-servers must not
// outlive the worker. Vitest ends fork workers with SIGTERM, which skips
// 'exit' handlers, so the common termination signals are covered too.
const live = new Map<ChildProcess, string>();
let exitHooksInstalled = false;

/** Kills `child` and removes `dir` should the test process end without stopping it. */
function trackForExitCleanup(child: ChildProcess, dir: string): void {
  live.set(child, dir);
  if (exitHooksInstalled) return;
  exitHooksInstalled = true;
  process.once('exit', killAllLive);
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
    process.once(signal, () => {
      killAllLive();
      // Our listener replaced the default action; with it gone, re-raising
      // the signal terminates the process the way it would have anyway.
      process.kill(process.pid, signal);
    });
  }
}

function untrack(child: ChildProcess): void {
  live.delete(child);
}

/** Synchronous, because it also runs from the 'exit' event. */
function killAllLive(): void {
  for (const [child, dir] of live) {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
  live.clear();
}
