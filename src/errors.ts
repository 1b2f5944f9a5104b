/**
 * The errors the proxy raises for what an operator gave it. Each has a stable `code`, and a
 * message that says what is wrong and where; a wrapped error is kept as `cause`.
 */

/** A setting the operator gave is wrong; the message says which and why. Exit code 2. */
export class ConfigError extends Error {
  readonly code = 'ECONFIG';
}

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
 * Any problem with the rule files: missing, unreadable, bad YAML, or an invalid rule. Exit code 2.
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
