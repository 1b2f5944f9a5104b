/**
 * One rule of a rule file, from its YAML mapping to a validated Rule. Every error names the file,
 * the line, the rule (by number, and by name once that is known to be valid) and the field; a
 * rule with several wrong fields is refused with every one of them.
 */
import { isNode, isScalar, type Document, type LineCounter } from 'yaml';
import { RuleFileError, throwProblems } from '../errors.js';
import { parseDescription } from './key-description.js';
import { parseHexBytes, parseKeyLayout, type KeyLayout } from './key-layout.js';
import type { Rule, RuleAction, RuleMode } from './types.js';

const RULE_FIELDS = ['name', 'prefix', 'prefix_hex', 'pattern', 'key', 'describe', 'action', 'mode'] as const;
const ACTIONS: readonly RuleAction[] = ['expire-on-create'];
const MODES: readonly RuleMode[] = ['enforce', 'observe'];
const NAME_SYNTAX = /^[A-Za-z0-9_.-]+$/;

/** A rule file's parsed YAML, with what it takes to say on which line a node is. */
export class RuleFileText {
  constructor(
    readonly file: string,
    readonly doc: Document,
    private readonly lines: LineCounter,
  ) {}

  /**
   * The 1-based line of the node at `path` (e.g. ['rules', 1, 'key', 2]); where there is no such
   * node (a field that is missing), the line of the nearest node above it.
   */
  lineAt(path: readonly (string | number)[]): number | undefined {
    for (let length = path.length; length >= 0; length--) {
      const node = length === 0 ? this.doc.contents : this.doc.getIn(path.slice(0, length), true);
      const offset = isNode(node) ? node.range?.[0] : undefined;
      if (offset !== undefined) return this.lines.linePos(offset).line;
    }
    return undefined;
  }
}

/** What a rule's validation needs to word its errors. */
export class RuleContext {
  /** Set once the rule's name is known to be valid, so later errors can show it. */
  ruleName: string | undefined;

  constructor(
    readonly text: RuleFileText,
    readonly index: number,
  ) {}

  get file(): string {
    return this.text.file;
  }

  /** The line the rule starts on. */
  get line(): number | undefined {
    return this.text.lineAt(['rules', this.index - 1]);
  }

  error(field: string | undefined, problem: string): RuleFileError {
    const line = this.text.lineAt(['rules', this.index - 1, ...fieldPath(field)]);
    const where = { file: this.file, line, rule: this.index, ruleName: this.ruleName, field };
    return new RuleFileError(where, problem);
  }

  /** The field's value as written in the file (e.g. "0x17" for a number YAML read as 23). */
  writtenText(field: string): string | undefined {
    const node = this.text.doc.getIn(['rules', this.index - 1, field], true);
    return isScalar(node) && typeof node.source === 'string' ? node.source : undefined;
  }
}

/** "key[3]" → ['key', 2]; "prefix" → ['prefix']; no field → []. */
function fieldPath(field: string | undefined): (string | number)[] {
  if (field === undefined) return [];
  const part = /^(.*)\[(\d+)\]$/.exec(field);
  return part === null ? [field] : [part[1], Number(part[2]) - 1];
}

type Fields = Record<string, unknown>;

/**
 * Validates one rule. Each field is checked on its own, so that a rule with several mistakes is
 * refused with all of them (a ConfigProblems of RuleFileErrors; one alone is thrown as it is);
 * only a check that needs another field's value waits for that field to be right.
 */
export function parseRule(item: unknown, ctx: RuleContext): Rule {
  if (!isMapping(item)) {
    throw ctx.error(undefined, `must be a mapping with name and key, prefix or prefix_hex, got ${describeValue(item)}`);
  }
  // Known before the other checks only so that their messages can name the rule.
  if (typeof item['name'] === 'string' && NAME_SYNTAX.test(item['name'])) {
    ctx.ruleName = item['name'];
  }
  const problems: RuleFileError[] = [];
  const checked = <T>(check: () => T): T | undefined => {
    try {
      return check();
    } catch (error) {
      if (!(error instanceof RuleFileError)) throw error;
      problems.push(error);
      return undefined;
    }
  };

  problems.push(...unknownFields(item, ctx));
  const name = checked(() => parseName(item, ctx));
  const hasKey = Object.hasOwn(item, 'key');
  const key = hasKey ? checked(() => parseKey(item, ctx)) : undefined;
  // With `key`, prefix and pattern are refused by parseKey; without, they say what the rule matches.
  const prefix = hasKey ? key?.prefix : checked(() => parsePrefix(item, ctx));
  const beforePattern = problems.length;
  const pattern = hasKey ? undefined : checked(() => parsePattern(item, ctx));
  if (prefix !== undefined && prefix.length === 0 && pattern === undefined && problems.length === beforePattern) {
    const field = Object.hasOwn(item, 'prefix_hex') ? 'prefix_hex' : 'prefix';
    problems.push(ctx.error(field, 'is empty and there is no pattern: the rule would match every key'));
  }
  // A description is read against the key's fields: with a wrong key there are none to check it by.
  const describe =
    Object.hasOwn(item, 'describe') && (!hasKey || key !== undefined)
      ? checked(() => parseDescription(requireString(item, 'describe', ctx), key, (problem) => ctx.error('describe', problem)))
      : undefined;
  const action = checked(() => parseChoice(item, 'action', ACTIONS, 'expire-on-create', ctx));
  const mode = checked(() => parseChoice(item, 'mode', MODES, 'enforce', ctx));
  throwProblems(problems);
  // With no problem, every check returned its value.
  if (name === undefined || prefix === undefined || action === undefined || mode === undefined) {
    throw new Error(`rule ${ctx.index} of ${ctx.file} was checked without a problem, yet a field is missing`);
  }

  const definition = JSON.stringify({
    prefix: prefix.toString('hex'),
    pattern: pattern?.source ?? null,
    key: key?.parts.map((part) => (part.type === 'literal' ? part.bytes.toString('hex') : [part.type, part.name, part.length])) ?? null,
    describe: describe?.template ?? null,
    action,
    mode,
  });
  return Object.freeze({
    name,
    prefix,
    pattern,
    key,
    describe,
    action,
    mode,
    source: `${ctx.file}#${ctx.index}`,
    line: ctx.line,
    definition,
  });
}

/** Typos like `prefx` must fail loudly: silently ignoring one would leave keys unprotected. */
function unknownFields(item: Fields, ctx: RuleContext): RuleFileError[] {
  const known: readonly string[] = RULE_FIELDS;
  return Object.keys(item)
    .filter((field) => !known.includes(field))
    .map((field) => ctx.error(field, `unknown field (allowed: ${RULE_FIELDS.join(', ')})`));
}

function parseName(item: Fields, ctx: RuleContext): string {
  if (!Object.hasOwn(item, 'name')) throw ctx.error('name', 'is required');
  const name = requireString(item, 'name', ctx);
  if (name === '') throw ctx.error('name', 'is empty');
  if (!NAME_SYNTAX.test(name)) {
    throw ctx.error('name', `may only contain letters, digits, "_", "." and "-", got ${JSON.stringify(name)}`);
  }
  return name;
}

/** `key:` spells the key out, so it replaces prefix, prefix_hex and pattern. */
function parseKey(item: Fields, ctx: RuleContext): KeyLayout {
  const other = ['prefix', 'prefix_hex', 'pattern'].find((field) => Object.hasOwn(item, field));
  if (other !== undefined) {
    throw ctx.error(other, 'cannot be combined with "key": the key layout already says what the key starts with');
  }
  return parseKeyLayout(item['key'], (where, problem) => ctx.error(where, problem));
}

function parsePrefix(item: Fields, ctx: RuleContext): Buffer {
  const hasText = Object.hasOwn(item, 'prefix');
  const hasHex = Object.hasOwn(item, 'prefix_hex');
  if (hasText && hasHex) {
    throw ctx.error('prefix_hex', 'cannot be combined with "prefix": give exactly one of them');
  }
  if (!hasText && !hasHex) {
    throw ctx.error('prefix', 'is required: give "key", or exactly one of "prefix" or "prefix_hex"');
  }
  if (hasText) return Buffer.from(requireString(item, 'prefix', ctx), 'utf8');
  return parseHexBytes(requireString(item, 'prefix_hex', ctx), (problem) => ctx.error('prefix_hex', problem));
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

function parseChoice<T extends string>(item: Fields, field: string, allowed: readonly T[], fallback: T, ctx: RuleContext): T {
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

export function describeValue(value: unknown, written?: string): string {
  if (value === null || value === undefined) return 'nothing';
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  if (typeof value === 'string') return `the text ${JSON.stringify(value)}`;
  return `a ${typeof value} (${written ?? String(value)})`;
}

export function isMapping(value: unknown): value is Fields {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
