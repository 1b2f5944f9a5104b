/**
 * systemd socket activation, with the test in systemd's part (support/socket-unit.ts): the
 * proxy listens on the sockets it is passed (LISTEN_FDS) instead of --listen and
 * --admin-listen; a restart under load refuses no connection, since the socket stays open
 * between the old process and the new one; and /readyz says not ready from the moment a
 * shutdown begins, while the connections drain.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanEnv, ensureBuilt } from '../support/cli.js';
import { freePort, isPortFree } from '../support/ports.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { SocketUnit, type ActivatedProxy } from '../support/socket-unit.js';

let redis: RedisServer;

beforeAll(async () => {
  await ensureBuilt();
  redis = await startRedis();
}, 120_000);

afterAll(async () => {
  await redis?.stop();
});

/** How long a reply may take: one sent during a restart waits for the next process to start. */
const REPLY_TIMEOUT_MS = 60_000;

/** What the clients under load saw. */
interface LoadCount {
  /** Commands answered, each with the value it set. */
  answered: number;
  /** Connections refused (ECONNREFUSED): what socket activation is there to prevent. */
  refused: number;
  /** Connections the draining proxy closed before a command's reply (the command is sent again). */
  closedByDrain: number;
  /** Anything else: a reply that was not the one expected, another error. */
  failures: string[];
}

/**
 * Clients that each loop until `stop()`: `persistent` of them on one connection each (opened
 * again when the proxy closes it), `shortLived` with a new connection per command pair, as a
 * pool that opens connections on demand does. Each pair is SET of a value of its own, then GET,
 * which must return it.
 */
function startLoad(port: number, persistent: number, shortLived: number): { count: LoadCount; stop: () => Promise<void> } {
  const count: LoadCount = { answered: 0, refused: 0, closedByDrain: 0, failures: [] };
  let stopping = false;
  const client = async (name: string, reuse: boolean): Promise<void> => {
    let connection: RawClient | null = null;
    for (let i = 0; !stopping; i++) {
      const key = `socket-activation:${name}`;
      const value = `${name}-${i}`;
      try {
        connection ??= await RawClient.connect(port);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ECONNREFUSED') count.refused++;
        else count.failures.push(`${name} connect: ${(err as Error).message}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
        continue;
      }
      try {
        connection.write(Buffer.concat([cmd('SET', key, value), cmd('GET', key)]));
        const replies = (await connection.readReplies(2, REPLY_TIMEOUT_MS)).toString('latin1');
        if (replies === `+OK\r\n$${value.length}\r\n${value}\r\n`) count.answered++;
        else count.failures.push(`${name}: ${JSON.stringify(replies)}`);
      } catch (err) {
        if (connection.isClosed) count.closedByDrain++;
        else count.failures.push(`${name}: ${(err as Error).message}`);
        connection.destroy();
        connection = null;
        continue;
      }
      if (!reuse) {
        await connection.close();
        connection = null;
      }
    }
    await connection?.close();
  };
  const clients = [
    ...Array.from({ length: persistent }, (_, i) => client(`persistent-${i}`, true)),
    ...Array.from({ length: shortLived }, (_, i) => client(`short-${i}`, false)),
  ];
  return {
    count,
    stop: async () => {
      stopping = true;
      await Promise.all(clients);
    },
  };
}

/** Waits until `count` has grown by `more` answered commands. */
async function answeredMore(count: LoadCount, more: number): Promise<void> {
  const target = count.answered + more;
  await expect.poll(() => count.answered, { timeout: REPLY_TIMEOUT_MS, interval: 50 }).toBeGreaterThanOrEqual(target);
}

describe('socket activation (LISTEN_FDS)', () => {
  it('a restart under load refuses no connection: the new process accepts what waited on the socket', async () => {
    const unit = await SocketUnit.open(['redis-lock-proxy.socket']);
    const [port] = unit.ports;
    // The listen setting is not used: the socket passed stands in for it.
    const configured = await freePort();
    const args = ['--listen', `127.0.0.1:${configured}`, '--upstream', redis.url, '--shutdown-timeout-ms', '30000'];
    const proxies: ActivatedProxy[] = [];
    const start = (): ActivatedProxy => {
      const proxy = unit.start(args, cleanEnv());
      proxies.push(proxy);
      return proxy;
    };
    try {
      const first = start();
      const listening = await first.waitForLog('redis-lock-proxy listening');
      expect(listening.listen).toBe(`127.0.0.1:${port}`);
      expect(await first.waitForLog('listening on the socket systemd passed (LISTEN_FDS); the listen setting is not used')).toMatchObject({
        level: 40, // warn: the two addresses differ
        listen: `127.0.0.1:${configured}`,
        listening: `127.0.0.1:${port}`,
        socket: 'descriptor 3 (redis-lock-proxy.socket) passed by systemd',
      });
      expect(await isPortFree(configured)).toBe(true);

      const load = startLoad(port, 4, 8);
      try {
        await answeredMore(load.count, 200);
        // systemctl restart: SIGTERM, wait for the exit, start again; the socket stays open throughout.
        await first.kill('SIGTERM');
        expect(await first.exited).toBe(0);
        // Connections made while no process runs: the kernel completes them, the commands wait.
        const between = await RawClient.connect(port);
        between.write(cmd('PING'));
        const second = start();
        await second.waitForLog('redis-lock-proxy listening');
        expect((await between.readReplies(1, REPLY_TIMEOUT_MS)).toString()).toBe('+PONG\r\n');
        await between.close();
        await answeredMore(load.count, 200);
      } finally {
        await load.stop();
      }
      const { count } = load;
      expect(count.failures).toEqual([]);
      expect(count.refused).toBe(0);
      // Each persistent connection was closed by the draining proxy once, at most when idle;
      // short-lived ones may have been too. Their commands were sent again, and answered.
      expect(count.closedByDrain).toBeGreaterThanOrEqual(4);
      expect(count.answered).toBeGreaterThanOrEqual(400);
      expect(first.logLines().find((l) => l.msg === 'shut down')).toMatchObject({ cutAtDeadline: 0 });

      // And again, the second process as the old one: the socket is still systemd's.
      await proxies[1].kill('SIGTERM');
      expect(await proxies[1].exited).toBe(0);
      const third = start();
      await third.waitForLog('redis-lock-proxy listening');
      expect(await exchange(port, cmd('PING'), 1)).toBe('+PONG\r\n');
    } finally {
      await unit.close();
    }
  }, 180_000);

  it('/readyz answers 503 from the moment SIGTERM arrives while the connections drain, on an admin socket passed too', async () => {
    const unit = await SocketUnit.open(['redis-lock-proxy.socket', 'admin']);
    const [port, adminPort] = unit.ports;
    // --admin-listen off: the admin socket passed is used all the same.
    const proxy = unit.start(
      ['--listen', '127.0.0.1:0', '--upstream', redis.url, '--admin-listen', 'off', '--shutdown-timeout-ms', '60000'],
      cleanEnv(),
    );
    const readyz = async (): Promise<{ status: number; body: string }> => {
      const reply = await fetch(`http://127.0.0.1:${adminPort}/readyz`);
      return { status: reply.status, body: await reply.text() };
    };
    try {
      const listening = await proxy.waitForLog('redis-lock-proxy listening');
      expect(listening).toMatchObject({ listen: `127.0.0.1:${port}`, admin: `127.0.0.1:${adminPort}` });
      await expect.poll(async () => (await readyz()).status, { timeout: 30_000 }).toBe(200);

      // A connection with a command in flight keeps the drain going until Redis answers it.
      const key = `socket-activation:drain:${adminPort}`;
      const busy = await RawClient.connect(port);
      busy.write(cmd('BLPOP', key, '0'));
      await expect
        .poll(async () => (await exchange(redis.port, cmd('CLIENT', 'LIST', 'TYPE', 'normal'), 1)).includes('cmd=blpop'), {
          timeout: 30_000,
        })
        .toBe(true);
      await proxy.kill('SIGTERM');
      await proxy.waitForLog('shutting down: finishing in-flight requests');
      expect(await readyz()).toEqual({
        status: 503,
        body: 'not ready: shutting down: finishing in-flight requests, accepting no new connections\n',
      });
      expect((await fetch(`http://127.0.0.1:${adminPort}/healthz`)).status).toBe(200);
      expect(busy.isClosed).toBe(false);

      expect(await exchange(redis.port, cmd('RPUSH', key, 'done'), 1)).toBe(':1\r\n');
      expect((await busy.readReplies(1, REPLY_TIMEOUT_MS)).toString()).toBe(`*2\r\n$${key.length}\r\n${key}\r\n$4\r\ndone\r\n`);
      await busy.readUntilClosed(REPLY_TIMEOUT_MS);
      expect(await proxy.exited).toBe(0);
    } finally {
      await unit.close();
    }
  }, 120_000);

  it('refuses sockets it cannot tell apart, naming the variables, and exits with status 2', async () => {
    const unit = await SocketUnit.open(['redis-lock-proxy.socket', 'redis-lock-proxy.socket']);
    try {
      const proxy = unit.start(['--upstream', redis.url], cleanEnv());
      expect(await proxy.exited).toBe(2);
      expect(proxy.stderr).toBe(
        'redis-lock-proxy: LISTEN_FDS passes 2 sockets for clients and 0 for the admin server ' +
          '(3: redis-lock-proxy.socket, 4: redis-lock-proxy.socket); the proxy takes one of each: one ListenStream= for clients, ' +
          'and the admin socket in a socket unit of its own with FileDescriptorName=admin\n',
      );
    } finally {
      await unit.close();
    }
  }, 60_000);
});
