/**
 * The operator commands for every Stalwart release line, against a real Redis and the proxy:
 *
 * - `verify --stalwart VERSION` proves the fix on that release's key shapes, fails where the
 *   proxy does not cover the release (or is bypassed), and says plainly when a release has no bug;
 * - `locks` finds and decodes the lock keys of every line, and flags the abandoned ones.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { escapeKey } from '../../src/key-text.js';
import { run as locks } from '../../src/ops/locks.js';
import { run as verify } from '../../src/ops/verify.js';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { closedPort } from '../support/ports.js';
import { attemptCounter } from '../support/stalwart.js';
import { RELEASE_LINES } from '../support/stalwart-releases.js';
import { runOp } from '../support/ops.js';

const env = redisAndProxy();
/** The proxy with Stalwart 0.16's rules only. */
let proxy016: TestProxy;

beforeAll(async () => {
  proxy016 = await startTestProxy({ upstream: env.redis.url, stalwart: '0.16.3' });
});

afterAll(async () => {
  await proxy016?.close();
});

async function dbsize(): Promise<number> {
  return Number(/^:(\d+)/.exec(await env.admin.call('DBSIZE'))?.[1]);
}

describe('verify --stalwart VERSION', () => {
  it.each(RELEASE_LINES)('proves the fix for Stalwart $last on its key shapes, touching nothing for good', async (line) => {
    const migration = Buffer.concat([Buffer.from([0x18]), Buffer.from('migrate_core_lock')]);
    const hasMigration = line.locks.some((kind) => kind.rule === 'stalwart-migration-core-lock');
    if (hasMigration) expect(await env.admin.call('SET', migration, '1', 'EX', '300')).toBe('+OK\r\n');
    const before = await dbsize();
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.proxy.port}`, '--stalwart', line.last, '--admin', 'off']);
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    const range = line.first === line.last ? `Stalwart ${line.first}` : `Stalwart ${line.first} - ${line.last}`;
    const kinds = [...new Set(line.locks.map((kind) => kind.rule))].filter((rule) => rule !== 'stalwart-migration-core-lock');
    expect(result.stdout).toBe(
      `verify: OK: ${kinds.length} rule(s) enforce the fix through 127.0.0.1:${env.proxy.port} for ${range} (${kinds.join(', ')})` +
        (hasMigration ? '; fixed key, not touched: stalwart-migration-core-lock' : '') +
        "; verify's own rules, as it could not ask the proxy for its own: the admin endpoint is off (--admin off, or " +
        'REDIS_LOCK_PROXY_ADMIN_LISTEN=off)\n',
    );
    expect(await dbsize()).toBe(before);
    // The live migration lock is exactly as it was.
    if (hasMigration) expect(await env.admin.call('GET', migration)).toBe('$1\r\n1\r\n');
  });

  it('builds each kind’s real key shape, with values no real lock has', async () => {
    const result = await runOp(verify, ['--via', `127.0.0.1:${env.proxy.port}`, '--stalwart', '0.15.5', '--verbose']);
    expect(result.code).toBe(0);
    // The rest of the line: a random byte can print as a space.
    const keyOf = (rule: string) =>
      /scratch key (.+)$/.exec(result.stdout.split('\n').find((l) => l.includes(`rule ${rule}: scratch key`)) ?? '')?.[1];
    expect(keyOf('stalwart-purge-account')).toMatch(/^\\x14(\\x[89a-f][0-9a-f]|[ -~])([ -~]|\\x[0-9a-f]{2}){3}$/);
    expect(keyOf('stalwart-tls-report-lock')).toMatch(
      /^\\x16\\x00\\x[89a-f][0-9a-f](\\x[0-9a-f]{2}|[ -~]){7}rlp-verify-[0-9a-f]{8}\.invalid$/,
    );
    expect(keyOf('stalwart-migration-account-lock')).toMatch(/^\\x18migrate_\d{10}_lock$/);
    expect(keyOf('stalwart-queue-lock')).toMatch(/^\\x15\\x[89a-f][0-9a-f](\\x[0-9a-f]{2}|[ -~]){7}rlp-/);
    expect(result.stdout).toContain('verify: rule stalwart-migration-core-lock: its only key is a live lock (not touched)\n');
  });

  it('fails directly against Redis, and through a proxy whose rules are for another release', async () => {
    const direct = await runOp(verify, ['--via', `127.0.0.1:${env.redis.port}`, '--stalwart', '0.15.3']);
    expect(direct.code).toBe(1);
    expect(direct.stderr).toMatch(/^verify: FAILED: rule stalwart-purge-account: second attempt re-armed the expiry/);
    const other = await runOp(verify, ['--via', `127.0.0.1:${proxy016.port}`, '--stalwart', '0.13.2']);
    expect(other.code).toBe(1);
    expect(other.stderr).toMatch(/^verify: FAILED: rule stalwart-purge-account: second attempt re-armed the expiry/);
    const same = await runOp(verify, ['--via', `127.0.0.1:${proxy016.port}`, '--stalwart', '0.16.3']);
    expect(same.code).toBe(0);
  });

  it('says plainly when the release does not have the bug, touching nothing, once the address answers', async () => {
    const closed = await closedPort();
    const via = `127.0.0.1:${proxy016.port}`;
    for (const [version, reason] of [
      [
        '0.16.16',
        'Stalwart 0.16.16 is not affected: from 0.16.16 on it takes its locks with SET NX EX, whose expiry a failed attempt does not push forward',
      ],
      [
        'v0.16.18',
        'Stalwart 0.16.18 is not affected: from 0.16.16 on it takes its locks with SET NX EX, whose expiry a failed attempt does not push forward',
      ],
      ['0.8.0', 'Stalwart 0.8.0 is not affected: releases before 0.8.1 take no lock with INCRBY + EXPIRE in Redis'],
    ]) {
      expect(await runOp(verify, ['--via', via, '--stalwart', version])).toEqual({
        code: 0,
        stdout: `verify: OK: ${reason}; nothing to verify (${via} answers)\n`,
        stderr: '',
      });
      expect(await runOp(verify, ['--via', `127.0.0.1:${closed}`, '--stalwart', version])).toMatchObject({ code: 1 });
    }
    // A fleet whose every release is fixed: each is said, nothing is touched.
    expect(await runOp(verify, ['--via', via, '--stalwart', '0.16.16', '--stalwart', '0.16.18'])).toMatchObject({
      code: 0,
      stdout: expect.stringMatching(
        /^verify: OK: Stalwart 0\.16\.16 is not affected: .*; Stalwart 0\.16\.18 is not affected: .*; nothing to verify/,
      ),
    });
    const vague = await runOp(verify, ['--via', `127.0.0.1:${closed}`, '--stalwart', '0.15']);
    expect(vague.code).toBe(2);
    expect(vague.stderr).toMatch(/"0\.15" is not a Stalwart release number/);
  });
});

describe('verify --stalwart for a mixed fleet', () => {
  it('takes the flag repeated as it takes a comma list: the union of the releases’ lock kinds, each proved', async () => {
    const via = ['--via', `127.0.0.1:${env.proxy.port}`, '--admin', 'off'];
    const repeated = await runOp(verify, [...via, '--stalwart', '0.15.5', '--stalwart', '0.16.9']);
    const listed = await runOp(verify, [...via, '--stalwart', '0.15.5,0.16.9']);
    const only016 = await runOp(verify, [...via, '--stalwart', '0.16.9']);
    expect(repeated.stderr).toBe('');
    expect(repeated.code).toBe(0);
    expect(repeated.stdout).toMatch(/for Stalwart 0\.15\.0 - 0\.15\.5, Stalwart 0\.16\.0 - 0\.16\.15 /);
    expect(listed).toEqual(repeated);
    const rules = (out: string): string[] => / for [^(]*\(([^)]*)\)/.exec(out)?.[1].split(', ') ?? [];
    // The 0.16 task lock is there, and so is every 0.15-only kind: nothing dropped by the second flag.
    expect(rules(repeated.stdout)).toEqual(expect.arrayContaining(rules(only016.stdout)));
    expect(rules(repeated.stdout).length).toBeGreaterThan(rules(only016.stdout).length);
  });
});

describe('locks, every release line', () => {
  /** Each line's example key, once (lines share lock kinds). */
  const EXAMPLES = [
    ...new Map(RELEASE_LINES.flatMap((line) => line.locks.map((kind) => [kind.example.key.toString('hex'), kind] as const))).values(),
  ];

  const take = (key: Buffer, seconds: number): Promise<number> => attemptCounter(env.proxy.port, key, seconds);

  it('finds and decodes the lock keys of every line, and flags the abandoned one, not the contended one', async () => {
    for (const kind of EXAMPLES) expect(await take(kind.example.key, kind.expiry)).toBe(1);
    const tried = EXAMPLES.find((kind) => kind.rule === 'stalwart-migration-core-lock');
    expect(await take(tried!.example.key, tried!.expiry)).toBe(2); // a waiter tried while it was held: normal
    const lost = EXAMPLES.find((kind) => kind.rule === 'stalwart-purge-account');
    expect(await env.admin.call('PERSIST', lost!.example.key)).toBe(':1\r\n'); // it lost its expiry: abandoned
    const result = await runOp(locks, ['--upstream', env.redis.url, '--json', '--recheck-ms', '50']);
    expect(result.code).toBe(0);
    const rows = result.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as { key: string; rule: string; what: string; flags: string[] });
    expect(rows).toHaveLength(EXAMPLES.length);
    for (const kind of EXAMPLES) {
      const row = rows.find((r) => r.key === escapeKey(kind.example.key));
      expect(row, kind.purpose).toMatchObject({ rule: kind.rule, what: kind.example.what });
      expect(row?.flags).toEqual(kind === lost ? ['abandoned: no expiry, never expires'] : []);
    }
  });

  it('--stalwart narrows it to one release’s lock kinds', async () => {
    for (const kind of EXAMPLES) expect(await take(kind.example.key, kind.expiry)).toBe(1);
    const result = await runOp(locks, ['--upstream', env.redis.url, '--json', '--stalwart', '0.16.9', '--recheck-ms', '0']);
    expect(result.code).toBe(0);
    const whats = result.stdout
      .trim()
      .split('\n')
      .map((line) => (JSON.parse(line) as { what: string }).what)
      .sort();
    expect(whats).toEqual(['queue message 42 in queue "local"', 'task 1234']);
    const keys = async (...stalwart: string[]): Promise<string[]> => {
      const out = await runOp(locks, ['--upstream', env.redis.url, '--json', '--recheck-ms', '0', ...stalwart]);
      expect(out.code).toBe(0);
      return out.stdout
        .trim()
        .split('\n')
        .map((line) => (JSON.parse(line) as { key: string }).key)
        .sort();
    };
    // A mixed fleet: the flag repeated is the comma list, the union of both releases' lock keys.
    const fleet = await keys('--stalwart', '0.15.5', '--stalwart', '0.16.9');
    expect(fleet).toEqual(await keys('--stalwart', '0.15.5,0.16.9'));
    expect(fleet).toEqual([...new Set([...(await keys('--stalwart', '0.15.5')), ...(await keys('--stalwart', '0.16.9'))])].sort());
    const fixed = await runOp(locks, ['--upstream', env.redis.url, '--stalwart', '0.16.16']);
    expect(fixed.code).toBe(2);
    expect(fixed.stderr).toMatch(/Stalwart 0\.16\.16 is not affected/);
  });
});
