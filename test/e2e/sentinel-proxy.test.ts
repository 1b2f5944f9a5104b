/**
 * The proxy behind Redis Sentinel, through the built command line: new
 * connections go to the master the sentinels name; after a failover the
 * connections to the old master are closed (as a client library would close
 * them) and new ones reach the new master, where the fix still holds. The
 * lock scan reads the master of the moment, in the URL's database.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { Cli, cleanEnv, ensureBuilt } from '../support/cli.js';
import { freePort } from '../support/ports.js';
import { cmd, RawClient } from '../support/resp.js';
import { query, startSentinelSetup, type SentinelSetup } from '../support/sentinel.js';
import { startTestProxy } from '../support/proxy.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';

/** A Stalwart task lock: the proxy runs with its default rules. */
const KEY = taskLockKey(4242n);

let setup: SentinelSetup | undefined;

beforeAll(async () => {
  await ensureBuilt();
  setup = await startSentinelSetup({ sentinels: 1 });
}, 120_000);

afterAll(async () => {
  await setup?.stop();
});

it('the lock scan reads the master in the database the URL names', async () => {
  const s = setup as SentinelSetup;
  const proxy = await startTestProxy({
    upstream: 'redis://ignored/3',
    flags: ['--sentinel', `127.0.0.1:${s.sentinels[0].port}`, '--sentinel-master', s.masterName, '--lock-scan-interval-ms', '100'],
  });
  const key = taskLockKey(4343n);
  try {
    const client = await RawClient.connect(proxy.port);
    // The second expiry longer than the first, so that a re-armed lease would show.
    client.write(Buffer.concat([lockAttempt(key, 60), lockAttempt(key, 600), cmd('PTTL', key)]));
    const replies = (await client.readReplies(9)).toString();
    const attempts = attemptReplies(1, 1) + attemptReplies(2, 1);
    expect(replies.slice(0, attempts.length)).toBe(attempts);
    const pttl = Number(/^:(-?\d+)\r\n$/.exec(replies.slice(attempts.length))?.[1]);
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(60_000); // not re-armed
    await client.close();
    expect(await query(s.master.port, ['EXISTS', key])).toBe(0); // not in database 0
    const scans = proxy.app.lockScan?.latest.scans ?? 0;
    await expect.poll(() => proxy.app.lockScan?.latest.scans ?? 0, { timeout: 10_000 }).toBeGreaterThan(scans + 1);
    expect(proxy.app.lockScan?.latest.byRule.get('stalwart-task-lock')).toEqual({ keys: 1, abandoned: 0, rearmed: 0 });
  } finally {
    await proxy.close();
  }
});

it('follows a failover: old connections closed, new ones reach the new master', async () => {
  const s = setup as SentinelSetup;
  const port = await freePort();
  const cli = new Cli(
    ['--listen', `127.0.0.1:${port}`, '--sentinel', `127.0.0.1:${s.sentinels[0].port}`, '--sentinel-master', s.masterName],
    cleanEnv(),
  );
  try {
    const ready = await cli.waitForLog('redis-lock-proxy listening');
    expect(String(ready.upstream)).toContain(`master 127.0.0.1:${s.master.port}`);

    const before = await RawClient.connect(port);
    before.write(lockAttempt(KEY, 60));
    expect((await before.readReplies(4)).toString()).toBe(attemptReplies(1, 1));

    // A replica just after its first sync streams only after its first ACK (up to 1 s): let it catch up,
    // or the failover would legitimately lose the lock (replication is asynchronous).
    for (let i = 0; i < 100 && (await query(s.replica.port, ['EXISTS', KEY])) === 0; i++) await new Promise((r) => setTimeout(r, 50));
    await query(s.sentinels[0].port, ['SENTINEL', 'FAILOVER', s.masterName]);
    const switched = await cli.waitForLog('master changed; closed the connections to the old master', 15_000);
    expect(switched).toMatchObject({ from: `127.0.0.1:${s.master.port}`, to: `127.0.0.1:${s.replica.port}`, closed: 1 });
    await before.readUntilClosed(2000);

    const after = await RawClient.connect(port);
    // Its expiry longer than the lease (60 s), so that a re-armed one would show.
    after.write(Buffer.concat([lockAttempt(KEY, 600), cmd('ROLE'), cmd('PTTL', KEY)]));
    const replies = (await after.readReplies(6)).toString();
    expect(replies.slice(0, attemptReplies(2, 1).length)).toBe(attemptReplies(2, 1)); // the replicated lock
    expect(replies).toContain('$6\r\nmaster\r\n'); // talking to the promoted replica
    expect(Number(/:(-?\d+)\r\n$/.exec(replies)?.[1])).toBeLessThanOrEqual(60_000); // not re-armed
    await after.close();
  } finally {
    cli.kill('SIGTERM');
    await cli.stop();
  }
}, 60_000);
