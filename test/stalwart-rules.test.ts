/**
 * The shipped rules (rules/stalwart/, one file per release line) against every affected line's
 * exact keys, built independently in support/stalwart-releases.ts:
 *
 * - each line's file matches each of that line's lock kinds, with the rule meant for it;
 * - the directory (the default) matches every lock kind of every line;
 * - no rule matches a windowed counter of any line: the default is safe for every line at once;
 * - `--stalwart VERSION` picks the file of that release, and says which releases are not affected.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { chooseRules } from '../src/config.js';
import { describeLockKey } from '../src/lock-keys/read.js';
import { createRuleSet, loadRules, parseRuleFile } from '../src/rules/loader.js';
import { formatRange } from '../src/rules/releases.js';
import { shippedStalwartFiles, STALWART_RULES_DIR, stalwartRelease } from '../src/rules/stalwart.js';
import { releasesText } from '../src/rules/store.js';
import { ALL_WINDOWED, leb128, RELEASE_LINES } from './support/stalwart-releases.js';

const ALL = loadRules([STALWART_RULES_DIR]);
const fileOf = (name: string) => path.join(STALWART_RULES_DIR, name);
/** Runs per property; the windowed ones more, as they are the safety claim. */
const LOCK_RUNS = 300;
const WINDOWED_RUNS = 3000;

describe('the shipped rule files', () => {
  it('are one file per release line, each naming its releases, together 0.8.1 to 0.16.15 with no overlap', () => {
    expect(
      shippedStalwartFiles()
        .map((file) => path.basename(file))
        .sort(),
    ).toEqual(RELEASE_LINES.map((line) => line.file).sort());
    for (const line of RELEASE_LINES) {
      const { releases } = loadRules([fileOf(line.file)]);
      expect(releases.map(formatRange), line.file).toEqual([
        line.first === line.last ? `Stalwart ${line.first}` : `Stalwart ${line.first} - ${line.last}`,
      ]);
    }
    expect(releasesText(ALL)).toBe(
      'Stalwart 0.8.1 - 0.10.7, Stalwart 0.11.0 - 0.11.8, Stalwart 0.12.0 - 0.12.4, Stalwart 0.12.5, ' +
        'Stalwart 0.13.0 - 0.14.1, Stalwart 0.15.0 - 0.15.5, Stalwart 0.16.0 - 0.16.15',
    );
  });

  it('load together as one rule per lock kind: a kind several lines share is one rule', () => {
    const names = ALL.rules.map((rule) => rule.name);
    expect(new Set(names).size).toBe(names.length);
    const kinds = new Set(RELEASE_LINES.flatMap((line) => line.locks.map((kind) => kind.rule)));
    expect([...kinds].sort()).toEqual([...names].sort());
    expect(ALL.rules.every((rule) => rule.mode === 'enforce' && rule.key !== undefined && rule.describe !== undefined)).toBe(true);
  });
});

describe.each(RELEASE_LINES)('Stalwart $first - $last ($file)', (line) => {
  const own = loadRules([fileOf(line.file)]);

  it.each(line.locks)('matches every $purpose lock key with $rule, alone and in the default', (kind) => {
    fc.assert(
      fc.property(kind.keys, (key) => {
        expect(own.match(key)?.name).toBe(kind.rule);
        expect(ALL.match(key)).toBeDefined();
      }),
      { numRuns: LOCK_RUNS },
    );
    expect(ALL.match(kind.example.key)?.name).toBe(kind.rule);
    expect(describeLockKey(kind.example.key, own)).toBe(kind.example.what);
  });

  it('has a rule for each lock kind of the line and for nothing else', () => {
    expect(own.rules.map((rule) => rule.name).sort()).toEqual([...new Set(line.locks.map((kind) => kind.rule))].sort());
  });

  it.each(line.windowed)('leaves every $purpose counter alone', (kind) => {
    fc.assert(
      fc.property(kind.attempts, ({ key }) => {
        expect(own.match(key)).toBeUndefined();
      }),
      { numRuns: LOCK_RUNS },
    );
  });
});

describe('safety of the default for every line at once', () => {
  it.each(ALL_WINDOWED.map(({ line, kind }) => ({ line: `${line.first} - ${line.last}`, purpose: kind.purpose, kind })))(
    'no rule of any line matches a $purpose counter of Stalwart $line',
    ({ kind }) => {
      fc.assert(
        fc.property(kind.attempts, ({ key }) => {
          const rule = ALL.match(key);
          expect(rule, rule === undefined ? '' : `${rule.name} matched ${key.toString('hex')}`).toBeUndefined();
        }),
        { numRuns: WINDOWED_RUNS },
      );
    },
  );

  it('would catch a report rule that let any bytes follow its prefix (the generators reach the risky keys)', () => {
    const careless = createRuleSet(
      parseRuleFile('rules:\n  - name: careless\n    key: [{hex: "16 00"}, {u64: due}, {bytes: rest, length: 30}]\n', 'careless.yaml')
        .rules,
      [],
    );
    const throttles = RELEASE_LINES[0].windowed.find((kind) => kind.purpose.startsWith('SMTP throttle'));
    expect(throttles).toBeDefined();
    expect(() =>
      fc.assert(
        fc.property(throttles!.attempts, ({ key }) => careless.match(key) === undefined),
        { numRuns: WINDOWED_RUNS },
      ),
    ).toThrow(/Property failed/);
  });

  it('describes a key that two lines read differently with both readings', () => {
    // A 0.16 task id whose first byte is 01, and whose other 7 bytes read as two LEB128 numbers.
    const key = Buffer.concat([Buffer.from([0x17, 0x01]), leb128(2 ** 21), leb128(2 ** 14)]);
    const task = key.readBigUInt64BE(1);
    expect(describeLockKey(key, ALL)).toBe(`Bayes training task (account ${2 ** 21}, document ${2 ** 14}) or task ${task}`);
    expect(describeLockKey(key, loadRules([STALWART_RULES_DIR], { product: 'Stalwart', version: [0, 16, 3] }))).toBe(`task ${task}`);
  });
});

describe('--stalwart VERSION', () => {
  it('loads the file of the line the release is in', () => {
    for (const line of RELEASE_LINES) {
      for (const version of [line.first, line.last, `v${line.last}`]) {
        const choice = chooseRules({ stalwart: version });
        const set = loadRules(choice.paths, choice.release);
        expect(set.files, version).toEqual([fileOf(line.file)]);
      }
    }
  });

  it('keeps rule files that name no release (an operator’s own) beside the release’s file', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'rlp-own-rules-'));
    try {
      const own = path.join(dir, 'app.yaml');
      writeFileSync(own, 'rules:\n  - name: app-lock\n    prefix: "lock:"\n');
      const choice = chooseRules({ rules: [STALWART_RULES_DIR, own], stalwart: '0.15.2' });
      const set = loadRules(choice.paths, choice.release);
      expect(set.files).toEqual([fileOf('0.15.yaml'), own]);
      expect(set.rules.at(-1)?.name).toBe('app-lock');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('says plainly which releases are not affected, and refuses what is not a release', () => {
    expect(stalwartRelease('0.16.16')).toMatchObject({
      kind: 'not-affected',
      reason: expect.stringMatching(/^Stalwart 0\.16\.16 is not affected: from 0\.16\.16 on it takes its locks with SET NX EX/),
    });
    expect(stalwartRelease('0.17.0').kind).toBe('not-affected');
    expect(stalwartRelease('0.8.0')).toMatchObject({ kind: 'not-affected', reason: expect.stringMatching(/before 0\.8\.1/) });
    expect(stalwartRelease('0.5.3').kind).toBe('not-affected');
    expect(stalwartRelease('0.16.15')).toEqual({ kind: 'affected', version: [0, 16, 15] });
    expect(stalwartRelease('0.8.1')).toEqual({ kind: 'affected', version: [0, 8, 1] });
    expect(stalwartRelease('0.16').kind).toBe('invalid');
    expect(stalwartRelease('latest').kind).toBe('invalid');
    expect(() => chooseRules({ stalwart: '0.16.16' })).toThrow(/^stalwart: Stalwart 0\.16\.16 is not affected.*no lock rules to load/);
    expect(() => chooseRules({ stalwart: '0.16' })).toThrow(/give all three parts/);
    // Inside the affected span but in no line: no file is for it, and the error lists what the files are for.
    const gap = chooseRules({ stalwart: '0.10.9' });
    expect(() => loadRules(gap.paths, gap.release)).toThrow(
      /no rule file here is for Stalwart 0\.10\.9 \(the files are for Stalwart 0\.11\.0 - 0\.11\.8, .*Stalwart 0\.8\.1 - 0\.10\.7\)/,
    );
  });
});
