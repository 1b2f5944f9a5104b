/**
 * Every error class of the proxy, each with a stable `code` and a message that says what is
 * wrong and where; a wrapped error is kept as `cause`. First those for what an operator gave
 * it, then those of its own work.
 */

/** A setting the operator gave is wrong; the message says which and why. Exit code 2. */
export class ConfigError extends Error {
  readonly code = 'ECONFIG';
}

/**
 * Several settings or rules are wrong at once (`check` names them all; a start stops at them):
 * each is a ConfigError or RuleFileError of its own, in `problems`, one line of the message
 * each. Exit code 2.
 */
export class ConfigProblems extends ConfigError {
  constructor(readonly problems: readonly Error[]) {
    super(problems.map((problem) => problem.message).join('\n'));
  }
}

/** Whether `err` is a problem with what the operator gave (a setting, a rule file): exit code 2. */
export function isOperatorInputError(err: unknown): err is ConfigError | RuleFileError {
  return err instanceof ConfigError || err instanceof RuleFileError;
}

/** The problems an error stands for: those of a ConfigProblems, else the error itself. */
export function problemsOf(err: Error): readonly Error[] {
  return err instanceof ConfigProblems ? err.problems : [err];
}

/** Runs each check, and returns every problem of the operator's input they threw (anything else is thrown on). */
export function problemsFrom(checks: ReadonlyArray<() => unknown>): Error[] {
  const problems: Error[] = [];
  for (const check of checks) {
    try {
      check();
    } catch (err) {
      if (!isOperatorInputError(err)) throw err;
      problems.push(...problemsOf(err));
    }
  }
  return problems;
}

/** Throws the problems: nothing for none, the one error as it is, or ConfigProblems of them all. */
export function throwProblems(problems: readonly Error[]): void {
  if (problems.length === 1) throw problems[0];
  if (problems.length > 1) throw new ConfigProblems(problems);
}

/** Runs each check, and throws what they threw (throwProblems). */
export function allChecked(checks: ReadonlyArray<() => unknown>): void {
  throwProblems(problemsFrom(checks));
}

/** An operator command (`verify`, `locks`) was given options it cannot use. Exit code 2. */
export class UsageError extends Error {
  readonly code = 'EUSAGE';
}

/** Where in the rule files a problem is; every part but `file` is optional. */
export interface RuleFileLocation {
  readonly file: string;
  /** 1-based line in the file where the problem is (the field's, else the rule's). */
  readonly line?: number | undefined;
  /** 1-based position of the rule in its file. */
  readonly rule?: number | undefined;
  /** The rule's name, when it has a valid one (makes messages easier to act on). */
  readonly ruleName?: string | undefined;
  readonly field?: string | undefined;
}

/**
 * Any problem with the rule files: missing, unreadable, bad YAML, or an invalid rule. Exit code 2.
 * The message always starts with the location, e.g.
 * `rules/x.yaml, line 7: rule 2 ("queue-lock"): field "prefix_hex": not valid hex: "zz"`.
 */
export class RuleFileError extends Error {
  readonly code = 'ERULEFILE';
  readonly file: string;
  readonly line: number | undefined;
  readonly rule: number | undefined;
  readonly field: string | undefined;

  constructor(where: RuleFileLocation, problem: string, options?: ErrorOptions) {
    super(`${formatLocation(where)}: ${problem}`, options);
    this.name = 'RuleFileError';
    this.file = where.file;
    this.line = where.line;
    this.rule = where.rule;
    this.field = where.field;
  }
}

function formatLocation({ file, line, rule, ruleName, field }: RuleFileLocation): string {
  let text = line === undefined ? file : `${file}, line ${line}`;
  if (rule !== undefined) {
    text += `: rule ${rule}`;
    if (ruleName !== undefined) text += ` (${JSON.stringify(ruleName)})`;
  }
  if (field !== undefined) text += `: field ${JSON.stringify(field)}`;
  return text;
}

/** `verify`: a rule that did not hold through the proxy (or could not be tested); the message says why. */
export class RuleFailure extends Error {
  readonly code = 'EVERIFY';

  constructor(
    readonly rule: string,
    message: string,
  ) {
    super(message);
  }
}

/** The cluster's nodes could not be learnt: no node answered, or not as a cluster node does. */
export class TopologyError extends Error {
  readonly code = 'ETOPOLOGY';
}

/** A wait for an answer (a sentinel's) ran out of time. */
export class TimeoutError extends Error {
  readonly code = 'ETIMEOUT';
}

/** A wait was cut short because what waited is closing. */
export class ClosedError extends Error {
  readonly code = 'ECLOSED';
}
