/**
 * SentinelMonitor (src/upstream/sentinel.ts) against real sentinels
 * (redis-server --sentinel): finding the master a majority of them names,
 * failing clearly when it cannot, following a failover, and never following a
 * single sentinel: one that lies (a fake peer speaking RESP, naming a real
 * redis-server), listed first or last, claiming a far higher epoch, or
 * publishing +switch-master over and over; a real sentinel of another
 * environment that monitors a master of the same name; and what it does when
 * fewer than a majority answer. (The built proxy behind Sentinel:
 * e2e/sentinel-proxy.test.ts and e2e/sentinel-majority.test.ts.)
 */
import net from 'node:net';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Address } from '../src/address.js';
import { SentinelMonitor, type SentinelOptions } from '../src/upstream/sentinel.js';
import { startLyingSentinel, type LyingSentinel } from './support/lying-sentinel.js';
import { closedPort, freePort } from './support/ports.js';
import { startRelay } from './support/tcp-relay.js';
import { startRedis, type RedisServer } from './support/redis.js';
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

  it('works when the first of three sentinels is down (two are a majority), and warns about it once', async () => {
    const deadPort = await closedPort();
    const { log, lines } = capturingLogger();
    const monitor = await start({
      sentinels: [{ host: HOST, port: deadPort }, ...setup.sentinels.map((s) => ({ host: s.host, port: s.port }))],
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
    expect(Date.now() - before).toBeLessThan(6_500); // asked again for five seconds
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

  describe('never follows one sentinel alone', () => {
    /** A real redis-server that no real sentinel names: where a lying sentinel sends the proxy. */
    let elsewhere: RedisServer;
    const liars: LyingSentinel[] = [];
    const real = () => setup.sentinels.map((s) => ({ host: s.host, port: s.port }));
    const liar = async (epoch?: number) => {
      const sentinel = await startLyingSentinel({ masterName: setup.masterName, names: { host: HOST, port: elsewhere.port }, epoch });
      liars.push(sentinel);
      return sentinel;
    };

    beforeAll(async () => {
      elsewhere = await startRedis();
    });
    afterAll(async () => {
      await Promise.all(liars.map((l) => l.close()));
      await elsewhere?.stop();
    });

    it('a liar listed first does not win the start-up', async () => {
      const lying = await liar();
      const monitor = await start({ sentinels: [{ host: lying.host, port: lying.port }, ...real()] });
      expect(monitor.master).toEqual({ host: HOST, port: setup.master.port });
      await expect.poll(() => lying.queries).toBeGreaterThan(0); // it was asked, and not believed
    });

    it('a liar listed last, claiming a far higher epoch, never wins a poll', async () => {
      const lying = await liar(999);
      const { log, lines } = capturingLogger();
      const monitor = await start({ sentinels: [...real(), { host: lying.host, port: lying.port }], pollMs: 100, log });
      const switches: Address[] = [];
      monitor.on('switch', (_from, to) => switches.push(to));
      await sleep(1_500); // a dozen polls
      expect(switches).toEqual([]);
      expect(monitor.master).toEqual({ host: HOST, port: setup.master.port });
      expect(monitor.agreement().majority).toBe(true);
      expect(lines.filter((l) => l.level >= WARN)).toEqual([]);
    });

    it('a liar publishing +switch-master over and over makes it ask, never switch', async () => {
      const lying = await liar(999);
      const monitor = await start({ sentinels: [{ host: lying.host, port: lying.port }, ...real()], pollMs: 60_000 });
      const switches: Address[] = [];
      monitor.on('switch', (_from, to) => switches.push(to));
      const queries = lying.queries;
      lying.spam({ host: HOST, port: setup.master.port }, 100);
      await sleep(2_000);
      expect(lying.published).toBeGreaterThan(10);
      expect(switches).toEqual([]);
      expect(monitor.master).toEqual({ host: HOST, port: setup.master.port });
      // Each event made it ask every sentinel (at most every 250 ms), the liar included.
      expect(lying.queries - queries).toBeGreaterThan(3);
      expect(lying.queries - queries).toBeLessThan(12);
    });

    it('a real sentinel of another environment that monitors a master of the same name does not move it', async () => {
      const other = await startSentinelSetup({ sentinels: 1, masterName: setup.masterName });
      try {
        const monitor = await start({ sentinels: [{ host: HOST, port: other.sentinels[0].port }, ...real()] });
        expect(monitor.master).toEqual({ host: HOST, port: setup.master.port });
        expect(await query(other.sentinels[0].port, ['SENTINEL', 'get-master-addr-by-name', setup.masterName])).toEqual([
          HOST,
          String(other.master.port),
        ]);
      } finally {
        await other.stop();
      }
    }, 60_000);

    it('with fewer than a majority answering keeps its master, says so once, and says when a majority is back', async () => {
      const relay = await startRelay(setup.sentinels[1].port);
      const { log, lines } = capturingLogger();
      try {
        const monitor = await start({
          sentinels: [real()[0], { host: HOST, port: relay.port }, { host: HOST, port: await freePort() }],
          pollMs: 100,
          log,
        });
        expect(monitor.agreement()).toEqual({
          majority: true,
          detail: `a majority of the sentinels (2 of 3) names master ${HOST}:${setup.master.port}`,
        });
        relay.setDown(true);
        await expect.poll(() => monitor.agreement().majority, { timeout: 5_000 }).toBe(false);
        await sleep(1_000); // more polls without a majority
        expect(monitor.master).toEqual({ host: HOST, port: setup.master.port });
        expect(monitor.agreement().detail).toMatch(
          new RegExp(
            `^no majority of the sentinels \\(2 of 3\\) names one master; keeping master ${HOST}:${setup.master.port} \\(${HOST}:${setup.sentinels[0].port} names ${HOST}:${setup.master.port}; `,
          ),
        );
        const said = lines.filter((l) => l.msg === 'sentinel: no majority of the sentinels names one master; keeping the current master');
        expect(said).toHaveLength(1);
        expect(said[0]).toMatchObject({ level: WARN, master: `${HOST}:${setup.master.port}`, majority: '2 of 3' });

        relay.setDown(false);
        await expect.poll(() => monitor.agreement(), { timeout: 10_000 }).toMatchObject({ majority: true });
        expect(lines.filter((l) => l.msg === 'sentinel: a majority of the sentinels names the master again')).toHaveLength(1);
      } finally {
        await relay.close();
      }
    });
  });

  // Last: it turns the replica into the master.
  it('emits switch on SENTINEL FAILOVER, by event and by poll, once each', async () => {
    const oldMaster: Address = { host: HOST, port: setup.master.port };
    const newMaster: Address = { host: HOST, port: setup.replica.port };
    // One monitor prompted only by +switch-master (its poll is far off: the
    // event makes it ask both sentinels until both name the new master), one
    // that also polls fast, and one that can only poll (its sentinel, not the
    // one doing the failover, is behind a relay that drops events). Each must
    // report the change exactly once.
    const relay = await startRelay(setup.sentinels[1].port, { dropEvents: true });
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
        // Both sentinels must name the new master (one, behind the relay, for the poll-only monitor).
        const votes = w.name === 'poll' ? '1 of 1' : '2 of 2';
        expect(switched[0], w.name).toMatchObject({
          from: `${HOST}:${oldMaster.port}`,
          to: `${HOST}:${newMaster.port}`,
          cause: `a majority of the sentinels names it (${votes})`,
        });
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
