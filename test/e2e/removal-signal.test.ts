/**
 * The "can the proxy go?" signal stays true whatever rules the proxy was started with: against a
 * real Redis, with the proxy narrowed to one release (`--stalwart 0.15.3`),
 *
 * - old-shape blocks on the keys of a later affected line (0.16's task locks: 0x17 + u64), which
 *   the narrowed rules do not rewrite, still count as old-shape lock attempts, and as lock-shaped
 *   traffic no rule covers;
 * - a period without lock traffic says so, never "no old-shape attempt";
 * - the rollout followed literally, nodes upgraded one by one from 0.15.3 to 0.16.9 and then to
 *   0.16.16: the report says "only fixed-shape attempts" only once the last node sends SET NX EX,
 *   and never for a quiet period.
 *
 * (The alert's side of it, RedisLockProxyCanBeRemoved over the same rollout: examples.test.ts.)
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPORT_MESSAGES, verdictOf, type PeriodVerdict } from '../../src/admin/attempt-report.js';
import { VERSION } from '../support/cli.js';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { sample } from '../support/metrics.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { cmd, RawClient } from '../support/resp.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';
import { RELEASE_LINES, type ReleaseLine } from '../support/stalwart-releases.js';

const env = redisWithAdmin();

/** How often the proxy under test reports: long enough for a burst of traffic to fall inside one period on a busy machine. */
const REPORT_MS = 1000;

interface Report {
  msg: string;
  verdict: PeriodVerdict;
  oldShape: number;
  fixedShape: number;
  rules: Record<string, { oldShape: number; fixedShape: number }>;
}

function line(file: string): ReleaseLine {
  return RELEASE_LINES.find((l) => l.file === file) as ReleaseLine;
}

async function startNarrowedProxy(): Promise<TestProxy> {
  return startTestProxy({
    upstream: env.redis.url,
    rules: [], // the shipped rules, narrowed by --stalwart to the 0.15 line's
    stalwart: '0.15.3',
    admin: true,
    flags: ['--lock-attempt-report-ms', String(REPORT_MS)],
  });
}

function reports(proxy: TestProxy): Report[] {
  return proxy.logs().filter((l) => typeof l.verdict === 'string') as unknown as Report[];
}

/**
 * Waits for the next report, sends `burst` right after it (so that the burst falls in one period),
 * and returns the reports of the periods the burst fell in: from the first after it started to
 * the first that began after it ended.
 */
async function periodOf(proxy: TestProxy, burst: () => Promise<void>): Promise<Report[]> {
  const before = reports(proxy).length;
  await expect.poll(() => reports(proxy).length, { timeout: 10 * REPORT_MS, interval: 20 }).toBeGreaterThan(before);
  const started = reports(proxy).length;
  await burst();
  const ended = reports(proxy).length;
  await expect.poll(() => reports(proxy).length, { timeout: 10 * REPORT_MS, interval: 20 }).toBeGreaterThan(ended);
  return reports(proxy).slice(started, ended + 1);
}

/** The verdict of the periods together. */
function overall(periods: Report[]): PeriodVerdict {
  return verdictOf({
    oldShape: periods.reduce((sum, r) => sum + r.oldShape, 0),
    fixedShape: periods.reduce((sum, r) => sum + r.fixedShape, 0),
  });
}

describe('narrowed with --stalwart 0.15.3', () => {
  let proxy: TestProxy;
  beforeAll(async () => {
    proxy = await startNarrowedProxy();
  });
  afterAll(async () => {
    await proxy?.close();
  });

  it('counts old-shape blocks on 0.16 task keys, which it does not rewrite, as old-shape attempts and as traffic no rule covers', async () => {
    const client = await RawClient.connect(proxy.port);
    let periods: Report[] = [];
    try {
      periods = await periodOf(proxy, async () => {
        for (let i = 0; i < 3; i++) {
          client.write(lockAttempt(taskLockKey(1000n), 3600));
          // Not rewritten: the 0.15 rules do not name 0x17 + u64, so every attempt sets the expiry, as without the proxy.
          expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(i + 1, 1));
        }
        // Fixed-shape attempts on 0.16 keys, which no 0.15 rule names either; SET takes its options in any order.
        const deadline = String(Math.floor(Date.now() / 1000) + 3600);
        for (const [id, options] of [
          [2000n, ['NX', 'EX', '3600']],
          [2001n, ['ex', '3600', 'nx']],
        ] as const) {
          client.write(cmd('SET', taskLockKey(id), deadline, ...options));
          expect((await client.readReplies(1)).toString('latin1')).toBe('+OK\r\n');
        }
      });
    } finally {
      await client.close();
    }
    expect(overall(periods)).toBe('old-shape-seen');
    expect(periods.map((r) => r.verdict)).not.toContain('fixed-shape-only');
    const counted = periods.find((r) => r.oldShape > 0) as Report;
    expect(counted.msg).toBe(REPORT_MESSAGES['old-shape-seen']);
    expect(Object.keys(counted.rules)).toContain('stalwart-task-lock');

    await expect
      .poll(async () => {
        const text = await proxy.metrics();
        return [
          sample(text, 'redis_lock_proxy_lock_attempts_total{rule="stalwart-task-lock",shape="incrby-expire"}'),
          sample(text, 'redis_lock_proxy_lock_attempts_total{rule="stalwart-task-lock",shape="set-nx"}'),
          sample(text, 'redis_lock_proxy_lock_shaped_unmatched_total{prefix="0x17"}'),
          // Not rewritten, and not a block of a loaded rule.
          sample(text, 'redis_lock_proxy_blocks_total{rule="stalwart-task-lock",outcome="seen"}'),
          sample(text, 'redis_lock_proxy_block_releases_total{reason="no-rule"}'),
          sample(
            text,
            `redis_lock_proxy_build_info{version="${VERSION}",node_version="${process.version}",rule_releases="Stalwart 0.15.0 - 0.15.5"}`,
          ),
        ];
      })
      // Only the script way (--lock-method script) holds a block; auto holds none on any server.
      .toEqual([3, 2, 3, undefined, undefined, 1]);
  });

  it('counts every old-shape block however it arrives: split at every byte, typed one command at a time, or held past the deadline', async () => {
    // 0.15's queue locks (0x15 + u64) are named by the loaded rules: fixed inside the transaction
    // (with NX, or the expiry script before 7.0), however they arrive. Each is an old-shape attempt.
    const key = Buffer.concat([Buffer.from([0x15]), Buffer.alloc(8, 0x42), Buffer.from('queue-42')]);
    const client = await RawClient.connect(proxy.port);
    let periods: Report[] = [];
    try {
      periods = await periodOf(proxy, async () => {
        await client.writeSplit(lockAttempt(key, 600), 'bytewise', { delayMs: 1 });
        expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(1, 1));
        for (const frame of [cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '600'), cmd('EXEC')]) {
          client.write(frame);
          await client.readReplies(1);
        }
        client.write(Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1')]));
        await new Promise((resolve) => setTimeout(resolve, 100)); // beyond the script way's --hold-ms
        client.write(Buffer.concat([cmd('EXPIRE', key, '600'), cmd('EXEC')]));
        expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(3, 1));
      });
    } finally {
      await client.close();
    }
    expect(overall(periods)).toBe('old-shape-seen');
    const rule = Object.keys(periods.find((r) => r.oldShape > 0)?.rules ?? {});
    expect(rule).toHaveLength(1);
    expect(periods.reduce((sum, r) => sum + (r.rules[rule[0]]?.oldShape ?? 0), 0)).toBe(3);
    await env.admin.call('DEL', key);
  });

  it('says that a period without lock traffic showed nothing, not that no old-shape attempt came', async () => {
    const periods = await periodOf(proxy, async () => {});
    for (const report of periods) {
      expect(report).toMatchObject({ verdict: 'no-lock-traffic', oldShape: 0, fixedShape: 0, msg: REPORT_MESSAGES['no-lock-traffic'] });
      expect(report.msg).not.toMatch(/no old-shape/);
    }
  });
});

describe('the rollout, followed literally: three nodes behind one proxy started with --stalwart 0.15.3', () => {
  type Release = '0.15.3' | '0.16.9' | '0.16.16';
  const windowed = (file: string) => fc.sample(line(file).windowed[0].attempts, 1)[0];

  /** One node's lock traffic for a period, as its release sends it: every lock kind once, and a rate-limit counter. */
  function traffic(release: Release): Buffer {
    const deadline = String(Math.floor(Date.now() / 1000) + 3600);
    if (release === '0.16.16') {
      const fixed = line('0.16.yaml').locks.map((kind) => cmd('SET', kind.example.key, deadline, 'NX', 'EX', String(kind.expiry)));
      return Buffer.concat([...fixed, counter('0.16.yaml')]);
    }
    const file = release === '0.15.3' ? '0.15.yaml' : '0.16.yaml';
    return Buffer.concat([...line(file).locks.map((kind) => lockAttempt(kind.example.key, kind.expiry)), counter(file)]);
  }

  /** A windowed counter of the line (the same command shape, not a lock): never an attempt of either shape. */
  function counter(file: string): Buffer {
    const { key, delta, expiry } = windowed(file);
    return lockAttempt(key, expiry, delta);
  }

  function replyCount(release: Release): number {
    const file = release === '0.15.3' ? '0.15.yaml' : '0.16.yaml';
    const locks = line(file).locks.length;
    return (release === '0.16.16' ? locks : 4 * locks) + 4;
  }

  it('reports "only fixed-shape attempts" only after the last node sends SET NX EX, and never for a quiet period', async () => {
    const proxy = await startNarrowedProxy();
    const nodes = await Promise.all([0, 1, 2].map(() => RawClient.connect(proxy.port)));
    try {
      const fleets: Release[][] = [
        ['0.15.3', '0.15.3', '0.15.3'],
        ['0.16.9', '0.15.3', '0.15.3'],
        ['0.16.9', '0.16.9', '0.15.3'],
        ['0.16.9', '0.16.9', '0.16.9'],
        ['0.16.16', '0.16.9', '0.16.9'],
        ['0.16.16', '0.16.16', '0.16.9'],
        ['0.16.16', '0.16.16', '0.16.16'],
      ];
      const seen: Array<{ fleet: string; verdicts: PeriodVerdict[]; overall: PeriodVerdict }> = [];
      for (const [step, fleet] of fleets.entries()) {
        const periods = await periodOf(proxy, async () => {
          await Promise.all(
            nodes.map(async (node, i) => {
              node.write(traffic(fleet[i]));
              await node.readReplies(replyCount(fleet[i]));
            }),
          );
        });
        seen.push({ fleet: fleet.join(' '), verdicts: periods.map((r) => r.verdict), overall: overall(periods) });
        // A quiet period, before the fleet is upgraded, half-way and after: nothing to tell from,
        // whatever came before it.
        if (step % 3 === 0) {
          const quiet = await periodOf(proxy, async () => {});
          expect(
            quiet.map((r) => r.verdict),
            `quiet after ${fleet.join(' ')}`,
          ).toEqual(quiet.map(() => 'no-lock-traffic'));
        }
      }
      const last = seen.length - 1;
      seen.forEach((step, i) => {
        expect(step.overall, step.fleet).toBe(i === last ? 'fixed-shape-only' : 'old-shape-seen');
        if (i !== last) expect(step.verdicts, step.fleet).not.toContain('fixed-shape-only');
      });
    } finally {
      await Promise.all(nodes.map((node) => node.close()));
      await proxy.close();
    }
  }, 120_000);
});
