/**
 * The rule file loader (src/rules/loader.ts): reading files and directories,
 * parsing a rule file and matching keys with it, and the error each mistake
 * in a rule file gets (naming the file, the line, the rule and the field), with the
 * shipped rules/stalwart/0.16.yaml read byte by byte as a worked example.
 * (Every shipped file against every release line's keys: stalwart-rules.test.ts.)
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { fileURLToPath } from 'node:url';
import { problemsOf, RuleFileError } from '../src/errors.js';
import { createRuleSet, loadRules, parseRuleFile, ruleMatches, ruleProblems } from '../src/rules/loader.js';
import { RuleStore } from '../src/rules/store.js';
import type { RuleSet } from '../src/rules/types.js';
import { Stats } from '../src/stats.js';

const STALWART_016 = fileURLToPath(new URL('../rules/stalwart/0.16.yaml', import.meta.url));

/** A key: prefix byte followed by the given bytes. */
function key(...bytes: number[]): Buffer {
  return Buffer.from(bytes);
}

/** `prefix` followed by `length` copies of `fill`. */
function keyOf(prefix: number, length: number, fill = 0x41): Buffer {
  return Buffer.concat([Buffer.from([prefix]), Buffer.alloc(length, fill)]);
}

/** Builds a rule file from rule entries written as YAML list items. */
function file(...rules: string[]): string {
  return `rules:\n${rules.join('')}`;
}

/** Runs `fn`, expecting a RuleFileError, and returns it for property checks. */
function catchRuleError(fn: () => unknown): RuleFileError {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(RuleFileError);
    return error as RuleFileError;
  }
  throw new Error('expected a RuleFileError, but nothing was thrown');
}

/** Asserts message and properties of the error from parsing `text` as `x.yaml`. */
function expectParseError(text: string, message: RegExp, where: { rule: number | undefined; field: string | undefined }): RuleFileError {
  expect(() => parseRuleFile(text, 'rules/x.yaml')).toThrowError(message);
  const error = catchRuleError(() => parseRuleFile(text, 'rules/x.yaml'));
  expect(error.code).toBe('ERULEFILE');
  expect(error.file).toBe('rules/x.yaml');
  expect(error.rule).toBe(where.rule);
  expect(error.field).toBe(where.field);
  expect(error.message.startsWith(error.line === undefined ? 'rules/x.yaml: ' : `rules/x.yaml, line ${error.line}: `)).toBe(true);
  return error;
}

/** The problems parsing `text` as `x.yaml` finds, one message each (several throw together). */
function parseProblems(text: string): string[] {
  try {
    parseRuleFile(text, 'rules/x.yaml');
  } catch (error) {
    expect(error).toBeInstanceOf(Error);
    return problemsOf(error as Error).map((problem) => problem.message);
  }
  throw new Error('expected problems, but the file parsed');
}

function makeTempDir(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'rules-test-'));
}

describe('rules/stalwart/0.16.yaml, byte by byte', () => {
  let set: RuleSet;
  beforeAll(() => {
    set = loadRules([STALWART_016]);
  });

  it('has the two lock rules, both enforcing', () => {
    expect(set.files).toEqual([STALWART_016]);
    expect(set.rules.map((r) => [r.name, r.prefix.toString('hex'), r.mode, r.action])).toEqual([
      ['stalwart-task-lock', '17', 'enforce', 'expire-on-create'],
      ['stalwart-queue-lock', '15', 'enforce', 'expire-on-create'],
    ]);
    expect(set.rules[0].source).toBe(`${STALWART_016}#1`);
    expect(set.rules[1].source).toBe(`${STALWART_016}#2`);
  });

  it('matches a 9-byte task lock key (0x17 + u64 BE)', () => {
    const taskKey = Buffer.alloc(9);
    taskKey[0] = 0x17;
    taskKey.writeBigUInt64BE(123456789n, 1);
    expect(set.match(taskKey)?.name).toBe('stalwart-task-lock');
  });

  it('matches a 17-byte queue lock key (0x15 + u64 BE id + 8-byte name)', () => {
    const queueKey = Buffer.alloc(17);
    queueKey[0] = 0x15;
    queueKey.writeBigUInt64BE(0xfedcba9876543210n, 1);
    queueKey.write('local\0\0\0', 9, 'latin1');
    expect(set.match(queueKey)?.name).toBe('stalwart-queue-lock');
  });

  it('matches keys whose bytes are \\r, \\n, \\0 or 0xff', () => {
    for (const byte of [0x0d, 0x0a, 0x00, 0xff]) {
      expect(set.match(keyOf(0x17, 8, byte))?.name).toBe('stalwart-task-lock');
      expect(set.match(keyOf(0x15, 16, byte))?.name).toBe('stalwart-queue-lock');
    }
    // A newline as the very last byte must not let `$` match early or late.
    expect(set.match(key(0x17, 1, 2, 3, 4, 5, 6, 7, 0x0a))?.name).toBe('stalwart-task-lock');
    expect(set.match(key(0x17, 0x0d, 0x0a, 0, 0xff, 0x0d, 0x0a, 0, 0xff))?.name).toBe('stalwart-task-lock');
  });

  it('leaves rate-limit (0x02..0x0a) and blob quota (0x0b) keys alone', () => {
    for (let prefix = 0x02; prefix <= 0x0b; prefix++) {
      for (const length of [8, 16, 20, 40]) {
        expect(set.match(keyOf(prefix, length))).toBeUndefined();
      }
    }
  });

  it('does not match lock prefixes with the wrong length', () => {
    for (const length of [0, 7, 9, 16]) {
      expect(set.match(keyOf(0x17, length))).toBeUndefined();
    }
    for (const length of [0, 8, 15, 17]) {
      expect(set.match(keyOf(0x15, length))).toBeUndefined();
    }
    // One trailing newline is still one byte too many.
    expect(set.match(Buffer.concat([keyOf(0x17, 8), key(0x0a)]))).toBeUndefined();
  });

  it('does not match text keys or an empty key', () => {
    for (const text of ['lock:task:1', 'queue:12345678', '17', '\\x17abcdefgh', '']) {
      expect(set.match(Buffer.from(text))).toBeUndefined();
    }
  });
});

describe('loadRules', () => {
  let dir: string;
  beforeAll(() => {
    dir = makeTempDir();
  });
  afterAll(() => {
    fs.rmSync(dir, { recursive: true, force: true });
  });

  function writeFile(relative: string, text: string): string {
    const full = path.join(dir, relative);
    fs.mkdirSync(path.dirname(full), { recursive: true });
    fs.writeFileSync(full, text);
    return full;
  }

  it('reads a directory’s *.yaml and *.yml files in sorted order, skipping others', () => {
    const rulesDir = path.join(dir, 'many');
    writeFile('many/20-b.yml', file('  - name: b\n    prefix: "b:"\n'));
    writeFile('many/10-a.yaml', file('  - name: a\n    prefix: "a:"\n'));
    writeFile('many/30-c.yaml', file('  - name: c\n    prefix: "c:"\n'));
    writeFile('many/notes.txt', 'not a rule file');
    writeFile('many/.hidden.yaml', 'not: [valid');
    writeFile('many/sub/40-d.yaml', file('  - name: d\n    prefix: "d:"\n'));

    const set = loadRules([rulesDir]);
    expect(set.files).toEqual(['10-a.yaml', '20-b.yml', '30-c.yaml'].map((name) => path.join(rulesDir, name)));
    expect(set.rules.map((r) => r.name)).toEqual(['a', 'b', 'c']);
    expect(set.rules[1].source).toBe(`${path.join(rulesDir, '20-b.yml')}#1`);
  });

  it('combines files and directories in the order given', () => {
    const single = writeFile('single.yaml', file('  - name: z\n    prefix: "z:"\n'));
    const set = loadRules([single, STALWART_016]);
    expect(set.rules.map((r) => r.name)).toEqual(['z', 'stalwart-task-lock', 'stalwart-queue-lock']);
    expect(set.files).toEqual([single, STALWART_016]);
  });

  it('parses a file read again unchanged only once, and a changed one anew', () => {
    const once = writeFile('once.yaml', file('  - name: once\n    prefix: "once:"\n'));
    const first = loadRules([once]).rules[0];
    expect(loadRules([once]).rules[0]).toBe(first);
    writeFile('once.yaml', file('  - name: once\n    prefix: "twice:"\n'));
    expect(loadRules([once]).rules[0].prefix.toString()).toBe('twice:');
    writeFile('once.yaml', 'rules: [');
    expect(() => loadRules([once])).toThrowError(/invalid YAML/);
    expect(() => loadRules([once])).toThrowError(/invalid YAML/); // a broken file is never taken from before
  });

  it('refuses a path that does not exist', () => {
    const missing = path.join(dir, 'nope.yaml');
    expect(() => loadRules([missing])).toThrowError(/nope\.yaml: does not exist/);
    const error = catchRuleError(() => loadRules([missing]));
    expect(error.code).toBe('ERULEFILE');
    expect(error.file).toBe(missing);
    expect(error.rule).toBeUndefined();
    expect(error.field).toBeUndefined();
  });

  it('refuses a directory without rule files', () => {
    const empty = path.join(dir, 'empty');
    fs.mkdirSync(empty);
    writeFile('empty/readme.txt', 'nothing here');
    expect(() => loadRules([empty])).toThrowError(/empty: directory contains no rule files/);
    expect(catchRuleError(() => loadRules([empty])).file).toBe(empty);
  });

  it('refuses a rule file that cannot be read (dangling symlink)', () => {
    const broken = path.join(dir, 'broken');
    fs.mkdirSync(broken);
    fs.symlinkSync(path.join(dir, 'missing-target.yaml'), path.join(broken, 'link.yaml'));
    expect(() => loadRules([broken])).toThrowError(/broken[/\\]link\.yaml: does not exist/);
    expect(catchRuleError(() => loadRules([broken])).file).toBe(path.join(broken, 'link.yaml'));
  });

  it('refuses a rule file that cannot be read (a directory named like one)', () => {
    const odd = path.join(dir, 'odd');
    fs.mkdirSync(path.join(odd, 'sub.yaml'), { recursive: true });
    expect(() => loadRules([odd])).toThrowError(/odd[/\\]sub\.yaml: cannot read: is a directory/);
  });

  it('names the file in validation errors and refuses duplicate names across files', () => {
    const first = writeFile('dup/a.yaml', file('  - name: same\n    prefix: "a:"\n'));
    const second = writeFile('dup/b.yaml', file('  - name: other\n    prefix: "o:"\n', '  - name: same\n    prefix: "b:"\n'));
    const pattern = new RegExp(
      `b\\.yaml, line 4: rule 2 \\("same"\\): field "name": duplicate name "same" with a different definition: ` +
        `already used by .*a\\.yaml rule 1`,
    );
    expect(() => loadRules([path.dirname(first)])).toThrowError(pattern);
    const error = catchRuleError(() => loadRules([path.dirname(first)]));
    expect([error.file, error.line, error.rule, error.field]).toEqual([second, 4, 2, 'name']);
  });

  it('finds every problem of every file and every rule, and refuses to load with all of them', () => {
    const bad = writeFile(
      'all/10-bad.yaml',
      file(
        '  - name: one\n    prefix_hex: 17\n',
        '  - name: two\n    prefix: "b:"\n    mode: Enforce\n',
        '  - name: three\n    prefix: "c:"\n    pattern: \'^(c\'\n    action: expire-always\n    describ: "a typo"\n',
        '  - name: good\n    prefix: "g:"\n',
      ),
    );
    const worse = writeFile('all/20-worse.yaml', 'rules: [\n');
    const clash = writeFile('all/30-clash.yaml', file('  - name: good\n    prefix: "other:"\n'));
    const problems = ruleProblems([path.dirname(bad), path.join(dir, 'all-missing')]).map((problem) => problem.message);
    expect(problems).toEqual([
      `${path.join(dir, 'all-missing')}: does not exist (a path of the rules setting: --rules, REDIS_LOCK_PROXY_RULES or rules in the config file)`,
      `${bad}, line 3: rule 1 ("one"): field "prefix_hex": must be a string, got a number (17); quote hex digits so YAML keeps them as text: prefix_hex: "17"`,
      `${bad}, line 6: rule 2 ("two"): field "mode": must be one of: enforce, observe; got "Enforce"`,
      `${bad}, line 11: rule 3 ("three"): field "describ": unknown field (allowed: name, prefix, prefix_hex, pattern, key, describe, action, mode)`,
      `${bad}, line 9: rule 3 ("three"): field "pattern": not a valid regular expression: Invalid regular expression: /^(c/: Unterminated group`,
      `${bad}, line 10: rule 3 ("three"): field "action": must be one of: expire-on-create; got "expire-always"`,
      expect.stringMatching(new RegExp(`^${escapeRegExp(worse)}: invalid YAML`)),
      // What only the files together show, among the rules that are right.
      `${clash}, line 2: rule 1 ("good"): field "name": duplicate name "good" with a different definition: already used by ${bad} rule 4`,
    ]);
    // A start (or a reload) refuses the same rules with the same list.
    try {
      loadRules([path.dirname(bad), path.join(dir, 'all-missing')]);
      expect.unreachable('loadRules accepted rules with problems');
    } catch (error) {
      expect(problemsOf(error as Error).map((problem) => problem.message)).toEqual(problems);
    }
  });

  it('refuses a rule for the same keys as a rule loaded before it, naming both, whichever file it is in', () => {
    const site = writeFile(
      'layouts/site.yaml',
      file(
        '  - name: site-task-lock\n    key:\n      - hex: "17"\n      - u64: id\n    describe: "task {id}"\n',
        '  - name: site-a\n    prefix: "a:"\n    pattern: \'^a:[0-9]+$\'\n',
        // The same bytes written another way, and the same layout with other field names: the same keys.
        '  - name: site-a-again\n    prefix_hex: "61 3a"\n    pattern: \'^a:[0-9]+$\'\n    mode: observe\n',
        '  - name: site-migrate\n    key: [{hex: "18 6d"}, {text: "igrate_"}, {decimal: n}, {text: "_lock"}]\n',
      ),
    );
    const problems = ruleProblems([STALWART_016, site]).map((problem) => problem.message);
    const neverMatches = 'which is loaded before it: a key goes to the first rule that matches it, so this rule can never match';
    expect(problems).toEqual([
      expect.stringContaining(
        `${site}, line 2: rule 1 ("site-task-lock"): has the same key layout as rule 1 ("stalwart-task-lock") of ${STALWART_016}, line 23, ${neverMatches}`,
      ),
      expect.stringContaining(
        `${site}, line 10: rule 3 ("site-a-again"): has the same prefix and pattern as rule 2 ("site-a") of ${site}, line 7, ${neverMatches}`,
      ),
    ]);
    // The first in load order wins, so it is the later one that is named, shipped or not.
    expect(ruleProblems([site, STALWART_016]).map((problem) => problem.message)[1]).toContain(
      `${STALWART_016}, line 23: rule 1 ("stalwart-task-lock"): has the same key layout as rule 1 ("site-task-lock") of ${site}, line 2, ${neverMatches}`,
    );
    // The migration lock's layout, its literal bytes split differently, is the shipped rule's keys too.
    const migrate = ruleProblems([fileURLToPath(new URL('../rules/stalwart/0.15.yaml', import.meta.url)), site]).map((p) => p.message);
    expect(migrate.filter((message) => message.includes('"site-migrate"'))).toEqual([
      expect.stringContaining('rule 4 ("site-migrate"): has the same key layout as rule 13 ("stalwart-migration-account-lock")'),
    ]);
    expect(() => loadRules([STALWART_016, site])).toThrowError(/has the same key layout/);
  });

  it('refuses a reload with every problem in its log line, and keeps the rules in force', () => {
    const rules = writeFile('reload/rules.yaml', file('  - name: app-lock\n    prefix: "lock:"\n'));
    const lines: Array<Record<string, unknown>> = [];
    const sink = new Writable({
      write(chunk: Buffer, _encoding, done) {
        for (const line of chunk.toString('utf8').split('\n')) if (line !== '') lines.push(JSON.parse(line));
        done();
      },
    });
    const store = new RuleStore({ paths: [rules], release: undefined, mode: 'enforce' }, pino({ level: 'info' }, sink), new Stats());
    fs.writeFileSync(rules, file('  - name: app-lock\n    prefix: "lock:"\n    mode: Enforce\n', '  - name: other\n    prefx: "o:"\n'));
    expect(store.reload('test')).toBe(false);
    expect(store.current.rules.map((rule) => rule.name)).toEqual(['app-lock']);
    const refused = lines.find((line) => line.msg === 'rule reload refused; the previous rules stay in force');
    expect(String(refused?.err).split('\n')).toEqual([
      `${rules}, line 4: rule 1 ("app-lock"): field "mode": must be one of: enforce, observe; got "Enforce"`,
      `${rules}, line 6: rule 2 ("other"): field "prefx": unknown field (allowed: name, prefix, prefix_hex, pattern, key, describe, action, mode)`,
      `${rules}, line 5: rule 2 ("other"): field "prefix": is required: give "key", or exactly one of "prefix" or "prefix_hex"`,
    ]);
  });
});

describe('parseRuleFile and matching', () => {
  it('uses a text prefix as UTF-8 bytes', () => {
    const rules = parseRuleFile(file('  - name: app\n    prefix: "lock:é"\n'), 'x.yaml').rules;
    expect(rules[0].prefix).toEqual(Buffer.from('lock:é', 'utf8'));
    const set = createRuleSet(rules, ['x.yaml']);
    expect(set.match(Buffer.from('lock:é/42'))?.name).toBe('app');
    expect(set.match(Buffer.from('lock:e/42'))).toBeUndefined();
    expect(set.match(Buffer.from('lock:'))).toBeUndefined();
  });

  it('accepts spaces between hex bytes and either case', () => {
    const rules = parseRuleFile(file('  - name: h\n    prefix_hex: "DE ad  0f"\n'), 'x.yaml').rules;
    expect(rules[0].prefix).toEqual(key(0xde, 0xad, 0x0f));
  });

  it('defaults action and mode, and reads observe mode', () => {
    const rules = parseRuleFile(
      file(
        '  - name: default\n    prefix: "d:"\n',
        '  - name: watched\n    prefix: "w:"\n    mode: observe\n    action: expire-on-create\n',
      ),
      'x.yaml',
    ).rules;
    expect(rules.map((r) => [r.name, r.action, r.mode])).toEqual([
      ['default', 'expire-on-create', 'enforce'],
      ['watched', 'expire-on-create', 'observe'],
    ]);
    expect(createRuleSet(rules, ['x.yaml']).match(Buffer.from('w:1'))?.mode).toBe('observe');
  });

  it('returns the first matching rule in load order', () => {
    const rules = parseRuleFile(
      file(
        '  - name: narrow\n    prefix: "lock:"\n    pattern: \'^lock:[0-9]+$\'\n',
        '  - name: broad\n    prefix: "lock:"\n',
        '  - name: never-first\n    prefix: "lock:1"\n',
      ),
      'x.yaml',
    ).rules;
    const set = createRuleSet(rules, ['x.yaml']);
    expect(set.match(Buffer.from('lock:123'))?.name).toBe('narrow');
    expect(set.match(Buffer.from('lock:1a'))?.name).toBe('broad');
    expect(set.match(Buffer.from('other'))).toBeUndefined();
  });

  it("matches as a walk over every rule in order would, whatever the key's first byte (an empty prefix goes with every byte)", () => {
    const rules = parseRuleFile(
      file(
        '  - name: x-exact\n    prefix: "x"\n    pattern: \'^x[0-9]$\'\n',
        '  - name: any-ends-9\n    prefix: ""\n    pattern: \'^.*9$\'\n',
        '  - name: x-any\n    prefix: "x"\n',
        '  - name: bin\n    prefix_hex: "17"\n',
        '  - name: empty-key\n    prefix: ""\n    pattern: \'^$\'\n',
      ),
      'x.yaml',
    ).rules;
    const set = createRuleSet(rules, ['x.yaml']);
    const walked = (k: Buffer) => set.rules.find((rule) => ruleMatches(rule, k))?.name;
    const keys = ['x1', 'x19', 'xa', 'x', 'y9', 'y', '', '9', '\x17', '\x179', '\xff9'].map((k) => Buffer.from(k, 'latin1'));
    for (let byte = 0; byte < 256; byte++) keys.push(Buffer.from([byte]), Buffer.from([byte, 0x39]));
    for (const k of keys) expect(set.match(k)?.name, k.toString('hex')).toBe(walked(k));
    expect(set.match(Buffer.from('x19'))?.name).toBe('any-ends-9');
    expect(set.match(Buffer.from(''))?.name).toBe('empty-key');
  });

  it('allows an empty prefix when a pattern narrows it', () => {
    const rules = parseRuleFile(file('  - name: p\n    prefix: ""\n    pattern: \'^x$\'\n'), 'x.yaml').rules;
    const set = createRuleSet(rules, ['x.yaml']);
    expect(set.match(Buffer.from('x'))?.name).toBe('p');
    expect(set.match(Buffer.from('xx'))).toBeUndefined();
  });

  it('returns frozen rule lists', () => {
    const set = createRuleSet(parseRuleFile(file('  - name: f\n    prefix: "f"\n'), 'x.yaml').rules, ['x.yaml']);
    expect(Object.isFrozen(set.rules)).toBe(true);
    expect(Object.isFrozen(set.files)).toBe(true);
    expect(Object.isFrozen(set.rules[0])).toBe(true);
  });
});

describe('rule file errors', () => {
  const ok = '  - name: ok-rule\n    prefix: "ok:"\n';

  it('reports YAML syntax errors with line and column', () => {
    expectParseError('rules: [\n  - name: x\n', /^rules\/x\.yaml: invalid YAML \(first of 2 problems\): .*at line 2, column 3/, {
      rule: undefined,
      field: undefined,
    });
  });

  it('reports duplicate keys in a mapping', () => {
    expectParseError(
      file('  - name: d\n    prefix_hex: "17"\n    prefix_hex: "15"\n'),
      /rules\/x\.yaml: invalid YAML: Map keys must be unique at line 4, column 5/,
      { rule: undefined, field: undefined },
    );
  });

  it('reports YAML warnings such as unknown tags', () => {
    expectParseError(file('  - name: t\n    prefix: !hex "17"\n'), /rules\/x\.yaml: invalid YAML: .*!hex/, {
      rule: undefined,
      field: undefined,
    });
  });

  it('refuses an empty file', () => {
    expectParseError('# nothing\n', /rules\/x\.yaml: top level must be a mapping .*"rules", got nothing/, {
      rule: undefined,
      field: undefined,
    });
  });

  it('refuses a top level that is not a mapping', () => {
    expectParseError('- name: x\n', /rules\/x\.yaml: top level must be a mapping .*got a list/, {
      rule: undefined,
      field: undefined,
    });
  });

  it('refuses extra top-level keys', () => {
    expectParseError(
      `${file(ok)}rule:\n  - name: y\n`,
      /rules\/x\.yaml, line \d+: field "rule": unknown top-level key: the file may contain only "rules:" and "releases:"/,
      { rule: undefined, field: 'rule' },
    );
  });

  it('reads releases: as one range or a list, and refuses what is not a range', () => {
    const one = parseRuleFile(`releases: Stalwart 0.15.0 - 0.15.5\n${file(ok)}`, 'rules/x.yaml');
    expect(one.releases).toEqual([{ product: 'Stalwart', first: [0, 15, 0], last: [0, 15, 5] }]);
    const list = parseRuleFile(`releases: [App 1.0.0 - 1.2.3, App 2.0.0]\n${file(ok)}`, 'rules/x.yaml');
    expect(list.releases).toEqual([
      { product: 'App', first: [1, 0, 0], last: [1, 2, 3] },
      { product: 'App', first: [2, 0, 0], last: [2, 0, 0] },
    ]);
    for (const [text, message] of [
      ['Stalwart 0.15', /field "releases": versions must be MAJOR\.MINOR\.PATCH/],
      ['0.15.0 - 0.15.5', /field "releases": must read "PRODUCT FIRST - LAST"/],
      ['Stalwart 0.15.5 - 0.15.0', /field "releases": the first release comes after the last/],
      ['[1]', /field "releases": must be text such as "Stalwart 0\.15\.0 - 0\.15\.5", got a number/],
    ] as const) {
      expectParseError(`releases: ${text}\n${file(ok)}`, message, { rule: undefined, field: 'releases' });
    }
  });

  it('refuses a missing, empty or non-list rules key', () => {
    expect(parseProblems('other: 1\n')).toEqual([
      'rules/x.yaml, line 1: field "other": unknown top-level key: the file may contain only "rules:" and "releases:"',
      'rules/x.yaml, line 1: field "rules": must be a non-empty list of rules, got nothing',
    ]);
    expectParseError('rules: []\n', /rules\/x\.yaml, line \d+: field "rules": must be a non-empty list of rules, got a list/, {
      rule: undefined,
      field: 'rules',
    });
    expectParseError('rules:\n', /rules\/x\.yaml, line \d+: field "rules": must be a non-empty list of rules, got nothing/, {
      rule: undefined,
      field: 'rules',
    });
    expectParseError('rules:\n  name: x\n', /field "rules": must be a non-empty list of rules, got a mapping/, {
      rule: undefined,
      field: 'rules',
    });
  });

  it('refuses a rule that is not a mapping', () => {
    expectParseError(file(ok, '  - just-a-name\n'), /rules\/x\.yaml, line \d+: rule 2: must be a mapping .*got the text "just-a-name"/, {
      rule: 2,
      field: undefined,
    });
  });

  it('refuses unknown fields, naming them', () => {
    expectParseError(
      file(ok, '  - name: typo\n    prefix: "a:"\n    prefx: "a:"\n'),
      /rules\/x\.yaml, line 6: rule 2 \("typo"\): field "prefx": unknown field \(allowed: name, prefix, prefix_hex, pattern, key, describe, action, mode\)/,
      { rule: 2, field: 'prefx' },
    );
    // The misspelt field is not read: the one meant is missing too.
    expect(parseProblems(file(ok, '  - name: typo\n    prefx: "a:"\n'))).toEqual([
      'rules/x.yaml, line 5: rule 2 ("typo"): field "prefx": unknown field (allowed: name, prefix, prefix_hex, pattern, key, describe, action, mode)',
      'rules/x.yaml, line 4: rule 2 ("typo"): field "prefix": is required: give "key", or exactly one of "prefix" or "prefix_hex"',
    ]);
  });

  it('refuses a missing name', () => {
    expectParseError(file(ok, '  - prefix: "a:"\n'), /rules\/x\.yaml, line \d+: rule 2: field "name": is required/, {
      rule: 2,
      field: 'name',
    });
  });

  it('refuses an empty name', () => {
    expectParseError(file('  - name: ""\n    prefix: "a:"\n'), /rules\/x\.yaml, line \d+: rule 1: field "name": is empty/, {
      rule: 1,
      field: 'name',
    });
  });

  it('refuses a name with bad characters', () => {
    expectParseError(
      file('  - name: "my lock"\n    prefix: "a:"\n'),
      /rules\/x\.yaml, line \d+: rule 1: field "name": may only contain letters, digits, "_", "\." and "-", got "my lock"/,
      { rule: 1, field: 'name' },
    );
  });

  it('refuses a name that is not a string', () => {
    expectParseError(
      file('  - name: 123\n    prefix: "a:"\n'),
      /rules\/x\.yaml, line \d+: rule 1: field "name": must be a string, got a number \(123\); quote the value/,
      { rule: 1, field: 'name' },
    );
  });

  it('refuses duplicate names in one file, saying where the first was', () => {
    expectParseError(
      file(ok, '  - name: ok-rule\n    prefix: "other:"\n'),
      /rules\/x\.yaml, line \d+: rule 2 \("ok-rule"\): field "name": duplicate name "ok-rule": already used by rules\/x\.yaml rule 1/,
      { rule: 2, field: 'name' },
    );
  });

  it('refuses a name that two files define differently, naming both places', () => {
    const a = parseRuleFile(file(ok), 'rules/a.yaml').rules;
    const b = parseRuleFile(file('  - name: ok-rule\n    prefix: "other:"\n'), 'rules/b.yaml').rules;
    expect(() => createRuleSet([...a, ...b], ['rules/a.yaml', 'rules/b.yaml'])).toThrowError(
      /^rules\/b\.yaml, line 2: rule 1 \("ok-rule"\): field "name": duplicate name "ok-rule" with a different definition: already used by rules\/a\.yaml rule 1$/,
    );
    const error = catchRuleError(() => createRuleSet([...a, ...b], []));
    expect([error.code, error.file, error.rule, error.field]).toEqual(['ERULEFILE', 'rules/b.yaml', 1, 'name']);
  });

  it('loads a rule that several files repeat word for word once, at its first place', () => {
    const a = parseRuleFile(file(ok, '  - name: a-only\n    prefix: "a:"\n'), 'rules/a.yaml').rules;
    const b = parseRuleFile(file('  - name: b-only\n    prefix: "b:"\n', ok), 'rules/b.yaml').rules;
    const set = createRuleSet([...a, ...b], ['rules/a.yaml', 'rules/b.yaml']);
    expect(set.rules.map((rule) => [rule.name, rule.source])).toEqual([
      ['ok-rule', 'rules/a.yaml#1'],
      ['a-only', 'rules/a.yaml#2'],
      ['b-only', 'rules/b.yaml#1'],
    ]);
    // A different mode is a different definition.
    const observed = parseRuleFile(file(ok.replace('\n', '\n    mode: observe\n')), 'rules/c.yaml').rules;
    expect(() => createRuleSet([...a, ...observed], [])).toThrowError(/with a different definition/);
  });

  it('refuses both prefix and prefix_hex', () => {
    expectParseError(
      file('  - name: both\n    prefix: "a:"\n    prefix_hex: "61"\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("both"\): field "prefix_hex": cannot be combined with "prefix": give exactly one of them/,
      { rule: 1, field: 'prefix_hex' },
    );
  });

  it('refuses neither prefix nor prefix_hex', () => {
    expectParseError(
      file("  - name: neither\n    pattern: '^a'\n"),
      /rules\/x\.yaml, line \d+: rule 1 \("neither"\): field "prefix": is required: give "key", or exactly one of "prefix" or "prefix_hex"/,
      { rule: 1, field: 'prefix' },
    );
  });

  it('refuses an empty prefix without a pattern', () => {
    expectParseError(
      file('  - name: all\n    prefix: ""\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("all"\): field "prefix": is empty and there is no pattern: the rule would match every key/,
      { rule: 1, field: 'prefix' },
    );
    expectParseError(
      file('  - name: all-hex\n    prefix_hex: " "\n'),
      /rule 1 \("all-hex"\): field "prefix_hex": is empty and there is no pattern/,
      { rule: 1, field: 'prefix_hex' },
    );
  });

  it('refuses prefix_hex that is not hex', () => {
    expectParseError(
      file(ok, '  - name: queue-lock\n    prefix_hex: "zz"\n'),
      /^rules\/x\.yaml, line \d+: rule 2 \("queue-lock"\): field "prefix_hex": not valid hex: "zz"$/,
      { rule: 2, field: 'prefix_hex' },
    );
    expectParseError(
      file('  - name: hex0x\n    prefix_hex: "0x17"\n'),
      /field "prefix_hex": not valid hex: "0x17" \(write the bytes without "0x", e\.g\. "17"\)/,
      { rule: 1, field: 'prefix_hex' },
    );
  });

  it('refuses prefix_hex with an odd number of digits', () => {
    expectParseError(
      file('  - name: odd\n    prefix_hex: "abc"\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("odd"\): field "prefix_hex": odd number of hex digits in "abc"/,
      { rule: 1, field: 'prefix_hex' },
    );
    expectParseError(
      file('  - name: split\n    prefix_hex: "d ead"\n'),
      /field "prefix_hex": odd number of hex digits in "d ead".*spaces may only go between bytes/,
      { rule: 1, field: 'prefix_hex' },
    );
  });

  it('refuses unquoted hex that YAML reads as a number, showing it as written', () => {
    expectParseError(
      file('  - name: num\n    prefix_hex: 0x17\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("num"\): field "prefix_hex": must be a string, got a number \(0x17\); quote hex digits so YAML keeps them as text: prefix_hex: "17"$/,
      { rule: 1, field: 'prefix_hex' },
    );
    expectParseError(
      file('  - name: num\n    prefix_hex: 17\n'),
      /field "prefix_hex": must be a string, got a number \(17\); quote hex digits .*prefix_hex: "17"/,
      { rule: 1, field: 'prefix_hex' },
    );
  });

  it('refuses a text prefix that is not a string', () => {
    expectParseError(
      file('  - name: num\n    prefix: 23\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("num"\): field "prefix": must be a string, got a number \(23\); quote the value so YAML keeps it as text: prefix: "23"/,
      { rule: 1, field: 'prefix' },
    );
    expectParseError(file('  - name: list\n    prefix: [a, b]\n'), /rule 1 \("list"\): field "prefix": must be a string, got a list$/, {
      rule: 1,
      field: 'prefix',
    });
    expectParseError(file('  - name: nothing\n    prefix:\n'), /rule 1 \("nothing"\): field "prefix": must be a string, got nothing$/, {
      rule: 1,
      field: 'prefix',
    });
  });

  it('refuses a pattern that is not a string', () => {
    expectParseError(
      file('  - name: pat\n    prefix: "a"\n    pattern: true\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("pat"\): field "pattern": must be a string, got a boolean \(true\)/,
      { rule: 1, field: 'pattern' },
    );
  });

  it('refuses an invalid regex, including the JS error', () => {
    expectParseError(
      file('  - name: pat\n    prefix: "a"\n    pattern: \'^(a\'\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("pat"\): field "pattern": not a valid regular expression: Invalid regular expression: \/\^\(a\/: Unterminated group/,
      { rule: 1, field: 'pattern' },
    );
  });

  it('refuses an empty pattern', () => {
    expectParseError(
      file('  - name: pat\n    prefix: ""\n    pattern: ""\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("pat"\): field "pattern": is empty/,
      { rule: 1, field: 'pattern' },
    );
  });

  it('refuses an unknown action, listing the allowed ones', () => {
    expectParseError(
      file('  - name: act\n    prefix: "a"\n    action: expire-always\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("act"\): field "action": must be one of: expire-on-create; got "expire-always"/,
      { rule: 1, field: 'action' },
    );
  });

  it('refuses an unknown mode, listing the allowed ones', () => {
    expectParseError(
      file('  - name: m\n    prefix: "a"\n    mode: Enforce\n'),
      /rules\/x\.yaml, line \d+: rule 1 \("m"\): field "mode": must be one of: enforce, observe; got "Enforce"/,
      { rule: 1, field: 'mode' },
    );
  });

  it('names the rule only by number when its name is invalid', () => {
    expect(parseProblems(file('  - name: "bad name"\n    prefix_hex: "zz"\n'))).toEqual([
      'rules/x.yaml, line 2: rule 1: field "name": may only contain letters, digits, "_", "." and "-", got "bad name"',
      'rules/x.yaml, line 3: rule 1: field "prefix_hex": not valid hex: "zz"',
    ]);
    expect(parseProblems(file('  - name: 7\n    prefx: "a"\n'))).toEqual([
      'rules/x.yaml, line 3: rule 1: field "prefx": unknown field (allowed: name, prefix, prefix_hex, pattern, key, describe, action, mode)',
      'rules/x.yaml, line 2: rule 1: field "name": must be a string, got a number (7); quote the value so YAML keeps it as text: name: "7"',
      'rules/x.yaml, line 2: rule 1: field "prefix": is required: give "key", or exactly one of "prefix" or "prefix_hex"',
    ]);
  });
});

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
