/**
 * The work one look at the lock keys may cost Redis, against a real Redis with a large keyspace
 * (DEBUG POPULATE): `locks` and the proxy's lock scan make one SCAN pass for every rule's prefix
 * together, with a capped COUNT, and stop at a time budget, saying so; `locks` shows how far it
 * has got when standard error is a terminal.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { run as locks } from '../../src/ops/locks.js';
import { runOp } from '../support/ops.js';
import { STALWART_RULES, startTestProxy } from '../support/proxy.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { RawClient } from '../support/resp.js';
import { startedServerFacts } from '../support/server-facts.js';
import { attemptCounter, taskLockKey } from '../support/stalwart.js';

/** Keys that are not locks, besides a few lock keys. */
const FILLER = 300_000;

let redis: RedisServer;
let admin: RawClient;

beforeAll(async () => {
  // Before 7.0 there is no such setting: DEBUG is always allowed.
  const debug = (await startedServerFacts()).has('enable-debug-command') ? ['--enable-debug-command', 'yes'] : [];
  redis = await startRedis({ args: debug });
  admin = await RawClient.connect(redis.port);
  expect(await admin.call('DEBUG', 'POPULATE', String(FILLER), 'unrelated')).toBe('+OK\r\n');
  // Three task locks, written as a node of an affected release writes them (the proxy is not needed to write them).
  for (const id of [1n, 2n, 3n]) {
    expect(await admin.call('INCRBY', taskLockKey(id), '1')).toBe(':1\r\n');
    expect(await admin.call('EXPIRE', taskLockKey(id), '3600')).toBe(':1\r\n');
  }
}, 60_000);

afterAll(async () => {
  await admin?.close();
  await redis?.stop();
});

async function scanCalls(): Promise<number> {
  const stats = await admin.call('INFO', 'commandstats');
  return Number(/cmdstat_scan:calls=(\d+)/.exec(stats)?.[1] ?? 0);
}

const upstreamArgs = () => ['--upstream', redis.url, '--rules', STALWART_RULES, '--recheck-ms', '0'];

describe('locks on a large keyspace', () => {
  it('makes one SCAN pass for all the rules’ prefixes', async () => {
    await admin.call('CONFIG', 'RESETSTAT');
    const result = await runOp(locks, [...upstreamArgs(), '--count', '1000', '--json']);
    expect(result.code).toBe(0);
    expect(result.stdout.trim().split('\n')).toHaveLength(3);
    // SCAN visits about COUNT keys per call: one pass is about FILLER / COUNT calls. (A pass per
    // prefix, as before, was 6 times that with the shipped rules.)
    const calls = await scanCalls();
    console.info(`one pass over ${FILLER} keys, COUNT 1000: ${calls} SCAN calls`);
    expect(calls).toBeGreaterThan(FILLER / 1000 / 2);
    expect(calls).toBeLessThan((FILLER / 1000) * 1.5);
  });

  it('keeps every SCAN call short, so Redis keeps answering others: PINGs during a scan at the largest COUNT', async () => {
    const pings: number[] = [];
    let scanning = true;
    const pinger = (async () => {
      const client = await RawClient.connect(redis.port);
      while (scanning) {
        const sent = performance.now();
        expect(await client.call('PING')).toBe('+PONG\r\n');
        pings.push(performance.now() - sent);
      }
      await client.close();
    })();
    const started = performance.now();
    const result = await runOp(locks, [...upstreamArgs(), '--count', '10000', '--json']);
    const took = performance.now() - started;
    scanning = false;
    await pinger;
    expect(result.code).toBe(0);
    pings.sort((a, b) => a - b);
    const worst = pings.at(-1) ?? 0;
    console.info(
      `locks --count 10000 over ${FILLER} keys: ${took.toFixed(0)} ms; ${pings.length} PINGs meanwhile, ` +
        `median ${pings[Math.floor(pings.length / 2)]?.toFixed(2)} ms, worst ${worst.toFixed(1)} ms`,
    );
    // Generous for a busy machine; a single SCAN call over the whole keyspace takes far longer.
    expect(worst).toBeLessThan(500);
  });

  it('stops at --scan-budget-ms, shows what it found, says the list is incomplete, and exits 3', async () => {
    await admin.call('CONFIG', 'RESETSTAT');
    const started = performance.now();
    const result = await runOp(locks, [...upstreamArgs(), '--count', '10', '--scan-budget-ms', '300']);
    const took = performance.now() - started;
    console.info(`locks --count 10 --scan-budget-ms 300 over ${FILLER} keys: returned after ${took.toFixed(0)} ms`);
    expect(result.code).toBe(3);
    expect(result.stderr).toMatch(
      /^locks: the scan stopped after --scan-budget-ms 300 with \d+ lock key\(s\) read: the keyspace was not gone through, so this is not every lock \(give more time, or a larger --count\)\n$/,
    );
    expect(result.stdout).toMatch(/lock key|no lock keys found/);
    expect(await scanCalls()).toBeLessThan(FILLER / 10);
    expect(took).toBeLessThan(5_000);
  });

  it('shows its progress on standard error when that is a terminal, and nothing otherwise', async () => {
    let stderr = '';
    const onTerminal = await locks([...upstreamArgs(), '--count', '100'], {
      stdout: () => {},
      stderr: (text) => (stderr += text),
      env: {},
      stderrIsTerminal: true,
    });
    expect(onTerminal).toBe(0);
    const ERASE_LINE = '\x1b[K';
    expect(stderr.split(ERASE_LINE)[0]).toMatch(
      /^\rlocks: scanning: \d+ SCAN call\(s\) \(~\d+% of its \d+ keys\), \d+ lock key\(s\) so far, \d+s$/,
    );
    expect(stderr.endsWith(`\r${ERASE_LINE}`)).toBe(true); // the line is cleared at the end

    const piped = await runOp(locks, [...upstreamArgs(), '--count', '100']);
    expect([piped.code, piped.stderr]).toEqual([0, '']);
  });
  it('clears its progress line before each result line of --release-abandoned', async () => {
    const abandoned = taskLockKey(99n);
    expect(await admin.call('SET', abandoned, '1')).toBe('+OK\r\n');
    try {
      const transcript: Array<['out' | 'err', string]> = [];
      const code = await locks(
        [...upstreamArgs().filter((arg) => arg !== '--recheck-ms' && arg !== '0'), '--count', '100', '--release-abandoned', '--dry-run'],
        {
          stdout: (text) => transcript.push(['out', text]),
          stderr: (text) => transcript.push(['err', text]),
          env: {},
          stderrIsTerminal: true,
        },
      );
      expect(code).toBe(0);
      const results = transcript.flatMap(([stream], i) => (stream === 'out' ? [i] : []));
      expect(transcript[results[0]][1]).toMatch(
        /^would delete '\\x17(\\x00){7}c': stalwart-task-lock, task 99, counter 1, ttl none, abandoned/,
      );
      // What was written to the terminal before each result ends with a cleared line.
      for (const i of results) {
        const before = transcript.slice(0, i).filter(([stream]) => stream === 'err');
        if (before.length > 0) expect(before.at(-1)?.[1]).toBe('\r\x1b[K');
      }
    } finally {
      await admin.call('DEL', abandoned);
    }
  });
});

describe('the proxy’s lock scan on a large keyspace', () => {
  it('stops at --lock-scan-budget-ms and says so, in its gauge and once in the log', async () => {
    const proxy = await startTestProxy({
      upstream: redis.url,
      admin: true,
      flags: ['--lock-scan-interval-ms', '100', '--lock-scan-budget-ms', '20'],
    });
    try {
      await expect.poll(() => proxy.app.lockScan?.latest.scans ?? 0, { timeout: 10_000 }).toBeGreaterThan(2);
      expect(proxy.app.lockScan?.latest.stoppedEarly).toBe('time-budget');
      const text = await proxy.metrics();
      expect(text).toMatch(/^redis_lock_proxy_lock_scan_truncated 1$/m);
      expect(text).toMatch(/^redis_lock_proxy_lock_scan_duration_seconds 0\.\d+$/m);
      const stopped = proxy
        .logs()
        .filter((line) => line.msg === 'lock scan stopped early; the lock-key gauges count only the keys it read');
      expect(stopped).toHaveLength(1);
      expect(stopped[0]).toMatchObject({ reason: 'time-budget', limit: '--lock-scan-budget-ms 20' });
    } finally {
      await proxy.close();
    }
  });

  it('goes through the whole keyspace within the default budget, and reads the lock keys', async () => {
    const proxy = await startTestProxy({ upstream: redis.url, flags: ['--lock-scan-interval-ms', '60000'] });
    try {
      await expect.poll(() => proxy.app.lockScan?.latest.scans ?? 0, { timeout: 30_000 }).toBe(1);
      const state = proxy.app.lockScan?.latest;
      console.info(`the proxy's lock scan over ${FILLER} keys: ${state?.lastDurationSeconds.toFixed(2)} s`);
      expect(state?.stoppedEarly).toBeUndefined();
      expect(state?.byRule.get('stalwart-task-lock')).toEqual({ keys: 3, abandoned: 0, rearmed: 0 });
      expect(await attemptCounter(proxy.port, taskLockKey(1n), 3600)).toBe(2);
    } finally {
      await proxy.close();
    }
  }, 40_000);
});
