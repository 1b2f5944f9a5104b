/**
 * The memory part of the report: one table, a row per figure and a column per hop (the proxy,
 * the baseline build, HAProxy) with the proxy's ratios to the others, and the memory targets.
 */
import type { ChurnMemory, HopMemory, MemoryProfile } from './memory-tests.js';
import type { ProcMemory } from './memory.js';
import type { TargetName } from './processes.js';
import type { Outcome, PerTarget } from './report.js';
import { table } from './table.js';

export interface MemoryResults {
  /** The load proxy after all rounds: how much the loads themselves took. */
  afterLoads: ProcMemory | null;
  hops: PerTarget<HopMemory>;
}

export const emptyMemory = (): MemoryResults => ({ afterLoads: null, hops: {} });

const HOPS: readonly TargetName[] = ['proxy', 'baseline', 'haproxy'];
const KiB = 1024;

/** A figure of one hop, or undefined where the test did not run or broke. */
type Pick = (hop: HopMemory) => number | undefined;

const value = <T>(outcome: Outcome<T> | undefined, pick: (v: T) => number | undefined): number | undefined =>
  outcome?.ok ? pick(outcome.value) : undefined;

/** MiB one idle connection (and its upstream connection) costs: the RSS they added, per connection. */
export const perIdleConnectionKiB: Pick = (h) => value(h.idle, (v) => ((v.after.rss - v.before.rss) * KiB) / v.connections);

const ROWS: ReadonlyArray<[string, Pick, (v: number) => string]> = [
  ['fresh process: VmRSS (MiB)', (h) => value(h.idle, (v) => v.before.rss) ?? value(h.churn, (v) => v.before.rss), mib],
  ['idle connections: VmHWM (MiB)', (h) => value(h.idle, (v) => v.after.hwm), mib],
  ['  per idle connection (KiB of VmRSS)', perIdleConnectionKiB, fixed1],
  ['one slow reader of a large value: growth (MiB)', (h) => value(h.stream, (v) => v.growth), mib],
  ['slow readers of multi-MiB values at once: growth (MiB)', (h) => value(h.readers, (v) => v.growth), mib],
  ['churn: VmHWM (MiB)', (h) => value(h.churn, (v) => v.after.hwm), mib],
  ['  connections per second', (h) => value(h.churn, (v) => v.perSecond), (v) => Math.round(v).toLocaleString('en-US')],
  ['  VmRSS after it settled (MiB)', (h) => value(h.churn, (v) => v.settled.rss), mib],
  ['  V8 heap used before (MiB)', (h) => value(h.churn, (v) => v.heapBefore), mib],
  ['  V8 heap used after it settled (MiB)', (h) => value(h.churn, (v) => v.heapAfter), mib],
  ['all at once: VmHWM (MiB)', (h) => value(h.allAtOnce, (v) => v.after.hwm), mib],
];

function mib(v: number): string {
  return v.toFixed(1);
}

function fixed1(v: number): string {
  return v.toFixed(1);
}

/** The table, and under it why a hop's test did not run. */
export function renderMemory(memory: MemoryResults, profile: MemoryProfile, absent: PerTarget<string>): string[] {
  const hops = HOPS.filter((name) => memory.hops[name] !== undefined || (name === 'haproxy' && absent.haproxy));
  const ratios = hops.filter((name) => name !== 'proxy').map((name) => `proxy/${name}`);
  const { readers, stream } = profile;
  const out = [
    'Memory of each hop (/proc/<pid>/status), a fresh process for each test: ' +
      `${profile.idleConnections.toLocaleString('en-US')} idle connections; one reader of ${stream.valueBytes / (1024 * 1024)} MiB at ` +
      `${stream.bytesPerSecond / (1024 * 1024)} MiB/s; ${readers.readers} readers of ${readers.valueBytes / (1024 * 1024)} MiB at ` +
      `${readers.bytesPerSecond / (1024 * 1024)} MiB/s each; churn of ${profile.churnConcurrency} connections at a time for ` +
      `${profile.churnSeconds} s (six kinds: QUIT, protocol error, lock block, SUBSCRIBE+RESET, HELLO 3, half a block); ` +
      `all at once: churn ${profile.allAtOnceSeconds} s + the idle connections + the readers`,
  ];
  if (memory.afterLoads)
    out.push(`  load proxy after all rounds: VmHWM ${mib(memory.afterLoads.hwm)} MiB, VmRSS ${mib(memory.afterLoads.rss)} MiB`);
  const rows = ROWS.map(([label, pick, format]) => {
    const figure = (name: TargetName): number | undefined => {
      const hop = memory.hops[name];
      return hop === undefined ? undefined : pick(hop);
    };
    const proxy = figure('proxy');
    return [
      label,
      ...hops.map((name) => {
        const v = figure(name);
        return v !== undefined ? format(v) : memory.hops[name] === undefined ? 'absent' : 'n/a';
      }),
      ...hops.filter((name) => name !== 'proxy').map((name) => ratioText(proxy, figure(name))),
    ];
  });
  out.push(table(['', ...hops, ...ratios], rows));
  for (const name of hops) {
    const hop = memory.hops[name];
    if (hop === undefined) continue;
    for (const [test, outcome] of Object.entries(hop) as Array<[string, Outcome<unknown>]>) {
      if (!outcome.ok) out.push(`  ${name} ${test}: ${outcome.skipped ? 'skipped' : 'FAILED'}: ${outcome.reason}`);
    }
  }
  return out;
}

function ratioText(a: number | undefined, b: number | undefined): string {
  return a === undefined || b === undefined || b === 0 ? '-' : (a / b).toFixed(2);
}

/** What the memory targets need of the proxy's figures. */
export interface MemoryTargets {
  idleHwm: Outcome<number> | null;
  streamGrowth: Outcome<number> | null;
  readersGrowth: Outcome<number> | null;
  /** The churn's VmHWM, and what it may be: 1.2 x (a fresh proxy + the open connections' own cost). */
  churnHwm: Outcome<{ hwm: number; allowed: number }> | null;
  /** The heap after the churn settled, as a share of before. */
  heapAfterChurn: Outcome<number> | null;
  allAtOnceHwm: Outcome<number> | null;
}

/** The proxy's figures the targets are judged on (report.ts turns them into verdicts). */
export function memoryTargets(memory: MemoryResults, profile: MemoryProfile): MemoryTargets {
  const proxy = memory.hops.proxy;
  if (proxy === undefined)
    return { idleHwm: null, streamGrowth: null, readersGrowth: null, churnHwm: null, heapAfterChurn: null, allAtOnceHwm: null };
  const map = <T, U>(outcome: Outcome<T>, f: (v: T) => U): Outcome<U> => (outcome.ok ? { ok: true, value: f(outcome.value) } : outcome);
  const perConnectionMiB = (perIdleConnectionKiB(proxy) ?? 0) / KiB;
  return {
    idleHwm: map(proxy.idle, (v) => v.after.hwm),
    streamGrowth: map(proxy.stream, (v) => v.growth),
    readersGrowth: map(proxy.readers, (v) => v.growth),
    churnHwm: map(proxy.churn, (v: ChurnMemory) => ({
      hwm: v.after.hwm,
      allowed: 1.2 * (v.before.rss + profile.churnConcurrency * perConnectionMiB),
    })),
    heapAfterChurn: map(proxy.churn, (v: ChurnMemory) => (v.heapBefore && v.heapAfter ? v.heapAfter / v.heapBefore : Number.NaN)),
    allAtOnceHwm: map(proxy.allAtOnce, (v) => v.after.hwm),
  };
}
