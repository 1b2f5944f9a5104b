/**
 * Cluster mode against a real local Redis Cluster (3 masters, 3 replicas):
 * clients learn only the proxy's addresses, lock blocks are fixed on every
 * master, and redirects, slot migration and failover work through the proxy.
 */
import { once } from 'node:events';
import net from 'node:net';
import { Cluster, type ClusterOptions } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCluster, startSpareNode, type ClusterNode, type SpareNode, type TestCluster } from '../support/cluster.js';
import {
  expectLockFixedOnEveryMaster,
  expectNoDirectConnection,
  keyOn,
  listenerOf,
  socketsOf,
  waitForListeners,
} from '../support/cluster-checks.js';
import { cleanEnv, Cli, ensureBuilt, runCli } from '../support/cli.js';
import { startClusterTestProxy, type ClusterTestProxy } from '../support/proxy.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { closedPort, freePort, freePortRange, isPortFree } from '../support/ports.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';
import { runOp } from '../support/ops.js';
import { describeKey, keyArgument } from '../../src/key-text.js';
import { run as locks } from '../../src/ops/locks.js';

let cluster: TestCluster;
let proxy: ClusterTestProxy;
/** What the nodes' server can do (CLUSTER SHARDS from 7.0 on). */
let facts: ServerFacts;

beforeAll(async () => {
  cluster = await startCluster();
  const link = await RawClient.connect(cluster.nodes[0].port);
  facts = await serverFacts(link);
  await link.close();
  proxy = await startClusterTestProxy({ upstream: `redis://127.0.0.1:${cluster.nodes[0].port}`, refreshMs: 300 });
}, 90_000);

afterAll(async () => {
  await proxy?.close();
  await cluster?.stop();
});

/** The proxy listener in front of a real node port. */
const proxyPortOf = (realPort: number): number => listenerOf(proxy, realPort);

function realPorts(): Set<number> {
  return new Set(cluster.nodes.map((n) => n.port));
}

function listenerPorts(): Set<number> {
  return new Set(proxy.cluster.nodes().map((n) => n.listenPort));
}

/** A redirect as Redis sends it from a real node, with the real port replaced by its proxy listener. */
function viaProxy(text: string): string {
  return text.replace(
    /(MOVED|ASK) (\d+) 127\.0\.0\.1:(\d+)/g,
    (_, kind: string, slot: string, port: string) => `${kind} ${slot} 127.0.0.1:${proxyPortOf(Number(port))}`,
  );
}

async function newClusterClient(options: ClusterOptions = {}): Promise<Cluster> {
  const client = new Cluster([{ host: '127.0.0.1', port: proxy.port }], {
    ...options,
    slotsRefreshTimeout: 2000,
    redisOptions: { maxRetriesPerRequest: 5 },
  });
  await new Promise<void>((resolve, reject) => {
    client.once('ready', resolve);
    client.once('error', reject);
  });
  return client;
}

/**
 * Moves a slot and its keys to a node the test support does not manage (it
 * has no replica, so the support's migrateSlot would wait for one forever).
 */
async function handOver(slot: number, from: { port: number; id: string }, to: { port: number; id: string }): Promise<void> {
  const send = async (port: number, ...args: string[]) => {
    const reply = await exchange(port, cmd(...args), 1);
    if (reply.startsWith('-')) throw new Error(`${args.join(' ')} on ${port}: ${reply.trim()}`);
    return reply;
  };
  await send(to.port, 'CLUSTER', 'SETSLOT', String(slot), 'IMPORTING', from.id);
  await send(from.port, 'CLUSTER', 'SETSLOT', String(slot), 'MIGRATING', to.id);
  for (;;) {
    const keys = [...(await send(from.port, 'CLUSTER', 'GETKEYSINSLOT', String(slot), '100')).matchAll(/\$\d+\r\n([^\r]*)\r\n/g)].map(
      (m) => m[1],
    );
    if (keys.length === 0) break;
    await send(from.port, 'MIGRATE', '127.0.0.1', String(to.port), '', '0', '2000', 'KEYS', ...keys);
  }
  await send(to.port, 'CLUSTER', 'SETSLOT', String(slot), 'NODE', to.id);
  // A master that gives away its last slot becomes a replica of the taker (cluster-allow-replica-migration): then it refuses SETSLOT.
  await send(from.port, 'CLUSTER', 'SETSLOT', String(slot), 'NODE', to.id).catch((err: Error) =>
    expect(err.message).toMatch(/only with masters/),
  );
  for (const node of await cluster.masters()) await send(node.port, 'CLUSTER', 'SETSLOT', String(slot), 'NODE', to.id);
}

/**
 * A TCP listener where nothing should connect: at `port` (where the clients of
 * a node there would go) and at `port + 10000` (its cluster bus), each
 * counting the connections it gets.
 */
async function startTrap(): Promise<{ port: number; connections: () => number; busConnections: () => number; close(): Promise<void> }> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = await freePort();
    if (port + 10_000 > 65_535 || !(await isPortFree(port + 10_000))) continue;
    const counts = [0, 0];
    const servers = [port, port + 10_000].map((p, i) =>
      net
        .createServer((socket) => {
          counts[i]++;
          socket.destroy();
        })
        .listen(p, '127.0.0.1'),
    );
    try {
      await Promise.all(servers.map((server) => once(server, 'listening')));
    } catch {
      for (const server of servers) server.close();
      continue;
    }
    return {
      port,
      connections: () => counts[0],
      busConnections: () => counts[1],
      close: async () => {
        await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
      },
    };
  }
  throw new Error('no free port p with p + 10000 also free');
}

describe('cluster mode: what clients learn', () => {
  it('listens for every node, masters and replicas', () => {
    const nodes = proxy.cluster.nodes();
    expect(nodes.map((n) => n.address).sort()).toEqual(cluster.nodes.map((n) => `127.0.0.1:${n.port}`).sort());
    expect(nodes.every((n) => n.listening)).toBe(true);
    expect(nodes.filter((n) => n.role === 'master')).toHaveLength(3);
  });

  it('names only proxy listeners in CLUSTER SLOTS, SHARDS, NODES and REPLICAS, in RESP2 and RESP3', async () => {
    for (const protocol of ['2', '3']) {
      const client = await RawClient.connect(proxy.port);
      if (protocol === '3') await client.call('HELLO', '3');
      const slots = await client.call('CLUSTER', 'SLOTS');
      const shards = await client.call('CLUSTER', 'SHARDS');
      const nodes = await client.call('CLUSTER', 'NODES');
      const master = (await cluster.masters())[0];
      const replicas = await client.call('CLUSTER', 'REPLICAS', master.id);
      await client.close();

      for (const text of [slots, shards, nodes, replicas]) {
        for (const port of realPorts())
          expect(text, `real port ${port} in a reply`).not.toMatch(new RegExp(`[:\\n]${port}\\r?\\n|:${port}@`));
      }
      // Every node appears with its listener port.
      const nodePorts = [...nodes.matchAll(/127\.0\.0\.1:(\d+)@/g)].map((m) => Number(m[1]));
      expect(new Set(nodePorts)).toEqual(listenerPorts());
      expect(replicas).toMatch(new RegExp(`127\\.0\\.0\\.1:${proxyPortOf((await cluster.replicas())[0].port)}@`));
      // The bus port is left alone: clients never use it.
      expect(nodes).toContain(`@${cluster.nodes[0].port + 10_000}`);
    }
  });

  it('rewrites -MOVED to the listener of the node that owns the slot', async () => {
    const [first, second] = await cluster.masters();
    const key = await keyOn(cluster, second, (n) => `k${n}`);
    const direct = await exchange(first.port, cmd('GET', key), 1);
    expect(direct).toMatch(/^-MOVED \d+ 127\.0\.0\.1:\d+\r\n$/);
    expect(await exchange(proxyPortOf(first.port), cmd('GET', key), 1)).toBe(viaProxy(direct));
  });

  it('rewrites CLUSTER SLOTS and NODES replies inside a transaction', async () => {
    const node = cluster.nodes[0];
    const block = Buffer.concat([cmd('MULTI'), cmd('CLUSTER', 'SLOTS'), cmd('PING'), cmd('CLUSTER', 'NODES'), cmd('EXEC')]);
    const proxied = await exchange(proxyPortOf(node.port), block, 5);
    const slots = await exchange(node.port, cmd('CLUSTER', 'SLOTS'), 1);
    const withListeners = slots.replace(/:(\d+)\r\n\$40\r\n/g, (_, port: string) => `:${proxyPortOf(Number(port))}\r\n$40\r\n`);
    expect(proxied.startsWith(`+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n${withListeners}+PONG\r\n`)).toBe(true);
    const nodePorts = [...proxied.matchAll(/127\.0\.0\.1:(\d+)@/g)].map((m) => Number(m[1]));
    expect(new Set(nodePorts)).toEqual(listenerPorts());
  });

  it('rewrites redirects nested in EXEC arrays', async () => {
    const [first, second] = await cluster.masters();
    // A script can return any error value, a redirect too; inside MULTI it lands in the EXEC array.
    const script = `return {redis.error_reply('MOVED 42 127.0.0.1:${second.port}'), redis.error_reply('ASK 43 127.0.0.1:${first.port}')}`;
    const block = Buffer.concat([cmd('MULTI'), cmd('EVAL', script, '0'), cmd('EXEC')]);
    const direct = await exchange(first.port, block, 3);
    expect(direct).toBe(`+OK\r\n+QUEUED\r\n*1\r\n*2\r\n-MOVED 42 127.0.0.1:${second.port}\r\n-ASK 43 127.0.0.1:${first.port}\r\n`);
    expect(await exchange(proxyPortOf(first.port), block, 3)).toBe(viaProxy(direct));
  });

  it('rewrites redirects that arrive split across reads, among other replies', async () => {
    const [first, second] = await cluster.masters();
    const here = await keyOn(cluster, first, (n) => `small:${n}`);
    const there = await keyOn(cluster, second, (n) => `k${n}`);
    await cluster.command(first, 'SET', here, 'v'.repeat(21));
    // About half the bytes are -MOVED lines, so most of the reads the proxy makes end inside one.
    const pipeline = Buffer.concat(Array.from({ length: 40_000 }, (_, i) => cmd('GET', i % 3 === 0 ? here : there)));
    const [direct, proxied] = await Promise.all([
      exchange(first.port, pipeline, 40_000),
      exchange(proxyPortOf(first.port), pipeline, 40_000),
    ]);
    expect(proxied.length).toBeGreaterThan(1_000_000);
    expect(proxied === viaProxy(direct)).toBe(true);
  });

  it('keeps ioredis Cluster, given only the seed, on proxy listeners', async () => {
    const client = await newClusterClient();
    try {
      for (let i = 0; i < 300; i++) await client.set(`spread:${i}`, String(i));
      const values = await Promise.all(Array.from({ length: 300 }, (_, i) => client.get(`spread:${i}`)));
      expect(values).toEqual(Array.from({ length: 300 }, (_, i) => String(i)));

      const { local, remote } = socketsOf(client);
      for (const port of remote) expect(listenerPorts().has(port) || port === proxy.port, `client connected to ${port}`).toBe(true);
      await expectNoDirectConnection(cluster, local);
      // The proxy did connect to every master on the client's behalf.
      for (const master of await cluster.masters()) {
        expect((await cluster.clientList(master)).filter((c) => c.flags === 'N').length).toBeGreaterThan(0);
      }
    } finally {
      client.disconnect();
    }
  });

  it('finds the nodes with CLUSTER NODES where CLUSTER SHARDS is unavailable (Redis before 7.0, or an ACL)', async () => {
    const everyNode = (...args: string[]) => Promise.all(cluster.nodes.map((n) => cluster.command(n, 'ACL', ...args)));
    // An ACL takes CLUSTER SHARDS away where the server has it; before 7.0 there is none.
    const shards = facts.has('cluster-shards');
    await everyNode('SETUSER', 'no-shards', 'on', '>pw', '~*', ...facts.allChannels(), '+@all', ...(shards ? ['-cluster|shards'] : []));
    const limited = await startClusterTestProxy({ upstream: `redis://no-shards:pw@127.0.0.1:${cluster.nodes[0].port}` });
    try {
      expect(
        limited.cluster
          .nodes()
          .map((n) => n.address)
          .sort(),
      ).toEqual(
        proxy.cluster
          .nodes()
          .map((n) => n.address)
          .sort(),
      );
      expect(limited.cluster.nodes().filter((n) => n.role === 'master')).toHaveLength(3);
      const refused = await exchange(limited.port, cmd('CLUSTER', 'SHARDS'), 1);
      if (shards) expect(refused).toMatch(/^-NOPERM/);
      else expect(refused).toBe(await exchange(cluster.nodes[0].port, cmd('CLUSTER', 'SHARDS'), 1)); // the node's own refusal
      const slots = await exchange(limited.port, cmd('CLUSTER', 'SLOTS'), 1);
      for (const node of limited.cluster.nodes()) expect(slots).toContain(`:${node.listenPort}\r\n`);
    } finally {
      await limited.close();
      await everyNode('DELUSER', 'no-shards');
    }
  });

  it('passes READONLY through: reads scaled to replicas go to them via their listeners', async () => {
    const client = await newClusterClient({ scaleReads: 'slave' });
    try {
      await client.set('scaled-read', 'v');
      await cluster.waitHealthy();
      for (let i = 0; i < 20; i++) expect(await client.get('scaled-read')).toBe('v');
      const readonly = (await Promise.all((await cluster.replicas()).map((r) => cluster.clientList(r))))
        .flat()
        .filter((c) => c.flags.includes('r'));
      expect(readonly.length).toBeGreaterThan(0);
      await expectNoDirectConnection(cluster, socketsOf(client).local);
    } finally {
      client.disconnect();
    }
  });
});

describe('cluster mode: lock blocks', () => {
  it("fixes Stalwart's block on a key of every master", () => expectLockFixedOnEveryMaster(cluster, proxy));

  it('answers a block sent to the wrong node exactly as Redis does, addresses rewritten', async () => {
    const [owner, other] = await cluster.masters();
    const key = await keyOn(cluster, owner, (n) => taskLockKey(BigInt(5000 + n)));
    const direct = await exchange(other.port, lockAttempt(key, 60), 4);
    expect(direct).toMatch(
      /^\+OK\r\n-MOVED \d+ 127\.0\.0\.1:\d+\r\n-MOVED .*\r\n-EXECABORT Transaction discarded because of previous errors\.\r\n$/,
    );
    expect(await exchange(proxyPortOf(other.port), lockAttempt(key, 60), 4)).toBe(viaProxy(direct));
    expect(await cluster.command(owner, 'EXISTS', key)).toBe(0);
  });

  it('gives the same replies with --lock-method script (the script is refused, the original block answered by Redis)', async () => {
    const scripted = await startClusterTestProxy({ upstream: `redis://127.0.0.1:${cluster.nodes[0].port}`, lockMethod: 'script' });
    try {
      const [owner, other] = await cluster.masters();
      const good = await keyOn(cluster, other, (n) => taskLockKey(BigInt(7000 + n)));
      const wrong = await keyOn(cluster, owner, (n) => taskLockKey(BigInt(8000 + n)));
      const direct = await exchange(other.port, lockAttempt(wrong, 60), 4);
      const client = await RawClient.connect(
        scripted.cluster.nodes().find((n) => n.address === `127.0.0.1:${other.port}`)?.listenPort as number,
      );
      client.write(Buffer.concat([lockAttempt(good, 60), lockAttempt(wrong, 60), cmd('PING')]));
      const replies = (await client.readReplies(9)).toString('latin1');
      await client.close();
      const ownerListener = scripted.cluster.nodes().find((n) => n.address === `127.0.0.1:${owner.port}`)?.listenPort;
      expect(replies).toBe(attemptReplies(1, 1) + direct.replace(/127\.0\.0\.1:\d+/g, `127.0.0.1:${ownerListener}`) + '+PONG\r\n');
      expect([scripted.stats.rewrittenBy.script, scripted.stats.fallbacks.get('MOVED')]).toEqual([1, 1]);
      expect(await cluster.command(owner, 'EXISTS', wrong)).toBe(0);
    } finally {
      await scripted.close();
    }
  });
});

describe('cluster mode: lock keys on every master', () => {
  /**
   * One lock key on each master, taken through the proxy: the first one contended (a normal lock),
   * the second one abandoned (it lost its expiry).
   */
  async function lockOnEveryMaster(base: number): Promise<Array<{ master: ClusterNode; key: Buffer }>> {
    const placed = [];
    for (const [i, master] of (await cluster.masters()).entries()) {
      const key = await keyOn(cluster, master, (n) => taskLockKey(BigInt(base + 100 * i + n)));
      expect(await exchange(proxyPortOf(master.port), lockAttempt(key, 600), 4)).toBe(attemptReplies(1, 1));
      if (i === 0) expect(await exchange(proxyPortOf(master.port), lockAttempt(key, 600), 4)).toBe(attemptReplies(2, 1));
      if (i === 1) expect(await cluster.command(master, 'PERSIST', key)).toBe(1);
      placed.push({ master, key });
    }
    return placed;
  }

  const runLocks = (args: string[]) => runOp(locks, args);

  it('locks, given one node, reads every master, and deletes each key on the master that holds it', async () => {
    const placed = await lockOnEveryMaster(20_000);
    const seed = ['--upstream', `redis://127.0.0.1:${cluster.nodes[0].port}`, '--stalwart', '0.16.5'];
    const listed = await runLocks([...seed, '--json', '--recheck-ms', '50']);
    expect(listed.stderr).toBe('');
    const rows = listed.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as { key_hex: string; node: string; flagged: boolean });
    for (const { master, key } of placed) {
      expect(rows.find((row) => row.key_hex === key.toString('hex'))).toMatchObject({ node: `127.0.0.1:${master.port}` });
    }
    const table = await runLocks([...seed, '--recheck-ms', '50']);
    expect(table.stdout.split('\n')[0]).toMatch(/^NODE\s+KEY\s+RULE/);
    expect(table.stdout).toMatch(
      /\d+ lock key\(s\) on 3 master\(s\): 1 abandoned \(no expiry\), 0 re-armed \(traffic bypasses the proxy\)\n$/,
    );

    const abandoned = placed[1];
    const preview = await runLocks([...seed, '--release-abandoned']);
    expect(preview.code).toBe(1);
    expect(preview.stdout).toBe(
      `would delete ${keyArgument(abandoned.key)}: stalwart-task-lock, task ${abandoned.key.readBigUInt64BE(1)}, counter 1, ttl none, abandoned: no expiry, never expires\n`,
    );
    const released = await runLocks([...seed, '--release-abandoned', '--yes']);
    expect(released.code).toBe(0);
    expect(released.stdout).toContain(`deleted ${keyArgument(abandoned.key)}`);
    expect(await cluster.command(abandoned.master, 'EXISTS', abandoned.key)).toBe(0);
    const named = placed[2];
    expect((await runLocks([...seed, '--release', describeKey(named.key), '--release-live', '--yes'])).code).toBe(0);
    expect(await cluster.command(named.master, 'EXISTS', named.key)).toBe(0);
    expect(await cluster.command(placed[0].master, 'EXISTS', placed[0].key)).toBe(1);
    await cluster.command(placed[0].master, 'DEL', placed[0].key);
  });

  it('the proxy’s lock scan counts the lock keys of every master, also when the first seed is down', async () => {
    for (const master of await cluster.masters()) expect(await cluster.command(master, 'FLUSHALL')).toBe('OK');
    const placed = await lockOnEveryMaster(30_000);
    const deadSeed = `redis://127.0.0.1:${await closedPort()}`;
    const scanning = await startClusterTestProxy({
      upstream: `${deadSeed},redis://127.0.0.1:${cluster.nodes[0].port}`,
      admin: true,
      stalwart: '0.16.5',
      flags: ['--lock-scan-interval-ms', '200'],
    });
    try {
      await expect.poll(() => scanning.app.lockScan?.latest.scans ?? 0, { timeout: 10_000 }).toBeGreaterThanOrEqual(1);
      expect(scanning.app.lockScan?.latest.failures).toBe(0);
      const counts = scanning.app.lockScan?.latest.byRule.get('stalwart-task-lock');
      expect(counts?.keys).toBe(placed.length);
      expect(counts?.abandoned).toBe(1);
    } finally {
      await scanning.close();
      for (const { master, key } of placed) await cluster.command(master, 'DEL', key);
    }
  });
});

describe('cluster mode: slot migration', () => {
  it('gives -ASK and -MOVED through proxy addresses, and a block after ASKING runs on the importing node', async () => {
    const [source, target] = await cluster.masters();
    const key = await keyOn(cluster, source, (n) => `lock:{mig-a}${n}`);
    const existing = `lock:{mig-a}present`;
    const slot = cluster.slotOf(key);
    await cluster.command(source, 'SET', existing, '1');
    const sourcePort = proxyPortOf(source.port);
    const targetPort = proxyPortOf(target.port);

    await cluster.migrateSlot(slot, source, target, {
      onMigrating: async () => {
        // A key that is not on the source any more (or never was): -ASK to the target, in every reply of the block.
        const direct = await exchange(source.port, lockAttempt(key, 60), 4);
        expect(direct).toMatch(/^\+OK\r\n-ASK /);
        const discards = async (): Promise<number> =>
          Number(/cmdstat_discard:calls=(\d+)/.exec(String(await cluster.command(source, 'INFO', 'commandstats')))?.[1] ?? 0);
        const discardsBefore = await discards();
        expect(await exchange(sourcePort, lockAttempt(key, 60), 4)).toBe(viaProxy(direct));
        // Redis's refusal of the expiry is the one the client got: the transaction was not sent
        // again (a second round could meet the slot moved on, and answer another redirect).
        expect(await discards()).toBe(discardsBefore);
        // The client follows it: ASKING, then the block, on the target's listener.
        const replies = await exchange(targetPort, Buffer.concat([cmd('ASKING'), lockAttempt(key, 60)]), 5);
        expect(replies).toBe('+OK\r\n' + attemptReplies(1, 1));
        const pttl = await exchange(target.port, Buffer.concat([cmd('ASKING'), cmd('PTTL', key)]), 2);
        expect(Number(/:(\d+)\r\n$/.exec(pttl)?.[1])).toBeGreaterThan(59_000);
        // Without ASKING the target redirects back to the source.
        expect(await exchange(targetPort, cmd('GET', key), 1)).toBe(`-MOVED ${slot} 127.0.0.1:${sourcePort}\r\n`);
      },
    });
    // Migrated: the source now answers -MOVED to the target's listener.
    expect(await exchange(sourcePort, cmd('GET', existing), 1)).toBe(`-MOVED ${slot} 127.0.0.1:${targetPort}\r\n`);
    expect(await exchange(targetPort, cmd('GET', existing), 1)).toBe('$1\r\n1\r\n');
  });

  it('loses and misroutes nothing when a slot moves in the middle of a load', async () => {
    const client = await newClusterClient();
    try {
      const [source, target] = await cluster.masters();
      const keys = Array.from({ length: 20 }, (_, i) => `load:{mig-b}${i}`);
      const slot = cluster.slotOf(keys[0]);
      if ((await cluster.nodeFor(keys[0])).port !== source.port) {
        await cluster.migrateSlot(slot, await cluster.nodeFor(keys[0]), source);
      }
      const lockKey = 'lock:{mig-b}lease';
      let sent = 0;
      let attempts = 0;
      let expiriesAnswered = 0;
      /** When the first attempt's reply came: the lease it set ends 600 s after at the latest. */
      let leaseSetBy = 0;
      let running = true;
      const failures: string[] = [];
      const load = (async () => {
        while (running) {
          const key = keys[sent % keys.length];
          try {
            await client.incr(key);
            sent++;
            // Stalwart's block, which ioredis sends whole to the slot's node and redirects whole.
            const replies = await client.multi().incrby(lockKey, 1).expire(lockKey, 600).exec();
            expect(replies?.[0]).toEqual([null, attempts + 1]);
            if (attempts === 0) leaseSetBy = Date.now();
            attempts++;
            expiriesAnswered += Number(replies?.[1]?.[1]);
          } catch (err) {
            failures.push((err as Error).message);
          }
        }
      })();
      // The load is running before the slot moves, and goes on after it has moved.
      await expect.poll(() => sent, { timeout: 20_000 }).toBeGreaterThanOrEqual(50);
      const before = sent;
      await cluster.migrateSlot(slot, source, target, { pauseAfterMigratingMs: 500 });
      expect(sent).toBeGreaterThan(before); // requests ran while the slot was migrating
      const migrated = sent;
      await expect.poll(() => sent, { timeout: 20_000 }).toBeGreaterThanOrEqual(migrated + 50);
      running = false;
      await load;

      expect(failures).toEqual([]);
      expect(sent).toBeGreaterThan(100);
      const total = (await Promise.all(keys.map((k) => cluster.command(target, 'GET', k)))).reduce<number>(
        (sum, v) => sum + Number(v ?? 0),
        0,
      );
      expect(total).toBe(sent);
      // Every attempt counted once, each answered as Redis alone answers (1), and only the first
      // one set the lease: the time the load ran (with the migration's pause, over 500 ms) is gone
      // from it, which a re-arming attempt would have put back (100 ms allowed for the move's rounding).
      expect(Number(await cluster.command(target, 'GET', lockKey))).toBe(attempts);
      expect(expiriesAnswered).toBe(attempts);
      const askedAt = Date.now();
      expect(Number(await cluster.command(target, 'PTTL', lockKey))).toBeLessThanOrEqual(600_000 - (askedAt - leaseSetBy) + 100);
      expect(await cluster.command(source, 'CLUSTER', 'COUNTKEYSINSLOT', slot)).toBe(0);
      expect(proxy.stats.redirectsRewritten).toBeGreaterThan(0);
      await expectNoDirectConnection(cluster, socketsOf(client).local);
    } finally {
      client.disconnect();
    }
  });
});

describe('cluster mode: the command line', () => {
  beforeAll(ensureBuilt, 60_000);

  it('starts from seed URLs (a dead one first), listens per node from the base port or the port map, and exposes cluster metrics', async () => {
    const [listen, admin, dead, mapped] = await Promise.all([freePort(), freePort(), closedPort(), freePort()]);
    const mappedNode = cluster.nodes[3];
    const base = await freePortRange(8);
    const cli = new Cli(
      [
        '--cluster',
        '--listen',
        `127.0.0.1:${listen}`,
        '--cluster-base-port',
        String(base),
        '--upstream',
        `redis://127.0.0.1:${dead},redis://127.0.0.1:${cluster.nodes[1].port}`,
        '--admin-listen',
        `127.0.0.1:${admin}`,
        '--cluster-port-map',
        `127.0.0.1:${mappedNode.port}=${mapped}`,
      ],
      cleanEnv(),
    );
    try {
      const ready = await cli.waitForLog('redis-lock-proxy listening');
      expect(ready.clusterNodes).toHaveLength(6);
      const slots = await exchange(listen, cmd('CLUSTER', 'SLOTS'), 1);
      const ports = new Set([...slots.matchAll(/\r\n:(\d+)\r\n\$40\r\n/g)].map((m) => Number(m[1])));
      expect([...ports].filter((port) => port !== mapped).every((port) => port >= base && port < base + 5)).toBe(true);
      expect(ports.size).toBe(6);
      expect(ready.clusterNodes).toContain(
        `127.0.0.1:${mappedNode.port} (${(await cluster.masters()).includes(mappedNode) ? 'master' : 'replica'}) on ${mapped}`,
      );

      const master = (await cluster.masters())[2];
      const key = await keyOn(cluster, master, (n) => taskLockKey(BigInt(20_000 + n)));
      const listener = (ready.clusterNodes as string[]).find((line) => line.startsWith(`127.0.0.1:${master.port} `))?.split(' on ')[1];
      expect(await exchange(Number(listener), lockAttempt(key, 60), 4)).toBe(attemptReplies(1, 1));

      // verify finds scratch keys the node behind the address serves: through the seed, every time.
      for (let i = 0; i < 3; i++) {
        const verified = await runCli(['verify', '--via', `127.0.0.1:${listen}`]);
        expect(verified.stdout, verified.stderr).toMatch(/^verify: OK/);
      }
      const replica = (await cluster.replicas())[0];
      const replicaListener = (ready.clusterNodes as string[])
        .find((line) => line.startsWith(`127.0.0.1:${replica.port} `))
        ?.split(' on ')[1];
      const refused = await runCli(['verify', '--via', `127.0.0.1:${replicaListener}`]);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toContain('serves no slots (a replica?)');

      const metrics = await (await fetch(`http://127.0.0.1:${admin}/metrics`)).text();
      expect(metrics).toContain('redis_lock_proxy_cluster_nodes{role="master",listening="true"} 3');
      expect((await fetch(`http://127.0.0.1:${admin}/readyz`)).status).toBe(200);
      cli.kill('SIGTERM');
      expect((await cli.exited).code).toBe(0);
    } finally {
      await cli.stop();
    }
  });

  it('refuses to start when no seed answers, or the seed is not a cluster node', async () => {
    const dead = await closedPort();
    const none = await runCli(['--cluster', '--upstream', `redis://127.0.0.1:${dead}`, '--listen', `127.0.0.1:${await freePort()}`]);
    expect(none.code).toBe(1);
    expect(none.stderr).toMatch(
      /cluster: no seed answered CLUSTER SHARDS\/NODES \(redis:\/\/127\.0\.0\.1:\d+: cannot connect: .*ECONNREFUSED/,
    );

    const standalone = await startRedis();
    try {
      const exit = await runCli(['--cluster', '--upstream', standalone.url, '--listen', `127.0.0.1:${await freePort()}`]);
      expect(exit.code).toBe(1);
      expect(exit.stderr).toContain('not a cluster node (cluster support disabled): drop --cluster for a standalone Redis');
    } finally {
      await standalone.stop();
    }
  });

  it('refuses to start when a node listener port is taken: replies would send clients to another program', async () => {
    const base = await freePortRange(8);
    const squatter = net.createServer().listen(base + 2, '127.0.0.1');
    await once(squatter, 'listening');
    try {
      const exit = await runCli([
        '--cluster',
        '--upstream',
        `redis://127.0.0.1:${cluster.nodes[0].port}`,
        '--listen',
        `127.0.0.1:${await freePort()}`,
        '--cluster-base-port',
        String(base),
      ]);
      expect(exit.code).toBe(1);
      expect(exit.stderr).toMatch(
        new RegExp(
          `cluster: cannot listen on 127\\.0\\.0\\.1:${base + 2} for node 127\\.0\\.0\\.1:\\d+ \\(listen EADDRINUSE.*\\); choose free ports with --cluster-base-port or --cluster-port-map`,
        ),
      );
    } finally {
      squatter.close();
    }
  });
});

describe('cluster mode: topology changes', () => {
  it('follows a failover: the old master redirects to the new one through the proxy', async () => {
    const client = await newClusterClient();
    try {
      const master = (await cluster.masters())[0];
      const key = await keyOn(cluster, master, (n) => taskLockKey(BigInt(9000 + n)));
      await client.set('before-failover', '1');
      const replica = (await cluster.replicas())[0];
      await cluster.failover(replica);
      expect((await cluster.nodeFor(key)).port).toBe(replica.port);

      // The old master, now a replica, sends clients on to the new master's listener.
      expect(await exchange(proxyPortOf(master.port), lockAttempt(key, 60), 4)).toBe(
        viaProxy(await exchange(master.port, lockAttempt(key, 60), 4)),
      );
      expect(await exchange(proxyPortOf(replica.port), lockAttempt(key, 60), 4)).toBe(attemptReplies(1, 1));

      for (let i = 0; i < 100; i++) await client.set(`after-failover:${i}`, String(i));
      expect(await client.get('before-failover')).toBe('1');
      await expectNoDirectConnection(cluster, socketsOf(client).local);
      await expect
        .poll(() => proxy.cluster.nodes().find((n) => n.address === `127.0.0.1:${replica.port}`)?.role, { timeout: 5000 })
        .toBe('master');
    } finally {
      client.disconnect();
    }
  });

  it('a -MOVED to a node that joined since the last refresh waits for a refresh, then names its listener', async () => {
    const seed = cluster.nodes[0];
    const late = await startClusterTestProxy({ upstream: `redis://127.0.0.1:${seed.port}`, refreshMs: 3_600_000 });
    const extra = await startRedis({
      args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000'],
    });
    const key = 'moved-to-a-new-node';
    const owner = await cluster.nodeFor(key);
    const slot = cluster.slotOf(key);
    const newcomer = { port: extra.port, id: (await exchange(extra.port, cmd('CLUSTER', 'MYID'), 1)).split('\r\n')[1] };
    try {
      await cluster.command(owner, 'SET', key, 'here');
      await cluster.command(seed, 'CLUSTER', 'MEET', '127.0.0.1', extra.port);
      // Met: every node knows the newcomer, and the newcomer knows every node.
      const views = async () => [
        ...(await Promise.all(cluster.nodes.map((n) => cluster.command(n, 'CLUSTER', 'NODES')))),
        await exchange(extra.port, cmd('CLUSTER', 'NODES'), 1),
      ];
      const met = async () =>
        (await views()).every((view) => [newcomer, ...cluster.nodes].every((n) => String(view).includes(n.id))) &&
        (await exchange(extra.port, cmd('CLUSTER', 'INFO'), 1)).includes('cluster_state:ok');
      await expect.poll(met, { timeout: 10_000 }).toBe(true);
      await handOver(slot, owner, newcomer);
      expect(late.cluster.nodes().some((n) => n.address === `127.0.0.1:${extra.port}`)).toBe(false);

      const ownerListener = late.cluster.nodes().find((n) => n.address === `127.0.0.1:${owner.port}`)?.listenPort as number;
      const moved = /^-MOVED (\d+) 127\.0\.0\.1:(\d+)\r\n$/.exec(await exchange(ownerListener, cmd('GET', key), 1));
      expect(moved?.[1]).toBe(String(slot));
      const listener = Number(moved?.[2]);
      expect(late.cluster.nodes().find((n) => n.address === `127.0.0.1:${extra.port}`)?.listenPort).toBe(listener);
      expect(await exchange(listener, cmd('GET', key), 1)).toBe('$4\r\nhere\r\n');
      expect(late.stats.unknownNodesInRedirects).toBe(0);
    } finally {
      // Give the slot back, if it moved.
      if (
        await cluster.nodeFor(key).then(
          (n) => n.port !== owner.port,
          () => true,
        )
      )
        await handOver(slot, newcomer, owner);
      await extra.stop();
      await Promise.all(cluster.nodes.map((node) => cluster.command(node, 'CLUSTER', 'FORGET', newcomer.id).catch(() => undefined)));
      await late.close();
      await cluster.waitHealthy();
    }
  });

  it('listens for a node that joins, and drains it when it leaves', async () => {
    let extra: RedisServer | undefined;
    try {
      extra = await startRedis({
        args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000'],
      });
      const extraPort = extra.port;
      const seed = cluster.nodes[0];
      await cluster.command(seed, 'CLUSTER', 'MEET', '127.0.0.1', extraPort);
      await waitForListeners(proxy, 'a listener for the new node', (nodes) =>
        nodes.some((n) => n.address === `127.0.0.1:${extraPort}` && n.listening),
      );
      const listenPort = proxyPortOf(extraPort);
      expect(await exchange(listenPort, cmd('PING'), 1)).toBe('+PONG\r\n');
      expect(await exchange(proxy.port, cmd('CLUSTER', 'NODES'), 1)).toContain(`127.0.0.1:${listenPort}@`);

      // It leaves: every node forgets it.
      const extraId = (await exchange(extraPort, cmd('CLUSTER', 'MYID'), 1)).split('\r\n')[1];
      await extra.stop();
      // A node that has not heard of it yet through gossip says so; it will not hear of it now.
      const forget = (node: ClusterNode) =>
        cluster.command(node, 'CLUSTER', 'FORGET', extraId).catch((err: Error) => expect(err.message).toMatch(/Unknown node/));
      await Promise.all(cluster.nodes.map(forget));
      await waitForListeners(
        proxy,
        'the node that left to be drained',
        (nodes) => !nodes.some((n) => n.address === `127.0.0.1:${extraPort}`),
      );
      await expect(RawClient.connect(listenPort)).rejects.toThrow(/ECONNREFUSED/);
    } finally {
      await extra?.stop();
    }
  });
});

describe('cluster mode: what a reply or a node can make the proxy do', () => {
  it('never listens for, dials or authenticates to an address a -MOVED/-ASK names that no node has: the line waits for a refresh, then goes on as Redis wrote it, in order', async () => {
    const trap = await startTrap();
    // No refresh is due for an hour: any refresh is one the redirects asked for.
    const wary = await startClusterTestProxy({ upstream: `redis://127.0.0.1:${cluster.nodes[0].port}`, refreshMs: 3_600_000 });
    try {
      const node = cluster.nodes[0];
      const error = (kind: string, slot: number) => `return redis.error_reply('${kind} ${slot} 127.0.0.1:${trap.port}')`;
      const pipeline = Buffer.concat([
        cmd('EVAL', error('MOVED', 1), '0'),
        cmd('PING'),
        cmd('MULTI'),
        cmd('EVAL', error('ASK', 2), '0'),
        cmd('EXEC'),
        cmd('ECHO', 'after'),
      ]);
      const direct = await exchange(node.port, pipeline, 6);
      expect(direct).toBe(
        `-MOVED 1 127.0.0.1:${trap.port}\r\n+PONG\r\n+OK\r\n+QUEUED\r\n*1\r\n-ASK 2 127.0.0.1:${trap.port}\r\n$5\r\nafter\r\n`,
      );
      const addresses = wary.cluster.nodes().map((n) => n.address);

      expect(await exchange(listenerOf(wary, node.port), pipeline, 6)).toBe(direct);
      expect(wary.stats.unknownNodesInRedirects).toBe(2);
      expect(wary.stats.clusterRefreshes).toBeGreaterThanOrEqual(1);
      expect(wary.cluster.nodes().map((n) => n.address)).toEqual(addresses);
      expect(trap.connections()).toBe(0);
      expect(
        wary.logs().filter((line) => line.msg === 'cluster: a reply names a node the topology does not have; passed on as it is'),
      ).toEqual([expect.objectContaining({ node: `127.0.0.1:${trap.port}`, in: 'redirect' })]);
    } finally {
      await wary.close();
      await trap.close();
    }
  });

  it('leaves an address CLUSTER NODES names that no node of the topology has as Redis wrote it, and never dials it', async () => {
    const trap = await startTrap();
    try {
      const node = cluster.nodes[0];
      const addresses = proxy.cluster.nodes().map((n) => n.address);
      const unknownBefore = proxy.stats.unknownNodesInTopology;
      // The node starts a handshake with the address it is told to meet, and lists it until that times out.
      const replies = await exchange(
        proxyPortOf(node.port),
        Buffer.concat([cmd('CLUSTER', 'MEET', '127.0.0.1', String(trap.port)), cmd('CLUSTER', 'NODES')]),
        2,
      );
      expect(replies).toMatch(
        new RegExp(`^\\+OK\\r\\n\\$\\d+\\r\\n[^]* 127\\.0\\.0\\.1:${trap.port}@${trap.port + 10_000} [^\\n]*handshake`),
      );
      expect(proxy.stats.unknownNodesInTopology).toBeGreaterThan(unknownBefore);
      expect(proxy.cluster.nodes().map((n) => n.address)).toEqual(addresses);
      expect(trap.connections()).toBe(0);
    } finally {
      await trap.close();
    }
  });

  it('does not believe a node removed from the cluster that answers first alone: the nodes that serve the slots keep their listeners', async () => {
    let spare: SpareNode | undefined;
    let wary: ClusterTestProxy | undefined;
    try {
      // Its port is below every node's: the proxy lists it first, and asks it first.
      spare = await startSpareNode({ portBelow: Math.min(...cluster.nodes.map((n) => n.port)) });
      const joined = spare;
      await cluster.command(cluster.nodes[0], 'CLUSTER', 'MEET', '127.0.0.1', joined.port);
      const knowsEveryone = async (port: number) => {
        const view = await exchange(port, cmd('CLUSTER', 'NODES'), 1);
        return [joined, ...cluster.nodes].every((n) => view.includes(n.id) && !view.includes('handshake'));
      };
      await expect
        .poll(async () => (await Promise.all([joined, ...cluster.nodes].map((n) => knowsEveryone(n.port)))).every(Boolean), {
          timeout: 20_000,
        })
        .toBe(true);
      wary = await startClusterTestProxy({ upstream: `redis://127.0.0.1:${cluster.nodes[0].port}`, refreshMs: 300 });
      const proxied = wary;
      expect(proxied.cluster.nodes()[0]).toMatchObject({ address: `127.0.0.1:${joined.port}`, role: 'master', healthy: true });

      // Removed: every node forgets it, and it forgets them. It keeps running, alone.
      await Promise.all(cluster.nodes.map((n) => cluster.command(n, 'CLUSTER', 'FORGET', joined.id)));
      await cluster.command(joined, 'CLUSTER', 'RESET', 'SOFT');
      // It serves no slot now (CLUSTER SLOTS where the server has no CLUSTER SHARDS, before 7.0).
      if (facts.has('cluster-shards')) {
        expect(await exchange(joined.port, cmd('CLUSTER', 'SHARDS'), 1)).toMatch(/^\*1\r\n\*4\r\n\$5\r\nslots\r\n\*0\r\n/);
      } else {
        expect(await exchange(joined.port, cmd('CLUSTER', 'SLOTS'), 1)).toBe('*0\r\n');
      }
      const refreshes = proxied.stats.clusterRefreshes;
      await expect.poll(() => proxied.stats.clusterRefreshes, { timeout: 30_000 }).toBeGreaterThanOrEqual(refreshes + 5);

      const real = cluster.nodes.map((n) => `127.0.0.1:${n.port}`).sort();
      expect(
        proxied.cluster
          .nodes()
          .filter((n) => n.address !== `127.0.0.1:${joined.port}` && n.listening)
          .map((n) => n.address)
          .sort(),
      ).toEqual(real);
      expect(await exchange(proxied.port, cmd('CLUSTER', 'INFO'), 1)).toContain('cluster_state:ok');
      const slots = await exchange(proxied.port, cmd('CLUSTER', 'SLOTS'), 1);
      const direct = await exchange(cluster.nodes[0].port, cmd('CLUSTER', 'SLOTS'), 1);
      expect(slots.split('\r\n')[0]).toBe(direct.split('\r\n')[0]);
      expect(proxied.stats.clusterViewsSetAside).toBeGreaterThan(0);
      // It did leave the cluster, by the word of the nodes that serve every slot.
      await waitForListeners(
        proxied,
        'the removed node to be drained',
        (nodes) => !nodes.some((n) => n.address === `127.0.0.1:${joined.port}`),
        20_000,
      );
    } finally {
      await wary?.close();
      await spare?.stop();
      await cluster.waitHealthy();
    }
  });
});
