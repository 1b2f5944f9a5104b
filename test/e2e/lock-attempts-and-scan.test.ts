/**
 * When can the proxy go, and which locks are stuck, against a real Redis:
 *
 * - lock attempts are counted per rule in both shapes, the old block (MULTI/INCRBY/EXPIRE/EXEC)
 *   and the fixed one (SET key value NX EX n, Stalwart 0.16.16+), in /metrics;
 * - the periodic report says whether old-shape attempts came in its period, only fixed-shape ones,
 *   or no lock attempt at all (the rules narrowed to one release: removal-signal.test.ts);
 * - `verify`'s own blocks (the Kubernetes example's readiness probe) count apart, so that the
 *   "safe to remove" signal reads the application's attempts only;
 * - the lock scan exports, per rule, the lock keys, the abandoned ones (no expiry) and the
 *   re-armed ones, with its work bounded per run (more in locks-scan-bounds.test.ts and
 *   locks-evidence.test.ts).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { run as verify } from '../../src/ops/verify.js';
import { ROOT } from '../support/cli.js';
import { runOp } from '../support/ops.js';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { sample } from '../support/metrics.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { attemptReplies, lockAttempt, queueLockKey, taskLockKey } from '../support/stalwart.js';

const env = redisWithAdmin();

describe('lock attempts by shape', () => {
  let proxy: TestProxy;
  beforeAll(async () => {
    proxy = await startTestProxy({ upstream: env.redis.url, admin: true, flags: ['--lock-attempt-report-ms', '400'] });
  });
  afterAll(async () => {
    await proxy?.close();
  });

  it('counts old-shape blocks and fixed-shape SET NX EX per rule; other SETs are not attempts', async () => {
    const deadline = String(Math.floor(Date.now() / 1000) + 3600);
    const task = taskLockKey(1n);
    expect(await exchange(proxy.port, lockAttempt(task, 3600), 4)).toBe(attemptReplies(1, 1));
    expect(await exchange(proxy.port, cmd('SET', taskLockKey(2n), deadline, 'NX', 'EX', '3600'), 1)).toBe('+OK\r\n');
    expect(await exchange(proxy.port, cmd('set', taskLockKey(3n), deadline, 'nx', 'px', '3600000'), 1)).toBe('+OK\r\n');
    expect(await exchange(proxy.port, cmd('SET', queueLockKey(4n, 'local'), deadline, 'NX', 'EX', '600'), 1)).toBe('+OK\r\n');
    // Not fixed-shape lock attempts: a key no rule names, other options, a plain SET.
    expect(await exchange(proxy.port, cmd('SET', 'user:1', deadline, 'NX', 'EX', '60'), 1)).toBe('+OK\r\n');
    expect(await exchange(proxy.port, cmd('SET', taskLockKey(5n), deadline, 'XX', 'EX', '60'), 1)).toBe('$-1\r\n');
    expect(await exchange(proxy.port, cmd('SET', taskLockKey(6n), deadline), 1)).toBe('+OK\r\n');

    const text = await proxy.metrics();
    expect(sample(text, 'redis_lock_proxy_lock_attempts_total{rule="stalwart-task-lock",shape="incrby-expire"}')).toBe(1);
    expect(sample(text, 'redis_lock_proxy_lock_attempts_total{rule="stalwart-task-lock",shape="set-nx"}')).toBe(2);
    expect(sample(text, 'redis_lock_proxy_lock_attempts_total{rule="stalwart-queue-lock",shape="set-nx"}')).toBe(1);
    expect(sample(text, 'redis_lock_proxy_ready')).toBe(1);
  });

  it('reports each period whether old-shape attempts were seen, only fixed-shape ones, or none at all', async () => {
    const report = (verdict: string) => proxy.logs().filter((l) => l.verdict === verdict);
    const seenBefore = report('old-shape-seen').length;
    expect(await exchange(proxy.port, lockAttempt(taskLockKey(7n), 60), 4)).toBe(attemptReplies(1, 1));
    await expect.poll(() => report('old-shape-seen').length > seenBefore, { message: 'an old-shape report', timeout: 5000 }).toBe(true);
    // The period may also hold the previous test's attempts.
    const seen = report('old-shape-seen').at(-1) as { oldShape: number; msg: string; rules: Record<string, { oldShape: number }> };
    expect(seen.oldShape).toBeGreaterThanOrEqual(1);
    expect(seen.rules['stalwart-task-lock'].oldShape).toBeGreaterThanOrEqual(1);
    expect(seen.msg).toBe('old-shape lock attempts (MULTI/INCRBY/EXPIRE/EXEC) seen: nodes of an affected release still run');
    await expect.poll(() => report('no-lock-traffic').length > 0, { message: 'a report of no lock traffic', timeout: 3000 }).toBe(true);
    expect(report('no-lock-traffic').at(-1)).toMatchObject({ oldShape: 0, fixedShape: 0, periodMs: 400 });

    const fixedBefore = report('fixed-shape-only').length;
    const deadline = String(Math.floor(Date.now() / 1000) + 3600);
    expect(await exchange(proxy.port, cmd('SET', taskLockKey(8n), deadline, 'NX', 'EX', '3600'), 1)).toBe('+OK\r\n');
    await expect
      .poll(() => report('fixed-shape-only').length > fixedBefore, { message: 'a report of fixed-shape attempts only', timeout: 5000 })
      .toBe(true);
    expect(report('fixed-shape-only').at(-1)).toMatchObject({ oldShape: 0, fixedShape: 1 });
  });
});

describe("verify's own checks", () => {
  /** The verify probe the Kubernetes example suggests, as its command line (after `redis-lock-proxy verify`). */
  function exampleProbe(): string[] {
    const text = readFileSync(path.join(ROOT, 'examples/kubernetes/stalwart-with-proxy.yaml'), 'utf8');
    const command = /exec: \{ command: (\[.*\]) \}/.exec(text)?.[1];
    expect(command, 'the example names a verify probe').toBeDefined();
    const argv = JSON.parse(command as string) as string[];
    expect(argv.slice(0, 2)).toEqual(['redis-lock-proxy', 'verify']);
    return argv.slice(2);
  }

  it('do not count as lock attempts: the example probe leaves the "safe to remove" signal alone', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url, admin: true, flags: ['--lock-attempt-report-ms', '300'] });
    try {
      const reports = () => proxy.logs().filter((l) => typeof l.verdict === 'string');
      const before = reports().length;
      const probe = exampleProbe().map((arg) => (arg === '127.0.0.1:6380' ? `127.0.0.1:${proxy.port}` : arg));
      for (let run = 0; run < 3; run++) {
        const result = await runOp(verify, probe);
        expect(result.stderr).toBe('');
        expect(result.stdout).toMatch(/^verify: OK: 2 rule\(s\) enforce the fix/);
      }
      // Two report periods after the probes: every period that held them has been reported.
      const after = reports().length;
      await expect.poll(() => reports().length, { timeout: 5000 }).toBeGreaterThanOrEqual(after + 2);
      for (const report of reports().slice(before)) expect(report).toMatchObject({ verdict: 'no-lock-traffic' });

      const text = await proxy.metrics();
      expect(sample(text, 'redis_lock_proxy_lock_attempts_total{rule="stalwart-task-lock",shape="incrby-expire"}') ?? 0).toBe(0);
      expect(sample(text, 'redis_lock_proxy_blocks_total{rule="stalwart-task-lock",outcome="seen"}') ?? 0).toBe(0);
      // Counted apart: three probes, two attempts per rule each, all rewritten.
      expect(sample(text, 'redis_lock_proxy_verify_blocks_total{rule="stalwart-task-lock",outcome="seen"}')).toBe(6);
      expect(sample(text, 'redis_lock_proxy_verify_blocks_total{rule="stalwart-queue-lock",outcome="rewritten"}')).toBe(6);

      // The application's own attempt still counts.
      expect(await exchange(proxy.port, lockAttempt(taskLockKey(8n), 60), 4)).toBe(attemptReplies(1, 1));
      // /metrics is rendered at most once a second.
      await expect
        .poll(async () =>
          sample(await proxy.metrics(), 'redis_lock_proxy_lock_attempts_total{rule="stalwart-task-lock",shape="incrby-expire"}'),
        )
        .toBe(1);
      await expect.poll(() => reports().some((l) => l.verdict === 'old-shape-seen'), { timeout: 5000 }).toBe(true);
    } finally {
      await proxy.close();
    }
  });
});

describe('the lock scan', () => {
  it('exports per rule the lock keys, the abandoned ones (no expiry) and the re-armed ones; a contended lock is neither', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url, admin: true, flags: ['--lock-scan-interval-ms', '200'] });
    try {
      const client = await RawClient.connect(proxy.port);
      for (const [key, attempts] of [
        [taskLockKey(1n), 1],
        [taskLockKey(2n), 3], // others tried while it was held
        [queueLockKey(3n, 'local'), 1],
      ] as const) {
        for (let i = 0; i < attempts; i++) {
          client.write(lockAttempt(key, 3600));
          await client.readReplies(4);
        }
      }
      expect(await env.admin.call('PERSIST', queueLockKey(3n, 'local'))).toBe(':1\r\n');
      await env.admin.call('SET', 'unrelated', '1');
      await client.close();

      const scansBefore = proxy.app.lockScan?.latest.scans ?? 0;
      await expect
        .poll(() => (proxy.app.lockScan?.latest.scans ?? 0) > scansBefore + 1, {
          message: 'a lock scan after the keys were written',
          timeout: 5000,
        })
        .toBe(true);
      const text = await proxy.metrics();
      expect(sample(text, 'redis_lock_proxy_lock_keys{rule="stalwart-task-lock"}')).toBe(2);
      expect(sample(text, 'redis_lock_proxy_lock_keys_without_expiry{rule="stalwart-task-lock"}')).toBe(0);
      expect(sample(text, 'redis_lock_proxy_lock_keys_rearmed{rule="stalwart-task-lock"}')).toBe(0);
      expect(sample(text, 'redis_lock_proxy_lock_keys{rule="stalwart-queue-lock"}')).toBe(1);
      expect(sample(text, 'redis_lock_proxy_lock_keys_without_expiry{rule="stalwart-queue-lock"}')).toBe(1);
      expect(sample(text, 'redis_lock_proxy_lock_keys{rule="stalwart-purge-account"}')).toBe(0); // every rule, at zero
      expect(sample(text, 'redis_lock_proxy_lock_scan_truncated')).toBe(0);
      expect(sample(text, 'redis_lock_proxy_lock_scans_total{result="failed"}')).toBe(0);
      expect(sample(text, 'redis_lock_proxy_lock_scan_last_success_timestamp_seconds')).toBeGreaterThan(Date.now() / 1000 - 60);
      const stats = await env.admin.call('INFO', 'commandstats');
      expect(stats).toContain('cmdstat_scan:');
      expect(stats).not.toContain('cmdstat_keys:');
    } finally {
      await proxy.close();
    }
  });

  it('reads at most --lock-scan-max-keys keys per scan, and says so', async () => {
    const proxy = await startTestProxy({
      upstream: env.redis.url,
      admin: true,
      flags: ['--lock-scan-interval-ms', '200', '--lock-scan-max-keys', '3'],
    });
    try {
      // Exactly as many as the bound: all read, nothing left out.
      for (let id = 1n; id <= 3n; id++) await env.admin.call('SET', taskLockKey(id), '1', 'EX', '60');
      const scansBefore = proxy.app.lockScan?.latest.scans ?? 0;
      await expect
        .poll(() => (proxy.app.lockScan?.latest.scans ?? 0) > scansBefore + 1, {
          message: 'a scan after the keys were written',
          timeout: 5000,
        })
        .toBe(true);
      expect(proxy.app.lockScan?.latest.stoppedEarly).toBeUndefined();
      expect(proxy.app.lockScan?.latest.byRule.get('stalwart-task-lock')?.keys).toBe(3);

      for (let id = 4n; id <= 10n; id++) await env.admin.call('SET', taskLockKey(id), '1', 'EX', '60');
      await expect
        .poll(() => proxy.app.lockScan?.latest.stoppedEarly === 'max-keys', { message: 'a truncated scan', timeout: 5000 })
        .toBe(true);
      const text = await proxy.metrics();
      expect(sample(text, 'redis_lock_proxy_lock_keys{rule="stalwart-task-lock"}')).toBe(3);
      expect(sample(text, 'redis_lock_proxy_lock_scan_truncated')).toBe(1);
    } finally {
      await proxy.close();
    }
  });

  it('counts failed scans when Redis cannot be reached, and logs why', async () => {
    const proxy = await startTestProxy({
      upstream: 'redis://127.0.0.1:1',
      admin: true,
      flags: ['--lock-scan-interval-ms', '100'],
      connectTimeoutMs: 300,
    });
    try {
      await expect.poll(() => (proxy.app.lockScan?.latest.failures ?? 0) > 0, { message: 'a failed scan', timeout: 5000 }).toBe(true);
      expect(sample(await proxy.metrics(), 'redis_lock_proxy_lock_scans_total{result="failed"}')).toBeGreaterThan(0);
      expect(proxy.logs().find((l) => l.msg === 'lock scan failed')).toMatchObject({ err: expect.stringMatching(/ECONNREFUSED/) });
      expect(sample(await proxy.metrics(), 'redis_lock_proxy_ready')).toBe(0);
    } finally {
      await proxy.close();
    }
  });
});
