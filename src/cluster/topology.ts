/**
 * Which nodes a Redis Cluster has, asked of one of its nodes: CLUSTER SHARDS
 * (Redis 7.0+), else CLUSTER NODES. The proxy needs every node a client could
 * be sent to, masters and replicas, with the address the proxy dials.
 */
import type { Redis } from 'ioredis';
import type { UpstreamTls } from '../config.js';
import { TopologyError } from '../errors.js';
import { connectRedis, upstreamRedisOptions } from '../upstream/redis-client.js';
import type { UpstreamTarget } from '../upstream/target.js';

/** Hash slot ranges, [start, end] each (inclusive). */
export type SlotRanges = ReadonlyArray<readonly [number, number]>;

/** Whether `slot` is in one of the ranges. */
export function servesSlot(ranges: SlotRanges, slot: number): boolean {
  return ranges.some(([start, end]) => start <= slot && slot <= end);
}

export interface ClusterNodeInfo {
  readonly id: string;
  /** The address the proxy dials: the node's IP (or endpoint when it announces no IP). */
  readonly host: string;
  readonly port: number;
  /** The announced host name, '' when none. */
  readonly hostname: string;
  readonly role: 'master' | 'replica';
  /** False for a node the cluster marks failed (or not yet reachable). */
  readonly healthy: boolean;
  /** Slot ranges served, [start, end] each (masters). */
  readonly slots: SlotRanges;
}

/** Asks the node at host:port for the cluster's nodes. */
export async function fetchTopology(
  target: UpstreamTarget,
  tls: UpstreamTls | null,
  host: string,
  port: number,
  timeoutMs: number,
): Promise<ClusterNodeInfo[]> {
  let redis: Redis;
  try {
    ({ redis } = await connectRedis(upstreamRedisOptions(target, tls, timeoutMs, { host, port })));
  } catch (err) {
    throw new TopologyError(`cannot connect: ${(err as Error).message}`, { cause: err });
  }
  try {
    return await askTopology(redis, host, tls !== null);
  } finally {
    redis.disconnect();
  }
}

/** Asks the node `redis` is connected to (at `host`, over TLS or not) for the cluster's nodes. */
export async function askTopology(redis: Redis, host: string, tls: boolean): Promise<ClusterNodeInfo[]> {
  try {
    return parseShards(await redis.call('CLUSTER', 'SHARDS'), host, tls);
  } catch (err) {
    const message = (err as Error).message;
    if (/cluster support disabled/i.test(message)) {
      throw new TopologyError('not a cluster node (cluster support disabled): drop --cluster for a standalone Redis', { cause: err });
    }
    // Redis before 7.0 has no SHARDS, and an ACL may allow NODES but not SHARDS: NODES then.
    if (!/unknown subcommand|unknown command|^NOPERM/i.test(message)) {
      throw new TopologyError(`CLUSTER SHARDS failed: ${message}`, { cause: err });
    }
  }
  try {
    return parseNodes(String(await redis.call('CLUSTER', 'NODES')), host);
  } catch (err) {
    throw new TopologyError(`CLUSTER NODES failed: ${(err as Error).message}`, { cause: err });
  }
}

function pairs(value: unknown): Map<string, unknown> {
  const map = new Map<string, unknown>();
  if (!Array.isArray(value)) return map;
  for (let i = 0; i + 1 < value.length; i += 2) map.set(String(value[i]), value[i + 1]);
  return map;
}

/**
 * CLUSTER SHARDS as ioredis returns it to a RESP2 connection (maps as flat
 * arrays). A node may listen on a plain port and a TLS port: the proxy dials
 * the one its seed URLs use.
 */
export function parseShards(reply: unknown, askedHost: string, tls: boolean): ClusterNodeInfo[] {
  if (!Array.isArray(reply)) throw new TopologyError('CLUSTER SHARDS: unexpected reply');
  const nodes: ClusterNodeInfo[] = [];
  for (const shard of reply) {
    const fields = pairs(shard);
    const flat = (fields.get('slots') as unknown[] | undefined)?.map(Number) ?? [];
    const slots: Array<[number, number]> = [];
    for (let i = 0; i + 1 < flat.length; i += 2) slots.push([flat[i], flat[i + 1]]);
    for (const entry of (fields.get('nodes') as unknown[] | undefined) ?? []) {
      const node = pairs(entry);
      const ip = String(node.get('ip') ?? '');
      const endpoint = String(node.get('endpoint') ?? '');
      const port = Number((tls ? (node.get('tls-port') ?? node.get('port')) : (node.get('port') ?? node.get('tls-port'))) ?? 0);
      if (port === 0) continue;
      const role = node.get('role') === 'master' ? 'master' : 'replica';
      nodes.push({
        id: String(node.get('id')),
        host: ip !== '' && ip !== '?' ? ip : endpoint !== '' && endpoint !== '?' ? endpoint : askedHost,
        port,
        hostname: String(node.get('hostname') ?? ''),
        role,
        healthy: node.get('health') === 'online',
        slots: role === 'master' ? slots : [],
      });
    }
  }
  return nodes;
}

/** CLUSTER NODES text: `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`. */
export function parseNodes(text: string, askedHost: string): ClusterNodeInfo[] {
  const nodes: ClusterNodeInfo[] = [];
  for (const line of text.split('\n')) {
    const fields = line.trim().split(' ');
    if (fields.length < 8) continue;
    const [id, address, flagText, , , , , link, ...slotFields] = fields;
    const flags = flagText.split(',');
    if (flags.includes('noaddr') || flags.includes('handshake')) continue;
    const at = address.indexOf('@');
    const hostPort = at === -1 ? address : address.slice(0, at);
    const comma = address.indexOf(',');
    const colon = hostPort.lastIndexOf(':');
    const port = Number(hostPort.slice(colon + 1));
    if (colon === -1 || !(port > 0)) continue;
    const ip = hostPort.slice(0, colon);
    const slots: Array<[number, number]> = [];
    for (const field of slotFields) {
      if (field.startsWith('[')) continue; // a slot being migrated or imported
      const [start, end] = field.split('-').map(Number);
      slots.push([start, end ?? start]);
    }
    nodes.push({
      id,
      host: ip !== '' ? ip : askedHost,
      port,
      hostname: comma === -1 ? '' : address.slice(comma + 1),
      role: flags.includes('master') ? 'master' : 'replica',
      healthy: !flags.includes('fail') && !flags.includes('fail?') && link === 'connected',
      slots,
    });
  }
  return nodes;
}
