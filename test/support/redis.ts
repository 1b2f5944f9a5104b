/**
 * A real Redis for tests, never a mock.
 *
 * By default this spawns the local `redis-server` binary on a free port in a
 * throwaway directory. With `REDIS_TEST_IMAGE` set (e.g. `redis:8`,
 * `valkey/valkey:8`) it runs that image through testcontainers instead, which
 * is how other server versions get tested. testcontainers is imported lazily
 * so the default path never loads it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants as fsConstants, rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { StartedTestContainer } from 'testcontainers';
import { cmd, RawClient } from './resp.js';

export interface RedisServer {
  host: string;
  port: number;
  /** `redis://[:password@]host:port` */
  url: string;
  /** Stops the server and cleans up; safe to call twice. */
  stop(): Promise<void>;
  /** Everything the server printed so far. */
  logs(): string;
}

export interface StartRedisOptions {
  /** Extra `redis-server` arguments, e.g. `['--maxmemory', '1mb']`. */
  args?: string[];
  /** Sets `--requirepass`; the readiness check authenticates with it. */
  password?: string;
}

const HOST = '127.0.0.1';
const READY_TIMEOUT_MS = 10_000;
const POLL_INTERVAL_MS = 20;
const STOP_GRACE_MS = 3_000;
const MAX_PORT_ATTEMPTS = 5;
/** Cap on captured output, so a chatty --loglevel cannot eat memory. */
const MAX_LOG_CHARS = 1_000_000;

/** Starts a Redis: a container if `REDIS_TEST_IMAGE` is set, else the local binary. */
export async function startRedis(opts: StartRedisOptions = {}): Promise<RedisServer> {
  const image = process.env.REDIS_TEST_IMAGE;
  return image ? startContainer(image, opts) : startLocal(opts);
}

/** A TCP port that was free a moment ago (the OS picks it; someone may still take it). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once('error', reject);
    server.listen(0, HOST, () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** Whether `port` could be bound on the loopback address a moment ago. */
export function isPortFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.unref();
    server.once('error', () => resolve(false));
    server.listen(port, HOST, () => server.close(() => resolve(true)));
  });
}

/**
 * The first of `count` consecutive TCP ports that were free a moment ago
 * (cluster listeners). They are taken below Linux's ephemeral range
 * (32768 and up), from which freePort(), and so the redis-servers of tests
 * running in parallel, and every outgoing connection take theirs.
 */
export async function freePortRange(count: number): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 16_000 + Math.floor(Math.random() * (32_000 - 16_000 - count));
    const ports = Array.from({ length: count }, (_, i) => base + i);
    if ((await Promise.all(ports.map(isPortFree))).every(Boolean)) return base;
  }
  throw new Error(`no ${count} consecutive free ports found`);
}

// ---------------------------------------------------------------------------
// Local redis-server
// ---------------------------------------------------------------------------

async function startLocal(opts: StartRedisOptions): Promise<RedisServer> {
  const binary = findOnPath('redis-server');
  let lastLogs = '';
  // freePort() can race with other processes (other test workers start
  // servers too), so a port taken before redis-server binds it is retried.
  for (let attempt = 1; attempt <= MAX_PORT_ATTEMPTS; attempt++) {
    const port = await freePort();
    const server = await spawnLocal(binary, port, opts);
    const outcome = await waitUntilReady(server, opts.password);
    if (outcome === 'ready') return server.handle;
    lastLogs = server.handle.logs();
    await server.handle.stop();
    if (!/Address already in use|EADDRINUSE/i.test(lastLogs)) {
      throw new Error(`redis-server exited early (${server.exitDescription()}). Output:\n${lastLogs}`);
    }
  }
  throw new Error(
    `redis-server could not bind a free port in ${MAX_PORT_ATTEMPTS} attempts. Last output:\n${lastLogs}`,
  );
}

interface LocalServer {
  handle: RedisServer;
  process: ChildProcess;
  hasExited(): boolean;
  exitDescription(): string;
}

async function spawnLocal(binary: string, port: number, opts: StartRedisOptions): Promise<LocalServer> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'redis-test-'));
  const args = [
    '--port', String(port),
    '--bind', HOST,
    '--dir', dir,
    '--save', '',
    '--appendonly', 'no',
    '--daemonize', 'no',
    '--protected-mode', 'no',
    '--loglevel', 'warning',
    ...passwordArgs(opts.password),
    ...(opts.args ?? []),
  ];
  const child = spawn(binary, args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  trackForExitCleanup(child, dir);

  let output = '';
  const capture = (chunk: Buffer) => {
    output = (output + chunk.toString('utf8')).slice(-MAX_LOG_CHARS);
  };
  child.stdout?.on('data', capture);
  child.stderr?.on('data', capture);

  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  const exited = new Promise<void>((resolve) => {
    child.once('exit', (code, signal) => {
      exit = { code, signal };
      resolve();
    });
    // spawn failures (ENOENT, EACCES) arrive as 'error' without 'exit'.
    child.once('error', (err) => {
      output += `\n[spawn error] ${err.message}\n`;
      exit ??= { code: null, signal: null };
      resolve();
    });
  });

  let stopping: Promise<void> | undefined;
  const stop = () => (stopping ??= stopLocal(child, exited, () => exit !== undefined, dir));

  return {
    process: child,
    hasExited: () => exit !== undefined,
    exitDescription: () => (exit?.signal ? `signal ${exit.signal}` : `code ${exit?.code}`),
    handle: {
      host: HOST,
      port,
      url: redisUrl(HOST, port, opts.password),
      stop,
      logs: () => output,
    },
  };
}

/**
 * Polls until the server answers PING, or until the process exits.
 * Also checks INFO's process_id, so a server of another test that grabbed the
 * same port is never mistaken for ours.
 */
async function waitUntilReady(server: LocalServer, password: string | undefined): Promise<'ready' | 'exited'> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (server.hasExited()) return 'exited';
    if (await answersPing(server.handle.port, password, server.process.pid)) {
      // It may have died between the probe and now (e.g. the port was someone else's).
      return server.hasExited() ? 'exited' : 'ready';
    }
    await sleep(POLL_INTERVAL_MS);
  }
  const logs = server.handle.logs();
  await server.handle.stop();
  throw new Error(
    `redis-server on port ${server.handle.port} did not answer PING within ${READY_TIMEOUT_MS} ms. Output:\n${logs}`,
  );
}

async function stopLocal(
  child: ChildProcess,
  exited: Promise<void>,
  hasExited: () => boolean,
  dir: string,
): Promise<void> {
  if (!hasExited()) {
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
    await exited;
    clearTimeout(timer);
  }
  untrack(child);
  await rm(dir, { recursive: true, force: true });
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

// If a test file ends without calling stop(), its redis-servers must not
// outlive the worker. Vitest ends fork workers with SIGTERM, which skips
// 'exit' handlers, so the common termination signals are covered too.
const live = new Map<ChildProcess, string | undefined>();
let exitHooksInstalled = false;

/** Kills `child` (and removes `dir`, if given) should the test process end without stopping it. */
export function trackForExitCleanup(child: ChildProcess, dir?: string): void {
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

/** Synchronous, because it also runs from the 'exit' event. */
function killAllLive(): void {
  for (const [proc, dir] of live) {
    proc.kill('SIGKILL');
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  }
  live.clear();
}

export function untrack(child: ChildProcess): void {
  live.delete(child);
}

// ---------------------------------------------------------------------------
// Container (REDIS_TEST_IMAGE)
// ---------------------------------------------------------------------------

async function startContainer(image: string, opts: StartRedisOptions): Promise<RedisServer> {
  const tc = await import('testcontainers');
  await assertDockerReachable(tc, image);

  const userArgs = opts.args ?? [];
  // Docker port mapping makes connections non-local, so protected mode must be
  // off; the official images do that only for some command forms.
  const command = ['redis-server', '--protected-mode', 'no', ...passwordArgs(opts.password), ...userArgs];
  // "Ready to accept connections" is a notice; with a quieter --loglevel only
  // the port can tell readiness.
  const waitStrategy = userArgs.includes('--loglevel')
    ? tc.Wait.forListeningPorts()
    : tc.Wait.forLogMessage(/Ready to accept connections/);

  let output = '';
  const container: StartedTestContainer = await new tc.GenericContainer(image)
    .withExposedPorts(6379)
    .withCommand(command)
    .withWaitStrategy(waitStrategy)
    .withLogConsumer((stream) => {
      stream.on('data', (chunk: Buffer | string) => {
        output = (output + chunk.toString()).slice(-MAX_LOG_CHARS);
      });
    })
    .start();

  const host = container.getHost();
  const port = container.getMappedPort(6379);
  let stopping: Promise<void> | undefined;
  const handle: RedisServer = {
    host,
    port,
    url: redisUrl(host, port, opts.password),
    stop: () => (stopping ??= container.stop().then(() => undefined)),
    logs: () => output,
  };
  await waitForContainerPing(handle, opts.password);
  return handle;
}

/** The log line can precede the port mapping being usable from the host; PING is the real test. */
async function waitForContainerPing(server: RedisServer, password: string | undefined): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (await answersPing(server.port, password, undefined, server.host)) return;
    await sleep(POLL_INTERVAL_MS);
  }
  const logs = server.logs();
  await server.stop();
  throw new Error(`container Redis at ${server.url} did not answer PING. Output:\n${logs}`);
}

async function assertDockerReachable(tc: typeof import('testcontainers'), image: string): Promise<void> {
  try {
    await tc.getContainerRuntimeClient();
  } catch (err) {
    throw new Error(
      `REDIS_TEST_IMAGE=${image} is set, but no Docker (or compatible) engine is reachable: ` +
        `${(err as Error).message}. Start Docker, or unset REDIS_TEST_IMAGE to use the local redis-server.`,
      { cause: err },
    );
  }
}

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

/**
 * One raw-socket probe: [AUTH], PING and, when `pid` is given, INFO server.
 * True only for +PONG from the expected process; any failure means "not yet".
 */
async function answersPing(
  port: number,
  password: string | undefined,
  pid: number | undefined,
  host = HOST,
): Promise<boolean> {
  let client: RawClient | undefined;
  try {
    client = await RawClient.connect(port, host);
    const commands = [
      ...(password !== undefined ? [cmd('AUTH', password)] : []),
      cmd('PING'),
      ...(pid !== undefined ? [cmd('INFO', 'server')] : []),
    ];
    client.write(Buffer.concat(commands));
    const replies = (await client.readReplies(commands.length, 1000)).toString('latin1');
    const pongOk = replies.includes('+PONG\r\n');
    const pidOk = pid === undefined || replies.includes(`\r\nprocess_id:${pid}\r\n`);
    return pongOk && pidOk;
  } catch {
    return false;
  } finally {
    client?.destroy();
  }
}

function passwordArgs(password: string | undefined): string[] {
  return password !== undefined ? ['--requirepass', password] : [];
}

function redisUrl(host: string, port: number, password: string | undefined): string {
  const auth = password !== undefined ? `:${encodeURIComponent(password)}@` : '';
  return `redis://${auth}${host}:${port}`;
}
