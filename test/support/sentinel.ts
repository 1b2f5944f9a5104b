/**
 * A real Sentinel setup for tests: a master, one replica and N sentinels, all
 * local `redis-server` processes (sentinels run as `redis-server <conf>
 * --sentinel`, so the separate redis-sentinel package is not needed).
 *
 * Master and replica come from startRedis(); the sentinels are spawned here
 * because sentinel mode needs a writable config file as its first argument.
 * Containers (REDIS_TEST_IMAGE) are not supported: sentinels must reach the
 * master and replica at the addresses those announce.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { freePort, startRedis, trackForExitCleanup, untrack, type RedisServer } from './redis.js';

export interface SentinelProcess {
  host: string;
  port: number;
  /** Stops this sentinel; safe to call twice. */
  stop(): Promise<void>;
  /** Everything it printed so far. */
  logs(): string;
}

export interface SentinelSetup {
  master: RedisServer;
  replica: RedisServer;
  sentinels: SentinelProcess[];
  masterName: string;
  /** Stops the sentinels, the replica and the master; safe to call twice. */
  stop(): Promise<void>;
}

export interface SentinelSetupOptions {
  /** How many sentinels (default 1). */
  sentinels?: number;
  /** Default `mymaster`. */
  masterName?: string;
}

const HOST = '127.0.0.1';
const READY_TIMEOUT_MS = 15_000;
const POLL_INTERVAL_MS = 50;
const STOP_GRACE_MS = 3_000;
const MAX_PORT_ATTEMPTS = 5;
const MAX_LOG_CHARS = 1_000_000;

/** Starts master, replica and sentinels, and waits until every sentinel knows the replica. */
export async function startSentinelSetup(opts: SentinelSetupOptions = {}): Promise<SentinelSetup> {
  if (process.env.REDIS_TEST_IMAGE) {
    throw new Error('startSentinelSetup() runs local redis-server processes only; unset REDIS_TEST_IMAGE');
  }
  const count = opts.sentinels ?? 1;
  const masterName = opts.masterName ?? 'mymaster';
  const started: Array<{ stop(): Promise<void> }> = [];
  let dir: string | undefined;
  const stopAll = async () => {
    // Sentinels first, so they do not react to the data nodes going away.
    for (const item of started.slice().reverse()) await item.stop();
    if (dir) {
      await rm(dir, { recursive: true, force: true });
    }
  };
  try {
    // Without the default 5 s diskless-sync delay the replica is in sync at once
    // (and so is the old master after a failover, when the replica serves it).
    const noSyncDelay = ['--repl-diskless-sync-delay', '0'];
    const master = await startRedis({ args: noSyncDelay });
    started.push(master);
    const replica = await startRedis({ args: [...noSyncDelay, '--replicaof', HOST, String(master.port)] });
    started.push(replica);
    dir = await mkdtemp(path.join(os.tmpdir(), 'redis-sentinel-test-'));
    const sentinels: SentinelProcess[] = [];
    for (let i = 1; i <= count; i++) {
      const sentinel = await startSentinel(dir, i, masterName, master.port);
      started.push(sentinel);
      sentinels.push(sentinel);
    }
    await waitForReplication(master, replica);
    await Promise.all(sentinels.map((s) => waitForSentinel(s, masterName, master.port)));
    let stopping: Promise<void> | undefined;
    return { master, replica, sentinels, masterName, stop: () => (stopping ??= stopAll()) };
  } catch (err) {
    await stopAll();
    throw err;
  }
}

// ---------------------------------------------------------------------------
// Sentinel processes
// ---------------------------------------------------------------------------

async function startSentinel(dir: string, index: number, masterName: string, masterPort: number): Promise<SentinelProcess> {
  let lastLogs = '';
  for (let attempt = 1; attempt <= MAX_PORT_ATTEMPTS; attempt++) {
    const port = await freePort();
    const conf = path.join(dir, `sentinel-${index}.conf`);
    // Sentinel rewrites this file (ids, epochs, discovered replicas), so it lives in the writable tmp dir.
    await writeFile(
      conf,
      [
        `port ${port}`,
        `bind ${HOST}`,
        'protected-mode no',
        'daemonize no',
        `dir ${dir}`,
        'sentinel resolve-hostnames no',
        `sentinel monitor ${masterName} ${HOST} ${masterPort} 1`,
        `sentinel down-after-milliseconds ${masterName} 1000`,
        `sentinel failover-timeout ${masterName} 5000`,
        '',
      ].join('\n'),
    );
    const sentinel = spawnSentinel(conf, port);
    const outcome = await waitForPing(sentinel);
    if (outcome === 'ready') return sentinel.handle;
    lastLogs = sentinel.handle.logs();
    await sentinel.handle.stop();
    if (!/Address already in use|EADDRINUSE/i.test(lastLogs)) {
      throw new Error(`sentinel ${index} exited early. Output:\n${lastLogs}`);
    }
  }
  throw new Error(`sentinel ${index} could not bind a free port in ${MAX_PORT_ATTEMPTS} attempts. Last output:\n${lastLogs}`);
}

function spawnSentinel(conf: string, port: number): { handle: SentinelProcess; hasExited(): boolean } {
  const child = spawn('redis-server', [conf, '--sentinel'], { cwd: path.dirname(conf), stdio: ['ignore', 'pipe', 'pipe'] });
  trackForExitCleanup(child, path.dirname(conf));
  let output = '';
  const capture = (chunk: Buffer) => {
    output = (output + chunk.toString('utf8')).slice(-MAX_LOG_CHARS);
  };
  child.stdout?.on('data', capture);
  child.stderr?.on('data', capture);
  let exited = false;
  const exit = new Promise<void>((resolve) => {
    child.once('exit', () => {
      exited = true;
      resolve();
    });
    child.once('error', (err) => {
      output += `\n[spawn error] ${err.message}\n`;
      exited = true;
      resolve();
    });
  });
  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      if (!exited) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
        await exit;
        clearTimeout(timer);
      }
      untrack(child);
    })());
  return { handle: { host: HOST, port, stop, logs: () => output }, hasExited: () => exited };
}

async function waitForPing(sentinel: { handle: SentinelProcess; hasExited(): boolean }): Promise<'ready' | 'exited'> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (sentinel.hasExited()) return 'exited';
    const reply = await query(sentinel.handle.port, ['PING']).catch(() => undefined);
    if (reply === 'PONG') return sentinel.hasExited() ? 'exited' : 'ready';
    await sleep(POLL_INTERVAL_MS);
  }
  const logs = sentinel.handle.logs();
  await sentinel.handle.stop();
  throw new Error(`sentinel on port ${sentinel.handle.port} did not answer PING within ${READY_TIMEOUT_MS} ms. Output:\n${logs}`);
}

// ---------------------------------------------------------------------------
// Readiness
// ---------------------------------------------------------------------------

async function waitForReplication(master: RedisServer, replica: RedisServer): Promise<void> {
  await waitFor('the replica to sync with the master', async () => {
    const masterInfo = String(await query(master.port, ['INFO', 'replication']));
    const replicaInfo = String(await query(replica.port, ['INFO', 'replication']));
    return /\r\nconnected_slaves:1\r\n/.test(masterInfo) && /state=online/.test(masterInfo) && /\r\nmaster_link_status:up\r\n/.test(replicaInfo);
  });
}

/** The sentinel names the master and knows the replica as a healthy one (so SENTINEL FAILOVER can pick it). */
async function waitForSentinel(sentinel: SentinelProcess, masterName: string, masterPort: number): Promise<void> {
  await waitFor(`sentinel ${sentinel.port} to know the master and the replica`, async () => {
    const addr = await query(sentinel.port, ['SENTINEL', 'get-master-addr-by-name', masterName]);
    if (!Array.isArray(addr) || addr[1] !== String(masterPort)) return false;
    const replicas = await query(sentinel.port, ['SENTINEL', 'replicas', masterName]);
    if (!Array.isArray(replicas) || replicas.length === 0) return false;
    return replicas.some((fields) => {
      const map = fieldMap(fields);
      return map.get('flags') === 'slave' && map.get('master-link-status') === 'ok';
    });
  }, () => sentinel.logs());
}

async function waitFor(what: string, check: () => Promise<boolean>, logs?: () => string): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  let lastError = '';
  while (Date.now() < deadline) {
    try {
      if (await check()) return;
    } catch (err) {
      lastError = (err as Error).message;
    }
    await sleep(POLL_INTERVAL_MS);
  }
  const detail = lastError ? ` (last error: ${lastError})` : '';
  throw new Error(`timed out after ${READY_TIMEOUT_MS} ms waiting for ${what}${detail}${logs ? `. Output:\n${logs()}` : ''}`);
}

function fieldMap(fields: unknown): Map<string, string> {
  const map = new Map<string, string>();
  if (!Array.isArray(fields)) return map;
  for (let i = 0; i + 1 < fields.length; i += 2) map.set(String(fields[i]), String(fields[i + 1]));
  return map;
}

/** One command on a short-lived connection; rejects on any failure. */
export async function query(port: number, args: [string, ...Array<string | Buffer>], host = HOST): Promise<unknown> {
  const client = new Redis({
    host,
    port,
    lazyConnect: true,
    enableOfflineQueue: false,
    enableReadyCheck: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 1_000,
    commandTimeout: 2_000,
  });
  client.on('error', () => {}); // surfaces through connect() and call()
  try {
    await client.connect();
    return await client.call(args[0], ...args.slice(1));
  } finally {
    client.disconnect();
  }
}
