/**
 * The memory part of the bench: each memory test (memory.ts, churn.ts) against each hop that
 * holds connections (the proxy, with --baseline the build before, and HAProxy), each test on a
 * freshly started process of that hop, so that its VmHWM is the test's own.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { churn, type ChurnResult } from './churn.js';
import {
  filesNeeded,
  heapUsedMiB,
  idleConnections,
  openIdleConnections,
  readProcMemory,
  slowReaders,
  type IdleResult,
  type ProcMemory,
  type StreamOptions,
  type StreamResult,
} from './memory.js';
import { freePort, type Managed, type TargetName } from './processes.js';
import type { Outcome, PerTarget } from './report.js';

const MiB = 1024 * 1024;

export interface MemoryProfile {
  idleConnections: number;
  /** One large value to one slow reader. */
  stream: StreamOptions;
  /** Many multi-MiB values to as many slow readers at once. */
  readers: StreamOptions;
  /** Connections at once, and how long the churn runs. */
  churnConcurrency: number;
  churnSeconds: number;
  /** How long the churn runs in the all-at-once test. */
  allAtOnceSeconds: number;
}

/** The churn's figures, and the V8 heap (a Node hop) before it and after it settled. */
export interface ChurnMemory extends ChurnResult {
  /** MiB; undefined for a hop that is not a Node process. */
  heapBefore: number | undefined;
  heapAfter: number | undefined;
  /** VmRSS once the churn stopped and SETTLE_AFTER_CHURN_MS passed. */
  settled: ProcMemory;
}

export interface AllAtOnce {
  idle: number;
  readers: number;
  churn: ChurnResult;
  after: ProcMemory;
}

/** Every memory figure of one hop. */
export interface HopMemory {
  idle: Outcome<IdleResult>;
  stream: Outcome<StreamResult>;
  readers: Outcome<StreamResult>;
  churn: Outcome<ChurnMemory>;
  allAtOnce: Outcome<AllAtOnce>;
}

/** A hop the memory tests start afresh for each test; `admin` when it has an admin server (a Node hop). */
export interface MemoryHop {
  readonly name: TargetName;
  start(adminPort: number | undefined): Promise<Managed>;
  readonly node: boolean;
}

/**
 * After the churn, before the heap and RSS are read again: V8's memory reducer collects once
 * allocation has stayed low for about 8 s (--gc-memory-reducer-start-delay-ms).
 */
const SETTLE_AFTER_CHURN_MS = 12_000;

export async function measureMemory(
  hops: readonly MemoryHop[],
  redisPort: number,
  profile: MemoryProfile,
  fdLimit: number,
  log: (line: string) => void,
  outcome: <T>(what: string, run: () => Promise<T>) => Promise<Outcome<T>>,
): Promise<PerTarget<HopMemory>> {
  const results: PerTarget<HopMemory> = {};
  const needed = filesNeeded(profile.idleConnections + profile.readers.readers + profile.churnConcurrency);
  const noFiles: Outcome<never> = {
    ok: false,
    skipped: true,
    reason:
      `open-files limit ${fdLimit} < ${needed} (a hop holds a client and an upstream socket per connection); ` +
      'raise the hard limit (ulimit -Hn as root, limits.conf, or docker --ulimit nofile=65536:65536)',
  };
  for (const hop of hops) {
    const fresh = async <T>(test: (managed: Managed, adminPort: number | undefined) => Promise<T>): Promise<T> => {
      const adminPort = hop.node ? await freePort() : undefined;
      const managed = await hop.start(adminPort);
      try {
        return await test(managed, adminPort);
      } finally {
        await managed.stop();
      }
    };
    const t0 = Date.now();
    const idle =
      fdLimit < needed ? noFiles : await outcome('memory test', () => fresh((m) => idleConnections(m, redisPort, profile.idleConnections)));
    const stream = await outcome('memory test', () =>
      fresh((m) => slowReaders(m.port, redisPort, profile.stream, () => readProcMemory(m.pid))),
    );
    const readers = await outcome('memory test', () =>
      fresh((m) => slowReaders(m.port, redisPort, profile.readers, () => readProcMemory(m.pid))),
    );
    const churned = await outcome('memory test', () => fresh((m, admin) => churnMemory(m, admin, profile)));
    const allAtOnce =
      fdLimit < needed ? noFiles : await outcome('memory test', () => fresh((m) => everythingAtOnce(m, redisPort, profile)));
    results[hop.name] = { idle, stream, readers, churn: churned, allAtOnce };
    log(`bench: memory of ${hop.name} measured (${((Date.now() - t0) / 1000).toFixed(0)} s)`);
  }
  return results;
}

async function churnMemory(hop: Managed, adminPort: number | undefined, profile: MemoryProfile): Promise<ChurnMemory> {
  await sleep(1000);
  const heapBefore = await heapUsedMiB(adminPort);
  const result = await churn(hop.port, {
    concurrency: profile.churnConcurrency,
    seconds: profile.churnSeconds,
    memory: () => readProcMemory(hop.pid),
  });
  if (result.failed > result.connections / 100) throw new Error(`${result.failed} of ${result.connections} churn connections failed`);
  await sleep(SETTLE_AFTER_CHURN_MS);
  const heapAfter = await heapUsedMiB(adminPort);
  return { ...result, heapBefore, heapAfter, settled: readProcMemory(hop.pid) };
}

/** The sidecar's worst moment: churn, idle connections and slow readers of multi-MiB replies, all at once. */
async function everythingAtOnce(hop: Managed, redisPort: number, profile: MemoryProfile): Promise<AllAtOnce> {
  await sleep(1000);
  const idle = await openIdleConnections(hop.port, profile.idleConnections);
  try {
    const [, churned] = await Promise.all([
      slowReaders(hop.port, redisPort, profile.readers, () => readProcMemory(hop.pid)),
      churn(hop.port, { concurrency: profile.churnConcurrency, seconds: profile.allAtOnceSeconds, memory: () => readProcMemory(hop.pid) }),
    ]);
    const failure = idle.failure();
    if (failure !== null) throw failure;
    return { idle: idle.sockets.length, readers: profile.readers.readers, churn: churned, after: readProcMemory(hop.pid) };
  } finally {
    idle.close();
  }
}

export const MEMORY_FULL: MemoryProfile = {
  idleConnections: 5_000,
  stream: { readers: 1, valueBytes: 256 * MiB, bytesPerSecond: 32 * MiB, stallEveryBytes: 64 * MiB, stallMs: 500 },
  readers: { readers: 20, valueBytes: 8 * MiB, bytesPerSecond: 1 * MiB, stallEveryBytes: 2 * MiB, stallMs: 500 },
  churnConcurrency: 40,
  churnSeconds: 60,
  allAtOnceSeconds: 20,
};

export const MEMORY_QUICK: MemoryProfile = { ...MEMORY_FULL, churnSeconds: 10, allAtOnceSeconds: 10 };
