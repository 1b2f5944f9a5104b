/**
 * The cluster part of the bench: a local Redis Cluster, the proxy in cluster
 * mode in front of it, and the proof that a cluster client really went
 * through the proxy.
 *
 * Six redis-server processes (3 masters, 3 replicas, made one cluster by
 * `redis-cli --cluster create --cluster-replicas 1`), each in a directory of
 * its own under the bench's temporary directory, on loopback ports whose
 * cluster bus port (port + 10000) was free too. They are children like every
 * other (processes.ts), so SIGINT or an error anywhere stops them, and the
 * temporary directory goes with the rest.
 *
 * The proxy gets a listener port per node that the OS picked
 * (`--cluster-port-map`, rather than `--listen` port + 1, 2, ... which may be
 * taken), so the lock load can aim at the listener of the master that owns
 * its keys, as a cluster client does after reading the slot map.
 */
import { Buffer } from 'node:buffer';
import { mkdir } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { clearTimeout, setTimeout } from 'node:timers';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  bulkText,
  command,
  freePort,
  freePortWithCompanion,
  HOST,
  PING,
  redisArgs,
  roundTrip,
  spawnProxy,
  spawnTracked,
  waitUntil,
  type Managed,
} from './processes.js';

export const MASTERS = 3;
/** One replica per master. */
export const NODES = 2 * MASTERS;
const SLOTS = 16_384;
/** Redis listens for the cluster bus on the client port + 10000. */
const BUS_PORT_OFFSET = 10_000;
const NODE_TIMEOUT_MS = 5_000;
const CREATE_TIMEOUT_MS = 60_000;
/** From `redis-cli --cluster create` to every node agreeing and every replica in sync. */
const SETTLE_TIMEOUT_MS = 60_000;
/** Between reading the nodes' counters and the proxy's: a topology refresh in flight has counted itself by then. */
const COUNTER_SETTLE_MS = 200;

/** One redis-server of the cluster. */
export interface ClusterNode {
  managed: Managed;
  port: number;
  /** CLUSTER MYID. */
  id: string;
}

/** A master and the hash slots it serves, at the port a load aims at (the node's, or the proxy's listener for it). */
export interface Shard {
  port: number;
  /** Inclusive ranges. */
  slots: Array<[number, number]>;
}

export interface BenchCluster {
  nodes: ClusterNode[];
  /** The masters, by first slot, at their own ports. */
  shards: Shard[];
}

export interface ClusterProxy {
  managed: Managed;
  /** The seed listener (`--listen`): what a cluster client is given. */
  port: number;
  /** Its admin server, read for the routing check. */
  adminPort: number;
  /** The masters, by first slot, at the proxy's listener for each. */
  shards: Shard[];
}

// ------------------------------------------------------------------ slots

/** CRC16/XMODEM (polynomial 0x1021, initial value 0), Redis Cluster's key hash. */
function crc16(bytes: Buffer): number {
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

/** The key's hash slot: CRC16 of the key, or of its hash tag (between the first `{` and the next `}`, if not empty). */
export function keySlot(key: Buffer): number {
  const open = key.indexOf(0x7b);
  const close = open < 0 ? -1 : key.indexOf(0x7d, open + 1);
  return crc16(close > open + 1 ? key.subarray(open + 1, close) : key) % SLOTS;
}

export function servesSlot(shard: Shard, slot: number): boolean {
  return shard.slots.some(([first, last]) => slot >= first && slot <= last);
}

// ------------------------------------------------------------------ the cluster

/** A line of CLUSTER NODES, as far as the bench cares. */
interface NodeLine {
  id: string;
  port: number;
  master: boolean;
  /** A replica's master id; `-` for a master. */
  masterId: string;
  /** Link connected, and no fail, fail?, handshake or noaddr flag. */
  healthy: boolean;
  slots: Array<[number, number]>;
}

function parseClusterNodes(text: string): NodeLine[] {
  const lines = text.split('\n').filter((line) => line.trim() !== '');
  return lines.map((line) => {
    // <id> <ip:port@bus[,hostname]> <flags> <master> <ping-sent> <pong-recv> <epoch> <link> <slot>...
    const [id, address, flags, masterId, , , , link, ...slots] = line.trim().split(' ');
    const flagList = flags.split(',');
    return {
      id,
      port: Number(address.split('@')[0].split(':').pop()),
      master: flagList.includes('master'),
      masterId,
      healthy: link === 'connected' && !flagList.some((f) => ['fail', 'fail?', 'handshake', 'noaddr'].includes(f)),
      // `[slot->-id]` and `[slot-<-id]` are slots being migrated: none here.
      slots: slots
        .filter((s) => !s.startsWith('['))
        .map((range) => {
          const [first, last = first] = range.split('-').map(Number);
          return [first, last] as [number, number];
        }),
    };
  });
}

/** The slot map and the roles as one string, for "do all nodes agree?". */
function mapOf(view: NodeLine[]): string {
  const describe = (n: NodeLine): string =>
    `${n.id} ${n.port} ${n.master ? 'master' : `replica of ${n.masterId}`} ${n.slots.map((r) => r.join('-')).join(',')}`;
  return view.map(describe).sort().join('\n');
}

const ask = async (port: number, ...args: string[]): Promise<string> => bulkText(await roundTrip(port, command(...args)));

/**
 * Null once every node says cluster_state:ok, sees all six nodes healthy with
 * three masters covering every slot, agrees with the others on who serves
 * what, and (for a replica) has its link to the master up; else what is missing.
 */
async function unsettled(nodes: ClusterNode[]): Promise<string | null> {
  let agreed: string | null = null;
  for (const node of nodes) {
    if (!/^cluster_state:ok\r?$/m.test(await ask(node.port, 'CLUSTER', 'INFO'))) return `node ${node.port}: cluster_state not ok`;
    const view = parseClusterNodes(await ask(node.port, 'CLUSTER', 'NODES'));
    const masters = view.filter((n) => n.master && n.slots.length > 0);
    const covered = masters.flatMap((n) => n.slots).reduce((sum, [first, last]) => sum + last - first + 1, 0);
    const replicas = view.filter((n) => !n.master && masters.some((m) => m.id === n.masterId));
    if (view.length !== NODES || masters.length !== MASTERS || replicas.length !== NODES - MASTERS || covered !== SLOTS) {
      return `node ${node.port} sees ${masters.length} masters over ${covered} slots and ${replicas.length} replicas of ${view.length} nodes`;
    }
    const sick = view.find((n) => !n.healthy);
    if (sick) return `node ${node.port} sees node ${sick.port} as not healthy`;
    const map = mapOf(view);
    if (agreed !== null && map !== agreed) return `node ${node.port} sees another slot map than node ${nodes[0].port}`;
    agreed = map;
    const replication = await ask(node.port, 'INFO', 'replication');
    if (/^role:slave\r?$/m.test(replication) && !/^master_link_status:up\r?$/m.test(replication)) {
      return `replica ${node.port}: link to its master not up yet`;
    }
  }
  return null;
}

async function startNode(bin: string, dir: string): Promise<ClusterNode> {
  const port = await freePortWithCompanion(BUS_PORT_OFFSET);
  const nodeDir = path.join(dir, `cluster-node-${port}`);
  await mkdir(nodeDir);
  const args = [...redisArgs(port, nodeDir), '--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf'];
  // A replica's first (diskless) sync starts at once, not after the default 5 s wait for more replicas.
  args.push('--cluster-node-timeout', String(NODE_TIMEOUT_MS), '--repl-diskless-sync-delay', '0');
  const managed = spawnTracked(`redis-server (cluster node ${port})`, bin, args, port);
  try {
    // A node without slots answers GET with -CLUSTERDOWN, so PING alone says it is up.
    await waitUntil(managed.name, [managed], async () => ((await roundTrip(port, PING)) === '+PONG\r\n' ? null : 'no PONG'));
    return { managed, port, id: await ask(port, 'CLUSTER', 'MYID') };
  } catch (error) {
    await managed.stop();
    throw error;
  }
}

/** Six nodes, one cluster, settled; on any error the nodes started so far are stopped again. */
export async function startCluster(redisServer: string, redisCli: string, dir: string): Promise<BenchCluster> {
  const nodes: ClusterNode[] = [];
  try {
    for (let i = 0; i < NODES; i++) nodes.push(await startNode(redisServer, dir));
    const args = ['--cluster', 'create', ...nodes.map((n) => `${HOST}:${n.port}`), '--cluster-replicas', '1', '--cluster-yes'];
    const create = spawnTracked('redis-cli --cluster create', redisCli, args, 0);
    const timer = setTimeout(() => void create.stop(), CREATE_TIMEOUT_MS);
    const status = await create.exited;
    clearTimeout(timer);
    if (status !== 0) throw new Error(`redis-cli ${args.join(' ')} failed (${status}):\n${create.output()}`);
    const managed = nodes.map((n) => n.managed);
    await waitUntil('the Redis Cluster', managed, () => unsettled(nodes), SETTLE_TIMEOUT_MS);
    const view = parseClusterNodes(await ask(nodes[0].port, 'CLUSTER', 'NODES'));
    const shards = view
      .filter((n) => n.master)
      .map((n) => ({ port: n.port, slots: n.slots }))
      .sort((a, b) => a.slots[0][0] - b.slots[0][0]);
    return { nodes, shards };
  } catch (error) {
    await Promise.all(nodes.map((n) => n.managed.stop()));
    throw error;
  }
}

// ------------------------------------------------------------------ the proxy

/**
 * The proxy with `--cluster`, seeded with the masters, the shipped rules as
 * everywhere in the bench, and its admin server on (for the routing check).
 * Ready once the seed listener answers PING and every node listener answers
 * CLUSTER MYID with the id of its node.
 */
export async function startClusterProxy(cluster: BenchCluster): Promise<ClusterProxy> {
  const port = await freePort();
  const adminPort = await freePort();
  const listenerOf = new Map<number, number>();
  for (const node of cluster.nodes) listenerOf.set(node.port, await freePort());
  const listener = (nodePort: number): number => listenerOf.get(nodePort) ?? -1;
  const proxy = spawnProxy(port, [
    '--cluster',
    '--upstream',
    cluster.shards.map((s) => `redis://${HOST}:${s.port}`).join(','),
    '--cluster-port-map',
    cluster.nodes.map((n) => `${HOST}:${n.port}=${listener(n.port)}`).join(','),
    '--admin-listen',
    `${HOST}:${adminPort}`,
  ]);
  try {
    await waitUntil(proxy.name, [proxy], async () => {
      if ((await roundTrip(port, PING)) !== '+PONG\r\n') return 'the seed listener does not answer PING';
      for (const node of cluster.nodes) {
        const id = await ask(listener(node.port), 'CLUSTER', 'MYID');
        if (id !== node.id) return `listener ${listener(node.port)} reaches node ${id}, not ${node.id} (${node.port})`;
      }
      return null;
    });
  } catch (error) {
    await proxy.stop();
    throw error;
  }
  return { managed: proxy, port, adminPort, shards: cluster.shards.map((s) => ({ port: listener(s.port), slots: s.slots })) };
}

// ------------------------------------------------------------------ routing check

/** Connections counted during one run, on all nodes and by the proxy. */
export interface Routing {
  /** Connections the nodes accepted (INFO total_connections_received), the bench's own INFO requests left out. */
  atNodes: number;
  /** Connections the proxy opened to the nodes: upstream connections and topology refreshes (its /metrics). */
  byProxy: number;
  /** Client connections the proxy accepted. */
  proxyClients: number;
}

/** Connections that reached the nodes without the proxy. */
export const bypassing = (r: Routing): number => Math.max(0, r.atNodes - r.byProxy);

async function nodeConnections(cluster: BenchCluster): Promise<number> {
  let sum = 0;
  for (const node of cluster.nodes) {
    const match = /^total_connections_received:(\d+)/m.exec(await ask(node.port, 'INFO', 'stats'));
    if (match === null) throw new Error(`node ${node.port}: no total_connections_received in INFO stats`);
    sum += Number(match[1]);
  }
  return sum;
}

function getMetrics(adminPort: number): Promise<string> {
  return new Promise((resolve, reject) => {
    // No keep-alive: no connection of ours lingers on the admin server.
    const request = http.get({ host: HOST, port: adminPort, path: '/metrics', agent: false, timeout: 5_000 }, (response) => {
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => (body += chunk));
      response.on('end', () => (response.statusCode === 200 ? resolve(body) : reject(new Error(`/metrics: HTTP ${response.statusCode}`))));
    });
    request.on('timeout', () => request.destroy(new Error('/metrics: no answer within 5 s')));
    request.on('error', reject);
  });
}

/** A counter's value, summed over its labels. */
function counter(metrics: string, name: string): number {
  const lines = metrics.split('\n').filter((line) => line.startsWith(`${name} `) || line.startsWith(`${name}{`));
  if (lines.length === 0) throw new Error(`the proxy's /metrics has no ${name}`);
  return lines.reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
}

async function proxyConnections(proxy: ClusterProxy): Promise<{ upstream: number; clients: number }> {
  const metrics = await getMetrics(proxy.adminPort);
  return {
    upstream:
      counter(metrics, 'redis_lock_proxy_upstream_connect_seconds_count') +
      counter(metrics, 'redis_lock_proxy_cluster_topology_refreshes_total'),
    clients: counter(metrics, 'redis_lock_proxy_connections_total'),
  };
}

/**
 * Runs `run` and counts the connections it caused. Every connection the
 * proxy opens counts on both sides; one that reached a node any other way
 * (a client that learnt a real node's address) counts at the nodes only.
 * The proxy is read first before and last after, so its window holds the
 * nodes' window.
 */
export async function withRouting<T>(cluster: BenchCluster, proxy: ClusterProxy, run: () => Promise<T>): Promise<[T, Routing]> {
  const proxyBefore = await proxyConnections(proxy);
  const nodesBefore = await nodeConnections(cluster);
  const value = await run();
  const nodesAfter = await nodeConnections(cluster);
  await sleep(COUNTER_SETTLE_MS);
  const proxyAfter = await proxyConnections(proxy);
  return [
    value,
    {
      // Each INFO request of nodesAfter is a connection of its own, counted by its node.
      atNodes: nodesAfter - nodesBefore - cluster.nodes.length,
      byProxy: proxyAfter.upstream - proxyBefore.upstream,
      proxyClients: proxyAfter.clients - proxyBefore.clients,
    },
  ];
}
