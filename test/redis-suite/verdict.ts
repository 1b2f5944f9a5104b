/**
 * What one unit's run through the proxy says, beside the same unit run
 * directly against the same server line (the baseline) and the excluded list:
 * a test is blamed on the proxy only when it failed (or never ran) through
 * the proxy, passed directly, and is not excluded.
 *
 * A test is known by its name within its unit; a unit may run a name more
 * than once (loops over encodings), so outcomes are counted per name.
 */
import { exclusionFor, type Exclusion } from './excluded.js';
import type { UnitRun } from './runtest.js';

export interface Failure {
  test: string;
  detail?: string;
}

export interface UnitVerdict {
  unit: string;
  /** Tests that passed through the proxy (each run of a name counts). */
  passed: number;
  /** Failed or missing through the proxy, passed directly, not excluded: the proxy's. */
  failed: Failure[];
  /** Failed through the proxy in one of two runs of the unit only (confirmed()): reported, not counted. */
  flaky: Failure[];
  /** Failed through the proxy and directly as well: not the proxy's. */
  failedDirectlyToo: Failure[];
  /** Excluded tests that failed through the proxy, as expected. */
  excludedFailing: Failure[];
  /** Excluded tests that passed through the proxy: the list may be hiding a fix. */
  excludedPassing: string[];
  /** The unit stopped early through the proxy (and why), when it did. */
  aborted?: string;
  /** It stopped early directly too. */
  abortedDirectly?: string;
}

interface Tally {
  ok: number;
  err: number;
  detail?: string;
}

function tally(run: UnitRun | undefined): Map<string, Tally> {
  const byName = new Map<string, Tally>();
  for (const result of run?.results ?? []) {
    const t = byName.get(result.name) ?? { ok: 0, err: 0 };
    if (result.outcome === 'ok') t.ok++;
    else {
      t.err++;
      t.detail ??= result.detail;
    }
    byName.set(result.name, t);
  }
  return byName;
}

/**
 * `direct` undefined: no baseline was run, so every failure through the proxy
 * that is not excluded is counted.
 */
export function unitVerdict(version: string, proxy: UnitRun, direct: UnitRun | undefined, excluded: Exclusion[]): UnitVerdict {
  const through = tally(proxy);
  const alone = tally(direct);
  const verdict: UnitVerdict = {
    unit: proxy.unit,
    passed: 0,
    failed: [],
    flaky: [],
    failedDirectlyToo: [],
    excludedFailing: [],
    excludedPassing: [],
    aborted: proxy.aborted,
    abortedDirectly: direct?.aborted,
  };
  const names = new Set([...through.keys(), ...alone.keys()]);
  for (const name of names) {
    const p = through.get(name) ?? { ok: 0, err: 0 };
    const d = alone.get(name);
    // Missing through the proxy: the baseline ran it more often (a unit that stopped early).
    const missing = d ? Math.max(0, d.ok + d.err - p.ok - p.err) : 0;
    const bad = p.err + missing > 0;
    verdict.passed += p.ok;
    const exclusion = exclusionFor(excluded, version, proxy.unit, name);
    const failure: Failure = {
      test: name,
      detail: p.detail ?? (missing ? 'did not run through the proxy (the unit stopped early)' : undefined),
    };
    if (exclusion) {
      if (bad) verdict.excludedFailing.push(failure);
      else verdict.excludedPassing.push(name);
    } else if (bad) {
      if (d && d.err > 0) verdict.failedDirectlyToo.push(failure);
      else verdict.failed.push(failure);
    }
  }
  // A unit that stopped early through the proxy but not directly is the proxy's, even when no
  // test it would have run is known by name (the baseline did not run either, or it stopped at once).
  if (proxy.aborted && (!direct || !direct.aborted) && verdict.failed.length === 0)
    verdict.failed.push({ test: `(the unit) ${proxy.aborted}` });
  // One that stopped before any test, directly as well, cannot run against an external server
  // here (before 7.0 the suite does not tag such units external:skip: they start servers of
  // their own). Nothing of it is the proxy's; a line that runs nothing at all fails (main.ts).
  if (proxy.aborted && direct?.aborted && proxy.results.length === 0 && direct.results.length === 0)
    verdict.failedDirectlyToo.push({ test: `(the whole unit) ${proxy.aborted}` });
  return verdict;
}

/**
 * A unit with failures through the proxy runs there once more: a failure counts only when the
 * same test fails again. One that fails in one run only is a race the run lost (the excluded
 * list names the known ones), reported as flaky so that it is seen, never dropped silently.
 * The first run's counts stand.
 */
export function confirmed(first: UnitVerdict, again: UnitVerdict): UnitVerdict {
  const failedAgain = new Set(again.failed.map((f) => f.test));
  const failedFirst = new Set(first.failed.map((f) => f.test));
  return {
    ...first,
    failed: first.failed.filter((f) => failedAgain.has(f.test)),
    flaky: [...first.failed.filter((f) => !failedAgain.has(f.test)), ...again.failed.filter((f) => !failedFirst.has(f.test))],
  };
}
