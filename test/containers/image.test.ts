/**
 * The proxy's image, built from this checkout (support/images.ts) and run the
 * way an operator runs it: a Redis container beside it on a network of their
 * own, ports published on 127.0.0.1, a read-only root file system, settings
 * from environment variables, rules mounted over the shipped ones, stopped
 * with the engine's `stop`.
 */
import { execFile } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, inject, it, vi } from 'vitest';
import { churn } from '../bench/churn.js';
import { MEMORY_FULL } from '../bench/memory-tests.js';
import { openIdleConnections, slowReaders } from '../bench/memory.js';
import { ROOT } from '../support/cli.js';
import { podmanNotes } from '../support/docs.js';
import { cmd, RawClient } from '../support/resp.js';
import { attemptCounter, taskLockKey } from '../support/stalwart.js';
import { createNetwork, httpGet, runContainer, type Container, type RunOptions } from './support/containers.js';
import { engineExec } from './support/engine.js';
import { SERVER_FOR_IMAGE_TESTS } from './support/global-setup.js';
import { proxyImage, qualified, serverImage, serverImageSpec, type ProxyImage } from './support/images.js';

const setup = inject('containers');
const RESP_PORT = 6380;
const ADMIN_PORT = 9180;
/** A Stalwart lock's expiry, and the lower TTL a test sets to see whether an attempt re-arms it. */
const LOCK_SECONDS = 60;
const LOWERED_MS = 30_000;

interface RunningProxy {
  container: Container;
  resp: number;
  admin: number;
}

describe.skipIf(setup.skip !== undefined)('the image', () => {
  let image: ProxyImage;
  let network: { name: string; remove(): Promise<void> };
  let redis: Container;
  let redisPort: number;
  let upstream: string;
  let proxy: RunningProxy;
  const containers: Container[] = [];
  const dirs: string[] = [];

  /** The proxy's image, started and ready (/readyz answers 200). */
  async function startProxy(opts: Partial<RunOptions> & { ports?: [number, number] } = {}): Promise<RunningProxy> {
    const [resp, admin] = opts.ports ?? [RESP_PORT, ADMIN_PORT];
    const container = await runContainer({
      image: image.reference,
      network: network.name,
      publish: [resp, admin],
      readOnly: true,
      ...opts,
      env: { REDIS_LOCK_PROXY_UPSTREAM: upstream, ...opts.env },
    });
    containers.push(container);
    const running = { container, resp: await container.hostPort(resp), admin: await container.hostPort(admin) };
    await vi.waitFor(
      async () => {
        const ready = await httpGet(`http://127.0.0.1:${running.admin}/readyz`).catch((err: Error) => ({ status: 0, body: err.message }));
        if (ready.status !== 200) throw new Error(`/readyz: ${ready.status} ${ready.body}\n${await container.logs()}`);
      },
      { timeout: 60_000, interval: 200 },
    );
    return running;
  }

  /** A raw connection to Redis itself, past the proxy. */
  const direct = () => RawClient.connect(redisPort);

  /**
   * Stalwart's exact bytes through `port`, twice, with the TTL lowered in
   * between: whether the second attempt left the TTL alone (the fix) and the
   * counters both attempts returned.
   */
  async function lockTwice(port: number, key: Buffer | string): Promise<{ counters: number[]; rearmed: boolean }> {
    const redisClient = await direct();
    try {
      const first = await attemptCounter(port, Buffer.from(key), LOCK_SECONDS);
      await redisClient.call('PEXPIRE', key, String(LOWERED_MS));
      const second = await attemptCounter(port, Buffer.from(key), LOCK_SECONDS);
      return { counters: [first, second], rearmed: (await redisClient.pttl(key)) > LOWERED_MS };
    } finally {
      redisClient.destroy();
    }
  }

  /**
   * The HEALTHCHECK passes, at the latest after a few tries: its command (a Node process) must
   * start and answer within the check's own timeout, which a busy machine can miss now and then.
   */
  const expectHealthy = (container: Container) =>
    vi.waitFor(async () => expect(await container.healthcheck()).toBe(true), { timeout: 60_000, interval: 1000 });

  let keys = 0;
  /** A task lock key no other test uses. */
  const freshTaskKey = () => taskLockKey(BigInt(Date.now()) * 1000n + BigInt(keys++));

  beforeAll(async () => {
    image = await proxyImage();
    network = await createNetwork();
    redis = await runContainer({
      image: await serverImage(serverImageSpec(SERVER_FOR_IMAGE_TESTS)),
      name: `${network.name}-redis`,
      network: network.name,
      publish: [6379],
    });
    containers.push(redis);
    upstream = `redis://${redis.name}:6379`;
    redisPort = await redis.hostPort(6379);
    await vi.waitFor(
      async () => {
        const client = await direct();
        try {
          expect(await client.call('PING')).toBe('+PONG\r\n');
        } finally {
          client.destroy();
        }
      },
      { timeout: 60_000, interval: 200 },
    );
    proxy = await startProxy();
  });

  afterAll(async () => {
    await Promise.all(containers.map((c) => c.remove()));
    await network?.remove();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it('holds the Kubernetes example memory limit (256Mi) with 5,000 idle connections, 20 slow readers of 8 MiB and churn, all at once', async () => {
    const limited = await startProxy({ memory: '256m', ports: [RESP_PORT, ADMIN_PORT] });
    const { idleConnections, readers, churnConcurrency, allAtOnceSeconds } = MEMORY_FULL;
    // The cgroup's own peak is read after the load; nothing is polled meanwhile.
    const notPolled = () => ({ rss: 0, hwm: 0 });
    const idle = await openIdleConnections(limited.resp, idleConnections);
    try {
      const [, churned] = await Promise.all([
        slowReaders(limited.resp, redisPort, readers, notPolled),
        churn(limited.resp, { concurrency: churnConcurrency, seconds: allAtOnceSeconds, memory: notPolled }),
      ]);
      expect(idle.failure()).toBeNull();
      expect(churned.failed).toBeLessThanOrEqual(churned.connections / 100);
    } finally {
      idle.close();
    }
    const peak = await limited.container.memoryPeakMiB();
    console.log(`the image under --memory 256m, all at once: cgroup memory peak ${peak.toFixed(1)} MiB`);
    expect((await limited.container.inspect('{{.State.OOMKilled}}')).trim()).toBe('false');
    expect(peak).toBeLessThan(256);
    const client = await RawClient.connect(limited.resp);
    try {
      expect(await client.call('PING')).toBe('+PONG\r\n');
    } finally {
      client.destroy();
    }
    await limited.container.remove();
  });

  it('runs as uid 1000 on a read-only root file system', async () => {
    const status = await proxy.container.exec(['cat', '/proc/1/status']);
    expect(status.stdout).toMatch(/^Uid:\s+1000\s+1000\s+1000\s+1000$/m);
    expect(status.stdout).toMatch(/^Gid:\s+1000\s+1000\s+1000\s+1000$/m);
    expect((await proxy.container.inspect('{{.HostConfig.ReadonlyRootfs}}')).trim()).toBe('true');
    for (const dir of ['/app', '/tmp', '/home/node']) {
      const write = await proxy.container.exec(['touch', `${dir}/written`]);
      expect(write.code, dir).not.toBe(0);
      expect(write.stderr, dir).toMatch(/Read-only file system/);
    }
  });

  it('starts under the ulimits docs/running.md gives for hosts whose hard limits are below podman’s defaults', async () => {
    // The open-file limit at most what this host allows, as the note says.
    const hardFiles = Number((await promisify(execFile)('sh', ['-c', 'ulimit -Hn'])).stdout.trim());
    const ulimits = podmanNotes().ulimits.map((ulimit) => {
      const [, name, value] = /^(\w+)=(\d+):\2$/.exec(ulimit) ?? [];
      expect(name, ulimit).toBeDefined();
      return name === 'nofile' && hardFiles < Number(value) ? `nofile=${hardFiles}:${hardFiles}` : ulimit;
    });
    const limited = await startProxy({ ulimits });
    const limits = (await limited.container.exec(['cat', '/proc/1/limits'])).stdout;
    const limit = (name: string) =>
      /^Max (?:open files|processes)\s+(\d+)\s+(\d+)/m.exec(limits.split('\n').find((line) => line.startsWith(name)) ?? '');
    for (const ulimit of ulimits) {
      const [, name, value] = /^(\w+)=(\d+):/.exec(ulimit) ?? [];
      expect(limit(name === 'nofile' ? 'Max open files' : 'Max processes')?.slice(1), ulimit).toEqual([value, value]);
    }
    expect((await lockTwice(limited.resp, freshTaskKey())).rearmed).toBe(false);
  });

  it("proxies, and fixes a lock taken with Stalwart's exact bytes", async () => {
    const client = await RawClient.connect(proxy.resp);
    try {
      expect(await client.call('PING')).toBe('+PONG\r\n');
    } finally {
      client.destroy();
    }
    const key = freshTaskKey();
    expect(await lockTwice(proxy.resp, key)).toEqual({ counters: [1, 2], rearmed: false });
    // The same bytes straight to Redis re-arm the expiry: the bug the proxy fixes.
    const bare = freshTaskKey();
    expect(await lockTwice(redisPort, bare)).toEqual({ counters: [1, 2], rearmed: true });
  });

  it('serves /healthz, /readyz and /metrics outside the container', async () => {
    const base = `http://127.0.0.1:${proxy.admin}`;
    expect(await httpGet(`${base}/healthz`)).toMatchObject({ status: 200 });
    expect(await httpGet(`${base}/readyz`)).toMatchObject({ status: 200 });
    const metrics = await httpGet(`${base}/metrics`);
    expect(metrics.status).toBe(200);
    expect(metrics.body).toMatch(/^redis_lock_proxy_ready 1$/m);
    expect(metrics.body).toMatch(/^redis_lock_proxy_blocks_total\{rule="stalwart-task-lock",outcome="seen"\} [1-9]/m);
  });

  it('passes its HEALTHCHECK while the proxy answers, and fails it when the proxy does not', async () => {
    await expectHealthy(proxy.container);
    // A stopped (hung) process: the check's request goes unanswered until its timeout.
    await proxy.container.kill('SIGSTOP');
    try {
      expect(await proxy.container.healthcheck()).toBe(false);
    } finally {
      await proxy.container.kill('SIGCONT');
    }
    await expectHealthy(proxy.container);
  });

  it('keeps the HEALTHCHECK the Dockerfile declares', async () => {
    const dockerfile = readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8');
    const declared = /^HEALTHCHECK --interval=(\d+)s --timeout=(\d+)s --start-period=(\d+)s --retries=(\d+) \\\n\s+CMD (\[.*\])$/m.exec(
      dockerfile,
    );
    expect(declared).not.toBeNull();
    const [, interval, timeout, startPeriod, retries, command] = declared ?? [];
    const healthcheck = JSON.parse(
      (await engineExec(['image', 'inspect', '--format', '{{json .Config.Healthcheck}}', image.reference])).stdout,
    ) as {
      Test: string[];
      Interval: number;
      Timeout: number;
      StartPeriod: number;
      Retries: number;
    };
    const seconds = (n: string) => Number(n) * 1e9;
    expect(healthcheck).toEqual({
      Test: ['CMD', ...(JSON.parse(command) as string[])],
      Interval: seconds(interval),
      Timeout: seconds(timeout),
      StartPeriod: seconds(startPeriod),
      Retries: Number(retries),
    });
  });

  it('exits 0 on SIGTERM (engine stop) with an in-flight request answered, inside the 10 s default grace', async () => {
    const stopping = await startProxy();
    const list = `shutdown:${Date.now()}`;
    const blocked = await RawClient.connect(stopping.resp);
    const redisClient = await direct();
    try {
      blocked.write(cmd('BLPOP', list, '0'));
      await vi.waitFor(async () => expect(await redisClient.call('INFO', 'clients')).toMatch(/^blocked_clients:[1-9]/m), {
        timeout: 30_000,
      });
      const stopped = stopping.container.stop();
      await stopping.container.waitForLog(/shutting down: finishing in-flight requests/);
      expect(await redisClient.call('RPUSH', list, 'answered')).toBe(':1\r\n');
      expect((await blocked.readReplies(1, 30_000)).toString()).toBe(`*2\r\n$${list.length}\r\n${list}\r\n$8\r\nanswered\r\n`);
      // 0, not 137: it exited by itself, before the engine's SIGKILL.
      const { exitCode, ms } = await stopped;
      expect(exitCode).toBe(0);
      console.info(`engine stop: exit code 0 after ${ms} ms`);
      expect(await stopping.container.logs()).toMatch(/"msg":"shut down"/);
    } finally {
      blocked.destroy();
      redisClient.destroy();
    }
  });

  it('uses rules mounted over /etc/redis-lock-proxy/rules, and reloads them on SIGHUP and when watching', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'rlp-rules-'));
    dirs.push(dir);
    chmodSync(dir, 0o755); // readable by uid 1000, as a ConfigMap is
    const writeRules = (prefixes: string[]) =>
      writeFileSync(path.join(dir, 'site.yaml'), 'rules:\n' + prefixes.map((p) => `  - name: site-${p}\n    prefix: "${p}:"\n`).join(''), {
        mode: 0o644,
      });
    writeRules(['mounted']);
    const mounts = [{ source: dir, target: '/etc/redis-lock-proxy/rules', readOnly: true }];
    const signalled = await startProxy({ mounts });
    const watching = await startProxy({ mounts, env: { REDIS_LOCK_PROXY_WATCH_RULES: 'true' } });
    for (const running of [signalled, watching]) {
      expect(await lockTwice(running.resp, `mounted:${keys++}`)).toEqual({ counters: [1, 2], rearmed: false });
      // The mounted directory replaces the shipped rules.
      expect((await lockTwice(running.resp, freshTaskKey())).rearmed).toBe(true);
    }

    writeRules(['mounted', 'reloaded']);
    await signalled.container.kill('SIGHUP');
    for (const running of [signalled, watching]) {
      await vi.waitFor(async () => expect((await lockTwice(running.resp, `reloaded:${keys++}`)).rearmed).toBe(false), {
        timeout: 30_000,
        interval: 500,
      });
    }
  });

  it('takes its settings from environment variables, and its HEALTHCHECK follows the admin address given that way', async () => {
    const observing = await startProxy({
      ports: [6390, 9190],
      env: { REDIS_LOCK_PROXY_LISTEN: '0.0.0.0:6390', REDIS_LOCK_PROXY_ADMIN_LISTEN: '0.0.0.0:9190', REDIS_LOCK_PROXY_MODE: 'observe' },
    });
    expect((await lockTwice(observing.resp, freshTaskKey())).rearmed).toBe(true);
    expect((await httpGet(`http://127.0.0.1:${observing.admin}/metrics`)).body).toMatch(
      /^redis_lock_proxy_blocks_total\{rule="stalwart-task-lock",outcome="observed"\} [1-9]/m,
    );
    await expectHealthy(observing.container);

    // Moved by the flag instead, the admin address is not where the HEALTHCHECK looks (as docs/running.md warns).
    const flagged = await startProxy({ ports: [RESP_PORT, 9191], args: ['--admin-listen', '0.0.0.0:9191'] });
    expect(await flagged.container.healthcheck()).toBe(false);

    // With the admin server off, the HEALTHCHECK checks that the RESP port takes connections.
    const quiet = await runContainer({
      image: image.reference,
      network: network.name,
      readOnly: true,
      env: { REDIS_LOCK_PROXY_UPSTREAM: upstream, REDIS_LOCK_PROXY_ADMIN_LISTEN: 'off' },
    });
    containers.push(quiet);
    await quiet.waitForLog(/redis-lock-proxy listening/);
    await expectHealthy(quiet);
  });

  it('runs verify and locks inside the container', async () => {
    // A generous --timeout-ms: the machine may be busy.
    const verify = await proxy.container.exec(['redis-lock-proxy', 'verify', '--via', `127.0.0.1:${RESP_PORT}`, '--timeout-ms', '60000']);
    expect(verify, verify.stderr).toMatchObject({ code: 0 });
    expect(verify.stdout).toMatch(/^verify: OK: \d+ rule\(s\) enforce the fix through 127\.0\.0\.1:6380/);

    const key = freshTaskKey();
    await lockTwice(proxy.resp, key);
    const locks = await proxy.container.exec(['redis-lock-proxy', 'locks', '--upstream', upstream, '--json']);
    expect(locks, locks.stderr).toMatchObject({ code: 0 });
    const rows = locks.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as { key_hex: string });
    expect(rows.find((row) => row.key_hex === key.toString('hex'))).toMatchObject({ rule: 'stalwart-task-lock', counter: 2 });
  });

  it('carries its labels', async () => {
    const labels = JSON.parse(
      (await engineExec(['image', 'inspect', '--format', '{{json .Config.Labels}}', image.reference])).stdout,
    ) as Record<string, string>;
    expect(labels).toMatchObject({
      'org.opencontainers.image.title': 'redis-lock-proxy',
      'org.opencontainers.image.licenses': 'Apache-2.0',
      'org.opencontainers.image.version': image.version,
      'org.opencontainers.image.revision': image.revision,
      'org.opencontainers.image.base.name': image.base,
    });
    expect(labels['org.opencontainers.image.description']).toMatch(/Stalwart/);
    expect(new Date(labels['org.opencontainers.image.created']).getTime()).not.toBeNaN();
  });

  it('holds no dev dependency, compiler, source or test file', async () => {
    const lock = JSON.parse(readFileSync(path.join(ROOT, 'package-lock.json'), 'utf8')) as { packages: Record<string, { dev?: boolean }> };
    const devOnly = Object.entries(lock.packages)
      .filter(([where, pkg]) => where !== '' && pkg.dev)
      .map(([where]) => where);
    expect(devOnly).toContain('node_modules/typescript');
    const present = await proxy.container.exec([
      'sh',
      '-c',
      'cd /app && for p in "$@"; do [ -e "$p" ] && echo "$p"; done; true',
      'sh',
      ...devOnly,
    ]);
    expect(present.stdout.trim().split('\n').filter(Boolean)).toEqual([]);

    const app = await proxy.container.exec(['ls', '-A', '/app']);
    expect(app.stdout.trim().split('\n').sort()).toEqual(['dist', 'node_modules', 'package-lock.json', 'package.json', 'rules']);
    const unwanted = await proxy.container.exec([
      'sh',
      '-c',
      "find /app/dist \\( -name '*.ts' -o -name '*.test.*' -o -name '*.spec.*' \\) -print",
    ]);
    expect(unwanted.stdout).toBe('');
    const compilers = await proxy.container.exec(['sh', '-c', 'for c in tsc gcc cc c++ g++ clang make; do command -v "$c"; done; true']);
    expect(compilers.stdout).toBe('');
  });

  it('keeps the extra CA given to its build out of every layer it adds to the base', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'rlp-image-save-'));
    dirs.push(dir);
    const archive = path.join(dir, 'image.tar');
    await engineExec(['image', 'save', '--output', archive, image.reference]);
    const sh = (script: string, ...args: string[]) =>
      promisify(execFile)('sh', ['-c', script, 'sh', archive, ...args], { maxBuffer: 64 * 1024 * 1024 });
    const manifest = JSON.parse((await sh('tar -xOf "$1" manifest.json')).stdout) as Array<{ Layers: string[] }>;
    const baseLayers = Number((await engineExec(['image', 'inspect', '--format', '{{len .RootFS.Layers}}', qualified(image.base)])).stdout);
    const added = manifest[0].Layers.slice(baseLayers);
    expect(added.length).toBeGreaterThan(0);
    for (const layer of added) {
      const files = (await sh('tar -xOf "$1" "$2" | tar -t', layer)).stdout;
      // The secret's mount point may stay behind as an empty directory; nothing may be in it.
      expect(files, layer).not.toMatch(/(^|\/)run\/secrets\/./m);
      const copies = (await sh('tar -xOf "$1" "$2" | tar -xO | grep -cF "$3" || true', layer, image.extraCaMarker)).stdout.trim();
      expect(copies, layer).toBe('0');
    }
    const history = (await engineExec(['image', 'history', '--no-trunc', '--format', '{{.CreatedBy}}', image.reference])).stdout;
    expect(history).not.toContain(image.extraCaMarker);
    expect(await proxy.container.exec(['sh', '-c', 'echo "$NODE_EXTRA_CA_CERTS"; ls /run/secrets 2>/dev/null; true'])).toMatchObject({
      stdout: '\n',
    });

    const size = async (ref: string) => Number((await engineExec(['image', 'inspect', '--format', '{{.Size}}', ref])).stdout);
    const [total, base] = [await size(image.reference), await size(qualified(image.base))];
    console.info(
      `image ${image.reference}: ${(total / 1e6).toFixed(1)} MB, of which the base ${(base / 1e6).toFixed(1)} MB and the project ${((total - base) / 1e6).toFixed(1)} MB`,
    );
  });
});
