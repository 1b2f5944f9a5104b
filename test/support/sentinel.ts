/**
 * A real Sentinel setup for tests: a master, one replica and N sentinels, all
 * local `redis-server` processes (sentinels run as `redis-server <conf>
 * --sentinel`, so the separate redis-sentinel package is not needed).
 *
 * Master and replica come from startRedis(); each sentinel is a server process
 * (server-process.ts) whose first argument is a config file written into its
 * own directory, because sentinel mode needs a writable one. With
 * REDIS_TEST_IMAGE they are all containers of that image on the host's network.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startRedis, type RedisServer } from './redis.js';
import { HOST, shortLivedClient, startServerProcess, type ServerProcess } from './server-process.js';

/** One sentinel: its port, its output, stop(). */
export type SentinelProcess = ServerProcess;

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

/**
 * For the replica's first sync, and for every sentinel to know the master and
 * the replica. Above Sentinel's 10 s INFO period: a sentinel that asked the
 * master before the replica had attached learns of it only at its next INFO.
 */
const SETTLE_TIMEOUT_MS = 15_000;
const POLL_INTERVAL_MS = 50;

/** Starts master, replica and sentinels, and waits until every sentinel knows the replica. */
export async function startSentinelSetup(opts: SentinelSetupOptions = {}): Promise<SentinelSetup> {
  const count = opts.sentinels ?? 1;
  const masterName = opts.masterName ?? 'mymaster';
  const started: Array<{ stop(): Promise<void> }> = [];
  const stopAll = async () => {
    // Sentinels first, so they do not react to the data nodes going away.
    for (const item of started.slice().reverse()) await item.stop();
  };
  try {
    // Without the default 5 s diskless-sync delay the replica is in sync at once
    // (and so is the old master after a failover, when the replica serves it).
    const noSyncDelay = ['--repl-diskless-sync-delay', '0'];
    const master = await startRedis({ args: noSyncDelay });
    started.push(master);
    const replica = await startRedis({ args: [...noSyncDelay, '--replicaof', HOST, String(master.port)] });
    started.push(replica);
    const sentinels: SentinelProcess[] = [];
    for (let i = 1; i <= count; i++) {
      const sentinel = await startSentinel(i, masterName, master.port);
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

function startSentinel(index: number, masterName: string, masterPort: number): Promise<SentinelProcess> {
  return startServerProcess({
    name: `sentinel ${index}`,
    args: async (port, dir) => {
      // Sentinel rewrites this file (ids, epochs, discovered replicas), so it lives in the writable directory.
      const conf = path.join(dir, 'sentinel.conf');
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
      return [conf, '--sentinel'];
    },
  });
}

// ---------------------------------------------------------------------------
// Readiness
// ---------------------------------------------------------------------------

async function waitForReplication(master: RedisServer, replica: RedisServer): Promise<void> {
  await waitFor('the replica to sync with the master', async () => {
    const masterInfo = String(await query(master.port, ['INFO', 'replication']));
    const replicaInfo = String(await query(replica.port, ['INFO', 'replication']));
    return (
      /\r\nconnected_slaves:1\r\n/.test(masterInfo) && /state=online/.test(masterInfo) && /\r\nmaster_link_status:up\r\n/.test(replicaInfo)
    );
  });
}

/** The sentinel names the master and knows the replica as a healthy one (so SENTINEL FAILOVER can pick it). */
async function waitForSentinel(sentinel: SentinelProcess, masterName: string, masterPort: number): Promise<void> {
  await waitFor(
    `sentinel ${sentinel.port} to know the master and the replica`,
    async () => {
      const addr = await query(sentinel.port, ['SENTINEL', 'get-master-addr-by-name', masterName]);
      if (!Array.isArray(addr) || addr[1] !== String(masterPort)) return false;
      const replicas = await query(sentinel.port, ['SENTINEL', 'replicas', masterName]);
      if (!Array.isArray(replicas) || replicas.length === 0) return false;
      return replicas.some((fields) => {
        const map = fieldMap(fields);
        return map.get('flags') === 'slave' && map.get('master-link-status') === 'ok';
      });
    },
    () => sentinel.logs(),
  );
}

async function waitFor(what: string, check: () => Promise<boolean>, logs?: () => string): Promise<void> {
  const deadline = Date.now() + SETTLE_TIMEOUT_MS;
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
  throw new Error(`timed out after ${SETTLE_TIMEOUT_MS} ms waiting for ${what}${detail}${logs ? `. Output:\n${logs()}` : ''}`);
}

function fieldMap(fields: unknown): Map<string, string> {
  const map = new Map<string, string>();
  if (!Array.isArray(fields)) return map;
  for (let i = 0; i + 1 < fields.length; i += 2) map.set(String(fields[i]), String(fields[i + 1]));
  return map;
}

/** One command on a short-lived connection; rejects on any failure. */
export async function query(port: number, args: [string, ...Array<string | Buffer>], host = HOST): Promise<unknown> {
  const client = shortLivedClient({ host, port }, 2_000);
  try {
    await client.connect();
    return await client.call(args[0], ...args.slice(1));
  } finally {
    client.disconnect();
  }
}
