/**
 * `verify` checks the running proxy's rules, as its admin endpoint lists them (GET /rules),
 * against a real Redis and an in-process proxy:
 *
 * - a proxy started with `--stalwart 0.15.3`, verified as in its container (no flags, the
 *   image's variables): its 0.15 rules are verified, instead of every release's (which failed,
 *   blaming the traffic);
 * - `verify --stalwart 0.16.9` through that proxy fails before touching anything, saying that the
 *   proxy does not enforce 0.16's locks;
 * - where it cannot ask, a failure says what verify could not know;
 * - a proxy in observe mode, and rules of the proxy's own files.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { run as verify } from '../../src/ops/verify.js';
import { runOp } from '../support/ops.js';
import { closedPort } from '../support/ports.js';
import { STALWART_RULES, startTestProxy, TEST_RULES, type TestProxy } from '../support/proxy.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';

const env = redisWithAdmin();

const dbsize = async () => Number((await env.admin.call('DBSIZE')).slice(1));

describe('through a proxy started with --stalwart 0.15.3', () => {
  let proxy: TestProxy;
  let admin: string;
  beforeAll(async () => {
    proxy = await startTestProxy({ upstream: env.redis.url, rules: [], stalwart: '0.15.3', admin: true });
    admin = `127.0.0.1:${proxy.app.adminAddress?.port}`;
  });
  afterAll(async () => {
    await proxy?.close();
  });

  const fifteen =
    'stalwart-purge-account, stalwart-queue-lock, stalwart-tls-report-lock, stalwart-dmarc-report-lock, stalwart-index-task-0.15, ' +
    'stalwart-alarm-task, stalwart-imip-task, stalwart-merge-threads-task, stalwart-housekeeper-data, stalwart-housekeeper-blob, ' +
    'stalwart-housekeeper-in-memory, stalwart-migration-account-lock';

  it('verifies the rules the proxy runs, learnt from its admin endpoint, as `verify --via` in its container does', async () => {
    const before = await dbsize();
    // The container's environment: the image's variables, the admin endpoint on every address.
    const container = { REDIS_LOCK_PROXY_RULES: STALWART_RULES, REDIS_LOCK_PROXY_ADMIN_LISTEN: `0.0.0.0:${proxy.app.adminAddress?.port}` };
    const result = await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`], container);
    expect(result).toEqual({
      code: 0,
      stdout:
        `verify: OK: 12 rule(s) enforce the fix through 127.0.0.1:${proxy.port} for Stalwart 0.15.0 - 0.15.5 (${fifteen}); ` +
        `fixed key, not touched: stalwart-migration-core-lock; the proxy's rules, from its admin endpoint ${admin}\n`,
      stderr: '',
    });
    // --admin says where, as well.
    expect((await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`, '--admin', admin])).stdout).toMatch(/^verify: OK: 12 rule\(s\)/);
    expect(await dbsize()).toBe(before);
  });

  it('without the admin endpoint, fails on a rule the proxy does not load, saying what it could not know, not blaming the traffic', async () => {
    const result = await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`, '--admin', 'off'], { REDIS_LOCK_PROXY_RULES: STALWART_RULES });
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^verify: FAILED: rule \S+: second attempt re-armed the expiry \(pttl \d+ ms\): the fix did not apply/);
    expect(result.stderr).toContain('or the proxy does not load this rule in enforce mode (its --stalwart, --rules or --mode)');
    expect(result.stderr).toContain('could not ask it which rules it runs: the admin endpoint is off');
    expect(result.stderr).not.toContain('really going through');
    // A port where nothing answers is named, with why.
    const closed = await closedPort();
    const nowhere = await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`, '--admin', `127.0.0.1:${closed}`]);
    expect(nowhere.stderr).toContain(`its admin endpoint 127.0.0.1:${closed} did not answer (connect ECONNREFUSED 127.0.0.1:${closed})`);
  });

  it("with --stalwart 0.16.9, fails before touching anything: the proxy does not enforce 0.16's locks", async () => {
    const before = await dbsize();
    const result = await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`, '--admin', admin, '--stalwart', '0.16.9']);
    expect(result).toEqual({
      code: 1,
      stdout: '',
      stderr:
        `verify: FAILED: the running proxy (admin endpoint ${admin}) runs mode enforce with rules for Stalwart 0.15.0 - 0.15.5; ` +
        'it does not enforce stalwart-task-lock\n',
    });
    expect(await dbsize()).toBe(before);
    // Its own release, asked for: verified.
    expect((await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`, '--admin', admin, '--stalwart', '0.15.3'])).stdout).toMatch(
      /^verify: OK: 12 rule\(s\) enforce the fix .* for Stalwart 0\.15\.0 - 0\.15\.5 /,
    );
  });

  it("says the traffic did not go through the proxy when that proxy did not see verify's connection, touching nothing", async () => {
    const before = await dbsize();
    const via = `127.0.0.1:${env.redis.port}`;
    const result = await runOp(verify, ['--via', via, '--admin', admin]);
    expect(result).toEqual({
      code: 1,
      stdout: '',
      stderr:
        `verify: FAILED: ${via} and the admin endpoint ${admin} are not the same proxy: the proxy at ${admin} did not see this ` +
        `run's connection, which went through ${via}; ${via} is another redis-lock-proxy, or no proxy at all (Redis itself?); ` +
        `verify does not judge it by another proxy's rules or mode: give --admin the admin endpoint of the proxy at ${via} ` +
        '(its --admin-listen)\n',
    });
    expect(await dbsize()).toBe(before);
  });

  it("names an admin address that is not a proxy's", async () => {
    const other = http.createServer((_req, res) => res.writeHead(404).end());
    await new Promise<void>((resolve) => other.listen(0, '127.0.0.1', resolve));
    try {
      const port = (other.address() as { port: number }).port;
      const result = await runOp(verify, ['--via', `127.0.0.1:${env.redis.port}`, '--admin', `127.0.0.1:${port}`]);
      expect(result.stderr).toContain(
        `127.0.0.1:${port} answered /rules with HTTP 404: not the admin endpoint of a redis-lock-proxy that lists its rules`,
      );
    } finally {
      other.close();
    }
  });
});

describe("the proxy's mode and its own rule files", () => {
  let tmp: string;
  beforeAll(() => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-verify-rules-'));
  });
  afterAll(() => {
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('in observe mode: nothing to verify, and it says the proxy only observes', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url, rules: [], stalwart: '0.16.9', admin: true, mode: 'observe' });
    try {
      const admin = `127.0.0.1:${proxy.app.adminAddress?.port}`;
      const result = await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`, '--admin', admin]);
      expect(result).toEqual({
        code: 1,
        stdout: '',
        stderr:
          `verify: FAILED: no enforce-mode rule to verify in the proxy's rules, from its admin endpoint ${admin} ` +
          '(observe only: stalwart-task-lock, stalwart-queue-lock)\n',
      });
    } finally {
      await proxy.close();
    }
  });

  it("builds the keys of the proxy's own rules from its files, and says when it cannot", async () => {
    const file = path.join(tmp, 'site.yaml');
    fs.writeFileSync(file, TEST_RULES);
    const proxy = await startTestProxy({ upstream: env.redis.url, rules: [], admin: true, flags: ['--rules', file] });
    try {
      const admin = `127.0.0.1:${proxy.app.adminAddress?.port}`;
      const result = await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`, '--admin', admin]);
      expect(result.stdout).toBe(
        `verify: OK: 1 rule(s) enforce the fix through 127.0.0.1:${proxy.port} (test-lock); observe (not verified): test-observe; ` +
          `the proxy's rules, from its admin endpoint ${admin}\n`,
      );
      fs.rmSync(file);
      const unreadable = await runOp(verify, ['--via', `127.0.0.1:${proxy.port}`, '--admin', admin]);
      expect(unreadable.code).toBe(1);
      expect(unreadable.stderr).toContain('and enforces test-lock, whose keys verify cannot build');
    } finally {
      await proxy.close();
    }
  });
});

describe('two proxies on one host', () => {
  // The first only observes; the second enforces. Each has an admin endpoint of its own.
  let observing: TestProxy;
  let enforcing: TestProxy;
  let observingAdmin: string;
  let enforcingAdmin: string;
  beforeAll(async () => {
    observing = await startTestProxy({ upstream: env.redis.url, rules: [], stalwart: '0.16.9', admin: true, mode: 'observe' });
    enforcing = await startTestProxy({ upstream: env.redis.url, rules: [], stalwart: '0.16.9', admin: true });
    observingAdmin = `127.0.0.1:${observing.app.adminAddress?.port}`;
    enforcingAdmin = `127.0.0.1:${enforcing.app.adminAddress?.port}`;
  });
  afterAll(async () => {
    await Promise.all([observing?.close(), enforcing?.close()]);
  });

  it("refuses to judge one proxy by the other's rules, naming both addresses", async () => {
    const via = `127.0.0.1:${enforcing.port}`;
    const differ =
      `verify: FAILED: ${via} and the admin endpoint ${observingAdmin} are not the same proxy: the proxy at ${observingAdmin} ` +
      `did not see this run's connection, which went through ${via}; ${via} is another redis-lock-proxy, or no proxy at all ` +
      "(Redis itself?); verify does not judge it by another proxy's rules or mode: " +
      `give --admin the admin endpoint of the proxy at ${via} (its --admin-listen)\n`;
    const before = await dbsize();
    // --admin naming the other's, and the proxy's variable as verify reads it (the default address) naming it.
    for (const [args, environment] of [
      [['--admin', observingAdmin], {}],
      [[], { REDIS_LOCK_PROXY_ADMIN_LISTEN: observingAdmin }],
      [['--admin', observingAdmin, '--stalwart', '0.16.9'], {}],
    ] as const) {
      const result = await runOp(verify, ['--via', via, ...args], environment);
      expect(result, args.join(' ')).toEqual({ code: 1, stdout: '', stderr: differ });
    }
    expect(await dbsize()).toBe(before);
  });

  it('names where the rules came from on the OK line, when the admin endpoint is the same proxy', async () => {
    const via = `127.0.0.1:${enforcing.port}`;
    const suffix = `; the proxy's rules, from its admin endpoint ${enforcingAdmin}\n`;
    const all = await runOp(verify, ['--via', via, '--admin', enforcingAdmin]);
    expect(all.stdout).toBe(
      `verify: OK: 2 rule(s) enforce the fix through ${via} for Stalwart 0.16.0 - 0.16.15 (stalwart-task-lock, stalwart-queue-lock)${suffix}`,
    );
    const release = await runOp(verify, ['--via', via, '--admin', enforcingAdmin, '--stalwart', '0.16.9']);
    expect(release.stdout).toBe(all.stdout);
    // The observing proxy, asked through its own admin endpoint: its mode is what fails, as it is its own.
    const observed = await runOp(verify, ['--via', `127.0.0.1:${observing.port}`, '--admin', observingAdmin]);
    expect(observed.stderr).toBe(
      `verify: FAILED: no enforce-mode rule to verify in the proxy's rules, from its admin endpoint ${observingAdmin} ` +
        '(observe only: stalwart-task-lock, stalwart-queue-lock)\n',
    );
  });

  it("marks verify's blocks as verify's in the log lines of a proxy that only observes", async () => {
    const result = await runOp(verify, ['--via', `127.0.0.1:${observing.port}`, '--admin', 'off', '--stalwart', '0.16.9']);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^verify: FAILED: rule stalwart-task-lock: second attempt re-armed the expiry/);
    const blockLines = () => observing.logs().filter((line) => String(line.msg).includes('lock block would be rewritten'));
    await vi.waitFor(() => expect(blockLines().length).toBeGreaterThanOrEqual(2), { timeout: 10_000 });
    for (const line of blockLines()) {
      expect(line).toMatchObject({
        verify: true,
        msg: "verify's probe, not an application's lock: observe: lock block would be rewritten",
        rule: 'stalwart-task-lock',
      });
    }
  });
});
