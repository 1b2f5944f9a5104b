/**
 * The lock-attempt census: every shipped Stalwart release line's lock keys, read once at start,
 * whatever rules are loaded for rewriting. `--stalwart` and `--rules` narrow what is rewritten,
 * never what is counted: a node still on an affected release whose keys the loaded rules do not
 * name (a 0.16.9 node behind a proxy started with `--stalwart 0.15.3`, say) still counts as an
 * old-shape attempt, so that the "can be removed" signal cannot read it as gone.
 */
import type { Logger } from '../log.js';
import { createRuleSet, loadRules } from './loader.js';
import { STALWART_RULES_DIR } from './stalwart.js';
import type { RuleSet } from './types.js';

/**
 * The shipped rules of every release line. Should they not read (a container whose rule
 * directory was replaced by a mount of other files), the census is what can be read, or empty:
 * attempts are then counted by the loaded rules only, and a warning says so.
 */
export function loadCensus(log: Logger, dir: string = STALWART_RULES_DIR): RuleSet {
  try {
    return loadRules([dir]);
  } catch (err) {
    log.warn(
      { path: dir, err: (err as Error).message },
      'the shipped rules cannot be read: lock attempts are counted by the loaded rules only',
    );
    return createRuleSet([], []);
  }
}

/** The rule an attempt on `key` counts under: the loaded rule that names it, else the shipped one; undefined: not a lock key. */
export function attemptRule(key: Buffer, loaded: RuleSet, census: RuleSet): string | undefined {
  return loaded.match(key)?.name ?? census.match(key)?.name;
}
