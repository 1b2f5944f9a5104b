/**
 * Cluster mode in front of a Redis Cluster that speaks only TLS and wants a
 * password: the proxy dials every node's TLS port trusting the test CA and
 * sends AUTH from the seed URL, while its clients use plain TCP and no password.
 */
import { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCluster, type ClusterNode, type TestCluster } from '../support/cluster.js';
import { expectLockFixedOnEveryMaster, expectNoDirectConnection, keyOn, listenerOf, socketsOf } from '../support/cluster-checks.js';
import { startClusterTestProxy, type ClusterTestProxy } from '../support/proxy.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { makeCertificates, type TestCertificates } from '../support/tls.js';

const PASSWORD = 'secret';

let certs: TestCertificates;
let cluster: TestCluster;
let proxy: ClusterTestProxy;

const seedUrl = (password: string) => `rediss://:${password}@127.0.0.1:${cluster.nodes[0].port}`;
const upstreamTls = () => ({ ca: certs.read(certs.caCert), insecure: false });

beforeAll(async () => {
  certs = makeCertificates();
  cluster = await startCluster({
    tls: { cert: certs.serverCert, key: certs.serverKey, ca: certs.caCert, clientCert: certs.clientCert, clientKey: certs.clientKey },
    password: PASSWORD,
  });
  proxy = await startClusterTestProxy({ upstream: seedUrl(PASSWORD), upstreamTls: upstreamTls() });
}, 90_000);

afterAll(async () => {
  await proxy?.close();
  await cluster?.stop();
  certs?.remove();
});

/** The proxy listener in front of a node's TLS port. */
const proxyPortOf = (node: ClusterNode): number => listenerOf(proxy, node.port);

const listenerPorts = () => new Set(proxy.cluster.nodes().map((n) => n.listenPort));

describe('cluster mode over TLS with a password', () => {
  it('listens for every node, by its TLS port', () => {
    const nodes = proxy.cluster.nodes();
    expect(nodes.map((n) => n.address).sort()).toEqual(cluster.nodes.map((n) => `127.0.0.1:${n.port}`).sort());
    expect(nodes.every((n) => n.listening)).toBe(true);
    expect(nodes.filter((n) => n.role === 'master')).toHaveLength(3);
  });

  it('names only proxy listeners in CLUSTER SLOTS, SHARDS and NODES (RESP2)', async () => {
    const client = await RawClient.connect(proxy.port);
    const slots = await client.call('CLUSTER', 'SLOTS');
    const shards = await client.call('CLUSTER', 'SHARDS');
    const nodes = await client.call('CLUSTER', 'NODES');
    await client.close();

    for (const text of [slots, shards, nodes]) {
      for (const { port } of cluster.nodes)
        expect(text, `real port ${port} in a reply`).not.toMatch(new RegExp(`[:\\n]${port}\\r?\\n|:${port}@`));
    }
    // Every node, masters and replicas, by its listener port.
    const slotPorts = [...slots.matchAll(/\r\n:(\d+)\r\n\$40\r\n/g)].map((m) => Number(m[1]));
    expect(new Set(slotPorts)).toEqual(listenerPorts());
    const shardPorts = [...shards.matchAll(/\$(?:4\r\nport|8\r\ntls-port)\r\n:(\d+)\r\n/g)].map((m) => Number(m[1]));
    expect(new Set(shardPorts)).toEqual(listenerPorts());
    const nodePorts = [...nodes.matchAll(/127\.0\.0\.1:(\d+)@/g)].map((m) => Number(m[1]));
    expect(new Set(nodePorts)).toEqual(listenerPorts());
  });

  it('keeps ioredis Cluster, given only the seed (no TLS, no password), on proxy listeners', async () => {
    const client = new Cluster([{ host: '127.0.0.1', port: proxy.port }], { slotsRefreshTimeout: 2000 });
    try {
      await new Promise((resolve, reject) => client.once('ready', resolve).once('error', reject));
      for (let i = 0; i < 300; i++) await client.set(`spread:${i}`, String(i));
      const values = await Promise.all(Array.from({ length: 300 }, (_, i) => client.get(`spread:${i}`)));
      expect(values).toEqual(Array.from({ length: 300 }, (_, i) => String(i)));
      const held = await Promise.all(
        (await cluster.masters()).map(async (m) => ((await cluster.command(m, 'KEYS', 'spread:*')) as string[]).length),
      );
      expect(
        held.every((count) => count > 0),
        `keys per master: ${held.join(', ')}`,
      ).toBe(true);
      expect(held.reduce((a, b) => a + b)).toBe(300);

      const { local, remote } = socketsOf(client);
      for (const port of remote) expect(listenerPorts().has(port) || port === proxy.port, `client connected to ${port}`).toBe(true);
      await expectNoDirectConnection(cluster, local);
    } finally {
      client.disconnect();
    }
  });

  it("fixes Stalwart's block on a key of every master", () => expectLockFixedOnEveryMaster(cluster, proxy));

  it('rewrites -MOVED to the listener of the node that owns the slot', async () => {
    const [first, second] = await cluster.masters();
    const key = await keyOn(cluster, second, (n) => `k${n}`);
    const slot = cluster.slotOf(key);
    // The node itself names the other node's TLS port...
    await expect(cluster.command(first, 'GET', key)).rejects.toThrow(`MOVED ${slot} 127.0.0.1:${second.port}`);
    // ...the proxy, that node's listener.
    expect(await exchange(proxyPortOf(first), cmd('GET', key), 1)).toBe(`-MOVED ${slot} 127.0.0.1:${proxyPortOf(second)}\r\n`);
  });

  it('refuses to start when the seed URL has the wrong password', async () => {
    const start = startClusterTestProxy({ upstream: seedUrl('wrong'), upstreamTls: upstreamTls() });
    const error = await start.then(
      async (started) => {
        await started.close();
        throw new Error('the proxy started with a wrong password');
      },
      (err: Error) => err,
    );
    expect(error.message).toContain(`cluster: no seed answered CLUSTER SHARDS/NODES (rediss://:***@127.0.0.1:${cluster.nodes[0].port}`);
    expect(error.message).toMatch(/WRONGPASS/);
    expect(error.message).not.toContain('wrong@');
  });
});
