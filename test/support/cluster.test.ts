/**
 * Self-test of the Redis Cluster test helper: topology, local slot hashing
 * against CLUSTER KEYSLOT, CLIENT LIST parsing, resharding and failover.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { slotOf, startCluster, type ClusterNode, type TestCluster } from './cluster.js';

describe('startCluster', () => {
  let cluster: TestCluster;
  beforeAll(async () => {
    cluster = await startCluster();
  });
  afterAll(async () => {
    await cluster?.stop();
  });

  it('has 3 masters and 3 replicas, the masters sorted by slot', async () => {
    const masters = await cluster.masters();
    const replicas = await cluster.replicas();
    expect(masters).toHaveLength(3);
    expect(replicas).toHaveLength(3);
    const ports = (nodes: ClusterNode[]) => nodes.map((n) => n.port).sort();
    expect(ports([...masters, ...replicas])).toEqual(ports(cluster.nodes));
    // redis-cli gives the masters 0-5460, 5461-10922 and 10923-16383.
    expect(await cluster.nodeFor('{06S}')).toBe(masters[0]); // slot 0
    expect(await cluster.nodeFor('{apX}')).toBe(masters[2]); // slot 16383
    // replicas()[i] replicates masters()[i].
    for (const [i, replica] of replicas.entries()) {
      const role = (await cluster.command(replica, 'ROLE')) as unknown[];
      expect(role.slice(0, 3)).toEqual(['slave', '127.0.0.1', masters[i].port]);
    }
  });

  it('computes the same slots as CLUSTER KEYSLOT', async () => {
    const keys: Array<string | Buffer> = [
      '123456789', // CRC16/XMODEM check value 0x31c3 -> slot 12739
      'foo',
      '{user1000}.following',
      '{user1000}.followers',
      'foo{}{bar}', // empty first tag: the whole key is hashed
      'foo{{bar}}zap', // tag is "{bar"
      'foo{bar}{zap}', // tag is "bar"
      '{',
      '}{',
      '',
      'ключ{ü}',
      Buffer.from([0x17, 1, 2, 3]),
      Buffer.from([0xff, 0x7b, 0x80, 0x00, 0x7d, 0xfe]), // binary hashtag
    ];
    expect(slotOf('123456789')).toBe(12739);
    expect(slotOf('{06S}')).toBe(0);
    expect(slotOf('{apX}')).toBe(16383);
    for (const key of keys) {
      expect(cluster.slotOf(key), `slot of ${JSON.stringify(key)}`).toBe(
        await cluster.command(cluster.nodes[0], 'CLUSTER', 'KEYSLOT', key),
      );
    }
  });

  it('lists the clients of a node without the asking connection', async () => {
    const [master] = await cluster.masters();
    const probe = new Redis({ host: master.host, port: master.port, connectionName: 'probe', lazyConnect: true });
    await probe.connect();
    try {
      await probe.ping();
      const clients = await cluster.clientList(master);
      const mine = clients.filter((c) => c.name === 'probe');
      expect(mine).toHaveLength(1);
      expect(mine[0].laddr).toBe(`127.0.0.1:${master.port}`);
      expect(mine[0].addr).toBe(`127.0.0.1:${(probe.stream as { localPort?: number }).localPort}`);
      expect(mine[0].cmd).toBe('ping');
      expect(clients.some((c) => c.cmd === 'client|list')).toBe(false);
      // Besides the probe only the replica's replication link (flags=S) remains.
      expect(clients.filter((c) => c.name !== 'probe').map((c) => c.flags)).toEqual(['S']);
    } finally {
      probe.disconnect();
    }
  });

  it('migrates a slot with its keys to another master', async () => {
    const keys = ['{mig}a', '{mig}b', Buffer.concat([Buffer.from('{mig}'), Buffer.from([0x00, 0xff])])];
    const slot = cluster.slotOf('{mig}');
    const from = await cluster.nodeFor('{mig}');
    const to = (await cluster.masters()).find((m) => m !== from)!;
    for (const [i, key] of keys.entries()) await cluster.command(from, 'SET', key, `v${i}`);

    let askedDuringMigration = '';
    await cluster.migrateSlot(slot, from, to, {
      onMigrating: async () => {
        // A key the source does not have is redirected to the target meanwhile.
        askedDuringMigration = await cluster.command(from, 'GET', '{mig}absent').then(
          () => 'no error',
          (err: Error) => err.message,
        );
      },
    });

    expect(askedDuringMigration).toBe(`ASK ${slot} 127.0.0.1:${to.port}`);
    expect(await cluster.nodeFor('{mig}')).toBe(to);
    for (const [i, key] of keys.entries()) {
      expect(await cluster.command(to, 'GET', key)).toBe(`v${i}`);
      await expect(cluster.command(from, 'GET', key)).rejects.toThrow(`MOVED ${slot} 127.0.0.1:${to.port}`);
    }
    // MIGRATE's cached connection to the target was closed.
    expect((await cluster.clientList(to)).filter((c) => c.cmd === 'restore-asking')).toEqual([]);
  });

  it('fails over to a replica without losing writes', async () => {
    const [oldMaster] = await cluster.masters();
    const [replica] = await cluster.replicas();
    const key = '{06S}failover'; // slot 0: owned by the first master
    await cluster.command(oldMaster, 'SET', key, 'kept');

    await cluster.failover(replica);

    expect((await cluster.masters())[0]).toBe(replica);
    expect(await cluster.replicas()).toContain(oldMaster);
    expect(((await cluster.command(oldMaster, 'ROLE')) as unknown[])[0]).toBe('slave');
    expect(await cluster.nodeFor(key)).toBe(replica);
    expect(await cluster.command(replica, 'GET', key)).toBe('kept');
    await expect(cluster.command(oldMaster, 'GET', key)).rejects.toThrow(`MOVED 0 127.0.0.1:${replica.port}`);
    await expect(cluster.failover(replica)).rejects.toThrow(`node 127.0.0.1:${replica.port} is not a replica`);
  });
});

describe('startCluster with an announced hostname', () => {
  let cluster: TestCluster;
  beforeAll(async () => {
    cluster = await startCluster({ announceHostname: 'localhost', preferredEndpointType: 'hostname' });
  });
  afterAll(async () => {
    await cluster?.stop();
  });

  it('names nodes by hostname in CLUSTER SLOTS and redirects', async () => {
    const [first] = await cluster.masters();
    const slots = (await cluster.command(first, 'CLUSTER', 'SLOTS')) as Array<[number, number, unknown[]]>;
    expect(slots.every(([, , master]) => master[0] === 'localhost')).toBe(true);
    const owner = await cluster.nodeFor('{apX}');
    expect(owner).not.toBe(first);
    await expect(cluster.command(first, 'GET', '{apX}')).rejects.toThrow(`MOVED 16383 localhost:${owner.port}`);
  });
});
