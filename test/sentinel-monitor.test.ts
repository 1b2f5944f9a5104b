/**
 * SentinelMonitor (src/upstream/sentinel.ts) against real sentinels
 * (redis-server --sentinel): finding the master, failing clearly when it
 * cannot, and following a failover. (The built proxy behind Sentinel:
 * e2e/sentinel-proxy.test.ts.)
 */
import net from 'node:net';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Address } from '../src/address.js';
import { SentinelMonitor, type SentinelOptions } from '../src/upstream/sentinel.js';
import { freePort } from './support/ports.js';
import { query, startSentinelSetup, type SentinelSetup } from './support/sentinel.js';

const HOST = '127.0.0.1';

interface LogLine {
  level: number;
  msg: string;
  sentinel?: string;
  [field: string]: unknown;
}

/** A logger that keeps its lines for assertions. */
function capturingLogger(): { log: SentinelOptions['log']; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const log = pino({ level: 'debug' }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
  return { log, lines };
}

const WARN = 40;

/** Resource kinds that would keep the process alive. */
function liveHandles(): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const kind of process.getActiveResourcesInfo()) {
    if (kind === 'TCPSocketWrap' || kind === 'TCPWRAP' || kind === 'Timeout') counts[kind] = (counts[kind] ?? 0) + 1;
  }
  return counts;
}

/**
 * A TCP relay to a sentinel that forwards everything except what the sentinel
 * sends to a connection that subscribed: a monitor behind it gets no
 * +switch-master events and can only learn of a failover by polling.
 */
async function startEventDroppingRelay(target: number): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: HOST, port: target });
    sockets.add(client).add(upstream);
    let subscribed = false;
    client.on('data', (chunk) => {
      if (/subscribe/i.test(chunk.toString('latin1'))) subscribed = true;
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      if (!subscribed) client.write(chunk);
    });
    for (const [a, b] of [
      [client, upstream],
      [upstream, client],
    ]) {
      a.on('error', () => {});
      a.on('close', () => {
        sockets.delete(a);
        b.destroy();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

describe('SentinelMonitor', () => {
  let setup: SentinelSetup;
  const monitors: SentinelMonitor[] = [];

  async function start(opts: Partial<SentinelOptions> = {}): Promise<SentinelMonitor> {
    const monitor = await SentinelMonitor.start({
      sentinels: setup.sentinels.map((s) => ({ host: s.host, port: s.port })),
      masterName: setup.masterName,
      log: capturingLogger().log,
      ...opts,
    });
    monitors.push(monitor);
    return monitor;
  }

  beforeAll(async () => {
    setup = await startSentinelSetup({ sentinels: 2 });
  }, 60_000);

  afterAll(async () => {
    await Promise.all(monitors.map((m) => m.close()));
    await setup?.stop();
  });

  it('finds the master and describes itself', async () => {
    const monitor = await start();
    expect(monitor.master).toEqual({ host: HOST, port: setup.master.port });
    const [s1, s2] = setup.sentinels;
    expect(monitor.describe()).toBe(
      `sentinel ${setup.masterName} via ${HOST}:${s1.port},${HOST}:${s2.port} (master ${HOST}:${setup.master.port})`,
    );
    await monitor.close();
    await monitor.close(); // twice is fine
  });

  it('works when the first sentinel is down, and warns about it once', async () => {
    const deadPort = await freePort();
    const { log, lines } = capturingLogger();
    const monitor = await start({
      sentinels: [
        { host: HOST, port: deadPort },
        { host: HOST, port: setup.sentinels[0].port },
      ],
      pollMs: 100,
      log,
    });
    expect(monitor.master).toEqual({ host: HOST, port: setup.master.port });
    await sleep(700); // several polls
    const warnings = lines.filter((l) => l.level === WARN && l.sentinel === `${HOST}:${deadPort}`);
    expect(warnings).toHaveLength(1);
    expect(warnings[0].msg).toBe('sentinel unreachable');
    expect(String(warnings[0].err)).toMatch(/ECONNREFUSED/);
    await monitor.close();
  });

  it('rejects with a clear message when no sentinel knows the master name', async () => {
    const [s1, s2] = setup.sentinels;
    await expect(start({ masterName: 'no-such-master' })).rejects.toThrow(
      `none of the sentinels ${HOST}:${s1.port},${HOST}:${s2.port} knows a master named "no-such-master"`,
    );
  });

  it('rejects with a clear message when no sentinel is reachable', async () => {
    const ports = [await freePort(), await freePort()];
    const before = Date.now();
    const err = await start({ sentinels: ports.map((port) => ({ host: HOST, port })) }).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err).toBeInstanceOf(Error);
    expect(err?.message).toContain(`none of the sentinels ${HOST}:${ports[0]},${HOST}:${ports[1]} answered`);
    expect(err?.message).toContain(`master "${setup.masterName}"`);
    expect(err?.message).toMatch(/ECONNREFUSED/);
    expect(Date.now() - before).toBeLessThan(6_000);
  });

  it('rejects after about five seconds when a sentinel accepts connections but never answers', async () => {
    const silent = net.createServer((socket) => socket.on('error', () => {}));
    const sockets = new Set<net.Socket>();
    silent.on('connection', (socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
    });
    await new Promise<void>((resolve) => silent.listen(0, HOST, resolve));
    const { port } = silent.address() as net.AddressInfo;
    try {
      const before = Date.now();
      await expect(start({ sentinels: [{ host: HOST, port }] })).rejects.toThrow(
        `none of the sentinels ${HOST}:${port} answered within 5000 ms when asked for master "${setup.masterName}"`,
      );
      const elapsed = Date.now() - before;
      expect(elapsed).toBeGreaterThanOrEqual(4_900);
      expect(elapsed).toBeLessThan(6_500);
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    }
  }, 15_000);

  it('close() leaves no sockets or timers behind, after success and after failure', async () => {
    await sleep(100); // let earlier tests' sockets finish closing
    const before = liveHandles();

    const monitor = await SentinelMonitor.start({
      sentinels: [{ host: HOST, port: await freePort() }, ...setup.sentinels.map((s) => ({ host: s.host, port: s.port }))],
      masterName: setup.masterName,
      pollMs: 50,
      log: capturingLogger().log,
    });
    await sleep(300); // polls and reconnect attempts in flight
    await monitor.close();

    await expect(
      SentinelMonitor.start({
        sentinels: [{ host: HOST, port: await freePort() }],
        masterName: setup.masterName,
        log: capturingLogger().log,
      }),
    ).rejects.toThrow(/answered/);

    await sleep(50);
    expect(liveHandles()).toEqual(before);
  });

  // Last: it turns the replica into the master.
  it('emits switch on SENTINEL FAILOVER, by event and by poll, once each', async () => {
    const oldMaster: Address = { host: HOST, port: setup.master.port };
    const newMaster: Address = { host: HOST, port: setup.replica.port };
    // One monitor that can only learn from +switch-master (its poll is far
    // off), one that also polls fast, and one that can only poll (its
    // sentinel, not the one doing the failover, is behind a relay that drops
    // events). Each must report the change exactly once.
    const relay = await startEventDroppingRelay(setup.sentinels[1].port);
    const logs = new Map<string, LogLine[]>();
    const monitor = async (name: string, opts: Partial<SentinelOptions>) => {
      const { log, lines } = capturingLogger();
      logs.set(name, lines);
      return {
        name,
        monitor: await start({ ...opts, log }),
        switches: [] as Array<{ from: Address; to: Address; at: number }>,
      };
    };
    const watched = [
      await monitor('event', { pollMs: 60_000 }),
      await monitor('event+poll', { pollMs: 200 }),
      await monitor('poll', { pollMs: 300, sentinels: [{ host: HOST, port: relay.port }] }),
    ];
    try {
      for (const w of watched) w.monitor.on('switch', (from, to) => w.switches.push({ from, to, at: Date.now() }));

      const sentAt = Date.now();
      expect(await query(setup.sentinels[0].port, ['SENTINEL', 'FAILOVER', setup.masterName])).toBe('OK');

      const deadline = sentAt + 15_000;
      while (watched.some((w) => w.switches.length === 0) && Date.now() < deadline) await sleep(20);
      for (const w of watched) {
        expect(w.switches, w.name).toEqual([{ from: oldMaster, to: newMaster, at: expect.any(Number) }]);
        expect(w.monitor.master, w.name).toEqual(newMaster);
        expect(w.monitor.describe(), w.name).toContain(`(master ${HOST}:${setup.replica.port})`);
        const switched = logs.get(w.name)?.filter((l) => l.msg === 'sentinel: master switched') ?? [];
        expect(switched, w.name).toHaveLength(1);
        expect(switched[0], w.name).toMatchObject({
          from: `${HOST}:${oldMaster.port}`,
          to: `${HOST}:${newMaster.port}`,
          epoch: expect.any(Number),
        });
        // A fast poll may see the promoted replica before the event comes
        // (get-master-addr-by-name names it once the failover reconfigures replicas).
        const cause = { event: /^\+switch-master from /, 'event+poll': /^(\+switch-master from |poll of )/, poll: /^poll of / }[w.name];
        expect(switched[0].cause, w.name).toMatch(cause ?? /never/);
      }
      console.info(`failover seen after: ${watched.map((w) => `${w.name} ${w.switches[0].at - sentAt} ms`).join(', ')}`);

      // The second sentinel's +switch-master and later polls are no change.
      await sleep(2_500);
      for (const w of watched) expect(w.switches, w.name).toHaveLength(1);
    } finally {
      await Promise.all(watched.map((w) => w.monitor.close()));
      await relay.close();
    }
  }, 30_000);
});
