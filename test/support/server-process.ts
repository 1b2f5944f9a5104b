/**
 * One local `redis-server` process for tests, whatever it is for: a plain
 * Redis (redis.ts), a sentinel (sentinel.ts), a cluster node (cluster.ts).
 * The callers say which arguments it gets; this module does the rest the same
 * way for all of them:
 *
 * - the local `redis-server` binary, or with REDIS_TEST_IMAGE set a container
 *   of that image on the host's network (server-container.ts);
 * - a free port, and a port taken between picking and binding it
 *   (EADDRINUSE) retried with another;
 * - a throwaway working directory of its own;
 * - ready once it answers PING (over TLS, after AUTH, when asked) as itself:
 *   INFO's process_id must be its pid (a container's server: its working
 *   directory must be this one), so another test's server on a recycled port
 *   is never mistaken for it;
 * - its output kept, capped;
 * - killed should the test process end without stopping it;
 * - stop(): SIGTERM, SIGKILL after a grace period, directory removed.
 */
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { findOnPath } from './find-on-path.js';
import { freePort } from './ports.js';
import { startServerContainer } from './server-container.js';

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
/** The same for a container, which a busy engine may take seconds to start. */
const CONTAINER_READY_TIMEOUT_MS = 60_000;
const POLL_INTERVAL_MS = 20;
/** Between SIGTERM and SIGKILL. */
const STOP_GRACE_MS = 3_000;
const MAX_PORT_ATTEMPTS = 5;
const DEFAULT_MAX_LOG_CHARS = 1_000_000;

/** Starts `redis-server` with `opts.args(port, dir)` and resolves once it answers as itself. */
export async function startServerProcess(opts: ServerProcessOptions): Promise<ServerProcess> {
  const image = process.env.REDIS_TEST_IMAGE;
  const binary = image ? undefined : requireOnPath('redis-server');
  let lastLogs = '';
  for (let attempt = 1; attempt <= MAX_PORT_ATTEMPTS; attempt++) {
    const port = await (opts.pickPort ?? freePort)();
    const server = binary !== undefined ? await spawnServer(binary, port, opts) : await runContainer(image as string, port, opts);
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

/** What tells a server apart from another on the same port: its pid, or (in a container) its working directory. */
export type Itself = { pid: number } | { dir: string };

/**
 * One probe: [AUTH], PING and, when `itself` is given, whether the server is
 * that one. True only for PONG from the expected server; any failure means
 * "not yet". QUIT at the end, so the probe is gone from the server's CLIENT
 * LIST before the caller goes on.
 */
export async function answersPing(server: { host: string; port: number } & ServerAccess, itself?: Itself): Promise<boolean> {
  const client = shortLivedClient(server, 1_000);
  let answered = false;
  try {
    await client.connect();
    answered = (await client.call('PING')) === 'PONG';
    return answered && (itself === undefined || (await isItself(client, itself)));
  } catch {
    return false;
  } finally {
    // Something that never answered would not answer QUIT either.
    if (answered) await client.quit().catch(() => client.disconnect());
    else client.disconnect();
  }
}

/**
 * A sentinel names its config file (in its directory) in INFO (mode line
 * `redis_mode`, Valkey's `server_mode`); a server answers CONFIG GET dir.
 */
async function isItself(client: Redis, itself: Itself): Promise<boolean> {
  const info = String(await client.call('INFO', 'server'));
  if ('pid' in itself) return info.includes(`\r\nprocess_id:${itself.pid}\r\n`);
  if (/\r\n(redis|server)_mode:sentinel\r\n/.test(info)) return info.includes(`\r\nconfig_file:${itself.dir}/`);
  const [, dir] = (await client.call('CONFIG', 'GET', 'dir')) as string[];
  return dir === itself.dir;
}

// ---------------------------------------------------------------------------
// One process, or one container
// ---------------------------------------------------------------------------

interface Spawned {
  handle: ServerProcess;
  /** Undefined while it cannot be told yet (a spawn whose pid is not known). */
  itself(): Itself | undefined;
  hasExited(): boolean;
  exitDescription(): string;
  readyTimeoutMs: number;
}

/** A new working directory, and the server's arguments for it; the directory is removed if they cannot be had. */
async function directoryAndArgs(port: number, opts: ServerProcessOptions): Promise<{ dir: string; args: string[] }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'redis-test-'));
  const args = await Promise.resolve(opts.args(port, dir)).catch(async (err: unknown) => {
    await rm(dir, { recursive: true, force: true });
    throw err;
  });
  return { dir, args };
}

async function runContainer(image: string, port: number, opts: ServerProcessOptions): Promise<Spawned> {
  const { dir, args } = await directoryAndArgs(port, opts);
  const container = await startServerContainer(image, args, dir, opts.maxLogChars ?? DEFAULT_MAX_LOG_CHARS).catch(async (err: unknown) => {
    await rm(dir, { recursive: true, force: true });
    throw err;
  });
  trackForExitCleanup(container, () => {
    container.removeNow();
    rmSync(dir, { recursive: true, force: true });
  });
  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= container.stop().then(async () => {
      untrack(container);
      await rm(dir, { recursive: true, force: true });
    }));
  return {
    itself: () => ({ dir }),
    hasExited: container.hasExited,
    exitDescription: () => 'its container ended',
    readyTimeoutMs: CONTAINER_READY_TIMEOUT_MS,
    handle: { host: HOST, port, logs: container.logs, stop },
  };
}

async function spawnServer(binary: string, port: number, opts: ServerProcessOptions): Promise<Spawned> {
  const { dir, args } = await directoryAndArgs(port, opts);
  const child = spawn(binary, args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  trackForExitCleanup(child, () => {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

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
    // No pid: spawn failed, and its 'error' event is on the way.
    itself: () => (child.pid !== undefined ? { pid: child.pid } : undefined),
    hasExited,
    exitDescription: () => (exit?.signal ? `signal ${exit.signal}` : `code ${exit?.code}`),
    readyTimeoutMs: READY_TIMEOUT_MS,
    handle: { host: HOST, port, logs: () => output, stop },
  };
}

/** True once it answers as itself; false if it exited first. Throws (having stopped it) on timeout. */
async function waitUntilReady(server: Spawned, opts: ServerProcessOptions): Promise<boolean> {
  const { port } = server.handle;
  const target = { host: HOST, port, tls: opts.tls, password: opts.password };
  const deadline = Date.now() + server.readyTimeoutMs;
  while (Date.now() < deadline) {
    if (server.hasExited()) return false;
    const itself = server.itself();
    if (itself !== undefined && (await answersPing(target, itself))) {
      // It may have died between the probe and now.
      return !server.hasExited();
    }
    await sleep(POLL_INTERVAL_MS);
  }
  const logs = server.handle.logs();
  await server.handle.stop();
  throw new Error(`${opts.name} on port ${port} did not answer PING within ${server.readyTimeoutMs} ms. Output:\n${logs}`);
}

function requireOnPath(name: string): string {
  const found = findOnPath(name);
  if (found !== undefined) return found;
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
/** What removes each live server at once, synchronously (it also runs from the 'exit' event). */
const live = new Map<object, () => void>();
let exitHooksInstalled = false;

/** Runs `removeNow` should the test process end before `server` is stopped. */
function trackForExitCleanup(server: object, removeNow: () => void): void {
  live.set(server, removeNow);
  if (exitHooksInstalled) return;
  exitHooksInstalled = true;
  process.once('exit', removeAllLive);
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
    process.once(signal, () => {
      removeAllLive();
      // Our listener replaced the default action; with it gone, re-raising
      // the signal terminates the process the way it would have anyway.
      process.kill(process.pid, signal);
    });
  }
}

function untrack(server: object): void {
  live.delete(server);
}

function removeAllLive(): void {
  for (const removeNow of live.values()) removeNow();
  live.clear();
}
