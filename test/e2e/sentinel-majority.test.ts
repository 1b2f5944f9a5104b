/**
 * The proxy behind Sentinel believes only what a majority of its sentinels say, against real
 * sentinels (redis-server --sentinel) and real masters:
 *
 * - a lying sentinel (a fake peer speaking RESP) listed first, claiming a far higher epoch and
 *   publishing +switch-master every 300 ms, names another real redis-server: no client
 *   connection, no AUTH, no write ever reaches that server, /readyz stays ready, nothing switches;
 * - with fewer than a majority of the sentinels answering, the proxy keeps its master and serves
 *   on, and says so in /readyz, in the sentinel_majority gauge and once in the log;
 * - Redis's own lever against the writes a failover loses (min-replicas-to-write) works through
 *   the proxy: a master cut off from its replica refuses writes, and the client sees why.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startLyingSentinel, type LyingSentinel } from '../support/lying-sentinel.js';
import { closedPort } from '../support/ports.js';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { RawClient } from '../support/resp.js';
import { query, startSentinelSetup, type SentinelSetup } from '../support/sentinel.js';
import { startRelay } from '../support/tcp-relay.js';
import { attemptReplies, lockAttempt } from '../support/stalwart.js';

const HOST = '127.0.0.1';
const PASSWORD = 'the-masters-password';

let setup: SentinelSetup;
/** A real redis-server that no real sentinel names: where the liar points. */
let elsewhere: RedisServer;
let watcher: RawClient;

beforeAll(async () => {
  setup = await startSentinelSetup({ sentinels: 2 });
  elsewhere = await startRedis({ password: PASSWORD });
  watcher = await RawClient.connect(elsewhere.port);
  expect(await watcher.call('AUTH', PASSWORD)).toBe('+OK\r\n');
}, 120_000);

afterAll(async () => {
  await watcher?.close();
  await elsewhere?.stop();
  await setup?.stop();
});

/** What `elsewhere` has seen: connections accepted (the watcher's own is one) and AUTH calls. */
async function seenElsewhere(): Promise<{ connections: number; auths: number; keys: string }> {
  const stats = await watcher.call('INFO', 'stats');
  const commands = await watcher.call('INFO', 'commandstats');
  return {
    connections: Number(/total_connections_received:(\d+)/.exec(stats)?.[1]),
    auths: Number(/cmdstat_auth:calls=(\d+)/.exec(commands)?.[1] ?? 0),
    keys: await watcher.call('DBSIZE'),
  };
}

async function readyz(proxy: TestProxy): Promise<{ status: number; body: string }> {
  const response = await fetch(`http://127.0.0.1:${proxy.app.adminAddress?.port}/readyz`);
  return { status: response.status, body: await response.text() };
}

function sentinelFlags(sentinels: Array<{ port: number }>): string[] {
  return ['--sentinel', sentinels.map((s) => `${HOST}:${s.port}`).join(','), '--sentinel-master', setup.masterName];
}

describe('a lying sentinel', () => {
  let liar: LyingSentinel;
  beforeAll(async () => {
    liar = await startLyingSentinel({ masterName: setup.masterName, names: { host: HOST, port: elsewhere.port }, epoch: 999 });
  });
  afterAll(async () => {
    await liar?.close();
  });

  it('listed first, with a far higher epoch, publishing +switch-master: no write, no AUTH, no connection reaches its master', async () => {
    const before = await seenElsewhere();
    const proxy = await startTestProxy({
      upstream: `redis://:${PASSWORD}@ignored`,
      admin: true,
      flags: sentinelFlags([liar, ...setup.sentinels]),
    });
    // The real master has no password; the proxy's AUTH is refused there, which the client sees.
    // What matters is where it goes: never to the liar's master.
    try {
      liar.spam({ host: HOST, port: setup.master.port }, 300);
      const key = `incr:${Date.now()}`;
      for (let i = 0; i < 20; i++) {
        const client = await RawClient.connect(proxy.port); // as a pool reconnects
        await client.call('INCR', key);
        await client.close();
        await new Promise((resolve) => setTimeout(resolve, 150));
      }
      expect(liar.published).toBeGreaterThan(5);
      expect(await seenElsewhere()).toEqual(before);
      expect(proxy.logs().filter((line) => line.msg === 'sentinel: master switched')).toEqual([]);
      expect(String(proxy.app.describe().upstream)).toContain(`(master ${HOST}:${setup.master.port})`);
      const ready = await readyz(proxy);
      expect(ready.body).not.toMatch(new RegExp(`${elsewhere.port}`));
      expect(await proxy.metrics()).toMatch(/^redis_lock_proxy_sentinel_majority 1$/m);
    } finally {
      await proxy.close();
    }
  }, 30_000);

  it('and the writes go to the master the real sentinels name', async () => {
    const proxy = await startTestProxy({ upstream: 'redis://ignored', admin: true, flags: sentinelFlags([liar, ...setup.sentinels]) });
    try {
      liar.spam({ host: HOST, port: setup.master.port }, 300);
      const key = `incr:${Date.now()}`;
      for (let i = 0; i < 20; i++) {
        const client = await RawClient.connect(proxy.port);
        expect(await client.call('INCR', key)).toBe(`:${i + 1}\r\n`);
        await client.close();
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(await query(setup.master.port, ['GET', key])).toBe('20');
      expect(await readyz(proxy)).toEqual({ status: 200, body: `ready: upstream ${HOST}:${setup.master.port} answers PING\n` });
    } finally {
      await proxy.close();
    }
  }, 30_000);
});

describe('fewer than a majority of the sentinels answering', () => {
  it('keeps the master and serves on, and says so in /readyz, in the gauge and once in the log', async () => {
    const relay = await startRelay(setup.sentinels[1].port);
    const dead = { port: await closedPort() };
    const proxy = await startTestProxy({
      upstream: 'redis://ignored',
      admin: true,
      flags: sentinelFlags([setup.sentinels[0], relay, dead]),
    });
    try {
      expect((await readyz(proxy)).status).toBe(200);
      relay.setDown(true);
      // The next poll (every 5 s) finds one sentinel of three.
      await expect.poll(async () => (await readyz(proxy)).body, { timeout: 15_000, interval: 500 }).toMatch(/no majority/);
      const ready = await readyz(proxy);
      expect(ready.status).toBe(200);
      expect(ready.body).toMatch(
        new RegExp(
          `^ready: upstream ${HOST}:${setup.master.port} answers PING; sentinel: no majority of the sentinels \\(2 of 3\\) names one master; keeping master ${HOST}:${setup.master.port} \\(`,
        ),
      );
      expect(await proxy.metrics()).toMatch(/^redis_lock_proxy_sentinel_majority 0$/m);
      const client = await RawClient.connect(proxy.port);
      expect(await client.call('PING')).toBe('+PONG\r\n');
      await client.close();

      await new Promise((resolve) => setTimeout(resolve, 6_000)); // another poll, still without a majority
      const said = proxy
        .logs()
        .filter((line) => line.msg === 'sentinel: no majority of the sentinels names one master; keeping the current master');
      expect(said).toHaveLength(1);

      relay.setDown(false);
      await expect.poll(async () => (await readyz(proxy)).body, { timeout: 15_000, interval: 500 }).not.toMatch(/sentinel/);
    } finally {
      await proxy.close();
      await relay.close();
    }
  }, 60_000);
});

describe('min-replicas-to-write, the lever against writes a failover loses', () => {
  it('through the proxy: a master cut off from its replica refuses writes, lock blocks included, and says why', async () => {
    const master = await startRedis({ args: ['--min-replicas-to-write', '1', '--min-replicas-max-lag', '2'] });
    const replica = await startRedis({ args: ['--replicaof', HOST, String(master.port)] });
    const proxy = await startTestProxy({ upstream: master.url });
    try {
      // The replica counts once it has acknowledged (REPLCONF ACK, every second).
      await expect.poll(() => query(master.port, ['INFO', 'replication']), { timeout: 10_000 }).toMatch(/min_slaves_good_slaves:1/);
      const client = await RawClient.connect(proxy.port);
      client.write(lockAttempt('lock:replicated', 60));
      expect((await client.readReplies(4)).toString()).toBe(attemptReplies(1, 1));
      // The replica is promoted (as a failover does) and no longer acknowledges the master.
      expect(await query(replica.port, ['REPLICAOF', 'NO', 'ONE'])).toBe('OK');
      await expect
        .poll(async () => (await client.call('INCR', 'counter')).split('\r\n')[0], { timeout: 15_000, interval: 250 })
        .toBe('-NOREPLICAS Not enough good replicas to write.');
      client.write(lockAttempt('lock:replicated', 60));
      const refused = (await client.readReplies(4)).toString();
      expect(refused).toMatch(/^\+OK\r\n-NOREPLICAS [^\r]*\r\n-NOREPLICAS [^\r]*\r\n-EXECABORT /);
      await client.close();
    } finally {
      await proxy.close();
      await replica.stop();
      await master.stop();
    }
  }, 40_000);
});
