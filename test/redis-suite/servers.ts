/**
 * The processes one lane of the suite runs against: a redis-server started as
 * the suite's own "external server" CI job starts it, and (through the proxy)
 * the proxy's command line in front of it. Between units the server is put
 * back as it was: what a unit may leave behind (config, ACL users, the
 * replication role, scripts and functions, keys, paused clients) is undone.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { freePort } from '../support/ports.js';

const HOST = '127.0.0.1';
const READY_TIMEOUT_MS = 20_000;

export interface Process {
  readonly port: number;
  alive(): boolean;
  stop(): Promise<void>;
}

/** The flags the suite's external-server CI job gives (7.0+; older servers have none of them). */
export function externalJobFlags(version: string): string[] {
  const [major] = version.split('.').map(Number);
  if (major < 7) return [];
  return ['--enable-protected-configs', 'yes', '--enable-debug-command', 'yes', '--enable-module-command', 'yes'];
}

export async function startServer(binary: string, version: string, dir: string, name: string): Promise<Process> {
  const port = await freePort();
  // As the suite's CI job starts it (--save "" --logfile ... and its flags), in the foreground, on a port of its own.
  const args = [
    '--port',
    String(port),
    '--bind',
    HOST,
    '--save',
    '',
    '--dir',
    dir,
    '--logfile',
    path.join(dir, `${name}-redis.log`),
    ...externalJobFlags(version),
  ];
  const child = spawn(binary, args, { stdio: 'ignore' });
  return ready(child, port, `redis-server ${binary}`, path.join(dir, `${name}-redis.log`));
}

/** The proxy as an operator runs it (dist/cli.js, default rules and lock method), in front of `upstreamPort`. */
export async function startProxy(cli: string, upstreamPort: number, dir: string, name: string): Promise<Process> {
  const port = await freePort();
  const log = path.join(dir, `${name}-proxy.log`);
  const out = createWriteStream(log);
  const child = spawn(
    process.execPath,
    [cli, '--listen', `${HOST}:${port}`, '--upstream', `redis://${HOST}:${upstreamPort}`, '--admin-listen', 'off'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  child.stdout?.pipe(out);
  child.stderr?.pipe(out);
  return ready(child, port, `the proxy (${cli})`, log);
}

async function ready(child: ChildProcess, port: number, what: string, log: string): Promise<Process> {
  let exited = false;
  child.once('exit', () => (exited = true));
  const proc: Process = {
    port,
    alive: () => !exited,
    stop: async () => {
      if (exited) return;
      const gone = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      const killed = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await gone;
      clearTimeout(killed);
    },
  };
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline && !exited) {
    const client = connect(port);
    try {
      if ((await client.ping()) === 'PONG') return proc;
    } catch {
      // not yet
    } finally {
      client.disconnect();
    }
    await sleep(50);
  }
  await proc.stop();
  throw new Error(`${what} did not answer PING on port ${port} within ${READY_TIMEOUT_MS / 1000} s (its log: ${log})`);
}

function connect(port: number): Redis {
  const client = new Redis({ host: HOST, port, maxRetriesPerRequest: 0, retryStrategy: () => null });
  client.on('error', () => {}); // each call rejects with it
  return client;
}

/**
 * What a unit may change on the server, as it was before the first unit:
 * every config value and the ACL users.
 */
export interface ServerState {
  config: Map<string, string>;
  aclUsers: string[];
}

export async function snapshot(port: number): Promise<ServerState> {
  const client = connect(port);
  try {
    const pairs = (await client.call('CONFIG', 'GET', '*')) as string[];
    const config = new Map<string, string>();
    for (let i = 0; i + 1 < pairs.length; i += 2) config.set(pairs[i], pairs[i + 1]);
    const aclUsers = (await client.call('ACL', 'LIST')) as string[];
    return { config, aclUsers };
  } finally {
    client.disconnect();
  }
}

/**
 * Puts the server back to `state`. Each step may be refused on a server that
 * lacks it (FUNCTION before 7.0, CLIENT UNPAUSE before 6.2); what is refused
 * there had nothing to undo.
 */
export async function reset(port: number, state: ServerState): Promise<void> {
  const client = connect(port);
  const tryCall = (...args: string[]): Promise<unknown> => client.call(args[0], ...args.slice(1)).catch(() => undefined);
  try {
    await tryCall('CLIENT', 'UNPAUSE');
    await tryCall('REPLICAOF', 'NO', 'ONE');
    const now = await snapshot(port);
    for (const [key, value] of state.config) {
      if (now.config.get(key) !== value) await tryCall('CONFIG', 'SET', key, value);
    }
    const users = new Set(state.aclUsers.map((line) => line.split(' ')[1]));
    for (const line of now.aclUsers) {
      const user = line.split(' ')[1];
      if (!users.has(user)) await tryCall('ACL', 'DELUSER', user);
    }
    for (const line of state.aclUsers) {
      const [, user, ...rules] = line.split(' ');
      await tryCall('ACL', 'SETUSER', user, 'reset', ...rules);
    }
    await tryCall('SCRIPT', 'FLUSH');
    await tryCall('FUNCTION', 'FLUSH');
    await tryCall('DEBUG', 'SET-ACTIVE-EXPIRE', '1');
    await tryCall('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes');
    await tryCall('CLIENT', 'KILL', 'TYPE', 'pubsub', 'SKIPME', 'yes');
    await tryCall('FLUSHALL');
    await tryCall('SLOWLOG', 'RESET');
    await tryCall('LATENCY', 'RESET');
    await tryCall('CONFIG', 'RESETSTAT');
  } finally {
    client.disconnect();
  }
}
