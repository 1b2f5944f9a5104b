/**
 * Readiness for systemd (Type=notify), without systemd: NOTIFY_SOCKET names a unix datagram
 * socket this test binds, as systemd does, and reads what the built command line sends: no
 * READY=1 while its Redis does not answer (a STATUS= line says why), READY=1 once the proxy
 * listens and Redis answers, STOPPING=1 on SIGTERM. (The unit itself: install-from-tarball.test.ts.)
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createSocket, type UnixDgramSocket } from 'unix-dgram';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cli, cleanEnv, ensureBuilt } from '../support/cli.js';
import { freePort } from '../support/ports.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { cmd, exchange } from '../support/resp.js';

let tmp: string;

beforeAll(async () => {
  await ensureBuilt();
  tmp = mkdtempSync(path.join(os.tmpdir(), 'rlp-notify-'));
});

afterAll(() => {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

/** A notification socket as systemd binds one; `messages` are the datagrams received. */
function notifySocket(name: string): { path: string; messages: string[]; socket: UnixDgramSocket } {
  const socketPath = path.join(tmp, name);
  const messages: string[] = [];
  const socket = createSocket('unix_dgram', (message: Buffer) => messages.push(message.toString()));
  socket.bind(socketPath);
  return { path: socketPath, messages, socket };
}

describe('NOTIFY_SOCKET (systemd Type=notify)', () => {
  it('sends READY=1 only once the proxy listens and its Redis answers, and STOPPING=1 on SIGTERM', async () => {
    const notify = notifySocket('notify-late.sock');
    const redisSocket = path.join(tmp, 'late-redis.sock');
    const port = await freePort();
    const cli = new Cli(['--listen', `127.0.0.1:${port}`, '--upstream', `unix://${redisSocket}`], cleanEnv({ NOTIFY_SOCKET: notify.path }));
    let redis: RedisServer | undefined;
    try {
      await cli.waitForLog('redis-lock-proxy listening');
      // Redis is not there yet: the status says so, and no READY=1 comes.
      await expect
        .poll(() => notify.messages.some((m) => m.startsWith('STATUS=waiting for the upstream to answer: ')), { timeout: 10_000 })
        .toBe(true);
      await new Promise((resolve) => setTimeout(resolve, 1500));
      expect(notify.messages.filter((m) => m.includes('READY=1'))).toEqual([]);

      redis = await startRedis({ args: ['--unixsocket', redisSocket, '--unixsocketperm', '700'] });
      await expect
        .poll(() => notify.messages.find((m) => m.startsWith('READY=1\n')), { timeout: 10_000 })
        .toMatch(new RegExp(`^READY=1\\nSTATUS=listening on 127\\.0\\.0\\.1:${port}; upstream .* answers PING$`));
      expect(await exchange(port, cmd('PING'), 1)).toBe('+PONG\r\n');
      await cli.waitForLog('upstream answers');

      cli.kill('SIGTERM');
      expect((await cli.exited).code).toBe(0);
      await expect.poll(() => notify.messages.at(-1), { timeout: 5000 }).toBe('STOPPING=1');
      expect(notify.messages.filter((m) => m.includes('READY=1'))).toHaveLength(1);
    } finally {
      await cli.stop();
      await redis?.stop();
      notify.socket.close();
    }
  });

  it('sends READY=1 at once when Redis answers from the start', async () => {
    const notify = notifySocket('notify-up.sock');
    const redis = await startRedis();
    const cli = new Cli(['--listen', `127.0.0.1:${await freePort()}`, '--upstream', redis.url], cleanEnv({ NOTIFY_SOCKET: notify.path }));
    try {
      await cli.waitForLog('redis-lock-proxy listening');
      await expect.poll(() => notify.messages, { timeout: 10_000 }).toContainEqual(expect.stringMatching(/^READY=1\n/));
      expect(notify.messages.filter((m) => m.startsWith('STATUS='))).toEqual([]);
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
      await redis.stop();
      notify.socket.close();
    }
  });
});
