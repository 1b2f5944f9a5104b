/**
 * Rule files: which keys' lock transactions the proxy rewrites.
 *
 * A rule file is YAML with a single top-level key, `rules`, holding a non-empty list:
 *
 * ```yaml
 * # rules/example.yaml
 * rules:
 *   - name: stalwart-task-lock        # required, unique across all files, [A-Za-z0-9_.-]+
 *     prefix_hex: "17"                # raw prefix bytes as hex (spaces allowed between bytes, e.g. "17" or "de ad"), OR
 *     # prefix: "lock:"               # prefix as UTF-8 text; exactly one of prefix / prefix_hex
 *     pattern: '^\x17[\s\S]{8}$'      # optional JS regex tested against the key decoded as latin1
 *     action: expire-on-create        # optional, the only action (default expire-on-create)
 *     mode: enforce                   # optional: enforce (default) | observe
 * ```
 *
 * How keys are matched: a rule matches a key when the key starts with the rule's prefix bytes and,
 * if the rule has a pattern, the pattern matches the whole key decoded as latin1 (one character
 * per byte, so binary keys are safe). The first matching rule wins, in load order: files in the
 * order given, rules in file order.
 *
 * Things that trip people up:
 * - Quote hex: `prefix_hex: 17` is the number seventeen to YAML, so it is refused; write "17".
 * - `prefix` is encoded as UTF-8, so "\xff" in a double-quoted YAML string is the two bytes
 *   c3 bf, not ff. Use `prefix_hex` for any byte above 0x7f.
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
import { isScalar, parseDocument, type Document } from 'yaml';
import type { Rule, RuleAction, RuleMode, RuleSet } from './types.js';

const RULE_FIELDS = ['name', 'prefix', 'prefix_hex', 'pattern', 'action', 'mode'] as const;
const ACTIONS: readonly RuleAction[] = ['expire-on-create'];
const MODES: readonly RuleMode[] = ['enforce', 'observe'];
const NAME_SYNTAX = /^[A-Za-z0-9_.-]+$/;
const RULE_FILE_NAME = /^[^.].*\.ya?ml$/;

/** Where in the rule files a problem is; every part but `file` is optional. */
export interface RuleFileLocation {
  readonly file: string;
  /** 1-based position of the rule in its file. */
  readonly rule?: number | undefined;
  /** The rule's name, when it has a valid one (makes messages easier to act on). */
  readonly ruleName?: string | undefined;
  readonly field?: string | undefined;
}

/**
 * Any problem with the rule files: missing, unreadable, bad YAML, or an invalid rule.
 * The message always starts with the location, e.g.
 * `rules/x.yaml: rule 2 ("queue-lock"): field "prefix_hex": not valid hex: "zz"`.
 */
export class RuleFileError extends Error {
  readonly code = 'ERULEFILE';
  readonly file: string;
  readonly rule: number | undefined;
  readonly field: string | undefined;

  constructor(where: RuleFileLocation, problem: string, options?: ErrorOptions) {
    super(`${formatLocation(where)}: ${problem}`, options);
    this.name = 'RuleFileError';
    this.file = where.file;
    this.rule = where.rule;
    this.field = where.field;
  }
}

function formatLocation({ file, rule, ruleName, field }: RuleFileLocation): string {
  let text = file;
  if (rule !== undefined) {
    text += `: rule ${rule}`;
    if (ruleName !== undefined) text += ` (${JSON.stringify(ruleName)})`;
  }
  if (field !== undefined) text += `: field ${JSON.stringify(field)}`;
  return text;
}

// ---------------------------------------------------------------------------------------------
// Loading from disk
// ---------------------------------------------------------------------------------------------

/** Reads every rule file named by `paths` (files or directories) and builds one RuleSet. */
export function loadRules(paths: string[]): RuleSet {
  const files = paths.flatMap(ruleFilesAt);
  const rules = files.flatMap((file) => parseRuleFile(readRuleFile(file), file));
  return createRuleSet(rules, files);
}

/** A file stands for itself; a directory for its rule files, sorted so load order is stable. */
function ruleFilesAt(path: string): string[] {
  const stats = fsCall(path, () => statSync(path));
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

/** Runs a fs call, turning its error into a RuleFileError that names the path. */
function fsCall<T>(path: string, call: () => T): T {
  try {
    return call();
  } catch (error) {
    throw new RuleFileError({ file: path }, describeFsError(error), { cause: error });
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

/** Parses and validates one rule file's text. Pure: `file` is only used in messages and `source`. */
export function parseRuleFile(text: string, file: string): Rule[] {
  const doc = parseYaml(text, file);
  const items = ruleListOf(toPlainValue(doc, file), file);
  const rules = items.map((item, i) => parseRule(item, new RuleContext(file, i + 1, doc)));
  assertUniqueNames(rules);
  return rules;
}

function parseYaml(text: string, file: string): Document {
  // uniqueKeys is yaml's default; spelled out because a duplicated key (say, two `prefix_hex`
  // lines) would otherwise silently keep the last one.
  const doc = parseDocument(text, { uniqueKeys: true, prettyErrors: true });
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

function ruleListOf(top: unknown, file: string): unknown[] {
  if (!isMapping(top)) {
    throw new RuleFileError(
      { file },
      `top level must be a mapping with the single key "rules", got ${describeValue(top)}`,
    );
  }
  for (const key of Object.keys(top)) {
    if (key !== 'rules') {
      throw new RuleFileError(
        { file, field: key },
        'unknown top-level key: the file must contain only "rules:"',
      );
    }
  }
  const list = top['rules'];
  if (!Array.isArray(list) || list.length === 0) {
    throw new RuleFileError(
      { file, field: 'rules' },
      `must be a non-empty list of rules, got ${describeValue(list)}`,
    );
  }
  return list;
}

/** What a rule's validation needs to word its errors. */
class RuleContext {
  /** Set once the rule's name is known to be valid, so later errors can show it. */
  ruleName: string | undefined;

  constructor(
    readonly file: string,
    readonly index: number,
    private readonly doc: Document,
  ) {}

  error(field: string | undefined, problem: string): RuleFileError {
    const where = { file: this.file, rule: this.index, ruleName: this.ruleName, field };
    return new RuleFileError(where, problem);
  }

  /** The field's value as written in the file (e.g. "0x17" for a number YAML read as 23). */
  writtenText(field: string): string | undefined {
    const node = this.doc.getIn(['rules', this.index - 1, field], true);
    return isScalar(node) && typeof node.source === 'string' ? node.source : undefined;
  }
}

type Fields = Record<string, unknown>;

function parseRule(item: unknown, ctx: RuleContext): Rule {
  if (!isMapping(item)) {
    throw ctx.error(
      undefined,
      `must be a mapping with name and prefix or prefix_hex, got ${describeValue(item)}`,
    );
  }
  // Known before the other checks only so that their messages can name the rule.
  if (typeof item['name'] === 'string' && NAME_SYNTAX.test(item['name'])) {
    ctx.ruleName = item['name'];
  }
  rejectUnknownFields(item, ctx);

  const name = parseName(item, ctx);
  const prefix = parsePrefix(item, ctx);
  const pattern = parsePattern(item, ctx);
  if (prefix.length === 0 && pattern === undefined) {
    const field = Object.hasOwn(item, 'prefix_hex') ? 'prefix_hex' : 'prefix';
    throw ctx.error(field, 'is empty and there is no pattern: the rule would match every key');
  }
  const action = parseChoice(item, 'action', ACTIONS, 'expire-on-create', ctx);
  const mode = parseChoice(item, 'mode', MODES, 'enforce', ctx);

  return Object.freeze({
    name,
    prefix,
    pattern,
    action,
    mode,
    source: `${ctx.file}#${ctx.index}`,
  });
}

/** Typos like `prefx` must fail loudly: silently ignoring one would leave keys unprotected. */
function rejectUnknownFields(item: Fields, ctx: RuleContext): void {
  const known: readonly string[] = RULE_FIELDS;
  for (const field of Object.keys(item)) {
    if (!known.includes(field)) {
      throw ctx.error(field, `unknown field (allowed: ${RULE_FIELDS.join(', ')})`);
    }
  }
}

function parseName(item: Fields, ctx: RuleContext): string {
  if (!Object.hasOwn(item, 'name')) throw ctx.error('name', 'is required');
  const name = requireString(item, 'name', ctx);
  if (name === '') throw ctx.error('name', 'is empty');
  if (!NAME_SYNTAX.test(name)) {
    throw ctx.error(
      'name',
      `may only contain letters, digits, "_", "." and "-", got ${JSON.stringify(name)}`,
    );
  }
  return name;
}

function parsePrefix(item: Fields, ctx: RuleContext): Buffer {
  const hasText = Object.hasOwn(item, 'prefix');
  const hasHex = Object.hasOwn(item, 'prefix_hex');
  if (hasText && hasHex) {
    throw ctx.error('prefix_hex', 'cannot be combined with "prefix": give exactly one of them');
  }
  if (!hasText && !hasHex) {
    throw ctx.error('prefix', 'is required: give exactly one of "prefix" or "prefix_hex"');
  }
  if (hasText) return Buffer.from(requireString(item, 'prefix', ctx), 'utf8');
  return parseHex(requireString(item, 'prefix_hex', ctx), ctx);
}

/** Hex digits, two per byte, optionally with whitespace between bytes ("de ad"). */
function parseHex(text: string, ctx: RuleContext): Buffer {
  const groups = text.split(/\s+/).filter((group) => group !== '');
  for (const group of groups) {
    if (!/^[0-9a-fA-F]*$/.test(group)) {
      const hint = /^0x/i.test(group) ? ' (write the bytes without "0x", e.g. "17")' : '';
      throw ctx.error('prefix_hex', `not valid hex: ${JSON.stringify(text)}${hint}`);
    }
    if (group.length % 2 !== 0) {
      throw ctx.error(
        'prefix_hex',
        `odd number of hex digits in ${JSON.stringify(text)}: each byte takes two digits ` +
          '(e.g. "0a", not "a"), and spaces may only go between bytes',
      );
    }
  }
  return Buffer.from(groups.join(''), 'hex');
}

function parsePattern(item: Fields, ctx: RuleContext): RegExp | undefined {
  if (!Object.hasOwn(item, 'pattern')) return undefined;
  const source = requireString(item, 'pattern', ctx);
  // An empty pattern matches everything; it is always a mistake, and with an empty prefix it
  // would slip past the "rule matches every key" check.
  if (source === '') throw ctx.error('pattern', 'is empty: remove the field or give a regex');
  try {
    // No flags: `g`/`y` would make test() stateful across keys.
    return new RegExp(source);
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw ctx.error('pattern', `not a valid regular expression: ${reason}`);
  }
}

function parseChoice<T extends string>(
  item: Fields,
  field: string,
  allowed: readonly T[],
  fallback: T,
  ctx: RuleContext,
): T {
  if (!Object.hasOwn(item, field)) return fallback;
  const value = requireString(item, field, ctx);
  const choice = allowed.find((candidate) => candidate === value);
  if (choice === undefined) {
    throw ctx.error(field, `must be one of: ${allowed.join(', ')}; got ${JSON.stringify(value)}`);
  }
  return choice;
}

/** The field's value if it is a string; otherwise an error that says how to fix the YAML. */
function requireString(item: Fields, field: string, ctx: RuleContext): string {
  const value = item[field];
  if (typeof value === 'string') return value;

  const written = ctx.writtenText(field);
  let problem = `must be a string, got ${describeValue(value, written)}`;
  if (typeof value === 'number' || typeof value === 'boolean') {
    problem += `; ${quotingHint(field, written ?? String(value))}`;
  }
  throw ctx.error(field, problem);
}

/** YAML turned unquoted text into a number or boolean; quoting keeps the characters as typed. */
function quotingHint(field: string, written: string): string {
  if (field === 'prefix_hex') {
    // 0x17 is YAML's hex number syntax; the rule wants the bare digits.
    return `quote hex digits so YAML keeps them as text: prefix_hex: "${written.replace(/^0x/i, '')}"`;
  }
  return `quote the value so YAML keeps it as text: ${field}: "${written}"`;
}

function describeValue(value: unknown, written?: string): string {
  if (value === null || value === undefined) return 'nothing';
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  if (typeof value === 'string') return `the text ${JSON.stringify(value)}`;
  return `a ${typeof value} (${written ?? String(value)})`;
}

function isMapping(value: unknown): value is Fields {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

// ---------------------------------------------------------------------------------------------
// The rule set
// ---------------------------------------------------------------------------------------------

/** Bundles validated rules (in match priority order) with the files they came from. */
export function createRuleSet(rules: Rule[], files: string[]): RuleSet {
  // Checked here as well as per file, because only here are all files' rules together.
  assertUniqueNames(rules);
  const ordered: readonly Rule[] = Object.freeze([...rules]);
  return {
    rules: ordered,
    files: Object.freeze([...files]),
    match: (key) => firstMatch(ordered, key),
  };
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
    if (rule.pattern === undefined) return rule;
    keyText ??= key.toString('latin1');
    if (rule.pattern.test(keyText)) return rule;
  }
  return undefined;
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

/** Names identify rules in logs and metrics, so two rules may not share one. */
function assertUniqueNames(rules: readonly Rule[]): void {
  const firstByName = new Map<string, Rule>();
  for (const rule of rules) {
    const first = firstByName.get(rule.name);
    if (first === undefined) {
      firstByName.set(rule.name, rule);
      continue;
    }
    const here = splitSource(rule.source);
    const there = splitSource(first.source);
    const firstPlace = there.rule === undefined ? there.file : `${there.file} rule ${there.rule}`;
    throw new RuleFileError(
      { ...here, ruleName: rule.name, field: 'name' },
      `duplicate name ${JSON.stringify(rule.name)}: already used by ${firstPlace}`,
    );
  }
}

/** "path/to/file.yaml#2" → { file, rule: 2 }; a source without "#n" is just a file. */
function splitSource(source: string): { file: string; rule: number | undefined } {
  const match = /^(.*)#(\d+)$/s.exec(source);
  if (match === null) return { file: source, rule: undefined };
  return { file: match[1], rule: Number(match[2]) };
}
