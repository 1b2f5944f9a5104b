/**
 * `verify`: which rules it checks, and what it can say when one is not fixed.
 *
 * - The running proxy's rules, when its admin endpoint lists them (proxy-rules.ts): without
 *   `--rules` or `--stalwart`, every rule the proxy enforces; with them, the rules they name, each
 *   of which the proxy must enforce (a proxy started with `--stalwart 0.15.3` does not protect a
 *   0.16 node, and verify says so before touching anything). A rule's keys are built from its
 *   definition, read from verify's rule files (`--rules`, REDIS_LOCK_PROXY_RULES, the shipped
 *   ones) or else from the files the proxy names.
 * - Where the proxy cannot be asked, the rules verify reads itself, as before; and a failure then
 *   says what verify could not know, rather than that the traffic bypasses the proxy.
 *
 * An admin endpoint that belongs to another proxy than the one at --via (it did not see this run's
 * connection) is never asked to select: verify.ts fails before.
 */
import type { RuleChoice } from '../config.js';
import { problemsFrom } from '../errors.js';
import { createRuleSet, loadRules } from '../rules/loader.js';
import { releasesText } from '../rules/store.js';
import type { Rule, RuleSet } from '../rules/types.js';
import type { ProxyRules } from './proxy-rules.js';
import { isFixedKey } from './verify-scratch.js';

export interface RuleSelection {
  /** The rules in match order, for scratch keys that no earlier rule takes. */
  readonly rules: RuleSet;
  /** Verified: enforce-mode rules with a scratch key to take. */
  readonly enforce: readonly Rule[];
  /** Listed, not verified: rules that only observe. */
  readonly observe: readonly string[];
  /** Listed, never touched: enforce rules whose only key is a live lock. */
  readonly untouched: readonly Rule[];
  /** The releases the rules are for, for the OK line. */
  readonly releases: string;
  /** Where the rules came from, when it was the proxy. */
  readonly from: string | undefined;
  /** What a second attempt that re-armed its expiry means, given what verify knows of the proxy's rules. */
  readonly rearmed: (via: string) => string;
  /** Set when the check cannot start: why. */
  readonly failure?: string;
}

/**
 * `choice`: verify's rule files and release; `scoped`: whether they were asked for (the --rules
 * flag, or --stalwart), rather than inherited from the proxy's variables.
 */
export function selectRules(choice: RuleChoice, scoped: boolean, proxy: Exclude<ProxyRules, { kind: 'elsewhere' }>): RuleSelection {
  if (proxy.kind === 'unknown') return ownRules(loadRules(choice.paths, choice.release), unknownRearmed(proxy.reason));
  const { view, where } = proxy;
  const rearmed = () =>
    `the proxy whose admin endpoint is ${where} enforces this rule, and this run's connection went through it, yet the ` +
    'block went to Redis unchanged: its log says why (the line on this block, marked verify: true)';
  const enforced = new Map(view.rules.filter((r) => r.mode === 'enforce').map((r) => [r.name, r.definition]));
  const proxyNote = `the running proxy (admin endpoint ${where}) runs mode ${view.mode} with rules for ${view.releases || 'no named release'}`;

  if (scoped) {
    const rules = loadRules(choice.paths, choice.release);
    const wanted = rules.rules.filter((rule) => rule.mode === 'enforce');
    const missing = wanted.filter((rule) => enforced.get(rule.name) !== rule.definition);
    const selection = ownRules(rules, rearmed);
    if (missing.length === 0) return selection;
    return { ...selection, failure: `${proxyNote}; it does not enforce ${missing.map((r) => r.name).join(', ')}` };
  }

  // The proxy's own rules: their definitions from verify's files, else from the proxy's (each on
  // its own: one that cannot be read here takes none of the others with it).
  const known = new Map<string, Rule>();
  for (const source of [choice.paths, ...view.files.map((file) => [file])]) {
    const unmet = view.rules.filter((r) => known.get(r.name)?.definition !== r.definition);
    if (unmet.length === 0) break;
    let read: RuleSet | undefined;
    problemsFrom([() => (read = loadRules(source))]);
    for (const rule of read?.rules ?? []) {
      if (unmet.some((r) => r.name === rule.name && r.definition === rule.definition)) known.set(rule.name, rule);
    }
  }
  const resolved = view.rules.flatMap((r) => {
    const rule = known.get(r.name);
    return rule !== undefined && rule.definition === r.definition ? [rule] : [];
  });
  const enforce = resolved.filter((rule) => enforced.has(rule.name) && !isFixedKey(rule.key));
  const unbuilt = view.rules.filter((r) => r.mode === 'enforce' && !resolved.some((rule) => rule.name === r.name));
  const selection: RuleSelection = {
    rules: createRuleSet(resolved, view.files),
    enforce,
    observe: view.rules.filter((r) => r.mode === 'observe').map((r) => r.name),
    untouched: resolved.filter((rule) => enforced.has(rule.name) && isFixedKey(rule.key)),
    releases: view.releases,
    from: `the proxy's rules, from its admin endpoint ${where}`,
    rearmed,
  };
  if (unbuilt.length === 0) return selection;
  return {
    ...selection,
    failure:
      `${proxyNote}, and enforces ${unbuilt.map((r) => r.name).join(', ')}, whose keys verify cannot build: their definitions ` +
      `are neither in ${choice.paths.join(', ')} nor readable in the proxy's files here (give verify the proxy's --rules)`,
  };
}

/** The rules verify read itself, as they say. */
function ownRules(rules: RuleSet, rearmed: (via: string) => string): RuleSelection {
  // A fixed key is a live lock: verify never takes it, even for a moment.
  const untouched = rules.rules.filter((rule) => rule.mode === 'enforce' && isFixedKey(rule.key));
  return {
    rules,
    enforce: rules.rules.filter((rule) => rule.mode === 'enforce' && !untouched.includes(rule)),
    observe: rules.rules.filter((rule) => rule.mode === 'observe').map((rule) => rule.name),
    untouched,
    releases: releasesText(rules),
    from: undefined,
    rearmed,
  };
}

/** What a re-armed expiry means when verify could not learn the proxy's rules: two causes, and why it cannot tell them apart. */
function unknownRearmed(reason: string): (via: string) => string {
  return (via) =>
    `the fix did not apply to this rule's keys at ${via}: either the client does not go through redis-lock-proxy there, or the ` +
    `proxy does not load this rule in enforce mode (its --stalwart, --rules or --mode), and verify could not ask it which ` +
    `rules it runs: ${reason} (give --admin HOST:PORT, or the proxy's --stalwart and --rules)`;
}
