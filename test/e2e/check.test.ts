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

/** The end of check's OK line where no server answers on the upstream (nothing listens there in these tests). */
const UNASKED = ', lock method auto (auto; the upstream did not answer: asked again by each connection)';

describe('redis-lock-proxy check', () => {
  it('says what a start would run with, and exits 0, opening nothing', async () => {
    const exit = await runCli(['check', '--listen', '127.0.0.1:1', '--upstream', 'redis://:s3cret@127.0.0.1:2/1', '--stalwart', '0.15.3']);
    expect(exit).toEqual({
      code: 0,
      signal: null,
      stdout:
        'check: OK: listen 127.0.0.1:1, upstream redis://:***@127.0.0.1:2/1, admin off, mode enforce, ' +
        `13 rule(s) (13 enforce, 0 observe) from 1 file(s) for Stalwart 0.15.0 - 0.15.5${UNASKED}\n`,
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
      `redis-lock-proxy check: ${badRule}, line 3: rule 1 ("hex"): field "prefix_hex": must be a string, got a number (17); quote hex digits so YAML keeps them as text: prefix_hex: "17"`,
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
      /^check: OK: listen 127\.0\.0\.1:6380, .*mode observe, 2 rule\(s\) \(0 enforce, 2 observe\) from 1 file\(s\) for Stalwart 0\.16\.0 - 0\.16\.15, lock method auto \(.*\)\n$/,
    );
    expect(lines(exit.stderr)).toEqual([
      expect.stringMatching(/^redis-lock-proxy check: warning: max-frame-bytes no longer applies/),
      `redis-lock-proxy check: warning: config file ${config}, line 1, setting "mode" does not apply: flag --mode gives the value in force (config file settings come after flags and variables)`,
    ]);
  });

  it('covers every release of a mixed fleet: a second --stalwart adds its rules, it does not replace the first', async () => {
    const config = writeTmp('fleet.yaml', `listen: 127.0.0.1:1\nadmin-listen: "off"\n`);
    const ok = (rules: number, files: number) =>
      `check: OK: listen 127.0.0.1:1, upstream redis://127.0.0.1:6379, admin off, mode enforce, ` +
      `${rules} rule(s) (${rules} enforce, 0 observe) from ${files} file(s) for Stalwart 0.15.0 - 0.15.5, Stalwart 0.16.0 - 0.16.15${UNASKED}\n`;
    // 0.15's 13 rules and 0.16's 2, the queue lock they share once.
    const repeated = await runCli(['check', '--config', config, '--stalwart', '0.15.3', '--stalwart', '0.16.9']);
    expect(repeated).toEqual({ code: 0, signal: null, stdout: ok(14, 2), stderr: '' });
    const listed = await runCli(['check', '--config', config, '--stalwart', '0.15.3,0.16.9,0.16.16']);
    expect([listed.code, listed.stdout, listed.stderr]).toEqual([0, ok(14, 2), '']);

    const fixed = await runCli(['check', '--config', config, '--stalwart', '0.16.16']);
    expect([fixed.code, fixed.stdout]).toEqual([2, '']);
    expect(lines(fixed.stderr)).toEqual([
      'redis-lock-proxy check: stalwart: Stalwart 0.16.16 is not affected: from 0.16.16 on it takes its locks with SET NX EX, ' +
        'whose expiry a failed attempt does not push forward; there are no lock rules to load for it. While nodes of affected ' +
        'releases still run, list every affected release still running (e.g. --stalwart 0.15.3,0.16.9; 0.16.16 may be listed ' +
        'with them), or give no --stalwart at all, which loads the rules of every affected release',
      'redis-lock-proxy check: 1 problem: the proxy would not start with this configuration',
    ]);
    const wrong = await runCli(['check', '--config', config, '--stalwart', '0.15.3,0.15,0.15.3']);
    expect([wrong.code, ...lines(wrong.stderr)]).toEqual([
      2,
      'redis-lock-proxy check: stalwart: "0.15" is not a Stalwart release number: give all three parts, e.g. 0.15.3',
      'redis-lock-proxy check: stalwart: Stalwart 0.15.3 is listed twice: list each release once',
      'redis-lock-proxy check: 2 problems: the proxy would not start with this configuration',
    ]);
  });

  it('names every bad rule of a file, and every problem of one rule, each on a line with its file, line and rule', async () => {
    const three = writeTmp(
      'three/bad.yaml',
      [
        'rules:',
        '  - name: one',
        '    prefix_hex: 17',
        '  - name: two',
        '    prefx: "b:"',
        '    prefix: "b:"',
        '  - name: three',
        '    prefix: "c:"',
        '    mode: Enforce',
        '',
      ].join('\n'),
    );
    const threeBad = await runCli(['check', '--rules', three]);
    expect([threeBad.code, threeBad.stdout, ...lines(threeBad.stderr)]).toEqual([
      2,
      '',
      `redis-lock-proxy check: ${three}, line 3: rule 1 ("one"): field "prefix_hex": must be a string, got a number (17); quote hex digits so YAML keeps them as text: prefix_hex: "17"`,
      `redis-lock-proxy check: ${three}, line 5: rule 2 ("two"): field "prefx": unknown field (allowed: name, prefix, prefix_hex, pattern, key, describe, action, mode)`,
      `redis-lock-proxy check: ${three}, line 9: rule 3 ("three"): field "mode": must be one of: enforce, observe; got "Enforce"`,
      'redis-lock-proxy check: 3 problems: the proxy would not start with this configuration',
    ]);

    const one = writeTmp(
      'one/bad.yaml',
      ['rules:', '  - name: many', '    prefix: "d:"', "    pattern: '^(d'", '    action: expire-always', '    mode: sometimes', ''].join(
        '\n',
      ),
    );
    const oneBad = await runCli(['check', '--rules', one]);
    expect([oneBad.code, ...lines(oneBad.stderr)]).toEqual([
      2,
      `redis-lock-proxy check: ${one}, line 4: rule 1 ("many"): field "pattern": not a valid regular expression: Invalid regular expression: /^(d/: Unterminated group`,
      `redis-lock-proxy check: ${one}, line 5: rule 1 ("many"): field "action": must be one of: expire-on-create; got "expire-always"`,
      `redis-lock-proxy check: ${one}, line 6: rule 1 ("many"): field "mode": must be one of: enforce, observe; got "sometimes"`,
      'redis-lock-proxy check: 3 problems: the proxy would not start with this configuration',
    ]);

    // A start refuses the same rules, with the same list.
    const start = await runCli(['--listen', '127.0.0.1:0', '--admin-listen', 'off', '--rules', one]);
    expect([start.code, start.stdout]).toEqual([2, '']);
    expect(lines(start.stderr)).toEqual(
      lines(oneBad.stderr)
        .slice(0, 3)
        .map((line) => line.replace(/^redis-lock-proxy check: /, 'redis-lock-proxy: ')),
    );
  });

  it('refuses a site rule for the keys of a shipped rule, which could never match, naming both', async () => {
    const site = writeTmp('site/tasks.yaml', 'rules:\n  - name: my-task-lock\n    key: [{hex: "17"}, {u64: id}]\n');
    const exit = await runCli(['check', '--rules', STALWART_RULES, '--rules', site, '--stalwart', '0.15.3,0.16.9']);
    expect([exit.code, ...lines(exit.stderr)]).toEqual([
      2,
      `redis-lock-proxy check: ${site}, line 2: rule 1 ("my-task-lock"): has the same key layout as rule 1 ("stalwart-task-lock") ` +
        `of ${path.join(STALWART_RULES, '0.16.yaml')}, line 23, which is loaded before it: a key goes to the first rule that matches it, ` +
        'so this rule can never match (remove one of the two, or give this one keys of its own)',
      'redis-lock-proxy check: 1 problem: the proxy would not start with this configuration',
    ]);
    // For 0.15 alone the 0.16 task lock is not loaded: the site rule is then the only one for those keys.
    const alone = await runCli(['check', '--rules', STALWART_RULES, '--rules', site, '--stalwart', '0.15.3']);
    expect([alone.code, alone.stderr]).toEqual([0, '']);
    expect(alone.stdout).toMatch(
      / 14 rule\(s\) \(14 enforce, 0 observe\) from 2 file\(s\) for Stalwart 0\.15\.0 - 0\.15\.5, lock method auto \(.*\)\n$/,
    );
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
