/**
 * Rule files: which keys' lock transactions the proxy rewrites.
 *
 * A rule file is YAML with a non-empty list under `rules`, and optionally the releases of the
 * application it is for:
 *
 * ```yaml
 * # rules/stalwart/0.16.yaml
 * releases: Stalwart 0.16.0 - 0.16.15       # optional: PRODUCT FIRST - LAST (or one release)
 * rules:
 *   - name: stalwart-task-lock              # required, [A-Za-z0-9_.-]+
 *     key: [{hex: "17"}, {u64: task}]       # the key part by part (key-layout.ts), OR
 *     # prefix_hex: "17"                    # raw prefix bytes as hex ("17" or "de ad"), OR
 *     # prefix: "lock:"                     # prefix as UTF-8 text; with either, optionally
 *     # pattern: '^\x17[\s\S]{8}$'           # a JS regex tested against the key decoded as latin1
 *     describe: "task {task}"               # optional, with key: what a key stands for (`locks`)
 *     action: expire-on-create              # optional, the only action (default expire-on-create)
 *     mode: enforce                         # optional: enforce (default) | observe
 * ```
 *
 * How keys are matched: a rule with `key` matches a key its layout reads exactly; a rule with a
 * prefix matches a key that starts with its bytes and, if the rule has a pattern, that the pattern
 * matches as a whole, decoded as latin1 (one character per byte, so binary keys are safe). The
 * first matching rule wins, in load order: files in the order given, rules in file order.
 *
 * A name is unique across the files, except that a rule repeated word for word in several files
 * (a lock kind that several release lines share) is loaded once, at its first place. Two rules
 * for the same keys (the same layout, or the same prefix and pattern) are refused: the later one
 * could never match.
 *
 * Every problem is found before any is reported: each path, each file, each rule and each field
 * of it, then what only the files together show.
 *
 * Things that trip people up:
 * - Quote hex: `prefix_hex: 17` is the number seventeen to YAML, so it is refused; write "17".
 * - `prefix` is encoded as UTF-8, so "\xff" in a double-quoted YAML string is the two bytes
 *   c3 bf, not ff. Use `prefix_hex` (or a `hex` key part) for any byte above 0x7f.
 * - Write patterns in single quotes, so YAML leaves the backslashes alone for the regex.
 * - Anchor patterns with ^ and $ (RegExp.test finds a match anywhere). JS `$` without flags
 *   matches only at the very end, never before a trailing newline byte.
 * - Use [\s\S] rather than `.` for "any byte": `.` does not match 0x0a or 0x0d.
 * - A rule must narrow the keys it touches: an empty prefix needs a pattern.
 *
 * Loading a directory reads its *.yaml and *.yml files (not subdirectories, not dotfiles) in
 * sorted name order; prefix file names with numbers ("10-app.yaml") to control the order.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { LineCounter, parseDocument, type Document } from 'yaml';
import { problemsFrom, RuleFileError, throwProblems } from '../errors.js';
import { matchesLayout } from './key-layout.js';
import { formatRange, formatVersion, parseReleaseRange, rangeContains, type ReleaseRange, type Version } from './releases.js';
import { describeValue, isMapping, parseRule, RuleContext, RuleFileText } from './rule-parser.js';
import type { Rule, RuleSet } from './types.js';

const TOP_LEVEL_FIELDS = ['rules', 'releases'];
const RULE_FILE_NAME = /^[^.].*\.ya?ml$/;

/** One rule file's contents. */
export interface RuleFile {
  readonly rules: Rule[];
  readonly releases: ReleaseRange[];
}

/** One rule file as read: the rules and releases that are right, and every problem found. */
interface ReadRuleFile extends RuleFile {
  readonly problems: readonly Error[];
}

// ---------------------------------------------------------------------------------------------
// Loading from disk
// ---------------------------------------------------------------------------------------------

/**
 * Which files to load of those found: those for any of these releases (the releases a fleet
 * runs, several during a rolling upgrade), and those that name no release.
 */
export interface ReleaseFilter {
  readonly product: string;
  readonly versions: readonly Version[];
}

/**
 * Reads every rule file named by `paths` (files or directories) and builds one RuleSet. With
 * `release`, a file whose `releases:` include none of its versions is left out; each version must
 * have a file. Throws every problem found (throwProblems): one alone as it is, several together.
 */
export function loadRules(paths: readonly string[], release?: ReleaseFilter): RuleSet {
  const { rules, problems } = readRules(paths, release);
  throwProblems(problems);
  return rules;
}

/**
 * Every problem loadRules would stop at, for `check`: each path that cannot be read, every
 * problem of every file (each rule's, several in one rule included), then what only the set of
 * files shows (a name given two meanings, two rules for the same keys, no file for a release).
 */
export function ruleProblems(paths: readonly string[], release?: ReleaseFilter): Error[] {
  return readRules(paths, release).problems;
}

/** The rules at `paths`, as far as they are right, and every problem found on the way. */
function readRules(paths: readonly string[], release: ReleaseFilter | undefined): { rules: RuleSet; problems: Error[] } {
  const found: string[] = [];
  const problems = problemsFrom(paths.map((path) => () => found.push(...ruleFilesAt(path))));
  let files: Array<ReadRuleFile & { file: string }> = [];
  for (const file of found) {
    let text: string | undefined;
    problems.push(...problemsFrom([() => (text = readRuleFile(file))]));
    if (text === undefined) continue;
    const read = readRuleFileOnce(text, file);
    problems.push(...read.problems);
    files.push({ file, ...read });
  }
  if (release !== undefined) {
    const chosen = filesFor(release, files, paths);
    // A file that did not read may be the one for a release: say it has none only when all read.
    if (problems.length === 0) problems.push(...chosen.problems);
    files = chosen.files;
  }
  const { distinct, problems: setProblems } = distinctRules(
    files.flatMap((one) => one.rules),
    'set',
  );
  problems.push(...setProblems);
  const rules = ruleSetOf(
    distinct,
    files.map((one) => one.file),
    files.flatMap((one) => one.releases),
  );
  return { rules, problems };
}

/**
 * The last reading of each file, with the text it was read from. Parsing takes tens of
 * milliseconds, and the same files are read more than once (the shipped ones for the rules in
 * force and for the attempt census; all of them at each reload): a text read again unchanged is
 * not parsed again. Any change to the text parses it anew.
 */
const lastParse = new Map<string, { text: string; parsed: ReadRuleFile }>();

function readRuleFileOnce(text: string, file: string): ReadRuleFile {
  const last = lastParse.get(file);
  if (last !== undefined && last.text === text) return last.parsed;
  const parsed = readRuleFileText(text, file);
  lastParse.set(file, { text, parsed });
  return parsed;
}

/** The files for the release's versions (and those that name none), and each version no file is for. */
function filesFor<T extends RuleFile>(release: ReleaseFilter, files: T[], paths: readonly string[]): { files: T[]; problems: Error[] } {
  const covers = (file: T, version: Version) => file.releases.some((range) => rangeContains(range, release.product, version));
  const named = files.flatMap((file) => file.releases.map(formatRange));
  const problems = release.versions
    .filter((version) => !files.some((file) => covers(file, version)))
    .map(
      (version) =>
        new RuleFileError(
          { file: paths.join(', ') },
          `no rule file here is for ${release.product} ${formatVersion(version)}` +
            (named.length > 0 ? ` (the files are for ${named.join(', ')})` : ' (no file names its releases)'),
        ),
    );
  const chosen = files.filter((file) => file.releases.length === 0 || release.versions.some((version) => covers(file, version)));
  return { files: chosen, problems };
}

/** A file stands for itself; a directory for its rule files, sorted so load order is stable. */
function ruleFilesAt(path: string): string[] {
  const stats = fsCall(path, () => statSync(path), RULES_SETTING);
  if (!stats.isDirectory()) return [path];

  const names = fsCall(path, () => readdirSync(path))
    .filter((name) => RULE_FILE_NAME.test(name))
    .sort();
  if (names.length === 0) {
    throw new RuleFileError({ file: path }, 'directory contains no rule files (*.yaml or *.yml)');
  }
  return names.map((name) => join(path, name));
}

function readRuleFile(file: string): string {
  return fsCall(file, () => readFileSync(file, 'utf8'));
}

/** Where a path given to loadRules comes from, for an error that names the setting to fix. */
const RULES_SETTING = 'a path of the rules setting: --rules, REDIS_LOCK_PROXY_RULES or rules in the config file';

/** Runs a fs call, turning its error into a RuleFileError that names the path (and, given, where it came from). */
function fsCall<T>(path: string, call: () => T, givenAs?: string): T {
  try {
    return call();
  } catch (error) {
    const problem = describeFsError(error);
    throw new RuleFileError({ file: path }, givenAs === undefined ? problem : `${problem} (${givenAs})`, { cause: error });
  }
}

function describeFsError(error: unknown): string {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  switch (code) {
    case 'ENOENT':
      return 'does not exist';
    case 'EACCES':
    case 'EPERM':
      return 'cannot read: permission denied';
    case 'EISDIR':
      return 'cannot read: is a directory';
    default:
      return `cannot read: ${error instanceof Error ? error.message : String(error)}`;
  }
}

// ---------------------------------------------------------------------------------------------
// Parsing one file
// ---------------------------------------------------------------------------------------------

/**
 * Parses and validates one rule file's text, and throws every problem in it (throwProblems).
 * Pure: `file` is only used in messages and `source`.
 */
export function parseRuleFile(text: string, file: string): RuleFile {
  const { rules, releases, problems } = readRuleFileText(text, file);
  throwProblems(problems);
  return { rules, releases };
}

/**
 * One rule file's text, read as far as it goes: YAML that does not parse, or a top level that is
 * not a mapping, stops the reading; past that every top-level key, every rule and every field is
 * checked, and each problem is kept.
 */
function readRuleFileText(text: string, file: string): ReadRuleFile {
  let top: Record<string, unknown> | undefined;
  let source: RuleFileText | undefined;
  const unread = problemsFrom([
    () => {
      const lines = new LineCounter();
      const doc = parseYaml(text, file, lines);
      top = topLevelOf(toPlainValue(doc, file), file);
      source = new RuleFileText(file, doc, lines);
    },
  ]);
  if (top === undefined || source === undefined) return { rules: [], releases: [], problems: unread };
  const fields = top;
  const where = source;
  const problems: Error[] = unknownTopLevelKeys(fields, where);
  let releases: ReleaseRange[] = [];
  problems.push(...problemsFrom([() => (releases = releasesIn(fields, where))]));
  let items: unknown[] = [];
  problems.push(...problemsFrom([() => (items = ruleListOf(fields, where))]));
  const rules: Rule[] = [];
  problems.push(...problemsFrom(items.map((item, i) => () => rules.push(parseRule(item, new RuleContext(where, i + 1))))));
  const named = distinctRules(rules, 'file');
  problems.push(...named.problems);
  return { rules: named.distinct, releases, problems };
}

function parseYaml(text: string, file: string, lineCounter: LineCounter): Document {
  // uniqueKeys is yaml's default; spelled out because a duplicated key (say, two `prefix_hex`
  // lines) would otherwise silently keep the last one.
  const doc = parseDocument(text, { uniqueKeys: true, prettyErrors: true, lineCounter });
  // Warnings too: they mean YAML ignored something (an unknown !tag, say) that the author
  // thought meant something, and a rule file is too small for that to be worth tolerating.
  const problems = [...doc.errors, ...doc.warnings];
  const first = problems[0];
  if (first !== undefined) {
    // The count goes first: yaml's message ends with a multi-line code frame.
    const count = problems.length > 1 ? ` (first of ${problems.length} problems)` : '';
    throw new RuleFileError({ file }, `invalid YAML${count}: ${first.message.trimEnd()}`, {
      cause: first,
    });
  }
  return doc;
}

function toPlainValue(doc: Document, file: string): unknown {
  try {
    return doc.toJS();
  } catch (error) {
    // Only alias trouble gets here (e.g. yaml's "excessive alias count" guard).
    const message = error instanceof Error ? error.message : String(error);
    throw new RuleFileError({ file }, `invalid YAML: ${message}`, { cause: error });
  }
}

function topLevelOf(top: unknown, file: string): Record<string, unknown> {
  if (!isMapping(top)) {
    throw new RuleFileError({ file }, `top level must be a mapping with the key "rules", got ${describeValue(top)}`);
  }
  return top;
}

function unknownTopLevelKeys(top: Record<string, unknown>, source: RuleFileText): RuleFileError[] {
  return Object.keys(top)
    .filter((key) => !TOP_LEVEL_FIELDS.includes(key))
    .map(
      (key) =>
        new RuleFileError(
          { file: source.file, line: source.lineAt([key]), field: key },
          'unknown top-level key: the file may contain only "rules:" and "releases:"',
        ),
    );
}

function ruleListOf(top: Record<string, unknown>, source: RuleFileText): unknown[] {
  const list = top['rules'];
  if (!Array.isArray(list) || list.length === 0) {
    const where = { file: source.file, line: source.lineAt(['rules']), field: 'rules' };
    throw new RuleFileError(where, `must be a non-empty list of rules, got ${describeValue(list)}`);
  }
  return list;
}

/** `releases: Stalwart 0.15.0 - 0.15.5`, or a list of such ranges; none when absent. */
function releasesIn(top: Record<string, unknown>, source: RuleFileText): ReleaseRange[] {
  if (!Object.hasOwn(top, 'releases')) return [];
  const value = top['releases'];
  const listed = Array.isArray(value);
  const texts = listed ? value : [value];
  const ranges: ReleaseRange[] = [];
  const problems = texts.map((text, i) => {
    const where = { file: source.file, line: source.lineAt(listed ? ['releases', i] : ['releases']), field: 'releases' };
    if (typeof text !== 'string') {
      return new RuleFileError(where, `must be text such as "Stalwart 0.15.0 - 0.15.5", got ${describeValue(text)}`);
    }
    const range = parseReleaseRange(text);
    if (typeof range === 'string') return new RuleFileError(where, range);
    ranges.push(range);
    return undefined;
  });
  throwProblems(problems.filter((problem) => problem !== undefined));
  return ranges;
}

// ---------------------------------------------------------------------------------------------
// The rule set
// ---------------------------------------------------------------------------------------------

/**
 * Bundles validated rules (in match priority order) with the files they came from. A rule
 * repeated word for word (same name, same definition) is kept once, at its first place; a name
 * given two meanings, or two rules for the same keys, are refused (every one of them).
 */
export function createRuleSet(rules: Rule[], files: readonly string[], releases: readonly ReleaseRange[] = []): RuleSet {
  const { distinct, problems } = distinctRules(rules, 'set');
  throwProblems(problems);
  return ruleSetOf(distinct, files, releases);
}

function ruleSetOf(rules: Rule[], files: readonly string[], releases: readonly ReleaseRange[]): RuleSet {
  const ordered: readonly Rule[] = Object.freeze(rules);
  const byFirstByte = rulesByFirstByte(ordered);
  return {
    rules: ordered,
    files: Object.freeze([...files]),
    releases: Object.freeze([...releases]),
    match: (key) => firstMatch(key.length > 0 ? byFirstByte[key[0]] : byFirstByte[256], key),
  };
}

/**
 * For each first byte of a key (256: the empty key), the rules that may match it, in priority
 * order: those whose prefix starts with that byte, and those with an empty prefix. A key is then
 * compared with the few rules of its kind, not with every release line's.
 */
function rulesByFirstByte(ordered: readonly Rule[]): ReadonlyArray<readonly Rule[]> {
  const lists: Rule[][] = Array.from({ length: 257 }, () => []);
  for (const rule of ordered) {
    if (rule.prefix.length === 0) for (const list of lists) list.push(rule);
    else lists[rule.prefix[0]].push(rule);
  }
  return lists;
}

/**
 * Called for every key of every lock transaction, so it must stay cheap: byte comparisons
 * only, and the latin1 string for patterns is built at most once, only after a prefix matched.
 */
function firstMatch(rules: readonly Rule[], key: Buffer): Rule | undefined {
  let keyText: string | undefined;
  // Indexed loop: for..of may allocate an iterator when not optimised.
  for (let i = 0; i < rules.length; i++) {
    const rule = rules[i];
    if (!startsWith(key, rule.prefix)) continue;
    if (rule.key !== undefined) {
      if (matchesLayout(rule.key, key)) return rule;
      continue;
    }
    if (rule.pattern === undefined) return rule;
    keyText ??= key.toString('latin1');
    if (rule.pattern.test(keyText)) return rule;
  }
  return undefined;
}

/** Whether this one rule matches the key, whatever the rules before it say. */
export function ruleMatches(rule: Rule, key: Buffer): boolean {
  if (!startsWith(key, rule.prefix)) return false;
  if (rule.key !== undefined) return matchesLayout(rule.key, key);
  return rule.pattern === undefined || rule.pattern.test(key.toString('latin1'));
}

/** Byte loop rather than subarray().equals(): prefixes are a few bytes and this allocates nothing. */
function startsWith(key: Buffer, prefix: Buffer): boolean {
  const length = prefix.length;
  if (key.length < length) return false;
  for (let i = 0; i < length; i++) {
    if (key[i] !== prefix[i]) return false;
  }
  return true;
}

/**
 * Names identify rules in logs and metrics, so two rules may not share one. Across files, a
 * rule repeated with the same definition is the same rule (a lock kind that several release
 * lines share, loaded once); within one file even that is a slip.
 *
 * Across files, two rules that match the same keys are refused too: a key goes to the first
 * rule that matches it, so the later one could never match, and whoever wrote it would believe
 * it in force. Returns the rules with repeats dropped, and every problem.
 */
function distinctRules(rules: readonly Rule[], scope: 'file' | 'set'): { distinct: Rule[]; problems: RuleFileError[] } {
  const firstByName = new Map<string, Rule>();
  const firstByKeys = new Map<string, Rule>();
  const distinct: Rule[] = [];
  const problems: RuleFileError[] = [];
  for (const rule of rules) {
    const here = splitSource(rule.source);
    const where = { ...here, line: rule.line, ruleName: rule.name };
    const first = firstByName.get(rule.name);
    if (first !== undefined) {
      const there = splitSource(first.source);
      if (scope === 'set' && here.file !== there.file && rule.definition === first.definition) continue;
      const firstPlace = there.rule === undefined ? there.file : `${there.file} rule ${there.rule}`;
      const differs = here.file !== there.file && scope === 'set' ? ' with a different definition' : '';
      problems.push(
        new RuleFileError({ ...where, field: 'name' }, `duplicate name ${JSON.stringify(rule.name)}${differs}: already used by ${firstPlace}`),
      );
      continue;
    }
    firstByName.set(rule.name, rule);
    const keys = keysMatched(rule);
    const shadowing = scope === 'set' ? firstByKeys.get(keys) : undefined;
    if (shadowing !== undefined) {
      const what = rule.key === undefined ? 'the same prefix and pattern' : 'the same key layout';
      problems.push(
        new RuleFileError(
          where,
          `has ${what} as ${placeOf(shadowing)}, which is loaded before it: a key goes to the first rule that ` +
            'matches it, so this rule can never match (remove one of the two, or give this one keys of its own)',
        ),
      );
      continue;
    }
    firstByKeys.set(keys, rule);
    distinct.push(rule);
  }
  return { distinct, problems };
}

/**
 * The keys a rule matches, as text that two rules share exactly when they match the same keys:
 * a layout's parts with adjacent literals joined and field names left out (a name changes no
 * match), or the prefix and pattern.
 */
function keysMatched(rule: Rule): string {
  if (rule.key === undefined) return JSON.stringify(['prefix', rule.prefix.toString('hex'), rule.pattern?.source ?? null]);
  const parts: string[] = [];
  let literal = '';
  for (const part of rule.key.parts) {
    if (part.type === 'literal') {
      literal += part.bytes.toString('hex');
      continue;
    }
    if (literal !== '') parts.push(literal);
    literal = '';
    parts.push(`${part.type}/${part.length}`);
  }
  if (literal !== '') parts.push(literal);
  return JSON.stringify(['key', ...parts]);
}

/** `rule 1 ("stalwart-task-lock") of rules/stalwart/0.16.yaml, line 23`: where a rule is. */
function placeOf(rule: Rule): string {
  const { file, rule: index } = splitSource(rule.source);
  const which = index === undefined ? `"${rule.name}"` : `rule ${index} (${JSON.stringify(rule.name)})`;
  return `${which} of ${file}${rule.line === undefined ? '' : `, line ${rule.line}`}`;
}

/** "path/to/file.yaml#2" → { file, rule: 2 }; a source without "#n" is just a file. */
function splitSource(source: string): { file: string; rule: number | undefined } {
  const match = /^(.*)#(\d+)$/s.exec(source);
  if (match === null) return { file: source, rule: undefined };
  return { file: match[1], rule: Number(match[2]) };
}
