/**
 * Lock keys whose names someone else chose (a report lock holds the domain of a report's
 * recipient), printed by `locks` against a real Redis:
 *
 * - every human column is printable ASCII: C1 controls (CSI, U+009B), bidirectional overrides
 *   (U+202E) and every other byte that is not printable ASCII come out as \xNN, and --json is
 *   ASCII (\uXXXX) yet gives back the same text;
 * - the KEY column is a shell word: pasted after `--release` into a real shell (bash, dash),
 *   it deletes exactly that key and runs nothing, whatever the key holds (`'`, `$`, `;`, `!`,
 *   backquotes). `--release-hex` takes --json's key_hex, which needs no quoting at all.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { keyArgument } from '../../src/key-text.js';
import { run as locks } from '../../src/ops/locks.js';
import { CLI, cleanEnv, ensureBuilt } from '../support/cli.js';
import { runOp } from '../support/ops.js';
import { STALWART_RULES } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { attemptCounter } from '../support/stalwart.js';

const env = redisAndProxy();

/** A TLS report lock of Stalwart 0.11-0.15: 0x16 00, the due time (u64 BE), the domain's bytes. */
function reportLockKey(domain: string): Buffer {
  const due = Buffer.alloc(8);
  due.writeBigUInt64BE(1_800_000_000n);
  return Buffer.concat([Buffer.from([0x16, 0x00]), due, Buffer.from(domain, 'utf8')]);
}

const HOSTILE = {
  /** CSI (U+009B) then "2J": on a terminal that takes C1 controls, clears the screen. */
  csi: 'a\u009b2J.example',
  /** A right-to-left override: what follows would be shown reversed. */
  bidi: 'moc.elpmaxe\u202e.example',
  /** Single quotes, $, ; and IFS: pasted into '...' as printed before, it ran `touch`. */
  shell: "x';touch${IFS}PWNED;'.example",
  /** More of what shells act on: backquotes, $(...), !, double quotes, backslashes. */
  more: 'y`touch${IFS}PWNED2`$(touch${IFS}PWNED3)!"\\\\.example',
};

const KEYS = Object.fromEntries(Object.entries(HOSTILE).map(([name, domain]) => [name, reportLockKey(domain)])) as Record<
  keyof typeof HOSTILE,
  Buffer
>;

let workDir: string;

beforeAll(async () => {
  await ensureBuilt();
  workDir = mkdtempSync(path.join(os.tmpdir(), 'rlp-hostile-'));
});

afterAll(() => {
  if (workDir) rmSync(workDir, { recursive: true, force: true });
});

async function takeAll(): Promise<void> {
  for (const key of Object.values(KEYS)) expect(await attemptCounter(env.proxy.port, key, 600)).toBe(1);
}

describe('locks output with hostile names', () => {
  it('prints every column as printable ASCII, escaping C1 controls and bidirectional overrides', async () => {
    await takeAll();
    const result = await runOp(locks, ['--upstream', env.redis.url, '--rules', STALWART_RULES, '--recheck-ms', '0']);
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/^[\x20-\x7e\n]*$/);
    expect(result.stdout).toContain('TLS report for a\\xc2\\x9b2J.example due 2027-01-15T08:00:00Z');
    expect(result.stdout).toContain('TLS report for moc.elpmaxe\\xe2\\x80\\xae.example due');
    expect(result.stdout).toContain("TLS report for x';touch${IFS}PWNED;'.example due");

    const json = await runOp(locks, ['--upstream', env.redis.url, '--rules', STALWART_RULES, '--recheck-ms', '0', '--json']);
    expect(json.stdout).toMatch(/^[\x20-\x7e\n]*$/);
    const whats = json.stdout
      .trim()
      .split('\n')
      .map((line) => (JSON.parse(line) as { what: string }).what);
    for (const domain of Object.values(HOSTILE)) expect(whats.some((what) => what.startsWith(`TLS report for ${domain} due`))).toBe(true);
  });

  it('prints keys that a shell passes on unchanged: pasted after --release, they delete exactly that key and run nothing', async () => {
    await takeAll();
    const listed = await runOp(locks, ['--upstream', env.redis.url, '--rules', STALWART_RULES, '--recheck-ms', '0']);
    const printed = (key: Buffer) => {
      const line = listed.stdout.split('\n').find((l) => l.startsWith(`${keyArgument(key)} `));
      expect(line, keyArgument(key)).toBeDefined();
      return (line as string).split('  ')[0];
    };
    for (const [shell, name] of [
      ['bash', 'shell'],
      ['dash', 'more'],
      ['bash', 'csi'],
    ] as const) {
      const key = KEYS[name];
      const command = `"${process.execPath}" "${CLI}" locks --upstream ${env.redis.url} --rules "${STALWART_RULES}" --release ${printed(key)} --release-live --yes`;
      const { stdout } = await promisify(execFile)(shell, ['-c', command], { cwd: workDir, env: cleanEnv() });
      expect(stdout, `${shell}: ${command}`).toContain(`deleted ${keyArgument(key)}`);
      expect(await env.admin.call('EXISTS', key), name).toBe(':0\r\n');
    }
    for (const file of ['PWNED', 'PWNED2', 'PWNED3']) expect(existsSync(path.join(workDir, file)), file).toBe(false);
    expect(await env.admin.call('EXISTS', KEYS.bidi)).toBe(':1\r\n');
  });

  it('--release-hex takes key_hex from --json, which no shell interprets', async () => {
    await takeAll();
    const json = await runOp(locks, ['--upstream', env.redis.url, '--rules', STALWART_RULES, '--recheck-ms', '0', '--json']);
    const hex = json.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as { key_hex: string })
      .find((row) => row.key_hex === KEYS.bidi.toString('hex'))?.key_hex;
    expect(hex).toMatch(/^[0-9a-f]+$/);
    const command = `"${process.execPath}" "${CLI}" locks --upstream ${env.redis.url} --rules "${STALWART_RULES}" --release-hex ${hex} --release-live --yes`;
    const { stdout } = await promisify(execFile)('dash', ['-c', command], { cwd: workDir, env: cleanEnv() });
    expect(stdout).toMatch(/^[\x20-\x7e\n]*$/);
    expect(await env.admin.call('EXISTS', KEYS.bidi)).toBe(':0\r\n');
  });
});
