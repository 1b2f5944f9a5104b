/**
 * When can the proxy go? It sees every lock attempt: the old shape (MULTI / INCRBY / EXPIRE /
 * EXEC, which it rewrites) and the fixed one (SET key value NX EX n, from Stalwart 0.16.16 on,
 * which it leaves alone). Every --lock-attempt-report-ms (an hour by default) it logs one line
 * saying whether any old-shape attempt came in that time: once no old-shape attempt has come for
 * a day, every node runs a fixed release and the proxy can be removed.
 */
import type { Logger } from '../log.js';
import type { Stats } from '../stats.js';

interface Totals {
  oldShape: number;
  fixedShape: number;
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
    const message =
      sum.oldShape > 0
        ? 'old-shape lock attempts (MULTI/INCRBY/EXPIRE/EXEC) seen: nodes of an affected release still run'
        : 'no old-shape lock attempt (MULTI/INCRBY/EXPIRE/EXEC) seen';
    log.info({ periodMs: intervalMs, oldShape: sum.oldShape, fixedShape: sum.fixedShape, rules }, message);
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}

function perRule(stats: Stats): Map<string, Totals> {
  const totals = new Map<string, Totals>();
  for (const [rule, counts] of stats.byRule) totals.set(rule, { oldShape: counts.seen, fixedShape: counts.fixedShape });
  return totals;
}
