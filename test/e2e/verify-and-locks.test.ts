/**
 * The operator subcommands against a real Redis and an in-process proxy:
 *
 * - `verify --via HOST:PORT` proves the fix through the proxy (and fails, with one clear line,
 *   directly against Redis, on a closed port, or on a server that never answers), and leaves no
 *   key behind;
 * - `locks --upstream URL` lists and decodes lock keys written with Stalwart's exact bytes,
 *   flags the abandoned ones (no expiry), releases keys, and finds locks among many other keys
 *   with SCAN, never KEYS. (What counts as trouble, and deleting safely: locks-release.test.ts.)
 *
 * The same commands for each Stalwart release line: verify-and-locks-stalwart-releases.test.ts.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { describeKey, escapeKey, keyArgument, unescapeKey } from '../../src/key-text.js';
import { run as locks } from '../../src/ops/locks.js';
import { upstreamRedisOptions } from '../../src/upstream/redis-client.js';
import { describeLockKey } from '../../src/lock-keys/read.js';
import { deleteUnchanged } from '../../src/lock-keys/delete.js';
import { scanNodes } from '../../src/lock-keys/pass.js';
import { globPatternFor } from '../../src/lock-keys/scan.js';
import { run as verify } from '../../src/ops/verify.js';
import { PROBE_ACL } from '../../src/ops/verify-scratch.js';
import { loadRules } from '../../src/rules/loader.js';
import { parseUpstreamUrl } from '../../src/upstream/target.js';
import { STALWART_RULES, startTestProxy, TEST_RULES, type TestProxy } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { freePort } from '../support/ports.js';
import { attemptCounter, queueLockKey, taskLockKey } from '../support/stalwart.js';
import { runOp } from '../support/ops.js';
import { RELEASE_LINES } from '../support/stalwart-releases.js';
import { RawClient } from '../support/resp.js';
import { serverFacts } from '../support/server-facts.js';

const env = redisAndProxy();
let tmp: string;
let testRulesFile: string;

beforeAll(() => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'rlp-ops-'));
  testRulesFile = writeRules('test.yaml', TEST_RULES);
});

afterAll(() => {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

function writeRules(name: string, text: string): string {
  const file = path.join(tmp, name);
  writeFileSync(file, text);
  return file;
}

const adminCall = (...args: (string | Buffer)[]): Promise<string> => env.admin.call(...args);

async function adminInt(...args: (string | Buffer)[]): Promise<number> {
  const reply = await adminCall(...args);
  const match = /^:(-?\d+)\r\n$/.exec(reply);
  if (!match) throw new Error(`not an integer reply: ${JSON.stringify(reply)}`);
  return Number(match[1]);
}

async function adminGet(key: Buffer | string): Promise<string | null> {
  const reply = await adminCall('GET', key);
  if (reply === '$-1\r\n') return null;
  return /^\$\d+\r\n([\s\S]*)\r\n$/.exec(reply)?.[1] ?? reply;
}

/** Stalwart's lock attempt through the proxy, byte for byte; returns the counter. */
const attemptViaProxy = (key: Buffer, seconds: number): Promise<number> => attemptCounter(env.proxy.port, key, seconds);

function lines(text: string): string[] {
  return text.split('\n').filter((line) => line !== '');
}

// ---------------------------------------------------------------------------------------------
// verify
// ---------------------------------------------------------------------------------------------

describe('verify', () => {
  beforeEach(async () => {
    // The fixture has just emptied Redis.
    await adminCall('SET', 'app:unrelated', 'x'); // so that "DBSIZE unchanged" is not just 0 == 0
  });

  it('passes through the proxy with the shipped Stalwart rules: one line, exit 0, no keys left', async () => {
    const before = await adminInt('DBSIZE');
    // This proxy serves no admin endpoint: the OK line says whose rules were verified.
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.proxy.port}`, '--admin', 'off']);
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    // From the independent tables of every release line, not from the rule loader.
    const verified = [...new Set(RELEASE_LINES.flatMap((line) => line.locks.map((kind) => kind.rule)))].filter(
      (name) => name !== 'stalwart-migration-core-lock',
    );
    const releases = RELEASE_LINES.map((line) =>
      line.first === line.last ? `Stalwart ${line.first}` : `Stalwart ${line.first} - ${line.last}`,
    );
    const ok =
      /^verify: OK: (\d+) rule\(s\) enforce the fix through (\S+) for (.+) \((.+)\); fixed key, not touched: stalwart-migration-core-lock; verify's own rules, as it could not ask the proxy for its own: the admin endpoint is off \(--admin off, or REDIS_LOCK_PROXY_ADMIN_LISTEN=off\)\n$/.exec(
        result.stdout,
      );
    expect(ok, result.stdout).not.toBeNull();
    const [, count, via, releasesShown, rulesShown] = ok as RegExpExecArray;
    expect([Number(count), via, releasesShown]).toEqual([verified.length, `127.0.0.1:${env.proxy.port}`, releases.join(', ')]);
    expect(rulesShown.split(', ').sort()).toEqual(verified.sort());
    expect(await adminInt('DBSIZE')).toBe(before);
  });

  it('passes with a text-prefix rule file, and names the observe rule it did not verify', async () => {
    const before = await adminInt('DBSIZE');
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.proxy.port}`, '--rules', testRulesFile, '--admin', 'off']);
    expect(result).toEqual({
      code: 0,
      stdout:
        `verify: OK: 1 rule(s) enforce the fix through 127.0.0.1:${env.proxy.port} (test-lock); ` +
        "observe (not verified): test-observe; verify's own rules, as it could not ask the proxy for its own: the admin " +
        'endpoint is off (--admin off, or REDIS_LOCK_PROXY_ADMIN_LISTEN=off)\n',
      stderr: '',
    });
    expect(await adminInt('DBSIZE')).toBe(before);
  });

  it('takes the rules from REDIS_LOCK_PROXY_RULES, as the proxy does', async () => {
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.proxy.port}`], {
      REDIS_LOCK_PROXY_RULES: `${STALWART_RULES},${testRulesFile}`,
    });
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(
      /^verify: OK: 19 rule\(s\) enforce the fix .*\(stalwart-purge-account, .*, stalwart-purge-account-text, test-lock\)/,
    );
  });

  it('fails directly against Redis: the second attempt re-armed the expiry, and it says what it could not know', async () => {
    const before = await adminInt('DBSIZE');
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.redis.port}`, '--admin', 'off']);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe('');
    expect(lines(result.stderr)).toHaveLength(1);
    expect(result.stderr).toMatch(
      new RegExp(
        '^verify: FAILED: rule stalwart-purge-account: second attempt re-armed the expiry \\(pttl (\\d+) ms\\): the fix did not apply ' +
          `to this rule's keys at 127\\.0\\.0\\.1:${env.redis.port}: either the client does not go through redis-lock-proxy there, ` +
          'or the proxy does not load this rule in enforce mode .* could not ask it which rules it runs: the admin endpoint is off',
      ),
    );
    const pttl = Number(/pttl (\d+) ms/.exec(result.stderr)?.[1]);
    expect(pttl).toBeGreaterThan(55_000);
    expect(await adminInt('DBSIZE')).toBe(before);
  });

  it('fails with a clear line on a closed port, also for a release with nothing to verify', async () => {
    const port = await freePort();
    const closed = {
      code: 1,
      stdout: '',
      stderr: `verify: FAILED: cannot connect to 127.0.0.1:${port}: connect ECONNREFUSED 127.0.0.1:${port}\n`,
    };
    expect(await runOp(verify, ['--via', `127.0.0.1:${port}`])).toEqual(closed);
    expect(await runOp(verify, ['--via', `127.0.0.1:${port}`, '--stalwart', '0.16.16'])).toEqual(closed);
  });

  it('for a release without the bug, touches nothing but checks that the proxy answers', async () => {
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.proxy.port}`, '--stalwart', '0.16.16']);
    expect(result).toEqual({
      code: 0,
      stdout:
        'verify: OK: Stalwart 0.16.16 is not affected: from 0.16.16 on it takes its locks with SET NX EX, whose expiry a ' +
        `failed attempt does not push forward; nothing to verify (127.0.0.1:${env.proxy.port} answers)\n`,
      stderr: '',
    });
    const orphan = await startTestProxy({ upstream: `redis://127.0.0.1:${await freePort()}` });
    try {
      const refused = await runOp(verify, ['--via', `127.0.0.1:${orphan.port}`, '--stalwart', '0.16.16']);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toMatch(/^verify: FAILED: ERR redis-lock-proxy: upstream redis:\/\/127\.0\.0\.1:\d+ is unreachable: /);
    } finally {
      await orphan.close();
    }
  });

  it('gives up after --timeout-ms on a server that never answers', async () => {
    const sockets: net.Socket[] = [];
    const silent = net.createServer((socket) => sockets.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const { port } = silent.address() as net.AddressInfo;
    try {
      const started = Date.now();
      const result = await runOp(verify, ['--via', `127.0.0.1:${port}`, '--timeout-ms', '300']);
      expect(Date.now() - started).toBeLessThan(3000);
      expect(result.code).toBe(1);
      expect(lines(result.stderr)).toHaveLength(1);
      expect(result.stderr).toMatch(/^verify: FAILED: .*(timed out after 300 ms|timed out|ETIMEDOUT)/);
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => silent.close(resolve));
    }
  });

  it('names the cause when HOST:PORT is not a Redis, or the proxy cannot reach its Redis', async () => {
    const http = net.createServer((socket) => {
      socket.resume(); // read (and drop) what the client sends, so its close is seen
      socket.end('HTTP/1.1 400 Bad Request\r\n\r\n');
    });
    await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
    const { port } = http.address() as net.AddressInfo;
    try {
      const notResp = `127.0.0.1:${port} does not speak RESP (it answered "H"...): give the address of Redis or of redis-lock-proxy`;
      const result = await runOp(verify, ['--via', `127.0.0.1:${port}`]);
      expect(result.code).toBe(1);
      expect(result.stderr).toBe(`verify: FAILED: rule stalwart-purge-account: ${notResp}\n`);
      // With nothing to verify for the release, the address must still answer as Redis does.
      const unaffected = await runOp(verify, ['--via', `127.0.0.1:${port}`, '--stalwart', '0.16.16']);
      expect(unaffected).toEqual({ code: 1, stdout: '', stderr: `verify: FAILED: ${notResp}\n` });
      const listing = await runOp(locks, ['--upstream', `redis://127.0.0.1:${port}`, '--rules', STALWART_RULES]);
      expect(listing).toMatchObject({ code: 1, stderr: `locks: redis://${notResp}\n` });
    } finally {
      await new Promise((resolve) => http.close(resolve));
    }

    const orphan = await startTestProxy({ upstream: `redis://127.0.0.1:${await freePort()}` });
    try {
      const result = await runOp(verify, ['--via', `127.0.0.1:${orphan.port}`]);
      expect(result.code).toBe(1);
      expect(result.stderr).toMatch(
        /^verify: FAILED: rule stalwart-purge-account: ERR redis-lock-proxy: upstream redis:\/\/127\.0\.0\.1:\d+ is unreachable: connect ECONNREFUSED/,
      );
    } finally {
      await orphan.close();
    }
  });

  it('--verbose prints each step, with the scratch keys', async () => {
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.proxy.port}`, '--verbose', '--rules', testRulesFile]);
    expect(result.code).toBe(0);
    const out = lines(result.stdout);
    expect(out.at(-1)).toMatch(/^verify: OK: 1 rule\(s\)/);
    expect(out).toContainEqual(expect.stringMatching(/^verify: rule test-lock: scratch key lock:rlp-verify[a-z0-9]{6}$/));
    expect(out).toContainEqual(expect.stringMatching(/^verify: rule test-lock: attempt 2: counter 2, expiry reply 1, pttl \d+ ms$/));
    expect(out).toContainEqual('verify: rule test-observe: observe (not verified)');
  });

  it('fails a rule it cannot build a scratch key for', async () => {
    const impossible = writeRules('impossible.yaml', `rules:\n  - name: impossible\n    prefix: "x:"\n    pattern: '^x:[\\s\\S]{200}$'\n`);
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.proxy.port}`, '--rules', impossible]);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^verify: FAILED: rule impossible: cannot build a scratch key/);
  });

  it('a rule shadowed by an earlier one has no key of its own', async () => {
    const shadowedProxy = await startTestProxy({
      upstream: env.redis.url,
      rules: [`rules:\n  - name: broad\n    prefix: "job:"\n  - name: narrow\n    prefix: "job:x"\n`],
    });
    try {
      const file = writeRules('shadowed2.yaml', `rules:\n  - name: broad\n    prefix: "job:"\n  - name: narrow\n    prefix: "job:x"\n`);
      const result = await runOp(verify, ['--via', `127.0.0.1:${shadowedProxy.port}`, '--rules', file]);
      expect(result.code).toBe(1);
      expect(result.stderr).toMatch(/^verify: FAILED: rule narrow: cannot build a scratch key: .*earlier rule/);
    } finally {
      await shadowedProxy.close();
    }
  });

  it('fails when the proxy only observes the rule', async () => {
    const observing = await startTestProxy({
      upstream: env.redis.url,
      rules: [`rules:\n  - name: test-lock\n    prefix: "lock:"\n    mode: observe\n`],
    });
    try {
      const file = writeRules('enforce.yaml', `rules:\n  - name: test-lock\n    prefix: "lock:"\n`);
      const result = await runOp(verify, ['--via', `127.0.0.1:${observing.port}`, '--rules', file]);
      expect(result.code).toBe(1);
      expect(result.stderr).toMatch(/^verify: FAILED: rule test-lock: second attempt re-armed the expiry/);
    } finally {
      await observing.close();
    }
  });

  it('usage: --help exits 0; unknown flags, a missing --via and bad rule files exit 2', async () => {
    const help = await runOp(verify, ['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/^Usage: redis-lock-proxy verify --via HOST:PORT/);

    const unknown = await runOp(verify, ['--via', '127.0.0.1:1', '--bogus']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^redis-lock-proxy verify: Unknown option '--bogus'/);

    const missing = await runOp(verify, []);
    expect(missing).toMatchObject({ code: 2, stderr: expect.stringContaining('--via HOST:PORT is required') });

    const badVia = await runOp(verify, ['--via', 'nowhere']);
    expect(badVia.code).toBe(2);

    const badRules = await runOp(verify, ['--via', '127.0.0.1:1', '--rules', path.join(tmp, 'missing.yaml')]);
    expect(badRules).toMatchObject({ code: 2, stderr: expect.stringContaining('does not exist') });
  });

  describe('when Redis wants the client to authenticate', () => {
    let secured: RedisServer;
    let securedProxy: TestProxy;

    beforeAll(async () => {
      secured = await startRedis({ password: 's3cret' });
      // The proxy does not authenticate upstream: the client's AUTH passes through.
      securedProxy = await startTestProxy({ upstream: `redis://127.0.0.1:${secured.port}` });
    });

    afterAll(async () => {
      await securedProxy?.close();
      await secured?.stop();
    });

    it('fails without a password, with a hint, and passes with --password or the environment', async () => {
      const via = `127.0.0.1:${securedProxy.port}`;
      const without = await runOp(verify, ['--via', via]);
      expect(without.code).toBe(1);
      expect(without.stderr).toMatch(/^verify: FAILED: rule stalwart-purge-account: NOAUTH.*--password/);

      const flag = await runOp(verify, ['--via', via, '--password', 's3cret']);
      expect(flag.code).toBe(0);
      const fromEnvironment = await runOp(verify, ['--via', via], { REDIS_LOCK_PROXY_VERIFY_PASSWORD: 's3cret' });
      expect(fromEnvironment.code).toBe(0);
      const user = await runOp(verify, ['--via', via, '--user', 'default', '--password', 's3cret']);
      expect(user.code).toBe(0);
      const wrong = await runOp(verify, ['--via', via, '--password', 'nope']);
      expect(wrong.code).toBe(1);
      expect(wrong.stderr).toMatch(
        /^verify: FAILED: rule stalwart-purge-account: connection to 127\.0\.0\.1:\d+ failed: WRONGPASS .*--password/,
      );
      expect(await runOp(verify, ['--via', via, '--user', 'someone'])).toMatchObject({ code: 2 });
    });

    it("--user with the lock block's commands only: verify's own probe fails, said as such; with the probe's commands it passes", async () => {
      const via = `127.0.0.1:${securedProxy.port}`;
      const admin = await RawClient.connect(secured.port);
      try {
        expect(await admin.call('AUTH', 's3cret')).toBe('+OK\r\n');
        // The README's least-privilege rules for this server's line.
        const block = ['+multi', '+exec', '+incr', '+incrby', '+expire', '+pexpire'];
        if (!(await serverFacts(admin)).has('expire-nx')) block.push('+eval', '+evalsha', '+pttl', '+get');
        expect(await admin.call('ACL', 'SETUSER', 'lean', 'on', '>pw', '~*', ...block)).toBe('+OK\r\n');
        expect(await admin.call('ACL', 'SETUSER', 'probed', 'on', '>pw', '~*', ...block, ...PROBE_ACL.split(' '))).toBe('+OK\r\n');
      } finally {
        await admin.close();
      }
      const lean = await runOp(verify, ['--via', via, '--user', 'lean', '--password', 'pw']);
      expect(lean.code).toBe(1);
      expect(lean.stderr).toMatch(/verify's own probe failed, not the rule: EXISTS on its scratch key was refused \(NOPERM/);
      expect(lean.stderr).toContain(PROBE_ACL);
      const probed = await runOp(verify, ['--via', via, '--user', 'probed', '--password', 'pw']);
      expect([probed.code, probed.stderr]).toEqual([0, '']);
    });
  });
});

// ---------------------------------------------------------------------------------------------
// locks
// ---------------------------------------------------------------------------------------------

describe('locks', () => {
  const task1234 = taskLockKey(1234n);
  const queue42 = queueLockKey(42n, 'local');
  const bumped = taskLockKey(777n);
  const noTtl = taskLockKey(555n);
  const fixedNode = taskLockKey(999n);
  /** Every glob special character and CR LF NUL in a task id. */
  const awkward = taskLockKey(0x0d0a005c2a3f5b5dn);
  const rateLimit = Buffer.concat([Buffer.from([0x02]), Buffer.from('12345678')]);
  const shortTask = Buffer.from([0x17, 9, 2, 3]); // a 0x17 key that no release uses for a lock

  let upstreamArgs: string[];
  /** The listing, reading the keys again soon after the first read (nothing changes between the two here). */
  let listArgs: string[];

  beforeAll(() => {
    upstreamArgs = ['--upstream', env.redis.url, '--rules', STALWART_RULES];
    listArgs = [...upstreamArgs, '--recheck-ms', '50'];
  });

  beforeEach(async () => {
    // The fixture has just emptied Redis.
    expect(await attemptViaProxy(task1234, 3600)).toBe(1);
    expect(await attemptViaProxy(queue42, 600)).toBe(1);
    expect(await attemptViaProxy(awkward, 3600)).toBe(1);
    // An owner, then two losers: the counter shows other nodes tried while it was held.
    for (const expected of [1, 2, 3]) expect(await attemptViaProxy(bumped, 3600)).toBe(expected);
    // A lock that lost its expiry.
    expect(await attemptViaProxy(noTtl, 3600)).toBe(1);
    expect(await adminInt('PERSIST', noTtl)).toBe(1);
    // A fixed node's lock (Stalwart 0.16.16: SET key <now + secs> NX EX secs), tried once by an old node.
    const deadline = Math.floor(Date.now() / 1000) + 3600;
    expect(await adminCall('SET', fixedNode, String(deadline), 'NX', 'EX', '3600')).toBe('+OK\r\n');
    expect(await attemptViaProxy(fixedNode, 3600)).toBe(deadline + 1);
    // Not locks: a rate-limit counter with the same shape, a short 0x17 key, application keys.
    expect(await attemptViaProxy(rateLimit, 60)).toBe(1);
    await adminCall('SET', shortTask, '7');
    await adminCall('SET', 'user:1', 'x');
    await adminCall('SET', 'lock:text', '1'); // a test-lock key, but that rule is not loaded here
  });

  it('lists and decodes Stalwart task and queue locks, and flags the abandoned one (no expiry), not the contended one', async () => {
    const result = await runOp(locks, listArgs);
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    const out = lines(result.stdout);
    expect(out[0]).toMatch(/^KEY\s+RULE\s+COUNTER\s+TTL\s+WHAT\s+FLAG$/);
    expect(out.at(-1)).toBe('6 lock key(s): 1 abandoned (no expiry), 0 re-armed (traffic bypasses the proxy)');
    const rowOf = (key: Buffer) => {
      const found = out.filter((line) => line.startsWith(`${keyArgument(key)} `));
      expect(found, keyArgument(key)).toHaveLength(1);
      return found[0].split(/ {2,}/);
    };

    const [, rule, counter, ttl, what, flag] = rowOf(task1234);
    expect(rule).toBe('stalwart-task-lock');
    expect(counter).toBe('1');
    expect(Number(ttl.replace(/s$/, ''))).toBeGreaterThan(3590);
    expect(what).toBe('task 1234');
    expect(flag).toBeUndefined();

    expect(rowOf(queue42).slice(1, 5)).toEqual([
      'stalwart-queue-lock',
      '1',
      expect.stringMatching(/^(59\d|600)\.\ds$/),
      'queue message 42 in queue "local"',
    ]);
    // Contended: others tried while it was held. Through the proxy that is normal, and it expires on time.
    expect(rowOf(bumped).slice(1)).toEqual(['stalwart-task-lock', '3', expect.stringMatching(/^3\d{3}\.\ds$/), 'task 777']);
    expect(rowOf(noTtl).slice(1)).toEqual(['stalwart-task-lock', '1', 'none', 'task 555', 'abandoned: no expiry, never expires']);
    const fixed = rowOf(fixedNode);
    expect(fixed[4]).toMatch(/^task 999 \(SET NX lock, deadline \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)$/);
    expect(fixed).toHaveLength(5); // not flagged: a live lock of a fixed node
    expect(rowOf(awkward)[4]).toBe(`task ${0x0d0a005c2a3f5b5dn}`);

    // Not locks: the rate-limit counter, the short 0x17 key, application keys.
    expect(result.stdout).not.toContain(describeKey(rateLimit));
    expect(result.stdout).not.toContain(describeKey(shortTask));
    expect(result.stdout).not.toContain('user:1');
    expect(result.stdout).not.toContain('lock:text');
  });

  it('--json: one object per key, with the key escaped and in hex', async () => {
    const result = await runOp(locks, [...listArgs, '--json']);
    expect(result.code).toBe(0);
    const rows = lines(result.stdout).map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(rows).toHaveLength(6);
    const byHex = new Map(rows.map((row) => [row.key_hex, row]));
    expect(byHex.get(bumped.toString('hex'))).toEqual({
      key: describeKey(bumped),
      key_hex: bumped.toString('hex'),
      node: expect.stringMatching(/^127\.0\.0\.1:\d+$/),
      rule: 'stalwart-task-lock',
      counter: 3,
      deadline: null,
      value: null,
      pttl_ms: expect.any(Number),
      what: 'task 777',
      flagged: false,
      abandoned: false,
      rearmed: null,
      flags: [],
    });
    expect(byHex.get(queue42.toString('hex'))).toMatchObject({ what: 'queue message 42 in queue "local"', flagged: false, flags: [] });
    expect(byHex.get(noTtl.toString('hex'))).toMatchObject({
      pttl_ms: -1,
      flagged: true,
      abandoned: true,
      flags: ['abandoned: no expiry, never expires'],
    });
    expect(byHex.get(fixedNode.toString('hex'))).toMatchObject({ counter: null, deadline: expect.any(Number), flagged: false });
  });

  it('--release --yes with an escaped binary key deletes exactly that key', async () => {
    const escaped = describeKey(awkward);
    expect(escaped).toBe('\\x17\\x0d\\x0a\\x00\\x5c*?[]');
    const result = await runOp(locks, [...upstreamArgs, '--release', escaped, '--release-live', '--yes']);
    expect(result.code).toBe(0);
    expect(lines(result.stdout)).toEqual([
      expect.stringMatching(/^will delete '\\x17\\x0d\\x0a\\x00\\x5c\*\?\[\]': stalwart-task-lock, task \d+, counter 1, ttl \d+\.\ds$/),
      expect.stringMatching(/^deleted '\\x17\\x0d\\x0a\\x00\\x5c\*\?\[\]': stalwart-task-lock, task \d+, counter 1, ttl \d+\.\ds$/),
    ]);
    expect(await adminInt('EXISTS', awkward)).toBe(0);
    expect(await adminInt('DBSIZE')).toBe(9);
  });

  it('--release: several keys; a missing one is reported, a key no rule names is refused', async () => {
    const result = await runOp(locks, [
      ...upstreamArgs,
      '--release',
      describeKey(task1234),
      describeKey(taskLockKey(1n)),
      '--release',
      'user:1',
      '--release-live',
      '--yes',
    ]);
    expect(result.code).toBe(1);
    expect(lines(result.stdout)).toEqual([
      expect.stringMatching(/^will delete '\\x17\\x00\\x00\\x00\\x00\\x00\\x00\\x04\\xd2': stalwart-task-lock, task 1234,/),
      expect.stringMatching(/^not found '\\x17(\\x00){7}\\x01' \(task 1\): nothing to delete$/),
      "refused 'user:1': no rule names this key, so it is not a lock; not deleted",
      expect.stringMatching(/^deleted '\\x17\\x00\\x00\\x00\\x00\\x00\\x00\\x04\\xd2': stalwart-task-lock, task 1234,/),
    ]);
    expect(await adminInt('EXISTS', task1234)).toBe(0);
    expect(await adminInt('EXISTS', 'user:1')).toBe(1);
  });

  it('--release refuses a malformed escape before touching anything', async () => {
    const result = await runOp(locks, [...upstreamArgs, '--release', describeKey(task1234), '--release', '\\x1']);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('invalid escape');
    expect(await adminInt('EXISTS', task1234)).toBe(1);
  });

  it('--release-abandoned without --yes lists what it would delete and deletes nothing', async () => {
    const before = await adminInt('DBSIZE');
    const result = await runOp(locks, [...upstreamArgs, '--release-abandoned']);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe('locks: nothing deleted: add --yes to delete it (each only if it still has no expiry)\n');
    expect(lines(result.stdout)).toEqual([
      "would delete '\\x17\\x00\\x00\\x00\\x00\\x00\\x00\\x02+': stalwart-task-lock, task 555, counter 1, ttl none, abandoned: no expiry, never expires",
    ]);
    expect(await adminInt('DBSIZE')).toBe(before);
    // --dry-run says the same and exits 0.
    const dry = await runOp(locks, [...upstreamArgs, '--release-abandoned', '--dry-run']);
    expect([dry.code, dry.stderr, lines(dry.stdout).at(-1)]).toEqual([0, '', 'dry run: nothing deleted (1 abandoned of 6 lock key(s))']);
    expect(await adminInt('DBSIZE')).toBe(before);
  });

  it('--release-abandoned --yes deletes only the locks without an expiry, never a contended one', async () => {
    const before = await adminInt('DBSIZE');
    const result = await runOp(locks, [...upstreamArgs, '--release-abandoned', '--yes']);
    expect(result.code).toBe(0);
    expect(lines(result.stdout)).toEqual([
      "deleted '\\x17\\x00\\x00\\x00\\x00\\x00\\x00\\x02+': stalwart-task-lock, task 555, counter 1, ttl none, abandoned: no expiry, never expires",
      '1 abandoned lock(s) deleted, 0 left alone (taken or tried since they were read), 0 failed, of 6 lock key(s) checked',
    ]);
    expect(await adminInt('EXISTS', noTtl)).toBe(0);
    expect(await adminInt('DBSIZE')).toBe(before - 1);
    for (const key of [task1234, queue42, bumped, fixedNode, awkward, rateLimit, shortTask]) {
      expect(await adminInt('EXISTS', key), describeKey(key)).toBe(1);
    }
  });

  it('deletes only what is unchanged since it was read: same value, and no expiry still or one not raised', async () => {
    const client = new Redis(upstreamRedisOptions(parseUpstreamUrl(env.redis.url), null, 5000));
    try {
      await client.connect();
      const rules = loadRules([STALWART_RULES]);
      const node = [{ name: '', redis: client, slots: [] }];
      const read = (await scanNodes(node, rules, { count: 1000 })).rows;
      const rowOf = (key: Buffer) => read.filter((row) => row.key.equals(key));
      // Meanwhile: another loser bumps 777; 555 is released, a new owner takes it, and it holds 1 again (same value, an expiry).
      expect(await attemptViaProxy(bumped, 3600)).toBe(4);
      await adminCall('DEL', noTtl);
      await adminCall('SET', noTtl, '1', 'EX', '3600');
      const results = await deleteUnchanged(client, [...rowOf(bumped), ...rowOf(noTtl)]);
      expect(results).toEqual(['changed', 'now-live']);
      expect(await adminGet(bumped)).toBe('4');
      expect(await adminInt('EXISTS', noTtl)).toBe(1);

      // A key whose expiry went up without a change of value was re-armed by someone: left alone too.
      await adminCall('SET', 'lock:x', '5', 'PX', '10000');
      const onlyX = writeRules('only-x.yaml', 'rules:\n  - name: x\n    prefix: "lock:x"\n');
      const { rows } = await scanNodes(node, loadRules([onlyX]), { count: 1000 });
      expect(rows).toHaveLength(1);
      await adminCall('PEXPIRE', 'lock:x', '60000');
      expect(await deleteUnchanged(client, rows)).toEqual(['changed']);
      await adminCall('PEXPIRE', 'lock:x', '5000');
      expect(await deleteUnchanged(client, rows)).toEqual(['deleted']);
      expect(await deleteUnchanged(client, rows)).toEqual(['gone']);
    } finally {
      client.disconnect();
    }
  });

  it('flags a fixed node lock whose deadline passed long ago but that still exists (expiry re-armed)', async () => {
    const stale = taskLockKey(31n);
    await adminCall('SET', stale, String(Math.floor(Date.now() / 1000) - 600), 'EX', '3600');
    const result = await runOp(locks, [...listArgs, '--json']);
    const row = lines(result.stdout)
      .map((line) => JSON.parse(line) as { key_hex: string; flags: string[] })
      .find((r) => r.key_hex === stale.toString('hex'));
    expect(row?.flags).toEqual([expect.stringMatching(/^re-armed: traffic bypasses the proxy \(SET NX deadline passed \d+s ago\)$/)]);
  });

  it('finds the locks among 20k other keys with SCAN, never KEYS, also with a small --count', async () => {
    const filler = new Redis(upstreamRedisOptions(parseUpstreamUrl(env.redis.url), null, 5000));
    try {
      await filler.connect();
      for (let start = 0; start < 20_000; start += 1000) {
        const args: string[] = [];
        for (let i = start; i < start + 1000; i++) args.push(`unrelated:${i}`, 'v');
        await filler.mset(...args);
      }
      // Near misses: prefix bytes of the locks, wrong lengths.
      for (let i = 0; i < 100; i++) await filler.set(Buffer.concat([Buffer.from([0x17]), Buffer.from(`x${i}`)]), '1');
    } finally {
      filler.disconnect();
    }
    expect(await adminInt('DBSIZE')).toBe(20_000 + 100 + 10);
    await adminCall('CONFIG', 'RESETSTAT');

    for (const extra of [[], ['--count', '10']]) {
      const result = await runOp(locks, [...listArgs, '--json', ...extra]);
      expect(result.code).toBe(0);
      const hexes = lines(result.stdout).map((line) => (JSON.parse(line) as { key_hex: string }).key_hex);
      expect(hexes.sort()).toEqual([task1234, queue42, bumped, noTtl, fixedNode, awkward].map((k) => k.toString('hex')).sort());
    }
    const stats = await adminCall('INFO', 'commandstats');
    expect(stats).toContain('cmdstat_scan:');
    expect(stats).not.toContain('cmdstat_keys:');
  });

  it('connects as the proxy would: password, database and unix socket from the URL', async () => {
    const socketDir = mkdtempSync(path.join(os.tmpdir(), 'rlp-sock-'));
    const socket = path.join(socketDir, 'redis.sock');
    const secured = await startRedis({ password: 'p@ss/word', args: ['--unixsocket', socket, '--unixsocketperm', '700'] });
    try {
      const setup = new Redis({ port: secured.port, host: '127.0.0.1', password: 'p@ss/word', db: 3, lazyConnect: true });
      await setup.connect();
      await setup.incrby(task1234, 1);
      await setup.expire(task1234, 3600);
      setup.disconnect();

      for (const url of [
        `redis://:${encodeURIComponent('p@ss/word')}@127.0.0.1:${secured.port}/3`,
        `redis://default:${encodeURIComponent('p@ss/word')}@127.0.0.1:${secured.port}/3`,
        `unix://${socket}?db=3&password=${encodeURIComponent('p@ss/word')}`,
      ]) {
        const result = await runOp(locks, ['--upstream', url, '--rules', STALWART_RULES, '--recheck-ms', '0']);
        expect(result.stderr, url).toBe('');
        expect(result.stdout, url).toContain('task 1234');
      }
      // The upstream URL also comes from the environment, as for the proxy.
      const fromEnv = await runOp(locks, ['--rules', STALWART_RULES, '--recheck-ms', '0'], {
        REDIS_LOCK_PROXY_UPSTREAM: `redis://:${encodeURIComponent('p@ss/word')}@127.0.0.1:${secured.port}/3`,
      });
      expect(fromEnv.stdout).toContain('task 1234');

      const noAuth = await runOp(locks, ['--upstream', `redis://127.0.0.1:${secured.port}/3`, '--rules', STALWART_RULES]);
      expect(noAuth.code).toBe(1);
      expect(noAuth.stderr).toBe(
        `locks: redis://127.0.0.1:${secured.port}/3: connection failed: NOAUTH Authentication required. ` +
          '(give the password in the --upstream URL, redis://:PASSWORD@HOST:PORT, or in REDIS_LOCK_PROXY_UPSTREAM)\n',
      );
    } finally {
      await secured.stop();
      rmSync(socketDir, { recursive: true, force: true });
    }
  });

  it('exits 1 with one line when Redis is unreachable, and 2 for bad options', async () => {
    const port = await freePort();
    const down = await runOp(locks, ['--upstream', `redis://127.0.0.1:${port}`, '--rules', STALWART_RULES]);
    expect(down).toEqual({
      code: 1,
      stdout: '',
      stderr: `locks: cannot connect to redis://127.0.0.1:${port}: connect ECONNREFUSED 127.0.0.1:${port}\n`,
    });
    expect((await runOp(locks, ['--bogus'])).code).toBe(2);
    expect((await runOp(locks, ['--upstream', 'http://x'])).code).toBe(2);
    expect((await runOp(locks, ['--yes'])).code).toBe(2);
    expect((await runOp(locks, ['stray'])).code).toBe(2);
    expect((await runOp(locks, ['--count', '0'])).code).toBe(2);
    const tooLarge = await runOp(locks, ['--count', '9999999']);
    expect([tooLarge.code, tooLarge.stderr]).toEqual([
      2,
      'redis-lock-proxy locks: --count must be an integer from 1 to 10000 (a larger SCAN call holds Redis up for every other client), got "9999999"\n',
    ]);
    expect((await runOp(locks, ['--dry-run'])).code).toBe(2);
    expect((await runOp(locks, ['--release', 'a', '--yes', '--dry-run'])).code).toBe(2);
    expect((await runOp(locks, ['--release-abandoned', '--recheck-ms', '10'])).code).toBe(2);
    expect((await runOp(locks, ['--release-hex', 'zz'])).code).toBe(2);
    expect((await runOp(locks, ['--release', 'a', '--release-abandoned'])).code).toBe(2);
    const help = await runOp(locks, ['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/^Usage: redis-lock-proxy locks/);
  });
});

// ---------------------------------------------------------------------------------------------
// Units: escaping and decoding
// ---------------------------------------------------------------------------------------------

describe('unescapeKey', () => {
  it('is the inverse of describeKey for keys up to 64 bytes, and of escapeKey for any key', () => {
    fc.assert(
      fc.property(fc.uint8Array({ minLength: 0, maxLength: 64 }), (bytes) => {
        const key = Buffer.from(bytes);
        expect(escapeKey(key)).toBe(describeKey(key));
        expect(unescapeKey(describeKey(key)).equals(key)).toBe(true);
      }),
      { numRuns: 2000 },
    );
    fc.assert(
      fc.property(fc.uint8Array({ minLength: 0, maxLength: 300 }), (bytes) => {
        const key = Buffer.from(bytes);
        expect(unescapeKey(escapeKey(key)).equals(key)).toBe(true);
      }),
    );
  });

  it('reads escapes in either case, text as UTF-8, and refuses bad escapes and cut-short keys', () => {
    expect(unescapeKey('\\x17\\xAB\\xcdz')).toEqual(Buffer.from([0x17, 0xab, 0xcd, 0x7a]));
    expect(unescapeKey('lock:café')).toEqual(Buffer.from('lock:café', 'utf8'));
    expect(() => unescapeKey('a\\x1')).toThrow(/invalid escape/);
    expect(() => unescapeKey('a\\n')).toThrow(/invalid escape/);
    expect(() => unescapeKey('\\')).toThrow(/invalid escape/);
    const long = Buffer.alloc(100, 0x41);
    expect(() => unescapeKey(describeKey(long))).toThrow(/cut short/);
    // The same text on a short key is just text.
    expect(unescapeKey('ab...(+36 bytes)').toString()).toBe('ab...(+36 bytes)');
  });
});

describe('describeLockKey', () => {
  const shipped = loadRules([STALWART_RULES]);
  it('decodes Stalwart task and queue lock keys', () => {
    expect(describeLockKey(taskLockKey(1234n), shipped)).toBe('task 1234');
    expect(describeLockKey(taskLockKey(2n ** 64n - 1n), shipped)).toBe('task 18446744073709551615');
    expect(describeLockKey(queueLockKey(42n, 'local'), shipped)).toBe('queue message 42 in queue "local"');
    expect(describeLockKey(queueLockKey(7n, 'remote12'), shipped)).toBe('queue message 7 in queue "remote12"');
    expect(describeLockKey(queueLockKey(7n, ''), shipped)).toBe('queue message 7 in queue ""');
    const odd = Buffer.concat([queueLockKey(9n, '').subarray(0, 9), Buffer.from([0x61, 0x22, 0x0a, 0x00, 0x5c, 0xff, 0, 0])]);
    expect(describeLockKey(odd, shipped)).toBe('queue message 9 in queue "a\\x22\\x0a\\x00\\x5c\\xff"');
  });

  it('describes a key of a rule without describe: by the rule name', () => {
    const rules = loadRules([testRulesFile]);
    expect(describeLockKey(Buffer.from('lock:x'), rules)).toBe('test-lock');
    expect(describeLockKey(Buffer.from('other'), rules)).toBe('no rule names this key');
  });
});

describe('globPatternFor', () => {
  it('escapes the glob characters of a prefix and matches everything after it', () => {
    expect(globPatternFor(Buffer.from('a*b?c[d]e\\f')).toString('latin1')).toBe('a\\*b\\?c\\[d\\]e\\\\f*');
    expect(globPatternFor(Buffer.from([0x17]))).toEqual(Buffer.from([0x17, 0x2a]));
    expect(globPatternFor(Buffer.alloc(0))).toEqual(Buffer.from('*'));
  });
});
