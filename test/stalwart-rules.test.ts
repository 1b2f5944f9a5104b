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
import { createRuleSet, loadRules, parseRuleFile, ruleMatches } from '../src/rules/loader.js';
import { formatRange } from '../src/rules/releases.js';
import { shippedStalwartFiles, STALWART_RULES_DIR, stalwartFleet, stalwartRelease } from '../src/rules/stalwart.js';
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

describe('matching the shipped rules', () => {
  it('gives each key the rule a walk over every rule in order gives it', () => {
    fc.assert(
      fc.property(fc.constantFrom(...ALL.rules), fc.uint8Array({ maxLength: 24 }), fc.boolean(), (rule, tail, withPrefix) => {
        const key = Buffer.concat([withPrefix ? rule.prefix : Buffer.alloc(0), tail]);
        expect(ALL.match(key)?.name).toBe(ALL.rules.find((r) => ruleMatches(r, key))?.name);
      }),
      { numRuns: LOCK_RUNS * 10 },
    );
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
    expect(describeLockKey(key, loadRules([STALWART_RULES_DIR], { product: 'Stalwart', versions: [[0, 16, 3]] }))).toBe(`task ${task}`);
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

describe('--stalwart with several releases (a fleet in a rolling upgrade)', () => {
  const rulesFor = (...versions: string[]) => {
    const choice = chooseRules({ stalwart: versions });
    return loadRules(choice.paths, choice.release);
  };
  const names = (set: { rules: readonly { name: string }[] }) => set.rules.map((rule) => rule.name);

  it('loads the union of the releases’ rules, each rule once, and names every release covered', () => {
    const only015 = rulesFor('0.15.3');
    const only016 = rulesFor('0.16.9');
    const both = rulesFor('0.15.3', '0.16.9');
    expect(both.files).toEqual([fileOf('0.15.yaml'), fileOf('0.16.yaml')]);
    expect(releasesText(both)).toBe('Stalwart 0.15.0 - 0.15.5, Stalwart 0.16.0 - 0.16.15');
    // The queue lock is one lock in both lines: one rule.
    expect(names(both)).toEqual([...new Set([...names(only015), ...names(only016)])]);
    expect(names(both).filter((name) => name === 'stalwart-queue-lock')).toHaveLength(1);
    for (const name of ['stalwart-index-task-0.15', 'stalwart-housekeeper-data', 'stalwart-migration-core-lock', 'stalwart-task-lock']) {
      expect(names(both)).toContain(name);
    }
    // Every key of either line is protected by the rule its own line has.
    for (const line of RELEASE_LINES.filter((one) => ['0.15.yaml', '0.16.yaml'].includes(one.file))) {
      for (const kind of line.locks) expect(both.match(kind.example.key)?.name, kind.purpose).toBe(kind.rule);
    }
    // A comma-separated value and a repeated flag say the same.
    expect(names(rulesFor('0.16.9,0.15.3'))).toEqual(names(rulesFor('0.16.9', '0.15.3')));
  });

  it('lists every affected line to get every shipped rule, as the default does', () => {
    const every = rulesFor(...RELEASE_LINES.map((line) => line.last));
    expect(names(every).sort()).toEqual(names(ALL).sort());
    expect(releasesText(every)).toBe(releasesText(ALL));
  });

  it('takes a release without the bug beside affected ones, adding no rule; alone it is refused, saying what to give', () => {
    expect(names(rulesFor('0.15.3', '0.16.9', '0.16.16'))).toEqual(names(rulesFor('0.15.3', '0.16.9')));
    expect(names(rulesFor('0.8.0', '0.9.4'))).toEqual(['stalwart-purge-account-text']);
    expect(thrownMessage(() => chooseRules({ stalwart: '0.16.16' }))).toBe(
      'stalwart: Stalwart 0.16.16 is not affected: from 0.16.16 on it takes its locks with SET NX EX, whose expiry a failed ' +
        'attempt does not push forward; there are no lock rules to load for it. While nodes of affected releases still run, ' +
        'list every affected release still running (e.g. --stalwart 0.15.3,0.16.9; 0.16.16 may be listed with them), ' +
        'or give no --stalwart at all, which loads the rules of every affected release',
    );
    expect(stalwartFleet(['0.16.16', '0.7.0']).problems).toEqual([
      expect.stringMatching(
        /^Stalwart 0\.16\.16 is not affected: .*; Stalwart 0\.7\.0 is not affected: .*no lock rules to load for them\. /,
      ),
    ]);
  });

  it('refuses a release listed twice and one that is not a release, naming each', () => {
    expect(stalwartFleet(['0.15.3', 'v0.15.3', '0.16', '0.16.9', 'latest'])).toEqual({
      versions: [
        [0, 15, 3],
        [0, 16, 9],
      ],
      problems: [
        'Stalwart 0.15.3 is listed twice: list each release once',
        '"0.16" is not a Stalwart release number: give all three parts, e.g. 0.15.3',
        '"latest" is not a Stalwart release number: give all three parts, e.g. 0.15.3',
      ],
    });
    // Two releases of one line are two nodes' releases, not a repeat.
    expect(names(rulesFor('0.15.1', '0.15.3'))).toEqual(names(rulesFor('0.15.3')));
  });

  it('names each release no rule file is for', () => {
    const choice = chooseRules({ stalwart: ['0.15.3', '0.10.9', '0.16.9'] });
    expect(() => loadRules(choice.paths, choice.release)).toThrow(/no rule file here is for Stalwart 0\.10\.9 \(the files are for /);
    const own = mkdtempSync(path.join(os.tmpdir(), 'rlp-own-rules-'));
    try {
      writeFileSync(path.join(own, 'app.yaml'), 'releases: App 1.0.0 - 1.9.9\nrules:\n  - name: app-lock\n    prefix: "lock:"\n');
      const mine = chooseRules({ rules: [own], stalwart: '0.15.3,0.16.9' });
      expect(thrownMessage(() => loadRules(mine.paths, mine.release))).toBe(
        `${own}: no rule file here is for Stalwart 0.15.3 (the files are for App 1.0.0 - 1.9.9)\n` +
          `${own}: no rule file here is for Stalwart 0.16.9 (the files are for App 1.0.0 - 1.9.9)`,
      );
    } finally {
      rmSync(own, { recursive: true, force: true });
    }
  });
});

/** The message of what `call` throws. */
function thrownMessage(call: () => unknown): string {
  try {
    call();
  } catch (error) {
    return (error as Error).message;
  }
  throw new Error('expected an error, nothing was thrown');
}
