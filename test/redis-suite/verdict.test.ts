import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { exclusionFor, readExclusions, type Exclusion } from './excluded.js';
import { parseRuntestOutput, stripColours, type UnitRun } from './runtest.js';
import { confirmed, unitVerdict } from './verdict.js';

// As Redis 7.0.15's test server prints them (colours and all).
const OUTPUT_7_0 = [
  'Testing unit/multi',
  '[\x1b[0;32;49mok\x1b[0m]: MULTI / EXEC basics (1 ms)',
  '[\x1b[0;33;49mskip\x1b[0m]: MULTI with config set appendonly',
  '[\x1b[0;36;49mignore\x1b[0m]: Not supported on external server',
  '[\x1b[0;31;49merr\x1b[0m]: EXEC fail on WATCHed key modified in tests/unit/multi.tcl',
  "Expected 'OK' to equal '' (context: type eval line 5 cmd {assert_equal {} [r exec]} proc ::test)",
  '[\x1b[0;32;49mok\x1b[0m]: Check encoding - listpack (0 ms)',
  '[\x1b[0;32;49mok\x1b[0m]: Check encoding - listpack (3 ms)',
  '[\x1b[0;32;49mok\x1b[0m]: Flush in the middle of a pipe in tests/other (2 ms)',
  '[1/1 \x1b[0;33;49mdone\x1b[0m]: unit/multi (5 seconds)',
  '!!! WARNING The following tests failed:',
  '*** [err]: EXEC fail on WATCHed key modified in tests/unit/multi.tcl',
].join('\n');

function run(unit: string, results: UnitRun['results'], aborted?: string): UnitRun {
  return { unit, results, aborted, seconds: 1, output: '' };
}

describe("reading the suite's output", () => {
  it('takes one result per test line: ok with its time cut, err with its details, skip and ignore left out', () => {
    const { results, aborted } = parseRuntestOutput(stripColours(OUTPUT_7_0));
    expect(aborted).toBeUndefined();
    expect(results).toEqual([
      { name: 'MULTI / EXEC basics', outcome: 'ok' },
      {
        name: 'EXEC fail on WATCHed key modified',
        outcome: 'err',
        detail: "Expected 'OK' to equal '' (context: type eval line 5 cmd {assert_equal {} [r exec]} proc ::test)",
      },
      { name: 'Check encoding - listpack', outcome: 'ok' },
      { name: 'Check encoding - listpack', outcome: 'ok' },
      { name: 'Flush in the middle of a pipe in tests/other', outcome: 'ok' },
    ]);
  });

  it("reads 6.0's lines, which give no time", () => {
    expect(parseRuntestOutput('[ok]: INCR against non existing key\n[err]: A test in tests/unit/type/incr.tcl\n').results).toEqual([
      { name: 'INCR against non existing key', outcome: 'ok' },
      { name: 'A test', outcome: 'err', detail: '' },
    ]);
  });

  it('says why a unit stopped early: an exception, a timeout', () => {
    const text = '[ok]: first (1 ms)\n[exception]: Executing test client: couldn\'t execute "src/redis-cli"\nmore\n';
    expect(parseRuntestOutput(text)).toEqual({
      results: [{ name: 'first', outcome: 'ok' }],
      aborted: '[exception]: Executing test client: couldn\'t execute "src/redis-cli"',
    });
    expect(parseRuntestOutput('[TIMEOUT]: clients state report follows.\n').aborted).toBe('[TIMEOUT]: clients state report follows.');
  });
});

describe('the verdict on a unit', () => {
  const ok = (name: string) => ({ name, outcome: 'ok' as const });
  const err = (name: string) => ({ name, outcome: 'err' as const, detail: `${name} broke` });

  it('blames the proxy only for a test that passed directly', () => {
    const verdict = unitVerdict('7.0.15', run('unit/x', [ok('a'), err('b'), err('c')]), run('unit/x', [ok('a'), ok('b'), err('c')]), []);
    expect(verdict.passed).toBe(1);
    expect(verdict.failed).toEqual([{ test: 'b', detail: 'b broke' }]);
    expect(verdict.failedDirectlyToo).toEqual([{ test: 'c', detail: 'c broke' }]);
  });

  it('counts a test that ran directly but never through the proxy (the unit stopped early) as failed', () => {
    const verdict = unitVerdict('7.0.15', run('unit/x', [ok('a')], '[exception]: boom'), run('unit/x', [ok('a'), ok('b')]), []);
    expect(verdict.failed.map((f) => f.test)).toEqual(['b']);
    expect(verdict.aborted).toBe('[exception]: boom');
  });

  it('counts a name run twice twice, and one missing run of it as failed', () => {
    const verdict = unitVerdict('7.0.15', run('unit/x', [ok('a')]), run('unit/x', [ok('a'), ok('a')]), []);
    expect(verdict.passed).toBe(1);
    expect(verdict.failed.map((f) => f.test)).toEqual(['a']);
  });

  it('fails a unit that stopped early through the proxy only, even with no test named', () => {
    const verdict = unitVerdict('7.0.15', run('unit/x', [], '[exception]: boom'), run('unit/x', []), []);
    expect(verdict.failed).toEqual([{ test: '(the unit) [exception]: boom' }]);
  });

  it('does not blame the proxy for a unit that stopped before any test directly too', () => {
    const verdict = unitVerdict('6.0.16', run('unit/x', [], 'key "client" not known'), run('unit/x', [], 'key "client" not known'), []);
    expect(verdict.failed).toEqual([]);
    expect(verdict.failedDirectlyToo).toEqual([{ test: '(the whole unit) key "client" not known' }]);
  });

  it('without a baseline, counts every failure through the proxy', () => {
    const verdict = unitVerdict('7.0.15', run('unit/x', [err('b')]), undefined, []);
    expect(verdict.failed.map((f) => f.test)).toEqual(['b']);
  });

  it('keeps an excluded failure out of the count, and reports an excluded test that passed', () => {
    const excluded: Exclusion[] = [
      { unit: 'unit/x', test: 'b', reason: 'a race any hop exposes' },
      { unit: 'unit/x', test: 'a', reason: 'a race any hop exposes' },
    ];
    const verdict = unitVerdict('7.0.15', run('unit/x', [ok('a'), err('b')]), run('unit/x', [ok('a'), ok('b')]), excluded);
    expect(verdict.failed).toEqual([]);
    expect(verdict.excludedFailing.map((f) => f.test)).toEqual(['b']);
    expect(verdict.excludedPassing).toEqual(['a']);
  });
});

describe('a failure through the proxy, run again', () => {
  const ok = (name: string) => ({ name, outcome: 'ok' as const });
  const err = (name: string) => ({ name, outcome: 'err' as const, detail: `${name} broke` });
  const direct = run('unit/x', [ok('a'), ok('b'), ok('c')]);

  it('counts a test that fails both times, and reports one that fails once as flaky', () => {
    const first = unitVerdict('7.0.15', run('unit/x', [err('a'), err('b'), ok('c')]), direct, []);
    const again = unitVerdict('7.0.15', run('unit/x', [err('a'), ok('b'), err('c')]), direct, []);
    const verdict = confirmed(first, again);
    expect(verdict.failed.map((f) => f.test)).toEqual(['a']);
    expect(verdict.flaky.map((f) => f.test)).toEqual(['b', 'c']);
    expect(verdict.passed).toBe(1);
  });
});

describe('the excluded list', () => {
  it('applies an entry to the server lines it names, by version prefix', () => {
    const list: Exclusion[] = [{ servers: ['6.0'], unit: 'unit/x', test: 't', reason: 'r' }];
    expect(exclusionFor(list, '6.0.16', 'unit/x', 't')).toBe(list[0]);
    expect(exclusionFor(list, '6.0', 'unit/x', 't')).toBe(list[0]);
    expect(exclusionFor(list, '6.2.14', 'unit/x', 't')).toBeUndefined();
    expect(exclusionFor(list, '60.0.1', 'unit/x', 't')).toBeUndefined();
    expect(exclusionFor(list, '6.0.16', 'unit/y', 't')).toBeUndefined();
  });

  it('checked in: every entry has a unit, a test and a reason', () => {
    for (const entry of readExclusions()) {
      expect(entry.unit).toMatch(/^(unit|integration)\//);
      expect(entry.reason.length).toBeGreaterThan(20);
    }
  });

  it('refuses an entry without a reason, naming it', () => {
    const file = path.join(mkdtempSync(path.join(os.tmpdir(), 'excluded-')), 'excluded.yaml');
    writeFileSync(file, 'excluded:\n  - unit: unit/multi\n    test: MULTI basics\n');
    expect(() => readExclusions(file)).toThrow(`${file}: excluded[0]: "reason" must be a non-empty text`);
  });
});
