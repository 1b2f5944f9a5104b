/**
 * When can the proxy go? It sees every lock attempt: the old shape (MULTI / INCRBY / EXPIRE /
 * EXEC, which it rewrites where a rule says so) and the fixed one (SET key value NX EX n, from
 * Stalwart 0.16.16 on, which it leaves alone), on the keys of the loaded rules and of every
 * shipped release line (rules/census.ts), whatever the rules loaded for rewriting. Every
 * --lock-attempt-report-ms (an hour by default) it logs one line saying which of three things
 * that period showed:
 *
 * - old-shape attempts: nodes of an affected release still send them through the proxy;
 * - no lock attempt at all: nothing to tell from (an idle period, or nodes that bypass the proxy);
 * - fixed-shape attempts only: every node that goes through the proxy runs a fixed release.
 *
 * Only the last one says the proxy can go, once it has held for a day.
 */
import type { Logger } from '../log.js';
import type { Stats } from '../stats.js';

interface Totals {
  oldShape: number;
  fixedShape: number;
}

/** What a period showed, and the line that says so. */
export type PeriodVerdict = 'old-shape-seen' | 'no-lock-traffic' | 'fixed-shape-only';

export const REPORT_MESSAGES: Record<PeriodVerdict, string> = {
  'old-shape-seen': 'old-shape lock attempts (MULTI/INCRBY/EXPIRE/EXEC) seen: nodes of an affected release still run',
  'no-lock-traffic':
    'no lock attempt seen at all: no sign either way (an idle period, or nodes that do not go through the proxy); not a reason to remove it',
  'fixed-shape-only':
    'only fixed-shape lock attempts (SET NX EX) seen, no old-shape one: every node going through the proxy runs a fixed release',
};

export function verdictOf(totals: Totals): PeriodVerdict {
  if (totals.oldShape > 0) return 'old-shape-seen';
  return totals.fixedShape > 0 ? 'fixed-shape-only' : 'no-lock-traffic';
}

/** Starts the periodic report; returns what stops it. */
export function startAttemptReport(stats: Stats, log: Logger, intervalMs: number): () => void {
  let last = perRule(stats);
  const timer = setInterval(() => {
    const now = perRule(stats);
    const rules: Record<string, Totals> = {};
    const sum: Totals = { oldShape: 0, fixedShape: 0 };
    for (const [rule, totals] of now) {
      const before = last.get(rule) ?? { oldShape: 0, fixedShape: 0 };
      const delta = { oldShape: totals.oldShape - before.oldShape, fixedShape: totals.fixedShape - before.fixedShape };
      if (delta.oldShape === 0 && delta.fixedShape === 0) continue;
      rules[rule] = delta;
      sum.oldShape += delta.oldShape;
      sum.fixedShape += delta.fixedShape;
    }
    last = now;
    const verdict = verdictOf(sum);
    log.info({ periodMs: intervalMs, verdict, oldShape: sum.oldShape, fixedShape: sum.fixedShape, rules }, REPORT_MESSAGES[verdict]);
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}

function perRule(stats: Stats): Map<string, Totals> {
  const totals = new Map<string, Totals>();
  for (const [rule, counts] of stats.attempts) totals.set(rule, { oldShape: counts.oldShape, fixedShape: counts.fixedShape });
  return totals;
}
