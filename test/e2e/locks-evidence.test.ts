/**
 * What `locks` and the proxy's lock scan call trouble, against a real Redis and the proxy in
 * front of it, and that deleting never touches a live lock:
 *
 * - a contended lock (an owner, then a contender: counter 2, expiry counting down) is the normal
 *   state of a lock behind the proxy: never flagged, never deleted;
 * - abandoned means no expiry; `--release-abandoned --yes` deletes those batch by batch, right
 *   after reading each batch, and only if a key still has no expiry: a lock released and taken
 *   again while the command runs stays;
 * - re-armed (the expiry went up with the counter between two reads) is what traffic that
 *   bypasses the proxy does, and a proxy in observe mode; through the proxy it never shows.
 */
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { keyArgument } from '../../src/key-text.js';
import { deleteUnchanged } from '../../src/lock-keys/delete.js';
import { forEachRowBatch } from '../../src/lock-keys/pass.js';
import { run as locks } from '../../src/ops/locks.js';
import { loadRules } from '../../src/rules/loader.js';
import { upstreamRedisOptions } from '../../src/upstream/redis-client.js';
import { parseUpstreamUrl } from '../../src/upstream/target.js';
import { runOp } from '../support/ops.js';
import { STALWART_RULES, startTestProxy } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { attemptCounter, taskLockKey } from '../support/stalwart.js';

const env = redisAndProxy({ proxy: { admin: true } });

const through = (key: Buffer, seconds = 3600): Promise<number> => attemptCounter(env.proxy.port, key, seconds);
/** Stalwart's attempt straight to Redis: what a node that bypasses the proxy sends. */
const bypassing = (key: Buffer, seconds = 3600): Promise<number> => attemptCounter(env.redis.port, key, seconds);

async function pttl(key: Buffer): Promise<number> {
  return Number(/^:(-?\d+)/.exec(await env.admin.call('PTTL', key))?.[1]);
}

function upstreamArgs(): string[] {
  return ['--upstream', env.redis.url, '--rules', STALWART_RULES];
}

function lines(text: string): string[] {
  return text.split('\n').filter((line) => line !== '');
}

/** A connection of the test's own, as `locks` makes them. */
async function ownConnection(): Promise<Redis> {
  const redis = new Redis(upstreamRedisOptions(parseUpstreamUrl(env.redis.url), null, 5000));
  await redis.connect();
  return redis;
}

describe('a contended lock', () => {
  it('is not flagged and not deleted by --release-abandoned --yes (owner [1,1], contender [2,0])', async () => {
    const key = taskLockKey(123n);
    expect(await through(key)).toBe(1);
    expect(await through(key)).toBe(2);
    const listed = await runOp(locks, [...upstreamArgs(), '--json', '--recheck-ms', '50']);
    expect(JSON.parse(listed.stdout)).toMatchObject({ counter: 2, flagged: false, abandoned: false, rearmed: null, flags: [] });

    const released = await runOp(locks, [...upstreamArgs(), '--release-abandoned', '--yes']);
    expect(released).toEqual({ code: 0, stdout: 'no abandoned locks (1 lock key(s) checked)\n', stderr: '' });
    expect(await env.admin.call('GET', key)).toBe('$1\r\n2\r\n');
    expect(await pttl(key)).toBeGreaterThan(3_500_000);
  });
});

describe('--release-abandoned', () => {
  it('never deletes a lock taken again between the read and the delete', async () => {
    const keys = [1n, 2n, 3n].map((id) => taskLockKey(900n + id));
    for (const key of keys) {
      expect(await through(key)).toBe(1);
      expect(await env.admin.call('PERSIST', key)).toBe(':1\r\n'); // abandoned: no expiry
    }
    const redis = await ownConnection();
    try {
      const node = { name: 'n', redis, slots: [] };
      const results: string[] = [];
      await forEachRowBatch([node], loadRules([STALWART_RULES]), { count: 1000 }, async (rows) => {
        expect(rows.map((row) => row.abandoned)).toEqual([true, true, true]);
        // Between the read and the delete: the first is released and taken again (the same value 1,
        // a fresh expiry: live now); the second is taken again and tried (counter 2); the third stays abandoned.
        const [first, second] = rows.map((row) => row.key);
        await env.admin.call('DEL', first);
        expect(await through(first)).toBe(1);
        await env.admin.call('DEL', second);
        expect(await through(second)).toBe(1);
        expect(await through(second)).toBe(2);
        for (const result of await deleteUnchanged(redis, rows)) results.push(String(result));
      });
      expect(results).toEqual(['now-live', 'changed', 'deleted']);
    } finally {
      redis.disconnect();
    }
  });

  it('deletes each batch right after reading it, and leaves every lock taken again during the scan', async () => {
    // 2,000 abandoned locks among 20,000 other keys; SCAN COUNT 100 makes the pass a few hundred calls.
    const filler = await ownConnection();
    const abandoned = Array.from({ length: 2000 }, (_, i) => taskLockKey(10_000n + BigInt(i)));
    try {
      for (let start = 0; start < 20_000; start += 1000) {
        const args: string[] = [];
        for (let i = start; i < start + 1000; i++) args.push(`unrelated:${i}`, 'v');
        await filler.mset(...args);
      }
      const pipeline = filler.pipeline();
      for (const key of abandoned) pipeline.set(key, '1');
      await pipeline.exec();
    } finally {
      filler.disconnect();
    }

    // Every command Redis runs, in the order it runs them.
    const monitor = await ownConnection();
    const seen: string[] = [];
    await monitor.monitor().then((feed) => feed.on('monitor', (_time: string, args: string[]) => seen.push(args[0].toLowerCase())));

    // Meanwhile other nodes release and take locks again, and contenders try them: 200 of them,
    // in an order of their own.
    let racing = true;
    const retaken: Buffer[] = [];
    const racer = (async () => {
      for (let i = 0; racing && i < 200; i++) {
        const key = abandoned[(i * 7919) % abandoned.length];
        await env.admin.call('DEL', key);
        expect(await through(key)).toBe(1);
        expect(await through(key)).toBe(2);
        retaken.push(key);
      }
    })();
    const result = await runOp(locks, [...upstreamArgs(), '--release-abandoned', '--yes', '--count', '100']);
    racing = false;
    await racer;
    await monitor.quit().catch(() => monitor.disconnect());

    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    expect(retaken.length).toBeGreaterThan(0);
    // Every lock taken again during the scan is still there, with the contender's counter and an expiry.
    for (const key of retaken) {
      expect(await env.admin.call('GET', key), keyArgument(key)).toBe('$1\r\n2\r\n');
      expect(await pttl(key), keyArgument(key)).toBeGreaterThan(0);
    }
    // Every other abandoned lock is gone, and nothing else was touched.
    const taken = new Set(retaken.map((key) => key.toString('hex')));
    for (const key of abandoned) {
      if (!taken.has(key.toString('hex'))) expect(await env.admin.call('EXISTS', key), keyArgument(key)).toBe(':0\r\n');
    }
    expect(await env.admin.call('DBSIZE')).toBe(`:${20_000 + taken.size}\r\n`);
    // Deleting began while SCAN still had most of the keyspace to go.
    const scans = seen.flatMap((name, i) => (name === 'scan' ? [i] : []));
    const firstDelete = seen.indexOf('eval');
    expect(firstDelete).toBeGreaterThan(0);
    expect(scans.filter((i) => i > firstDelete).length).toBeGreaterThan(scans.length / 2);
  }, 60_000);
});

describe('re-armed: traffic bypasses the proxy', () => {
  /** `locks` with a second read `recheckMs` after the first; `between` runs once the first read is done. */
  async function listWithRecheck(between: () => Promise<void>, recheckMs = 1500) {
    let waiting: Promise<void> | undefined;
    const result = await locksOnTerminal([...upstreamArgs(), '--json', '--recheck-ms', String(recheckMs)], (text) => {
      if (waiting === undefined && text.includes('reading them again')) waiting = between();
    });
    await waiting;
    return result;
  }

  it('shows in locks when a contender bypasses the proxy: the expiry went up with the counter', async () => {
    const key = taskLockKey(77n);
    expect(await through(key)).toBe(1);
    expect(await env.admin.call('PEXPIRE', key, '1000000')).toBe(':1\r\n'); // as if 2,600 s had passed
    const result = await listWithRecheck(async () => expect(await bypassing(key)).toBe(2));
    expect(result.code).toBe(0);
    const row = JSON.parse(lines(result.stdout)[0]) as Record<string, unknown>;
    expect(row).toMatchObject({ counter: 2, flagged: true, abandoned: false });
    expect(row.rearmed).toMatch(/^expiry raised 2\d{3}\.\ds while the counter went from 1 to 2$/);
    expect(row.flags).toEqual([`re-armed: traffic bypasses the proxy (${String(row.rearmed)})`]);
  });

  it('does not show when the contender goes through the proxy (the counter goes up, the expiry stays)', async () => {
    const key = taskLockKey(78n);
    expect(await through(key)).toBe(1);
    expect(await env.admin.call('PEXPIRE', key, '1000000')).toBe(':1\r\n');
    const result = await listWithRecheck(async () => expect(await through(key)).toBe(2));
    expect(JSON.parse(lines(result.stdout)[0])).toMatchObject({ counter: 2, flagged: false, rearmed: null });
  });

  it('is counted by the proxy’s lock scan, which sees nothing of attempts through an enforcing proxy', async () => {
    const scanning = await startTestProxy({ upstream: env.redis.url, flags: ['--lock-scan-interval-ms', '300'] });
    const observing = await startTestProxy({ upstream: env.redis.url, mode: 'observe' });
    try {
      // A lock of the test rule tried through the enforcing proxy; two task locks tried around it.
      const viaProxy = Buffer.from('lock:through-the-proxy');
      const viaBypass = taskLockKey(2n);
      const viaObserver = taskLockKey(3n);
      for (const key of [viaProxy, viaBypass, viaObserver]) {
        expect(await through(key)).toBe(1);
        expect(await env.admin.call('PEXPIRE', key, '1000000')).toBe(':1\r\n'); // as if 2,600 s had passed
      }
      const latest = () => scanning.app.lockScan?.latest;
      const scans = () => latest()?.scans ?? 0;
      const before = scans();
      await expect.poll(scans, { timeout: 10_000 }).toBeGreaterThan(before + 1); // a scan that read all three
      expect(latest()?.byRule.get('stalwart-task-lock')).toEqual({ keys: 2, abandoned: 0, rearmed: 0 });

      // A contender tries each lock once; the next scan compares.
      expect(await through(viaProxy)).toBe(2);
      expect(await bypassing(viaBypass)).toBe(2);
      expect(await attemptCounter(observing.port, viaObserver, 3600)).toBe(2);
      await expect.poll(() => latest()?.byRule.get('stalwart-task-lock')?.rearmed, { timeout: 10_000 }).toBe(2);
      expect(latest()?.byRule.get('test-lock')).toEqual({ keys: 1, abandoned: 0, rearmed: 0 });
      expect(await pttl(viaProxy)).toBeLessThan(1_000_000);
    } finally {
      await Promise.all([scanning.close(), observing.close()]);
    }
  });
});

/** `locks` run as on a terminal (progress lines on stderr); `onStderr` sees each write. */
async function locksOnTerminal(argv: string[], onStderr: (text: string) => void) {
  let stdout = '';
  let stderr = '';
  const code = await locks(argv, {
    stdout: (text) => (stdout += text),
    stderr: (text) => {
      stderr += text;
      onStderr(text);
    },
    env: {},
    stderrIsTerminal: true,
  });
  return { code, stdout, stderr };
}
