/**
 * A rule names the keys whose lock-style transactions the proxy rewrites.
 * Rules are data (rules/*.yaml); this is their validated, in-memory form.
 */
import type { KeyDescription } from './key-description.js';
import type { KeyLayout } from './key-layout.js';
import type { ReleaseRange } from './releases.js';

export type RuleMode = 'enforce' | 'observe';

/** What a rule does under the proxy's --mode: `observe` there makes every rule observe. */
export function effectiveMode(rule: Rule, globalMode: RuleMode): RuleMode {
  return globalMode === 'observe' ? 'observe' : rule.mode;
}

/** The only action today: apply the expiry only when the increment created the key (or it has none). */
export type RuleAction = 'expire-on-create';

export interface Rule {
  /** Unique across all loaded files; used in logs and metrics. */
  readonly name: string;
  /**
   * Raw key prefix bytes: from `prefix` as UTF-8 text or `prefix_hex`, or the leading literal
   * parts of `key`. May be empty only if `pattern` is set.
   */
  readonly prefix: Buffer;
  /** Optional regex tested against the whole key decoded as latin1 (one char per byte, binary safe). */
  readonly pattern: RegExp | undefined;
  /** The key's layout part by part (`key:`); when set, prefix comes from it and there is no pattern. */
  readonly key: KeyLayout | undefined;
  /** What a key stands for, in words (`describe:`), for `locks`. */
  readonly describe: KeyDescription | undefined;
  readonly action: RuleAction;
  readonly mode: RuleMode;
  /** Where the rule came from, for error messages and logs: "path/to/file.yaml#2" (1-based). */
  readonly source: string;
  /** The line the rule starts on in its file, for error messages. */
  readonly line: number | undefined;
  /**
   * What the rule does, as canonical text: a rule repeated word for word in several files (a lock
   * kind shared by several release lines) is loaded once; the same name meaning two things is refused.
   */
  readonly definition: string;
}

export interface RuleSet {
  readonly rules: readonly Rule[];
  /** The files that were read, in load order. */
  readonly files: readonly string[];
  /** The releases the files say they are for (their `releases:` fields), in load order. */
  readonly releases: readonly ReleaseRange[];
  /** First rule (in load order) that matches the key, or undefined. */
  match(key: Buffer): Rule | undefined;
}
