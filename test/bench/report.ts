/**
 * From raw figures to what a reader needs: medians over rounds (one slow
 * round from a noisy neighbour should not decide anything), ratios against
 * direct Redis and the peers (and, with --baseline, against another build of
 * the proxy), and a PASS/FAIL line per target of the issue.
 */
import { bypassing, MASTERS, NODES, type Routing } from './cluster.js';
import type { CpuPerRequest } from './cpu.js';
import { KEY_KINDS, STEPS, type InteractiveResult, type KeyKind, type Step } from './interactive.js';
import type { LatencyResult } from './latency.js';
import type { LockLoadResult } from './lock-load.js';
import type { MemoryProfile } from './memory-tests.js';
import { emptyMemory, memoryTargets, renderMemory, type MemoryResults } from './memory-report.js';
import { INTERACTIVE_TARGET_NAMES, LOCK_TARGET_NAMES, TARGET_NAMES, type TargetName } from './processes.js';
import { TESTS, type BenchmarkResult, type TestName } from './redis-benchmark.js';
import { table } from './table.js';

export type Pipeline = 'p1' | 'p16';
export const PIPELINES: readonly Pipeline[] = ['p1', 'p16'];
export const DEPTH: Record<Pipeline, number> = { p1: 1, p16: 16 };

/** A measurement that ran, or why it did not. */
export type Outcome<T> = { ok: true; value: T } | { ok: false; skipped: boolean; reason: string };

export type PerTarget<T> = Partial<Record<TargetName, T>>;

/** The two throughput loads, raw: one array entry per round. */
export interface LoadResults {
  passThrough: Record<Pipeline, PerTarget<BenchmarkResult[]>>;
  lock: Record<Pipeline, PerTarget<LockLoadResult[]>>;
}

/** The cluster part: direct (a real node as seed) and proxy (the proxy in cluster mode). */
export interface ClusterResults extends LoadResults {
  /** Per redis-benchmark run and target: where its connections went (cluster.ts). */
  routing: PerTarget<Routing[]>;
  /** Why the part did not run, or the error that stopped it (skipped: false); null when it ran. */
  missing: { skipped: boolean; reason: string } | null;
}

/** Every raw figure, one array entry per round. */
export interface Results extends LoadResults {
  /** The lock load with plain blocks: the same load's pass-through (lock-load.ts). */
  plain: Record<Pipeline, PerTarget<LockLoadResult[]>>;
  /** CPU per request of each hop's process during the pass-through runs (cpu.ts). */
  cpu: Record<Pipeline, PerTarget<CpuPerRequest[]>>;
  latency: PerTarget<LatencyResult[]>;
  /** The lock block sent a command at a time (interactive.ts). */
  interactive: PerTarget<InteractiveResult[]>;
  memory: MemoryResults;
  cluster: ClusterResults;
}

const emptyLoads = (): LoadResults => ({ passThrough: { p1: {}, p16: {} }, lock: { p1: {}, p16: {} } });

export function emptyResults(): Results {
  return {
    ...emptyLoads(),
    plain: { p1: {}, p16: {} },
    cpu: { p1: {}, p16: {} },
    latency: {},
    interactive: {},
    memory: emptyMemory(),
    cluster: { ...emptyLoads(), routing: {}, missing: null },
  };
}

export type BenchmarkMedian = Record<TestName, number> & { geomean: number };
export interface LatencyMedian {
  p50: number;
  p99: number;
  p999: number;
}

export type Percentiles = Pick<LatencyMedian, 'p50' | 'p99'>;
export type InteractiveMedian = { ping: Percentiles } & Record<KeyKind, Record<Step, Percentiles>>;

export interface LoadMedians {
  passThrough: Record<Pipeline, PerTarget<BenchmarkMedian>>;
  lock: Record<Pipeline, PerTarget<number>>;
}

/** µs per request, each the median over the rounds (total: the median of user + system). */
export interface CpuMedian {
  user: number;
  system: number;
  total: number;
}

export interface Medians extends LoadMedians {
  /** Requests/s of the lock load with plain blocks. */
  plain: Record<Pipeline, PerTarget<number>>;
  /** The lock load's latency under load (its requests, write to last reply). */
  lockLatency: Record<Pipeline, PerTarget<LatencyMedian>>;
  cpu: Record<Pipeline, PerTarget<CpuMedian>>;
  latency: PerTarget<LatencyMedian>;
  interactive: PerTarget<InteractiveMedian>;
  cluster: LoadMedians;
}

export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

export function geomean(values: number[]): number {
  return Math.exp(values.reduce((sum, v) => sum + Math.log(v), 0) / values.length);
}

function mapTargets<T, U>(per: PerTarget<T>, f: (value: T) => U): PerTarget<U> {
  const out: PerTarget<U> = {};
  for (const name of new Set([...TARGET_NAMES, ...LOCK_TARGET_NAMES])) {
    const value = per[name];
    if (value !== undefined) out[name] = f(value);
  }
  return out;
}

function loadMedians(results: LoadResults): LoadMedians {
  const benchmark = (runs: BenchmarkResult[]): BenchmarkMedian => {
    const m = { GET: 0, SET: 0, INCR: 0, geomean: 0 };
    for (const test of TESTS) m[test] = median(runs.map((r) => r[test]));
    m.geomean = geomean(TESTS.map((t) => m[t]));
    return m;
  };
  return {
    passThrough: {
      p1: mapTargets(results.passThrough.p1, benchmark),
      p16: mapTargets(results.passThrough.p16, benchmark),
    },
    lock: {
      p1: mapTargets(results.lock.p1, (runs) => median(runs.map((r) => r.rps))),
      p16: mapTargets(results.lock.p16, (runs) => median(runs.map((r) => r.rps))),
    },
  };
}

export function computeMedians(results: Results): Medians {
  const cpu = (runs: CpuPerRequest[]): CpuMedian => ({
    user: median(runs.map((r) => r.user)),
    system: median(runs.map((r) => r.system)),
    total: median(runs.map((r) => r.user + r.system)),
  });
  const interactive = (runs: InteractiveResult[]): InteractiveMedian => {
    const of = (pick: (r: InteractiveResult) => LatencyResult): Percentiles => ({
      p50: median(runs.map((r) => pick(r).p50)),
      p99: median(runs.map((r) => pick(r).p99)),
    });
    const steps = (kind: KeyKind) => Object.fromEntries(STEPS.map((step) => [step, of((r) => r[kind][step])])) as Record<Step, Percentiles>;
    return { ping: of((r) => r.ping), lock: steps('lock'), plain: steps('plain') };
  };
  const rps = (runs: LockLoadResult[]): number => median(runs.map((r) => r.rps));
  const lockLatency = (runs: LockLoadResult[]): LatencyMedian => ({
    p50: median(runs.map((r) => r.latency.p50)),
    p99: median(runs.map((r) => r.latency.p99)),
    p999: median(runs.map((r) => r.latency.p999)),
  });
  return {
    ...loadMedians(results),
    plain: { p1: mapTargets(results.plain.p1, rps), p16: mapTargets(results.plain.p16, rps) },
    lockLatency: { p1: mapTargets(results.lock.p1, lockLatency), p16: mapTargets(results.lock.p16, lockLatency) },
    cpu: { p1: mapTargets(results.cpu.p1, cpu), p16: mapTargets(results.cpu.p16, cpu) },
    latency: mapTargets(results.latency, (runs) => ({
      p50: median(runs.map((r) => r.p50)),
      p99: median(runs.map((r) => r.p99)),
      p999: median(runs.map((r) => r.p999)),
    })),
    interactive: mapTargets(results.interactive, interactive),
    cluster: loadMedians(results.cluster),
  };
}

// ------------------------------------------------------------------ targets

export type Status = 'PASS' | 'FAIL' | 'SKIP';

export interface Verdict {
  target: string;
  status: Status;
  /** The measured figure, in the unit of the threshold. */
  value: number | null;
  threshold: number;
  detail: string;
}

type Op = '>=' | '<=' | '<';

function check(
  target: string,
  value: number | undefined | null,
  op: Op,
  threshold: number,
  format: (v: number) => string,
  missing: string,
): Verdict {
  if (value === undefined || value === null || !Number.isFinite(value)) {
    return { target, status: 'SKIP', value: null, threshold, detail: missing };
  }
  const pass = op === '>=' ? value >= threshold : op === '<=' ? value <= threshold : value < threshold;
  return { target, status: pass ? 'PASS' : 'FAIL', value, threshold, detail: format(value) };
}

const ratioOf = (a: number | undefined, b: number | undefined): number | undefined =>
  a === undefined || b === undefined ? undefined : a / b;
const times = (v: number): string => `${v.toFixed(2)}x`;
const micros = (v: number): string => `${v >= 0 ? '+' : ''}${v.toFixed(1)} µs`;
const mib = (v: number): string => `${v.toFixed(1)} MiB`;

/** A memory test's figure, or why there is none; a test that broke is a FAIL, one not run a SKIP. */
function memoryCheck<T>(
  target: string,
  outcome: Outcome<T> | null,
  pick: (v: T) => number,
  op: Op,
  threshold: number,
  format: (v: number) => string = mib,
): Verdict {
  if (outcome === null) return check(target, null, op, threshold, format, 'not run');
  if (!outcome.ok) {
    const verdict = check(target, null, op, threshold, format, outcome.reason);
    return outcome.skipped ? verdict : { ...verdict, status: 'FAIL' };
  }
  return check(target, pick(outcome.value), op, threshold, format, '');
}

/**
 * The targets. Pass-through targets use the geometric mean of the
 * GET, SET and INCR medians (one figure per load; the table shows each).
 */
export function evaluateTargets(m: Medians, results: Results, absent: PerTarget<string>, memory: MemoryProfile): Verdict[] {
  const pt = m.passThrough;
  const geo = '(geomean GET/SET/INCR)';
  const noPeer = (peer: 'haproxy' | 'nutcracker' | 'relay'): string => absent[peer] ?? `no ${peer} figure`;
  const addedLatency = (p: keyof LatencyMedian): number | undefined =>
    m.latency.proxy && m.latency.direct ? m.latency.proxy[p] - m.latency.direct[p] : undefined;
  const proxyOver = (pipeline: Pipeline, peer: TargetName): number | undefined =>
    ratioOf(pt[pipeline].proxy?.geomean, pt[pipeline][peer]?.geomean);
  const cpuOver = (pipeline: Pipeline, peer: TargetName, part: keyof CpuMedian): number | undefined =>
    ratioOf(m.cpu[pipeline].proxy?.[part], m.cpu[pipeline][peer]?.[part]);
  const latencyOverHaproxy = (p: keyof LatencyMedian): number | undefined => ratioOf(m.latency.proxy?.[p], m.latency.haproxy?.[p]);
  // The lock blocks may cost the proxy no more, relative to direct Redis, than plain requests do.
  const lockAtPassThroughSpeed = (p: Pipeline): Verdict => {
    const lock = ratioOf(m.lock[p].proxy, m.lock[p].direct);
    const passThrough = proxyOver(p, 'direct');
    const P = p.toUpperCase();
    return check(
      `lock acquisition ${P} proxy/direct >= 0.95x pass-through ${P} proxy/direct ${geo}`,
      ratioOf(lock, passThrough),
      '>=',
      0.95,
      (v) => `${times(v)} (lock ${times(lock as number)}, pass-through ${times(passThrough as number)})`,
      'not measured',
    );
  };
  // The same, against the lock load's own pass-through: the same generator, its blocks in a shape nothing fixes.
  const lockAtPlainSpeed = (p: Pipeline): Verdict => {
    const lock = ratioOf(m.lock[p].proxy, m.lock[p].direct);
    const plain = ratioOf(m.plain[p].proxy, m.plain[p].direct);
    const P = p.toUpperCase();
    return check(
      `lock acquisition ${P} proxy/direct >= 0.95x the same load's with plain blocks ${P} proxy/direct`,
      ratioOf(lock, plain),
      '>=',
      0.95,
      (v) => `${times(v)} (lock ${times(lock as number)}, plain ${times(plain as number)})`,
      'not measured',
    );
  };
  const underLoadOverHaproxy = ratioOf(m.lockLatency.p16.proxy?.p99, m.lockLatency.p16.haproxy?.p99);
  // Each step of a transaction sent a command at a time against a PING on the same connection, in the same run.
  const interactiveSteps = (kind: KeyKind): Verdict => {
    const proxy = m.interactive.proxy;
    const slowest = proxy && STEPS.reduce((a, b) => (proxy[kind][b].p50 > proxy[kind][a].p50 ? b : a));
    return check(
      `interactive transaction, ${kind} key: each step's p50 via proxy <= 1.2x the proxy's PING p50`,
      proxy && slowest ? proxy[kind][slowest].p50 / proxy.ping.p50 : undefined,
      '<=',
      1.2,
      (v) => `${times(v)} (slowest step: ${slowest})`,
      'not measured',
    );
  };
  const noBaseline = 'no --baseline (the build before the change)';
  const mem = memoryTargets(results.memory, memory);
  const churnWithin = mem.churnHwm?.ok
    ? check(
        `churn VmHWM <= 1.2x (a fresh proxy + ${memory.churnConcurrency} connections' cost) = ${mem.churnHwm.value.allowed.toFixed(1)} MiB`,
        mem.churnHwm.value.hwm,
        '<=',
        mem.churnHwm.value.allowed,
        mib,
        '',
      )
    : memoryCheck('churn VmHWM <= 1.2x (a fresh proxy + the open connections)', mem.churnHwm, () => Number.NaN, '<=', Number.NaN);
  return [
    check(`pass-through P16 >= 0.9x HAProxy ${geo}`, proxyOver('p16', 'haproxy'), '>=', 0.9, times, noPeer('haproxy')),
    check(`pass-through P16 >= 1.5x nutcracker ${geo}`, proxyOver('p16', 'nutcracker'), '>=', 1.5, times, noPeer('nutcracker')),
    check(`pass-through P1 >= 0.7x nutcracker ${geo}`, proxyOver('p1', 'nutcracker'), '>=', 0.7, times, noPeer('nutcracker')),
    check('lock acquisition P1 via proxy >= 0.9x direct', ratioOf(m.lock.p1.proxy, m.lock.p1.direct), '>=', 0.9, times, 'not measured'),
    check('lock acquisition P16 via proxy >= 0.9x direct', ratioOf(m.lock.p16.proxy, m.lock.p16.direct), '>=', 0.9, times, 'not measured'),
    ...PIPELINES.map(lockAtPassThroughSpeed),
    ...PIPELINES.map(lockAtPlainSpeed),
    check('added latency p50 <= 60 µs', addedLatency('p50'), '<=', 60, micros, 'not measured'),
    check('added latency p99 <= 250 µs', addedLatency('p99'), '<=', 250, micros, 'not measured'),
    check("latency p50 (PING/GET) via proxy <= HAProxy's", latencyOverHaproxy('p50'), '<=', 1, times, noPeer('haproxy')),
    check("latency p99 (PING/GET) via proxy <= 1.2x HAProxy's", latencyOverHaproxy('p99'), '<=', 1.2, times, noPeer('haproxy')),
    check("latency under load (lock load P16) p99 via proxy <= 1.2x HAProxy's", underLoadOverHaproxy, '<=', 1.2, times, noPeer('haproxy')),
    ...KEY_KINDS.map(interactiveSteps),
    memoryCheck('RSS <= 135 MiB with 5,000 idle connections (VmHWM)', mem.idleHwm, (v) => v, '<=', 135),
    memoryCheck('RSS growth < 64 MiB streaming 256 MiB to a slow reader', mem.streamGrowth, (v) => v, '<', 64),
    memoryCheck('RSS growth < 64 MiB with 20 slow readers of 8 MiB', mem.readersGrowth, (v) => v, '<', 64),
    churnWithin,
    memoryCheck(`churn VmHWM <= 150 MiB at ${memory.churnConcurrency} connections at a time`, mem.churnHwm, (v) => v.hwm, '<=', 150),
    memoryCheck('V8 heap after the churn settled <= 1.1x before', mem.heapAfterChurn, (v) => v, '<=', 1.1, times),
    memoryCheck(
      'all at once (churn, 5,000 idle, 20 slow readers) VmHWM <= 256 MiB (the Kubernetes example limit)',
      mem.allAtOnceHwm,
      (v) => v,
      '<=',
      256,
    ),
    check('CPU per request P1 (user + system) <= 1.15x HAProxy', cpuOver('p1', 'haproxy', 'total'), '<=', 1.15, times, noPeer('haproxy')),
    check('CPU per request P16 (user + system) <= 1.3x HAProxy', cpuOver('p16', 'haproxy', 'total'), '<=', 1.3, times, noPeer('haproxy')),
    check(
      'CPU per request P1 (user + system) <= 1.05x the bare Node relay',
      cpuOver('p1', 'relay', 'total'),
      '<=',
      1.05,
      times,
      noPeer('relay'),
    ),
    check(
      'CPU per request P16 (user + system) <= 1.05x the bare Node relay',
      cpuOver('p16', 'relay', 'total'),
      '<=',
      1.05,
      times,
      noPeer('relay'),
    ),
    check('user CPU per request P1 <= 0.5x baseline', cpuOver('p1', 'baseline', 'user'), '<=', 0.5, times, noBaseline),
    check('user CPU per request P16 <= 0.5x baseline', cpuOver('p16', 'baseline', 'user'), '<=', 0.5, times, noBaseline),
  ];
}

// ------------------------------------------------------------------ printing

const int = (v: number): string => Math.round(v).toLocaleString('en-US');
const fixed = (digits: number) => (v: number) => v.toFixed(digits);

/** One row per pipeline and test (GET, SET, INCR, geomean), made by `row` from each target's median. */
function perTest(
  medians: LoadMedians['passThrough'],
  row: (label: string, v: (name: TargetName) => number | undefined) => string[],
): string[][] {
  return PIPELINES.flatMap((p) =>
    [...TESTS, 'geomean' as const].map((test) => row(`${p.toUpperCase()} ${test}`, (name) => medians[p][name]?.[test])),
  );
}

const errorReplies = (results: LoadResults): number =>
  PIPELINES.flatMap((p) => Object.values(results.lock[p]).flat()).reduce((s, r) => s + r.errors, 0);

export interface ReportContext {
  rounds: number;
  clients: number;
  lockConnections: number;
  latencyRoundTrips: number;
  /** Timed transactions per key and target of the interactive transaction. */
  interactiveTransactions: number;
  memory: MemoryProfile;
  /** redis-benchmark -n of the cluster part. */
  clusterRequests: Record<Pipeline, number>;
  /** Why a peer column is empty, e.g. "haproxy not installed". */
  absent: PerTarget<string>;
  /** The checkout behind the 'baseline' target; null: no --baseline, and no baseline column. */
  baseline: { dir: string; revision: string | null } | null;
}

/**
 * The target columns of a table: 'baseline' only in a run with --baseline,
 * so that a run without one prints exactly as before.
 */
function targetColumns(names: readonly TargetName[], ctx: ReportContext): TargetName[] {
  return names.filter((name) => name !== 'baseline' || ctx.baseline !== null);
}

export function renderReport(results: Results, m: Medians, verdicts: Verdict[], ctx: ReportContext): string {
  const cell = (name: TargetName, value: number | undefined, format: (v: number) => string, none = 'n/a'): string =>
    value !== undefined ? format(value) : ctx.absent[name] ? 'absent' : none;
  const ratio = (a: number | undefined, b: number | undefined): string => {
    const r = ratioOf(a, b);
    return r === undefined ? '-' : r.toFixed(2);
  };
  // The proxy/baseline column, last of the ratios; without --baseline neither it nor the baseline column is there.
  const vsBaseline = ctx.baseline === null ? [] : ['proxy/baseline'];
  const baselineRatio = (proxy: number | undefined, baseline: number | undefined): string[] =>
    ctx.baseline === null ? [] : [ratio(proxy, baseline)];
  const targets = targetColumns(TARGET_NAMES, ctx);
  const lockTargets = targetColumns(LOCK_TARGET_NAMES, ctx);
  const interactiveTargets = targetColumns(INTERACTIVE_TARGET_NAMES, ctx);
  const rounds = `median of ${ctx.rounds} round${ctx.rounds === 1 ? '' : 's'}`;
  const out: string[] = [];

  if (ctx.baseline !== null) {
    const { dir, revision } = ctx.baseline;
    out.push(`Baseline: the proxy built in ${dir} (${revision ?? 'not a git checkout'}), started like proxy, in every round with it`);
    out.push('  (proxy/baseline above 1: the proxy under test is faster; in the latency table, slower)');
    out.push('');
  }

  out.push(`Pass-through: redis-benchmark, ${ctx.clients} clients, requests/s, ${rounds}`);
  const ptRows = perTest(m.passThrough, (label, v) => [
    label,
    ...targets.map((name) => cell(name, v(name), int)),
    ratio(v('proxy'), v('direct')),
    ratio(v('proxy'), v('haproxy')),
    ratio(v('proxy'), v('nutcracker')),
    ...baselineRatio(v('proxy'), v('baseline')),
  ]);
  out.push(table(['load', ...targets, 'proxy/direct', 'proxy/haproxy', 'proxy/nutcracker', ...vsBaseline], ptRows));

  out.push('');
  out.push(...renderCpu(results, m, ctx, rounds));

  out.push('');
  out.push(
    `Lock acquisition: ${ctx.lockConnections} connections, 1 request in 5 a Stalwart lock block (counted as 1), requests/s, ${rounds}`,
  );
  out.push(
    '  (direct runs the block as sent; the proxy sends it with NX inside the transaction; script: the proxy with --lock-method script;',
  );
  out.push('   nutcracker does not support MULTI; plain: the same load, each block PING / INCRBY k 1 / EXPIRE k 3600 / PING on a');
  out.push("   key no rule names, the lock load's own pass-through; relay: the bare Node relay)");
  const lockRow = (label: string, v: (name: TargetName) => number | undefined, none: string): string[] => [
    label,
    ...lockTargets.map((name) => cell(name, v(name), int, none)),
    ratio(v('proxy'), v('direct')),
    ratio(v('script'), v('direct')),
    ratio(v('proxy'), v('haproxy')),
    ratio(v('proxy'), v('relay')),
    ...baselineRatio(v('proxy'), v('baseline')),
  ];
  out.push(
    table(
      ['load', ...lockTargets, 'proxy/direct', 'script/direct', 'proxy/haproxy', 'proxy/relay', ...vsBaseline],
      [
        ...PIPELINES.map((p) => lockRow(`lock ${p.toUpperCase()}`, (name) => m.lock[p][name], 'n/a')),
        ...PIPELINES.map((p) => lockRow(`plain ${p.toUpperCase()}`, (name) => m.plain[p][name], '-')),
      ],
    ),
  );
  const lockErrors = errorReplies(results);
  if (lockErrors > 0) out.push(`  WARNING: ${lockErrors} error replies during the lock loads`);

  out.push('');
  out.push(
    `Latency under load: the lock load's requests above, each from its write to its last reply (a lock block's 4), µs, ${rounds}`,
    `  (${ctx.lockConnections} connections; at P16 a request waits behind the 15 before it on its connection)`,
  );
  const underLoadRows = PIPELINES.flatMap((p) =>
    (['p50', 'p99', 'p999'] as const).map((q) => {
      const v = (name: TargetName): number | undefined => m.lockLatency[p][name]?.[q];
      return [
        `${p.toUpperCase()} ${q === 'p999' ? 'p99.9' : q}`,
        ...lockTargets.map((name) => cell(name, v(name), int)),
        ratio(v('proxy'), v('haproxy')),
        ratio(v('proxy'), v('relay')),
        ...baselineRatio(v('proxy'), v('baseline')),
      ];
    }),
  );
  out.push(table(['load', ...lockTargets, 'proxy/haproxy', 'proxy/relay', ...vsBaseline], underLoadRows));

  out.push('');
  out.push(
    `Latency: 1 connection per target, pipeline 1, PING/GET, ${int(ctx.latencyRoundTrips)} round trips each, ` +
      `interleaved over the targets, µs, ${rounds}`,
  );
  const latencyRows = (['p50', 'p99', 'p999'] as const).map((p) => {
    const v = (name: TargetName): number | undefined => m.latency[name]?.[p];
    const proxy = v('proxy');
    const direct = v('direct');
    return [
      p === 'p999' ? 'p99.9' : p,
      ...targets.map((name) => cell(name, v(name), fixed(1))),
      proxy !== undefined && direct !== undefined ? micros(proxy - direct).replace(' µs', '') : '-',
      ...baselineRatio(proxy, v('baseline')),
    ];
  });
  out.push(table(['percentile', ...targets, 'added (proxy-direct)', ...vsBaseline], latencyRows));

  out.push('');
  out.push(
    'Interactive transaction: 1 connection per target, MULTI / INCRBY k 1 / EXPIRE k 600 / EXEC, each sent after the reply',
    `  to the one before, and a PING before each; ${int(ctx.interactiveTransactions)} transactions per key and target, in turns`,
    `  interleaved over the targets, µs per round trip, ${rounds}`,
    '  (lock: 0x17 + a task id u64 BE, which the shipped rule stalwart-task-lock names; plain: a key no rule names;',
    "   proxy/PING: the proxy's figure over its own PING's; no script: it holds each MULTI for --hold-ms to send the block whole)",
  );
  const roundTrips: Array<[string, (x: InteractiveMedian) => Percentiles]> = [
    ['PING', (x) => x.ping],
    ...KEY_KINDS.flatMap((kind) =>
      STEPS.map((step): [string, (x: InteractiveMedian) => Percentiles] => [`${kind} ${step}`, (x) => x[kind][step]]),
    ),
  ];
  const interactiveRows = roundTrips.flatMap(([label, pick]) =>
    (['p50', 'p99'] as const).map((p) => {
      const v = (name: TargetName): number | undefined => {
        const x = m.interactive[name];
        return x === undefined ? undefined : pick(x)[p];
      };
      const proxy = v('proxy');
      const direct = v('direct');
      return [
        `${label} ${p}`,
        ...interactiveTargets.map((name) => cell(name, v(name), fixed(1))),
        proxy !== undefined && direct !== undefined ? micros(proxy - direct).replace(' µs', '') : '-',
        label === 'PING' ? '-' : ratio(proxy, m.interactive.proxy?.ping[p]),
        ...baselineRatio(proxy, v('baseline')),
      ];
    }),
  );
  out.push(table(['round trip', ...interactiveTargets, 'added (proxy-direct)', 'proxy/PING', ...vsBaseline], interactiveRows));

  out.push('');
  out.push(...renderMemory(results.memory, ctx.memory, ctx.absent));

  out.push('');
  out.push(...renderCluster(results.cluster, m.cluster, ctx, rounds));

  out.push('');
  out.push('Targets');
  const width = Math.max(...verdicts.map((v) => v.target.length));
  for (const v of verdicts) out.push(`  ${v.status.padEnd(4)}  ${v.target.padEnd(width)}  ${v.detail}`);
  return out.join('\n');
}

const cpuFigure = (v: number): string => v.toFixed(v < 1 ? 3 : 2);

/**
 * CPU per request of each hop's process (every target but direct) during the pass-through runs,
 * as ratios to HAProxy's; with --baseline, also against the build before; with the relay, what the
 * proxy costs above a bare Node relay.
 */
function renderCpu(results: Results, m: Medians, ctx: ReportContext, rounds: string): string[] {
  const hops = targetColumns(TARGET_NAMES, ctx).filter((name) => name !== 'direct');
  const measured = PIPELINES.flatMap((p) => Object.values(results.cpu[p]).flat());
  const least = measured.length > 0 ? Math.min(...measured.map((r) => r.seconds)) : 0;
  const out = [
    `CPU per request of each hop's process, µs, over the pass-through runs (GET, SET and INCR together), ${rounds}`,
    '  (utime and stime of /proc/<pid>/stat, all threads, read before and after each redis-benchmark run and divided by',
    `   its requests; they count in 10 ms ticks, and the kernel splits user from system by sampling at its timer tick,`,
    `   so a figure made from S seconds of CPU is good to about 10 ms / S: the least here was ${least.toFixed(1)} s)`,
  ];
  const peers = hops.filter((name) => name !== 'haproxy');
  const overHaproxy = peers.map((name) => `${name}/haproxy`);
  const vsBaseline = ctx.baseline === null ? [] : ['proxy/baseline'];
  const vsRelay = ctx.absent.relay === undefined ? ['proxy-relay'] : [];
  const rows = PIPELINES.flatMap((p) =>
    (['user', 'system', 'total'] as const).map((part) => {
      const v = (name: TargetName): number | undefined => m.cpu[p][name]?.[part];
      const ratio = (a: number | undefined, b: number | undefined): string => {
        const r = ratioOf(a, b);
        return r === undefined ? '-' : r.toFixed(2);
      };
      const proxy = v('proxy');
      const relay = v('relay');
      return [
        `${p.toUpperCase()} ${part}`,
        ...hops.map((name) => (v(name) !== undefined ? cpuFigure(v(name) as number) : ctx.absent[name] ? 'absent' : 'n/a')),
        ...peers.map((name) => ratio(v(name), v('haproxy'))),
        ...(ctx.baseline === null ? [] : [ratio(proxy, v('baseline'))]),
        ...(vsRelay.length === 0 ? [] : [proxy !== undefined && relay !== undefined ? cpuFigure(proxy - relay) : '-']),
      ];
    }),
  );
  out.push(table(['load', ...hops, ...overHaproxy, ...vsBaseline, ...vsRelay], rows));
  return out;
}

/** redis-benchmark runs a thread per master with --cluster, and a threaded run checks for the end of a test this often. */
const CLUSTER_TICK_SECONDS = 0.25;

/**
 * The cluster table: direct and through the proxy, the ratio, and below it
 * the routing check, which says whether redis-benchmark's connections really
 * went through the proxy in the proxy runs (and that the check would have
 * seen otherwise: in the direct runs they do not).
 */
function renderCluster(c: ClusterResults, m: LoadMedians, ctx: ReportContext, rounds: string): string[] {
  const out = [`Cluster: ${MASTERS} masters + ${MASTERS} replicas on this machine, requests/s, ${rounds}`];
  if (c.missing?.skipped) return [...out, `  skipped: ${c.missing.reason}`];
  out.push(
    `  (redis-benchmark --cluster, ${ctx.clients} clients: direct is seeded with a master, proxy with the --listen port of`,
    "   the proxy in cluster mode; lock: the lock load, each connection to the master, or the proxy's listener for the",
    `   master, that serves its keys, ${ctx.lockConnections} connections)`,
  );
  if (c.missing) out.push(`  FAILED: ${c.missing.reason} (all of it in the bench's log, on stderr)`);
  const measured = PIPELINES.some((p) => Object.keys(c.passThrough[p]).length + Object.keys(c.lock[p]).length > 0);
  if (!measured) return out;
  const figure = (v: number | undefined): string => (v === undefined ? 'n/a' : int(v));
  const ratio = (v: (name: TargetName) => number | undefined): string => {
    const r = ratioOf(v('proxy'), v('direct'));
    return r === undefined ? '-' : r.toFixed(2);
  };
  const row = (label: string, v: (name: TargetName) => number | undefined): string[] => [
    label,
    figure(v('direct')),
    figure(v('proxy')),
    ratio(v),
  ];
  const rows = [...perTest(m.passThrough, row), ...PIPELINES.map((p) => row(`lock ${p.toUpperCase()}`, (name) => m.lock[p][name]))];
  out.push(table(['load', 'direct', 'proxy', 'proxy/direct'], rows));
  const lockErrors = errorReplies(c);
  if (lockErrors > 0) out.push(`  WARNING: ${lockErrors} error replies during the cluster lock loads`);
  const seconds = PIPELINES.flatMap((p) =>
    Object.values(c.passThrough[p]).flatMap((runs) => runs.flatMap((r) => TESTS.map((t) => ctx.clusterRequests[p] / r[t]))),
  );
  if (seconds.length > 0) {
    // n / rps: the time redis-benchmark counted, the wait for the tick included.
    const shortest = Math.min(...seconds);
    const share = Math.min(100, (100 * CLUSTER_TICK_SECONDS) / shortest);
    out.push(
      `  redis-benchmark --cluster sees a test end only on a ${CLUSTER_TICK_SECONDS * 1000} ms tick, so its figures read low: the shortest`,
      `  test took ${shortest.toFixed(2)} s, up to ${share.toFixed(0)}% of it that wait (more requests make it less: --requests-p1, --requests-p16)`,
    );
  }

  const total = (runs: Routing[] | undefined, f: (r: Routing) => number): string => int((runs ?? []).reduce((s, r) => s + f(r), 0));
  const { proxy, direct } = c.routing;
  if (proxy === undefined || direct === undefined) return out;
  out.push(
    `  Routing over the redis-benchmark runs (INFO total_connections_received of all ${NODES} nodes, against the proxy's /metrics):`,
    `    through the proxy: ${total(proxy, (r) => r.proxyClients)} client connections to the proxy; the nodes accepted ` +
      `${total(proxy, (r) => r.atNodes)}, ${total(proxy, bypassing)} of them not opened by the proxy`,
    `    direct:            the nodes accepted ${total(direct, (r) => r.atNodes)}, ${total(direct, bypassing)} of them not opened by the proxy`,
  );
  const bypassed = proxy.reduce((s, r) => s + bypassing(r), 0);
  if (bypassed > 0)
    out.push(`  WARNING: ${bypassed} connections reached the nodes around the proxy in the proxy runs: those figures are not the proxy's`);
  return out;
}
