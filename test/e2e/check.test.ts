/**
 * `redis-lock-proxy check`, the built command as an operator runs it: everything a start would
 * use, checked without starting (flags, variables, config file, rule files), exit 0 or 2 with
 * every problem named; and `--print-config`, which fails where check does. (The systemd unit
 * runs it before a start and a reload: install-from-tarball.test.ts.)
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureBuilt, runCli } from '../support/cli.js';
import { STALWART_RULES } from '../support/proxy.js';

let tmp: string;

beforeAll(async () => {
  await ensureBuilt();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-check-'));
}, 120_000);

afterAll(() => {
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

function writeTmp(name: string, text: string): string {
  const file = path.join(tmp, name);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, text);
  return file;
}

/** The lines of a text, without the last newline. */
const lines = (text: string) => text.replace(/\n$/, '').split('\n');

describe('redis-lock-proxy check', () => {
  it('says what a start would run with, and exits 0, opening nothing', async () => {
    const exit = await runCli(['check', '--listen', '127.0.0.1:1', '--upstream', 'redis://:s3cret@127.0.0.1:2/1', '--stalwart', '0.15.3']);
    expect(exit).toEqual({
      code: 0,
      signal: null,
      stdout:
        'check: OK: listen 127.0.0.1:1, upstream redis://:***@127.0.0.1:2/1, admin off, mode enforce, ' +
        '13 rule(s) (13 enforce, 0 observe) from 1 file(s) for Stalwart 0.15.0 - 0.15.5\n',
      stderr: '',
    });
  });

  it('names the file and the line of a YAML error in a rule file, and exits 2; --print-config fails the same way', async () => {
    const rules = writeTmp('yaml/site.yaml', 'rules:\n  - name: site-lock\n    prefix: "lock:"\n   mode: observe\n');
    const exit = await runCli(['check', '--rules', rules]);
    expect([exit.code, exit.stdout]).toEqual([2, '']);
    const [problem, total] = [lines(exit.stderr)[0], lines(exit.stderr).at(-1)];
    expect(problem.startsWith(`redis-lock-proxy check: ${rules}: invalid YAML`)).toBe(true);
    expect(problem).toMatch(/at line 4, column \d+/);
    expect(total).toBe('redis-lock-proxy check: 1 problem: the proxy would not start with this configuration');

    // Before, --print-config printed these rules and exited 0; a start then refused them.
    const printed = await runCli(['--print-config', '--rules', rules]);
    expect([printed.code, printed.stdout]).toEqual([2, '']);
    expect(printed.stderr.startsWith(`redis-lock-proxy: ${rules}: invalid YAML`)).toBe(true);
    expect(printed.stderr).toMatch(/at line 4, column \d+/);
  });

  it("names every problem at once: a variable, the config file's keys with their lines, each rule file", async () => {
    const badYaml = writeTmp('many/10-broken.yaml', 'rules: [\n');
    const badRule = writeTmp('many/20-bad-rule.yaml', 'rules:\n  - name: hex\n    prefix_hex: 17\n');
    writeTmp('many/30-good.yaml', 'rules:\n  - name: good\n    prefix: "good:"\n');
    const config = writeTmp('many.yaml', `# proxy\nrules:\n  - ${path.dirname(badYaml)}\nhold-ms: ten\nlisne: 127.0.0.1:1\n`);
    const exit = await runCli(['check', '--config', config], { REDIS_LOCK_PROXY_MODEE: 'observe' });
    expect(exit.code).toBe(2);
    // One line each (YAML's quote of the line at fault indented under its problem).
    expect(lines(exit.stderr).filter((line) => !line.startsWith('    '))).toEqual([
      'redis-lock-proxy check: REDIS_LOCK_PROXY_MODEE is not a variable of redis-lock-proxy (did you mean REDIS_LOCK_PROXY_MODE?)',
      `redis-lock-proxy check: config file ${config}, line 5, setting "lisne": unknown setting (did you mean listen? settings are named like the flags)`,
      `redis-lock-proxy check: config file ${config}, line 4, setting "hold-ms": hold-ms must be an integer from 1 to 60000, got "ten"`,
      expect.stringMatching(new RegExp(`^redis-lock-proxy check: ${escapeRegExp(badYaml)}: invalid YAML.* at line \\d+, column \\d+`)),
      `redis-lock-proxy check: ${badRule}: rule 1 ("hex"): field "prefix_hex": must be a string, got a number (17); quote hex digits so YAML keeps them as text: prefix_hex: "17"`,
      'redis-lock-proxy check: 5 problems: the proxy would not start with this configuration',
    ]);
  });

  it('checks the same flags, variables and config file as a start, and says what a start would warn about', async () => {
    const config = writeTmp('observe.yaml', `mode: enforce\nrules: [${STALWART_RULES}]\nstalwart: 0.16.9\n`);
    const exit = await runCli(['check', '--mode', 'observe'], {
      REDIS_LOCK_PROXY_CONFIG: config,
      REDIS_LOCK_PROXY_MAX_FRAME_BYTES: '1000',
    });
    expect(exit.code).toBe(0);
    expect(exit.stdout).toMatch(
      /^check: OK: listen 127\.0\.0\.1:6380, .*mode observe, 2 rule\(s\) \(0 enforce, 2 observe\) from 1 file\(s\) for Stalwart 0\.16\.0 - 0\.16\.15\n$/,
    );
    expect(lines(exit.stderr)).toEqual([
      expect.stringMatching(/^redis-lock-proxy check: warning: max-frame-bytes no longer applies/),
      `redis-lock-proxy check: warning: config file ${config}, line 1, setting "mode" does not apply: flag --mode gives the value in force (config file settings come after flags and variables)`,
    ]);
  });

  it('refuses what is not a setting, and explains itself', async () => {
    const version = await runCli(['check', '--version']);
    expect([version.code, lines(version.stderr)[0]]).toEqual([
      2,
      "redis-lock-proxy check: check takes the proxy's settings; --version is not one (see check --help)",
    ]);
    const typo = await runCli(['check', '--upsteam', 'redis://h']);
    expect([typo.code, lines(typo.stderr)[0]]).toEqual([
      2,
      'redis-lock-proxy check: unknown flag --upsteam (did you mean --upstream?) (see --help)',
    ]);
    const help = await runCli(['check', '--help']);
    expect([help.code, help.stdout]).toEqual([0, expect.stringMatching(/^Usage: redis-lock-proxy check/)]);
  });
});

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
