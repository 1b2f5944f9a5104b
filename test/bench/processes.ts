/**
 * The processes a bench run needs, and their clean-up.
 *
 * One redis-server, and in front of it the proxy (`node dist/cli.js`, its own
 * process so /proc/<pid>/status shows its memory alone, and /proc/<pid>/stat
 * its CPU), HAProxy in TCP mode (an L4 baseline), nutcracker (twemproxy, an
 * L7 Redis proxy) and a bare Node relay (relay.ts); with `--baseline DIR`,
 * also another checkout's build of the proxy. Everything
 * listens on loopback on ports the OS picked. Every child goes into one
 * registry, so SIGINT or an error anywhere stops all of them (the Redis
 * Cluster of the cluster part too, see cluster.ts).
 *
 * Globals such as `process` and `Buffer` are imported explicitly in every
 * bench module: the compiled JavaScript lands in `.bench/`, which `eslint .`
 * also reads, and imported names keep `no-undef` quiet there.
 */
import { Buffer } from 'node:buffer';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants as fsConstants, existsSync, readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import process from 'node:process';
import { clearTimeout, setTimeout } from 'node:timers';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { ReplyCounter } from './resp-counter.js';

export const HOST = '127.0.0.1';

export type TargetName = 'direct' | 'proxy' | 'baseline' | 'script' | 'haproxy' | 'nutcracker' | 'relay';
/**
 * The targets of the pass-through and latency loads. 'baseline' is the proxy
 * as built in another checkout (--baseline DIR); it runs only when asked for.
 * 'relay' is a bare Node relay (relay.ts): the floor of what Node costs.
 */
export const TARGET_NAMES: readonly TargetName[] = ['direct', 'proxy', 'baseline', 'haproxy', 'nutcracker', 'relay'];
/** The targets of the lock load: also the proxy with --lock-method script ('script'); nutcracker cannot carry MULTI. */
export const LOCK_TARGET_NAMES: readonly TargetName[] = ['direct', 'proxy', 'baseline', 'script', 'haproxy', 'relay'];
/**
 * The targets of the interactive transaction (interactive.ts): the lock targets but the relay and 'script', which must see the whole
 * block before it can send it as one script, so it holds each MULTI for --hold-ms (10 ms: 50 s a round, for a figure
 * known in advance).
 */
export const INTERACTIVE_TARGET_NAMES: readonly TargetName[] = ['direct', 'proxy', 'baseline', 'haproxy'];

/** Something the loads connect to. */
export interface Target {
  name: TargetName;
  port: number;
}

/** A child process we started and must stop. */
export interface Managed {
  name: string;
  pid: number;
  port: number;
  /** The last 64 KiB it printed (stdout and stderr), for error messages. */
  output(): string;
  /** The last 64 KiB of its stdout alone (a worker's result). */
  stdout(): string;
  /** Resolves with the exit code, or the signal name, once it has exited. */
  exited: Promise<number | string>;
  /** Throws if it died: a peer that crashed would make every later figure wrong. */
  assertAlive(): void;
  stop(): Promise<void>;
}

const READY_TIMEOUT_MS = 15_000;
const STOP_GRACE_MS = 3_000;
const OUTPUT_TAIL_CHARS = 64 * 1024;

/** Every child we spawned and have not seen exit. */
const live = new Set<ChildProcess>();

/** Binds `port` (0: any) on loopback and lets it go again: the port bound, or null when it is taken. */
function tryBind(port: number): Promise<number | null> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(null));
    server.listen(port, HOST, () => {
      const { port: p } = server.address() as net.AddressInfo;
      server.close(() => resolve(p));
    });
  });
}

/** A TCP port that was free a moment ago; never the same one twice in a run. */
const handedOut = new Set<number>();
export async function freePort(): Promise<number> {
  for (;;) {
    const port = await tryBind(0);
    if (port === null) throw new Error(`cannot bind any port on ${HOST}`);
    if (!handedOut.has(port)) {
      handedOut.add(port);
      return port;
    }
  }
}

/**
 * A free port whose companion `port + offset` is free too, both handed out:
 * a cluster node's bus listens on its port + 10000.
 */
export async function freePortWithCompanion(offset: number): Promise<number> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = await freePort();
    const companion = port + offset;
    if (companion > 65_535 || handedOut.has(companion) || (await tryBind(companion)) === null) continue;
    handedOut.add(companion);
    return port;
  }
  throw new Error(`no free port p with p + ${offset} also free in 100 attempts`);
}

/** The repository root: the nearest directory above this file with our package.json. */
export function repoRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const pkg = path.join(dir, 'package.json');
    if (existsSync(pkg) && JSON.parse(readFileSync(pkg, 'utf8')).name === 'redis-lock-proxy') return dir;
    const up = path.dirname(dir);
    if (up === dir) throw new Error('cannot find the redis-lock-proxy package.json above ' + import.meta.url);
    dir = up;
  }
}

/**
 * Finds an executable on PATH, then in the sbin directories: Debian installs
 * haproxy and nutcracker in /usr/sbin, which a normal user's PATH lacks.
 */
export function findExecutable(name: string): string | null {
  const dirs = [...(process.env.PATH ?? '').split(path.delimiter), '/usr/local/sbin', '/usr/sbin', '/sbin'];
  for (const dir of dirs) {
    if (!dir) continue;
    const file = path.join(dir, name);
    try {
      accessSync(file, fsConstants.X_OK);
      return file;
    } catch {
      // not here; keep looking
    }
  }
  return null;
}

/** First line of `cmd args` (stdout, else stderr), for the machine section. */
export function versionOf(file: string, args: string[]): Promise<string> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: 5_000 }, (_error, stdout, stderr) => {
      const text = `${stdout}`.trim() || `${stderr}`.trim();
      resolve(text.split('\n')[0] ?? '');
    });
  });
}

/**
 * The commit a checkout is at (`git describe --always --dirty`), or null when
 * it is no git checkout: the report names the baseline by it, since a
 * directory such as /tmp/before says nothing about which code it holds.
 */
export function revisionOf(dir: string): Promise<string | null> {
  return new Promise((resolve) => {
    execFile('git', ['-C', dir, 'describe', '--always', '--dirty'], { timeout: 5_000 }, (error, stdout) => {
      resolve(error ? null : `${stdout}`.trim() || null);
    });
  });
}

/** Spawns a child and registers it for clean-up; its output is kept as a short tail. */
export function spawnTracked(name: string, file: string, args: string[], port: number): Managed {
  const child = spawn(file, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  live.add(child);
  let tail = '';
  let stdoutTail = '';
  const keep = (chunk: Buffer): void => {
    tail = (tail + chunk.toString('utf8')).slice(-OUTPUT_TAIL_CHARS);
  };
  child.stdout?.on('data', (chunk: Buffer) => {
    keep(chunk);
    stdoutTail = (stdoutTail + chunk.toString('utf8')).slice(-OUTPUT_TAIL_CHARS);
  });
  child.stderr?.on('data', keep);
  let spawnError: Error | null = null;
  // 'close' rather than 'exit': it comes after the output streams are drained.
  const exited = new Promise<number | string>((resolve) => {
    child.on('error', (error) => {
      spawnError = error;
      live.delete(child);
      resolve(String(error));
    });
    child.on('close', (code, signal) => {
      live.delete(child);
      resolve(code ?? signal ?? 'unknown');
    });
  });
  const gone = (): boolean => spawnError !== null || child.exitCode !== null || child.signalCode !== null;
  return {
    name,
    pid: child.pid ?? -1,
    port,
    output: () => tail,
    stdout: () => stdoutTail,
    exited,
    assertAlive() {
      if (gone()) {
        const why = spawnError ? String(spawnError) : `exit ${child.exitCode ?? child.signalCode}`;
        throw new Error(`${name} died (${why}); its last output:\n${tail}`);
      }
    },
    async stop() {
      if (gone()) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** Stops every child still running (SIGTERM, then SIGKILL after a grace period). */
export async function stopAll(): Promise<void> {
  await Promise.all(
    [...live].map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) return resolve();
          child.once('exit', () => resolve());
          child.kill('SIGTERM');
          setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS).unref();
        }),
    ),
  );
}

/** Last resort from the 'exit' handler, which cannot wait: kill what is left. */
export function killAllNow(): void {
  for (const child of live) child.kill('SIGKILL');
}

/**
 * Sends one request on a fresh connection and resolves with its whole reply
 * (latin1 text): readiness probes and the odd INFO, never on a hot path.
 */
export function roundTrip(port: number, request: string | Buffer, timeoutMs = 2_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, HOST);
    const counter = new ReplyCounter();
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => socket.destroy(new Error(`no reply on port ${port} within ${timeoutMs} ms`)), timeoutMs);
    const fail = (error: Error): void => {
      clearTimeout(timer);
      socket.destroy();
      reject(error);
    };
    socket.on('connect', () => socket.write(request));
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      if (counter.feed(chunk) === 0) return;
      clearTimeout(timer);
      socket.destroy();
      resolve(Buffer.concat(chunks).toString('latin1'));
    });
    socket.on('error', fail);
    socket.on('close', () => fail(new Error(`port ${port} closed the connection before replying`)));
  });
}

/** One request in RESP, as a client library writes it. */
export function command(...args: (string | Buffer)[]): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)];
  for (const arg of args) {
    const bytes = typeof arg === 'string' ? Buffer.from(arg) : arg;
    parts.push(Buffer.from(`$${bytes.length}\r\n`), bytes, Buffer.from('\r\n'));
  }
  return Buffer.concat(parts);
}

/** The text of a bulk string reply (INFO, CLUSTER NODES, ...); anything else, an error reply above all, throws. */
export function bulkText(reply: string): string {
  if (!reply.startsWith('$') || reply.startsWith('$-1'))
    throw new Error(`expected a bulk string, got ${JSON.stringify(reply.slice(0, 200))}`);
  return reply.slice(reply.indexOf('\r\n') + 2, -2);
}

export const PING = '*1\r\n$4\r\nPING\r\n';
const GET_PROBE = '*2\r\n$3\r\nGET\r\n$17\r\nbench:ready-probe\r\n';

/**
 * Polls `probe` until it resolves null (ready; else it says what is missing),
 * while every process in `watched` stays alive.
 */
export async function waitUntil(
  what: string,
  watched: Managed[],
  probe: () => Promise<string | null>,
  timeoutMs = READY_TIMEOUT_MS,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown = null;
  while (Date.now() < deadline) {
    for (const managed of watched) managed.assertAlive();
    try {
      last = await probe();
      if (last === null) return;
    } catch (error) {
      last = error;
    }
    await sleep(50);
  }
  const output = watched.map((managed) => managed.output()).join('\n');
  throw new Error(`${what} not ready after ${timeoutMs} ms: ${String(last)}\n${output}`);
}

/**
 * Waits until `port` answers PING, then a GET: the GET has to reach Redis, so
 * for the proxies it also proves the upstream side works (nutcracker answers
 * PING itself in some versions).
 */
async function waitReady(managed: Managed, port: number): Promise<void> {
  await waitUntil(managed.name, [managed], async () => {
    const pong = await roundTrip(port, PING);
    const nil = await roundTrip(port, GET_PROBE);
    return pong === '+PONG\r\n' && nil === '$-1\r\n' ? null : `unexpected answers ${JSON.stringify(pong)} ${JSON.stringify(nil)}`;
  });
}

/**
 * redis-server with nothing persisted. `--maxclients 20000`: the idle
 * connection test puts 5,000 proxy upstream connections on it; Redis lowers
 * the figure itself (with a log line) when the open-files limit is smaller.
 */
export async function startRedis(bin: string, dir: string): Promise<Managed> {
  const port = await freePort();
  const redis = spawnTracked('redis-server', bin, [...redisArgs(port, dir), '--maxclients', '20000'], port);
  await waitReady(redis, port);
  return redis;
}

/** What every redis-server of the bench runs with: loopback, in the foreground, nothing persisted. */
export function redisArgs(port: number, dir: string): string[] {
  const args = ['--port', String(port), '--bind', HOST, '--save', '', '--appendonly', 'no'];
  args.push('--dir', dir, '--daemonize', 'no', '--protected-mode', 'no', '--loglevel', 'warning');
  return args;
}

/** The build of one checkout of the proxy: its `dist/cli.js`, and the name its process goes by in error messages. */
export interface ProxyBuild {
  name: string;
  cli: string;
}

/** The `dist/cli.js` of the checkout at `root`. */
export function cliOf(root: string): string {
  return path.join(root, 'dist', 'cli.js');
}

/** This checkout's build: the proxy under test. */
export function ownBuild(): ProxyBuild {
  return { name: 'redis-lock-proxy', cli: cliOf(repoRoot()) };
}

/**
 * The proxy under test, exactly as an operator runs it, minus the admin
 * server and info logs. `build` picks the checkout: the baseline target is
 * another checkout's build started the same way, so that only the code
 * differs between the two.
 */
export async function startProxy(redisPort: number, extraArgs: string[] = [], build: ProxyBuild = ownBuild()): Promise<Managed> {
  const port = await freePort();
  const proxy = spawnProxy(port, ['--upstream', `redis://${HOST}:${redisPort}`, '--admin-listen', 'off', ...extraArgs], build);
  await waitReady(proxy, port);
  return proxy;
}

/** `node dist/cli.js --listen 127.0.0.1:<port>` with warnings only, and `args` (the upstream, the admin server). */
export function spawnProxy(port: number, args: string[], build: ProxyBuild = ownBuild()): Managed {
  const argv = [build.cli, '--listen', `${HOST}:${port}`, '--log-level', 'warn', ...args];
  return spawnTracked(build.name, process.execPath, argv, port);
}

/**
 * HAProxy as a plain TCP relay. `nbthread 1` because the proxy and nutcracker
 * are single-threaded too. HAProxy refuses to start when it cannot raise the
 * open-files limit to about 2 x maxconn, so the global maxconn is capped to
 * what the limit allows (the bench uses at most 50 connections through it).
 */
export async function startHaproxy(bin: string, redisPort: number, dir: string, fdLimit: number): Promise<Managed> {
  const port = await freePort();
  const maxconn = haproxyMaxconn(fdLimit);
  const config = [
    'global',
    '  nbthread 1',
    `  maxconn ${maxconn}`,
    'defaults',
    '  mode tcp',
    '  timeout connect 5s',
    // Long enough that no idle bench connection is ever cut.
    '  timeout client 1h',
    '  timeout server 1h',
    'frontend redis_in',
    `  bind ${HOST}:${port}`,
    `  maxconn ${maxconn}`,
    '  default_backend redis_out',
    'backend redis_out',
    `  server redis ${HOST}:${redisPort} maxconn ${maxconn}`,
    '',
  ].join('\n');
  const file = path.join(dir, 'haproxy.cfg');
  await writeFile(file, config);
  // -db: stay in the foreground, so the pid we hold is the one that serves.
  const haproxy = spawnTracked('haproxy', bin, ['-db', '-f', file], port);
  await waitReady(haproxy, port);
  return haproxy;
}

/** 10,000, or less when the open-files limit would make HAProxy refuse to start. */
export function haproxyMaxconn(fdLimit: number): number {
  return Math.max(256, Math.min(10_000, Math.floor((fdLimit - 200) / 2)));
}

/**
 * nutcracker with one Redis server, one connection to it (`server_connections:
 * 1`, twemproxy's multiplexing model), connected at start-up; hashing and
 * distribution stay at their defaults.
 */
export async function startNutcracker(bin: string, redisPort: number, dir: string): Promise<Managed> {
  const port = await freePort();
  const statsPort = await freePort();
  const config = [
    'bench:',
    `  listen: ${HOST}:${port}`,
    '  redis: true',
    '  preconnect: true',
    '  server_connections: 1',
    '  servers:',
    `    - ${HOST}:${redisPort}:1`,
    '',
  ].join('\n');
  const file = path.join(dir, 'nutcracker.yml');
  await writeFile(file, config);
  const args = ['-c', file, '-s', String(statsPort), '-a', HOST];
  const nutcracker = spawnTracked('nutcracker', bin, args, port);
  await waitReady(nutcracker, port);
  return nutcracker;
}

/** The bare Node relay (relay.ts, compiled next to this file) in front of Redis. */
export async function startRelay(redisPort: number): Promise<Managed> {
  const port = await freePort();
  const script = fileURLToPath(new URL('./relay.js', import.meta.url));
  const relay = spawnTracked('node relay', process.execPath, [script, String(port), String(redisPort)], port);
  await waitReady(relay, port);
  return relay;
}

/**
 * The process's open-files limit (soft). Node raises its own soft limit to
 * the hard limit at start-up, and children inherit it, so this is also what
 * the proxy and Redis get.
 */
export function openFilesLimit(): number {
  const line = readFileSync('/proc/self/limits', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('Max open files'));
  const soft = line?.split(/\s{2,}/)[1];
  if (soft === undefined) return 1024;
  return soft === 'unlimited' ? Number.MAX_SAFE_INTEGER : Number(soft);
}

/** A loopback TCP connection to `port`, Nagle off, as the load generators use. */
export function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, HOST);
    socket.setNoDelay(true);
    socket.once('connect', () => {
      socket.off('error', reject);
      resolve(socket);
    });
    socket.once('error', reject);
  });
}
