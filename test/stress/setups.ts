/**
 * What the integrity stress runs against: a real Redis (a redis-server process, or with
 * REDIS_TEST_IMAGE a container of that image), reached over TCP, a unix socket or TLS, or a
 * Redis Cluster, with the proxy in front of it as operators run it (its own process, the built
 * command line) with one lock method; or Redis directly, to show that the stress's model is
 * Redis's own.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { Cli, cleanEnv, ensureBuilt } from '../support/cli.js';
import { slotOf, startCluster, type TestCluster } from '../support/cluster.js';
import { freePort, freePortRange } from '../support/ports.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { cmd, RawClient } from '../support/resp.js';
import { makeCertificates, redisTlsArgs, type TestCertificates } from '../support/tls.js';
import type { Endpoint } from './client.js';

export const TRANSPORTS = ['tcp', 'unix', 'tls', 'cluster'] as const;
export type Transport = (typeof TRANSPORTS)[number];
export const LOCK_METHODS = ['auto', 'transaction', 'script'] as const;
export type LockMethod = (typeof LOCK_METHODS)[number];

export interface StressTarget {
  /** `proxy, tcp, lock method auto`, or `redis directly`. */
  readonly label: string;
  /** Lock blocks are fixed on the way. */
  readonly lockFixed: boolean;
  readonly endpointFor: (tag: string) => Endpoint;
  /** Empties every database the stress writes to. */
  flush(): Promise<void>;
  /** What the proxy printed on stderr (a crash, say); '' directly. */
  proxyErrors(): string;
  stop(): Promise<void>;
}

export interface TargetOptions {
  /** null: Redis directly, no proxy (tcp only). */
  readonly lockMethod: LockMethod | null;
  readonly transport: Transport;
  /** The checkout whose built proxy (dist/cli.js) runs: another commit's, say; default this one. */
  readonly proxyBuild?: string;
}

const HOST = '127.0.0.1';

export async function startTarget(options: TargetOptions): Promise<StressTarget> {
  const cleanups: Array<() => Promise<void> | void> = [];
  const stop = async (): Promise<void> => {
    for (const cleanup of cleanups.reverse()) await cleanup();
  };
  try {
    if (options.transport === 'cluster') return await clusterTarget(options, cleanups, stop);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'rlp-stress-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    let certs: TestCertificates | null = null;
    const args: string[] = [];
    const socket = path.join(dir, 'redis.sock');
    let tlsPort = 0;
    if (options.transport === 'unix') args.push('--unixsocket', socket, '--unixsocketperm', '700');
    if (options.transport === 'tls') {
      certs = makeCertificates();
      const made = certs;
      cleanups.push(() => made.remove());
      tlsPort = await freePort();
      args.push(...redisTlsArgs(certs, tlsPort, false));
    }
    const redis = await startRedis({ args });
    cleanups.push(() => redis.stop());
    const flush = (): Promise<void> => flushAll(redis);
    if (options.lockMethod === null) {
      if (options.transport !== 'tcp') throw new Error('Redis directly: over TCP only');
      return { label: 'redis directly', lockFixed: false, endpointFor: () => redis, flush, proxyErrors: () => '', stop };
    }
    const upstream =
      options.transport === 'unix' ? `unix://${socket}` : options.transport === 'tls' ? `rediss://${HOST}:${tlsPort}` : redis.url;
    const extra = certs === null ? [] : ['--upstream-ca', certs.caCert];
    const proxy = await startProxy(upstream, options, extra, cleanups);
    return {
      label: `proxy, ${options.transport}, lock method ${options.lockMethod}`,
      lockFixed: true,
      endpointFor: () => proxy.endpoint,
      flush,
      proxyErrors: proxy.errors,
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}

async function clusterTarget(
  options: TargetOptions,
  cleanups: Array<() => Promise<void> | void>,
  stop: () => Promise<void>,
): Promise<StressTarget> {
  if (options.lockMethod === null) throw new Error('Redis directly: over TCP only');
  const cluster = await startCluster();
  cleanups.push(() => cluster.stop());
  const basePort = await freePortRange(16);
  const seeds = cluster.nodes.map((node) => `redis://${node.host}:${node.port}`).join(',');
  const proxy = await startProxy(seeds, options, ['--cluster', '--cluster-base-port', String(basePort)], cleanups);
  const slots = await slotMap(proxy.endpoint);
  return {
    label: `proxy, cluster, lock method ${options.lockMethod}`,
    lockFixed: true,
    endpointFor: (tag) => {
      const slot = slotOf(tag);
      const range = slots.find(([start, end]) => slot >= start && slot <= end);
      if (range === undefined) throw new Error(`no node serves slot ${slot}`);
      return range[2];
    },
    flush: () => flushMasters(cluster),
    proxyErrors: proxy.errors,
    stop,
  };
}

interface RunningProxy {
  readonly endpoint: Endpoint;
  errors(): string;
}

async function startProxy(
  upstream: string,
  options: TargetOptions,
  extra: string[],
  cleanups: Array<() => Promise<void> | void>,
): Promise<RunningProxy> {
  const lockMethod = options.lockMethod as LockMethod;
  if (options.proxyBuild === undefined) await ensureBuilt();
  const port = await freePort();
  // --hold-ms is the default (10 ms), as operators run it. Where the proxy holds a lock block
  // (the script way), one whose pieces come further apart (a split block's pauses reach 20 ms; an
  // interactive block waits for each reply; a busy machine) is released at the hold deadline and
  // runs unchanged: its replies are Redis's own as a fixed block's are, so the model holds either
  // way, and a block sent one command at a time waits 10 ms, not the seconds of a long hold.
  const args = ['--listen', `${HOST}:${port}`, '--upstream', upstream, '--lock-method', lockMethod, ...extra];
  const cli =
    options.proxyBuild === undefined
      ? new Cli(args, cleanEnv())
      : new Cli([path.join(options.proxyBuild, 'dist', 'cli.js'), ...args], cleanEnv(), process.execPath);
  cleanups.push(() => cli.stop());
  await cli.waitForLog('redis-lock-proxy listening', 60_000);
  return { endpoint: { host: HOST, port }, errors: () => cli.stderr };
}

/** The slot ranges and the listener that serves each, as the proxy's CLUSTER SLOTS names them. */
async function slotMap(seed: Endpoint): Promise<Array<[number, number, Endpoint]>> {
  const client = new Redis({ host: seed.host, port: seed.port, lazyConnect: true, maxRetriesPerRequest: 0 });
  try {
    await client.connect();
    const reply = (await client.call('CLUSTER', 'SLOTS')) as Array<[number, number, [string, number]]>;
    return reply.map(([start, end, [host, port]]) => [start, end, { host, port }]);
  } finally {
    client.disconnect();
  }
}

async function flushAll(redis: RedisServer): Promise<void> {
  const admin = await RawClient.connect(redis.port, redis.host);
  try {
    admin.write(cmd('FLUSHALL'));
    const reply = (await admin.readReplies(1, 30_000)).toString();
    if (reply !== '+OK\r\n') throw new Error(`FLUSHALL answered ${reply}`);
  } finally {
    await admin.close();
  }
}

async function flushMasters(cluster: TestCluster): Promise<void> {
  for (const master of await cluster.masters()) await cluster.command(master, 'FLUSHALL');
}
