/**
 * The Redis nodes that hold the lock keys: the upstream itself, or, when it is a node of a Redis
 * Cluster, every master (each holds the keys of its own slots). `locks` and the proxy's lock
 * scan read them all, and send a delete to the node that holds the key.
 */
import type { Redis } from 'ioredis';
import { formatAddress } from '../address.js';
import { escapeKey } from '../key-text.js';
import type { UpstreamTls } from '../config.js';
import { askTopology, servesSlot, type SlotRanges } from '../cluster/topology.js';
import { connectRedis, isReplyError, upstreamRedisOptions } from '../upstream/redis-client.js';
import type { UpstreamTarget } from '../upstream/target.js';

export interface LockNode {
  /** host:port, or the socket path. */
  readonly name: string;
  readonly redis: Redis;
  /** Slot ranges served, [start, end] each; empty outside a cluster. */
  readonly slots: SlotRanges;
}

export interface LockNodes {
  readonly nodes: readonly LockNode[];
  /** Whether the nodes are a cluster's masters. */
  readonly cluster: boolean;
  /** The node that holds `key`. */
  nodeFor(key: Buffer): Promise<LockNode>;
  /** The last error a connection reported (it says why a command failed better than the command). */
  lastError(): Error | undefined;
  close(): void;
}

/**
 * Connects to the upstream (or to `at`, the master of the moment behind Sentinel), and in a
 * cluster to every master. Throws when a node cannot be reached; nothing stays open then.
 */
export async function openLockNodes(
  target: UpstreamTarget,
  tls: UpstreamTls | null,
  timeoutMs: number,
  at?: { host: string; port: number },
): Promise<LockNodes> {
  const first = await connectRedis(upstreamRedisOptions(target, tls, timeoutMs, at));
  const name =
    at !== undefined ? formatAddress(at.host, at.port) : (target.path ?? formatAddress(target.host as string, target.port ?? 6379));
  if (!(await isClusterNode(first.redis))) {
    const only: LockNode = { name, redis: first.redis, slots: [] };
    return {
      nodes: [only],
      cluster: false,
      nodeFor: () => Promise.resolve(only),
      lastError: first.lastError,
      close: () => first.redis.disconnect(),
    };
  }
  const seedHost = at?.host ?? (target.host as string);
  const nodes: LockNode[] = [];
  const errors: Array<() => Error | undefined> = [];
  try {
    const masters = (await askTopology(first.redis, seedHost, target.tls)).filter(
      (node) => node.role === 'master' && node.slots.length > 0,
    );
    for (const master of masters) {
      const masterName = formatAddress(master.host, master.port);
      const { redis, lastError } = await connectRedis(upstreamRedisOptions(target, tls, timeoutMs, master)).catch((error: Error) => {
        throw new Error(`master ${masterName}: ${error.message}`, { cause: error });
      });
      nodes.push({ name: masterName, redis, slots: master.slots });
      errors.push(lastError);
    }
  } catch (error) {
    for (const node of nodes) node.redis.disconnect();
    throw error;
  } finally {
    first.redis.disconnect();
  }
  return {
    nodes,
    cluster: true,
    nodeFor: async (key) => {
      const slot = Number(await nodes[0].redis.call('CLUSTER', 'KEYSLOT', key));
      const owner = nodes.find((node) => servesSlot(node.slots, slot));
      if (owner === undefined) throw new Error(`no master serves slot ${slot} of ${escapeKey(key)} (the cluster is being resharded?)`);
      return owner;
    },
    lastError: () => errors.map((get) => get()).find((error) => error !== undefined),
    close: () => {
      for (const node of nodes) node.redis.disconnect();
    },
  };
}

/** Whether the server is a node of a Redis Cluster (INFO cluster: cluster_enabled:1); a server that refuses INFO is taken as standalone. */
async function isClusterNode(redis: Redis): Promise<boolean> {
  try {
    return /^cluster_enabled:1\b/m.test(String(await redis.info('cluster')));
  } catch (error) {
    if (isReplyError(error)) return false; // NOPERM, or INFO renamed away
    throw error;
  }
}
