/**
 * An upstream that is not Redis, or that stops answering: the client learns it, and nothing
 * lingers. An HTTP server given as the upstream gets one RESP error naming it (not its bytes); a
 * listener that accepts and never answers is cut off by --upstream-timeout-ms when set, and in
 * any case once the client has gone; blocking commands and subscriptions are exempt from the
 * timeout. The misbehaving upstreams here are small servers of the test's own (they stand for
 * what is not Redis); everything else is a real redis-server.
 */
import http from 'node:http';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestProxy } from '../support/proxy.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { busyScript, cmd, RawClient } from '../support/resp.js';
import { lockAttempt, taskLockKey } from '../support/stalwart.js';

const env = redisWithAdmin();

/** A server of the test's own on a free loopback port. */
async function listening(server: net.Server): Promise<{ url: string; close(): Promise<void> }> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  return { url: `redis://127.0.0.1:${port}`, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

describe('an upstream that does not speak RESP', () => {
  let httpServer: { url: string; close(): Promise<void> };
  beforeAll(async () => {
    const server = http.createServer((_req, res) => res.end('not redis'));
    httpServer = await listening(server);
  });
  afterAll(async () => {
    await httpServer?.close();
  });

  it('gives the client one error naming it, and a close; it is logged, counted and /readyz says so', async () => {
    const proxy = await startTestProxy({ upstream: httpServer.url, admin: true });
    try {
      for (const request of [cmd('PING'), lockAttempt(taskLockKey(5n), 60)]) {
        const client = await RawClient.connect(proxy.port);
        client.write(request);
        const answer = (await client.readUntilClosed(10_000)).toString('latin1');
        expect(answer).toMatch(
          /^-ERR redis-lock-proxy: upstream redis:\/\/127\.0\.0\.1:\d+ does not speak RESP \(it answered "HTTP\/1\.1 400 Bad"\.\.\.\)\r\n$/,
        );
        await client.close();
      }
      expect(proxy.stats.upstreamNotResp).toBe(2);
      expect(proxy.logs().filter((l) => l.msg === 'upstream does not speak RESP')).toHaveLength(1);
      expect(await proxy.metrics()).toMatch(/^redis_lock_proxy_upstream_not_resp_total 2$/m);
      const ready = await proxy.app.probeUpstream();
      expect(ready).toEqual({
        ok: false,
        detail: expect.stringMatching(/does not speak RESP \(it answered "HTTP\/1\.1 400 Bad"\.\.\.\)$/),
      });
    } finally {
      await proxy.close();
    }
  });
});

describe('an upstream that accepts and never answers', () => {
  let silent: { url: string; close(): Promise<void> };
  const held: net.Socket[] = [];
  beforeAll(async () => {
    silent = await listening(net.createServer({ allowHalfOpen: true }, (socket) => held.push(socket)));
  });
  afterAll(async () => {
    for (const socket of held) socket.destroy();
    await silent?.close();
  });

  it('with --upstream-timeout-ms: the client connection is closed, logged and counted', async () => {
    const proxy = await startTestProxy({ upstream: silent.url, admin: true, flags: ['--upstream-timeout-ms', '300'] });
    try {
      const client = await RawClient.connect(proxy.port);
      client.write(cmd('PING'));
      expect((await client.readUntilClosed(10_000)).toString('latin1')).toBe('');
      expect(proxy.stats.upstreamTimeouts).toBe(1);
      expect(proxy.logs().find((l) => l.msg === 'no reply from Redis within --upstream-timeout-ms; closing the connection')).toMatchObject({
        silentMs: 300,
      });
      expect(await proxy.metrics()).toMatch(/^redis_lock_proxy_upstream_timeouts_total 1$/m);
      await client.close();
    } finally {
      await proxy.close();
    }
  });

  it('without it: once the client has gone, the connection does not linger half-closed', async () => {
    const proxy = await startTestProxy({ upstream: silent.url });
    try {
      const client = await RawClient.connect(proxy.port);
      client.write(cmd('PING'));
      await sleep(200);
      await client.close(); // the client gives up
      const deadline = Date.now() + 20_000;
      while (proxy.stats.connectionsOpen > 0 && Date.now() < deadline) await sleep(100);
      expect(proxy.stats.connectionsOpen).toBe(0);
    } finally {
      await proxy.close();
    }
  }, 30_000);
});

describe('--upstream-timeout-ms in front of Redis', () => {
  it('lets blocking commands and subscriptions wait, and closes on a command that takes longer', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url, flags: ['--upstream-timeout-ms', '300'] });
    const busy = await RawClient.connect(env.redis.port);
    try {
      const client = await RawClient.connect(proxy.port);
      client.write(Buffer.concat([cmd('BLPOP', 'nothing-here', '1'), cmd('PING')]));
      expect((await client.readReplies(2, 10_000)).toString('latin1')).toMatch(/^(\*-1|_)\r\n\+PONG\r\n$/);
      client.write(cmd('SUBSCRIBE', 'quiet'));
      await client.readReplies(1);
      await sleep(1000);
      expect(client.isClosed).toBe(false);
      await client.close();

      // A connection whose blocking command was answered is watched again: a script keeps the
      // server busy for 2 s, and a PING on it meanwhile gets no reply in time.
      const stalled = await RawClient.connect(proxy.port);
      stalled.write(cmd('BLPOP', 'nothing-here', '0.5'));
      expect((await stalled.readReplies(1, 10_000)).toString('latin1')).toMatch(/^(\*-1|_)\r\n$/);
      busy.write(busyScript(2));
      await sleep(100);
      stalled.write(cmd('PING'));
      expect((await stalled.readUntilClosed(10_000)).toString('latin1')).toBe('');
      expect(proxy.stats.upstreamTimeouts).toBe(1);
      await stalled.close();
    } finally {
      await busy.readReplies(1, 10_000).catch(() => undefined);
      await busy.close();
      await proxy.close();
    }
  });
});
