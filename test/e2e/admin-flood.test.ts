/**
 * A flood of the admin port does not take the data path down, against a real Redis, with the
 * built proxy in a process of its own whose file descriptor limit is 1,024 (as a service's often
 * is):
 *
 * - 3,000 connections that send half a request and wait: the admin server holds at most its cap
 *   of them and keeps file descriptors for clients, so PING and Stalwart's lock block through the
 *   proxy go on working, and the refusals are logged;
 * - 2,000 concurrent /metrics requests: rendered once per second, not once per request, so the
 *   event loop the clients share stays free.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, Cli, cleanEnv, ensureBuilt } from '../support/cli.js';
import { freePort } from '../support/ports.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { RawClient } from '../support/resp.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';

const FD_LIMIT = 1024;

let redis: RedisServer;
let proxy: Cli;
let port: number;
let adminPort: number;

beforeAll(async () => {
  await ensureBuilt();
  redis = await startRedis();
  port = await freePort();
  adminPort = await freePort();
  proxy = new Cli(
    [
      `--nofile=${FD_LIMIT}:${FD_LIMIT}`,
      process.execPath,
      CLI,
      '--listen',
      `127.0.0.1:${port}`,
      '--upstream',
      redis.url,
      '--admin-listen',
      `127.0.0.1:${adminPort}`,
    ],
    cleanEnv(),
    'prlimit',
  );
  await proxy.waitForLog('redis-lock-proxy listening');
}, 30_000);

afterAll(async () => {
  proxy?.kill('SIGTERM');
  await proxy?.stop();
  await redis?.stop();
});

/**
 * Runs `script` (JavaScript, with `port` the admin port) in a node process of its own, so that
 * the flood's own work does not hold up the PINGs this process measures. Resolves with its output.
 */
async function floodFromAnotherProcess(script: string): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, ['-e', `const port = ${adminPort};\n${script}`], { timeout: 60_000 });
  return stdout;
}

/** PINGs through the proxy, one after another, until `done` resolves; their latencies in ms. */
async function pingWhile(done: Promise<unknown>): Promise<number[]> {
  const client = await RawClient.connect(port);
  const latencies: number[] = [];
  let finished = false;
  void done.finally(() => (finished = true));
  try {
    while (!finished) {
      const sent = performance.now();
      expect(await client.call('PING')).toBe('+PONG\r\n');
      latencies.push(performance.now() - sent);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  } finally {
    client.destroy();
  }
  return latencies;
}

/** Stalwart's lock block on `count` fresh connections (as a pool reconnects), 10 at a time: each must take its lock. */
async function lockBlocks(first: number, count: number): Promise<void> {
  for (let start = first; start < first + count; start += 10) {
    await Promise.all(
      Array.from({ length: 10 }, async (_, i) => {
        const client = await RawClient.connect(port);
        client.write(lockAttempt(taskLockKey(BigInt(start + i)), 60));
        expect((await client.readReplies(4, 10_000)).toString()).toBe(attemptReplies(1, 1));
        client.destroy();
      }),
    );
  }
}

function describeLatencies(latencies: number[]): string {
  const sorted = [...latencies].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]?.toFixed(1);
  return `${sorted.length} PINGs: p50 ${at(0.5)} ms, p99 ${at(0.99)} ms, max ${sorted.at(-1)?.toFixed(1)} ms`;
}

describe(`the admin port flooded, the proxy's file descriptors limited to ${FD_LIMIT}`, () => {
  it('3,000 half-open requests: lock blocks and PINGs go on, and the refusals are logged', async () => {
    const before = describeLatencies(await pingWhile(new Promise((resolve) => setTimeout(resolve, 500))));
    // 3,000 connections that send half a request and then hold on, for ten seconds.
    const flood = floodFromAnotherProcess(`
      const net = require('node:net');
      let open = 0;
      for (let i = 0; i < 3000; i++) {
        const socket = net.connect({ host: '127.0.0.1', port });
        socket.on('error', () => {});
        socket.on('connect', () => { open++; socket.write('GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n'); });
      }
      setTimeout(() => { console.log(open); process.exit(0); }, 10000);
    `);
    await new Promise((resolve) => setTimeout(resolve, 2_000)); // the flood is on
    const blocks = lockBlocks(0, 200);
    const during = await pingWhile(blocks);
    await blocks;
    const connected = Number(await flood);
    console.info(`admin flood of 3,000 half-open requests (${connected} connected): before ${before}; during ${describeLatencies(during)}`);
    expect(connected).toBeGreaterThan(1000);
    expect(during.length).toBeGreaterThan(0);
    expect(proxy.logLines().some((line) => String(line.msg).startsWith('admin server: connections refused'))).toBe(true);
    // The admin server serves again once the flood is gone.
    await expect
      .poll(async () => (await fetch(`http://127.0.0.1:${adminPort}/healthz`).catch(() => undefined))?.status, { timeout: 15_000 })
      .toBe(200);
  }, 120_000);

  it('2,000 concurrent /metrics requests: PINGs through the proxy stay fast, lock blocks work', async () => {
    const flood = floodFromAnotherProcess(`
      Promise.allSettled(Array.from({ length: 2000 }, () => fetch('http://127.0.0.1:' + port + '/metrics').then((r) => r.text())))
        .then((results) => console.log(results.filter((r) => r.status === 'fulfilled').length));
    `);
    const work = Promise.all([flood, lockBlocks(1000, 100)]);
    const during = await pingWhile(work);
    const [output] = await work;
    console.info(`2,000 concurrent /metrics: ${Number(output)} served, the rest refused; during it ${describeLatencies(during)}`);
    expect(Number(output)).toBeGreaterThan(0);
    // Generous for a busy machine: rendering once per request stalled PINGs for seconds.
    expect(Math.max(...during)).toBeLessThan(1_000);
    const metrics = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
    expect(metrics).toMatch(/^redis_lock_proxy_admin_connections_refused_total\{reason="connections"\} [1-9]\d*$/m);
  }, 120_000);
});
