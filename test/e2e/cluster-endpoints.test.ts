/**
 * cluster-preferred-endpoint-type hostname and unknown-endpoint: the node
 * addresses a client learns take other forms, and the proxy must still
 * replace every one of them with its own listeners.
 */
import { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCluster, type StartClusterOptions, type TestCluster } from '../support/cluster.js';
import { listenerOf } from '../support/cluster-checks.js';
import { startClusterTestProxy, type ClusterTestProxy } from '../support/proxy.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';

/** One cluster and a proxy in front of it, for the tests of one describe block. */
function clusterFixture(options: StartClusterOptions, announceHost?: string) {
  const fixture = { cluster: undefined as unknown as TestCluster, proxy: undefined as unknown as ClusterTestProxy };
  beforeAll(async () => {
    fixture.cluster = await startCluster(options);
    fixture.proxy = await startClusterTestProxy({ upstream: `redis://127.0.0.1:${fixture.cluster.nodes[0].port}`, announceHost });
  }, 90_000);
  afterAll(async () => {
    await fixture.proxy?.close();
    await fixture.cluster?.stop();
  });
  return fixture;
}

/** The first master, a key it does not own, and the master that owns it. */
async function misdirected(cluster: TestCluster) {
  const [first, second] = await cluster.masters();
  for (let n = 0; ; n++) {
    const key = taskLockKey(BigInt(n));
    if ((await cluster.nodeFor(key)).port === second.port) return { asked: first, owner: second, key, slot: cluster.slotOf(key) };
  }
}

describe('cluster-preferred-endpoint-type hostname', () => {
  const f = clusterFixture({ announceHostname: 'localhost', preferredEndpointType: 'hostname' }, 'localhost');

  it('replaces the host name in -MOVED, CLUSTER SLOTS and NODES with the announce host and listener ports', async () => {
    const { asked, owner, key, slot } = await misdirected(f.cluster);
    expect(await exchange(asked.port, cmd('GET', key), 1)).toBe(`-MOVED ${slot} localhost:${owner.port}\r\n`);
    expect(await exchange(listenerOf(f.proxy, asked.port), cmd('GET', key), 1)).toBe(
      `-MOVED ${slot} localhost:${listenerOf(f.proxy, owner.port)}\r\n`,
    );

    const client = await RawClient.connect(f.proxy.port);
    const slots = await client.call('CLUSTER', 'SLOTS');
    const nodes = await client.call('CLUSTER', 'NODES');
    await client.close();
    for (const node of f.cluster.nodes) {
      expect(slots).not.toContain(`:${node.port}\r\n`);
      expect(nodes).toContain(`localhost:${listenerOf(f.proxy, node.port)}@${node.port + 10_000},localhost `);
    }
  });

  it('serves ioredis Cluster and the lock fix through the host names', async () => {
    const client = new Cluster([{ host: 'localhost', port: f.proxy.port }]);
    try {
      for (let i = 0; i < 50; i++) await client.set(`h:${i}`, String(i));
      expect(await client.get('h:49')).toBe('49');
      const listeners = new Set(f.proxy.cluster.nodes().map((n) => n.listenPort));
      for (const node of client.nodes('all'))
        expect(listeners.has(Number(node.options.port)) || node.options.port === f.proxy.port).toBe(true);
    } finally {
      client.disconnect();
    }
    const { owner, key } = await misdirected(f.cluster);
    expect(await exchange(listenerOf(f.proxy, owner.port), lockAttempt(key, 60), 4)).toBe(attemptReplies(1, 1));
  });
});

describe('cluster-preferred-endpoint-type unknown-endpoint', () => {
  const f = clusterFixture({ preferredEndpointType: 'unknown-endpoint' });

  it('keeps the empty host in -MOVED and the null host in CLUSTER SLOTS, with listener ports', async () => {
    const { asked, owner, key, slot } = await misdirected(f.cluster);
    expect(await exchange(asked.port, cmd('GET', key), 1)).toBe(`-MOVED ${slot} :${owner.port}\r\n`);
    expect(await exchange(listenerOf(f.proxy, asked.port), cmd('GET', key), 1)).toBe(
      `-MOVED ${slot} :${listenerOf(f.proxy, owner.port)}\r\n`,
    );
    expect(await exchange(listenerOf(f.proxy, asked.port), lockAttempt(key, 60), 4)).toBe(
      `+OK\r\n-MOVED ${slot} :${listenerOf(f.proxy, owner.port)}\r\n-MOVED ${slot} :${listenerOf(f.proxy, owner.port)}\r\n-EXECABORT Transaction discarded because of previous errors.\r\n`,
    );

    const slots = await exchange(f.proxy.port, cmd('CLUSTER', 'SLOTS'), 1);
    expect(slots).toContain('$-1\r\n');
    for (const node of f.cluster.nodes) expect(slots).not.toContain(`:${node.port}\r\n`);
    for (const node of f.proxy.cluster.nodes()) expect(slots).toContain(`:${node.listenPort}\r\n`);
  });
});
