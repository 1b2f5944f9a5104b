/**
 * The rules in force as the admin endpoint `/rules` lists them (JSON), and the reading of that
 * list by `verify`, which checks the running proxy's rules rather than guessing them. Read-only:
 * names, modes, canonical definitions, files and releases, and the running proxy's instance id
 * (new at each start), which `GET /verify/<nonce>` gives too; nothing of the traffic.
 */
import type { RuleSet, RuleMode } from '../rules/types.js';
import { effectiveMode } from '../rules/types.js';
import { releasesText } from '../rules/store.js';

export interface RulesView {
  readonly version: string;
  /** The running proxy's instance id (VerifyRuns.instance). */
  readonly instance: string;
  /** The proxy's --mode. */
  readonly mode: RuleMode;
  /** The releases the loaded rule files are for, e.g. "Stalwart 0.15.0 - 0.15.5"; "" for none. */
  readonly releases: string;
  readonly files: readonly string[];
  readonly rules: ReadonlyArray<{
    readonly name: string;
    /** What the rule does under the proxy's --mode. */
    readonly mode: RuleMode;
    /** Its canonical definition (Rule.definition): the same rule read from the same file says the same. */
    readonly definition: string;
  }>;
  /**
   * How lock blocks go to Redis: the --lock-method setting, the way chosen at start and why, and
   * each upstream address whose server's version is known, with its way.
   */
  readonly lockMethod?: LockMethodView;
}

export interface LockMethodView {
  readonly setting: string;
  readonly atStart: { readonly way: string | null; readonly why: string };
  readonly upstreams: Record<string, { readonly way: string; readonly server: string | null }>;
}

export function rulesView(rules: RuleSet, mode: RuleMode, version: string, instance: string, lockMethod?: LockMethodView): RulesView {
  return {
    version,
    instance,
    ...(lockMethod === undefined ? {} : { lockMethod }),
    mode,
    releases: releasesText(rules),
    files: [...rules.files],
    rules: rules.rules.map((rule) => ({ name: rule.name, mode: effectiveMode(rule, mode), definition: rule.definition })),
  };
}

/** A `/rules` answer read back; throws, saying what is wrong, when it is not one. */
export function readRulesView(json: unknown): RulesView {
  const view = json as Partial<RulesView> | null;
  const modes = ['enforce', 'observe'];
  const isText = (value: unknown): value is string => typeof value === 'string';
  if (
    view === null ||
    typeof view !== 'object' ||
    !isText(view.version) ||
    !isText(view.instance) ||
    !modes.includes(view.mode as string) ||
    !isText(view.releases) ||
    !Array.isArray(view.files) ||
    !view.files.every(isText) ||
    !Array.isArray(view.rules) ||
    !view.rules.every((rule) => isText(rule?.name) && modes.includes(rule?.mode) && isText(rule?.definition))
  ) {
    throw new Error('the answer is not a list of rules as redis-lock-proxy gives it');
  }
  return view as RulesView;
}
