/**
 * Checks shared by the cluster-mode tests: which proxy listener fronts a
 * node, keys a given master serves, and proof that a cluster client never
 * reached a node directly.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Cluster, Redis } from 'ioredis';
import { expect } from 'vitest';
import type { ClusterNode, TestCluster } from './cluster.js';
import type { ClusterTestProxy } from './proxy.js';
import { exchange } from './resp.js';
import { attemptReplies, lockAttempt, taskLockKey } from './stalwart.js';

/** The proxy listener in front of the node at 127.0.0.1:`realPort`. */
export function listenerOf(proxy: ClusterTestProxy, realPort: number): number {
  const node = proxy.cluster.nodes().find((n) => n.address === `127.0.0.1:${realPort}`);
  if (node === undefined) throw new Error(`no listener for node 127.0.0.1:${realPort}`);
  return node.listenPort;
}

/** The first key `make(n)` whose slot `master` serves (slots hashed locally, ranges from CLUSTER SLOTS). */
export async function keyOn<K extends Buffer | string>(cluster: TestCluster, master: ClusterNode, make: (n: number) => K): Promise<K> {
  const ranges = (await cluster.command(master, 'CLUSTER', 'SLOTS')) as Array<[number, number, [string, number]]>;
  const own = ranges.filter(([, , [, port]]) => port === master.port);
  for (let n = 0; n < 100_000; n++) {
    const slot = cluster.slotOf(make(n));
    if (own.some(([start, end]) => start <= slot && slot <= end)) return make(n);
  }
  throw new Error(`no key found for node ${master.port}`);
}

/** Local ports of the sockets a cluster client opened, and the ports it connected to. */
export function socketsOf(client: Cluster): { local: Set<number>; remote: Set<number> } {
  const local = new Set<number>();
  const remote = new Set<number>();
  for (const node of client.nodes('all')) {
    const stream = (node as Redis & { stream?: { localPort?: number } }).stream;
    if (stream?.localPort !== undefined) local.add(stream.localPort);
    remote.add(Number(node.options.port));
  }
  return { local, remote };
}

/**
 * Asserts that no node has a client connection coming from one of `localPorts` (the client's own
 * sockets). Replication links (flags S and M) are not clients: Linux may give one the same local
 * port as a client socket that goes elsewhere.
 */
export async function expectNoDirectConnection(cluster: TestCluster, localPorts: Set<number>): Promise<void> {
  for (const node of cluster.nodes) {
    const clients = (await cluster.clientList(node)).filter((c) => !/[SM]/.test(c.flags));
    const direct = clients.filter((c) => localPorts.has(Number(c.addr.split(':').pop())));
    expect(direct, `connections from the client straight to node ${node.port}`).toEqual([]);
  }
}

/** Stalwart's exact block through each master's listener: the first takes the lock, the second does not push the lease forward. */
export async function expectLockFixedOnEveryMaster(cluster: TestCluster, proxy: ClusterTestProxy): Promise<void> {
  for (const master of await cluster.masters()) {
    const key = await keyOn(cluster, master, (n) => taskLockKey(BigInt(1000 + n)));
    const port = listenerOf(proxy, master.port);
    expect(await exchange(port, lockAttempt(key, 60), 4)).toBe(attemptReplies(1, 1));
    await cluster.command(master, 'PEXPIRE', key, 5000);
    // Redis alone answers the expiry 1; the lease left at 5 s, not re-armed to 60, is the fix.
    expect(await exchange(port, lockAttempt(key, 60), 4)).toBe(attemptReplies(2, 1));
    expect(Number(await cluster.command(master, 'PTTL', key))).toBeLessThanOrEqual(5000);
  }
}

/**
 * Waits until `check` holds of the proxy's node listeners; on timeout the
 * error carries the proxy's cluster log lines (refreshes, binds), which say why.
 */
export async function waitForListeners(
  proxy: ClusterTestProxy,
  what: string,
  check: (nodes: ReturnType<ClusterTestProxy['cluster']['nodes']>) => boolean,
  timeoutMs = 10_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check(proxy.cluster.nodes())) {
    if (Date.now() > deadline) {
      const lines = proxy.logs().filter((line) => String(line.msg).startsWith('cluster:'));
      throw new Error(
        `timed out after ${timeoutMs} ms waiting for ${what}; listeners: ${JSON.stringify(proxy.cluster.nodes())}; log: ${JSON.stringify(lines.slice(-20))}`,
      );
    }
    await sleep(50);
  }
}
