/**
 * `npm run bench`: the proxy against direct Redis, HAProxy (TCP) and
 * nutcracker, on this machine, in one run. See DESIGN.md section 8.
 *
 * Loads are interleaved by round (round 1: direct, proxy, haproxy,
 * nutcracker; round 2 the same; ...) so that a slow patch of the machine
 * hits every target alike, and the report takes medians over rounds.
 *
 * With `--baseline DIR`, the proxy as built in another checkout (an older
 * commit, say) runs as one more target, `baseline`, started exactly like the
 * proxy under test and interleaved with the others in the pass-through, lock
 * and latency loads: a change is then measured against the code before it on
 * the same machine at the same moment, not against figures from another day.
 *
 * Last comes the cluster part (cluster.ts): a local Redis Cluster, the proxy
 * in cluster mode in front of it, and the same throughput loads against
 * both, interleaved by round in the same way.
 *
 * It is a measurement, not a test: it exits 0 whatever the verdicts, and
 * non-zero only when the bench itself broke (1) or was interrupted (130).
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import process from 'node:process';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import { bypassing, startCluster, startClusterProxy, withRouting, type BenchCluster, type ClusterProxy, type Shard } from './cluster.js';
import { withCpu } from './cpu.js';
import { BENCH_FLAGS } from './flags.js';
import { runInteractive, STEPS } from './interactive.js';
import { runLatency } from './latency.js';
import { runLockLoad, type LockLoadResult } from './lock-load.js';
import { readProcMemory } from './memory.js';
import { measureMemory, MEMORY_FULL, MEMORY_QUICK, type MemoryHop, type MemoryProfile } from './memory-tests.js';
import {
  cliOf,
  findExecutable,
  haproxyMaxconn,
  INTERACTIVE_TARGET_NAMES,
  killAllNow,
  openFilesLimit,
  ownBuild,
  revisionOf,
  startHaproxy,
  startNutcracker,
  startProxy,
  startRedis,
  startRelay,
  stopAll,
  versionOf,
  type Managed,
  type ProxyBuild,
  type Target,
  type TargetName,
} from './processes.js';
import { runRedisBenchmark, TESTS, type BenchmarkResult } from './redis-benchmark.js';
import {
  computeMedians,
  DEPTH,
  emptyResults,
  evaluateTargets,
  PIPELINES,
  renderReport,
  type ClusterResults,
  type Outcome,
  type PerTarget,
  type Pipeline,
  type Results,
} from './report.js';

const MiB = 1024 * 1024;
const CLIENTS = 50;
/**
 * The cluster part's redis-benchmark runs take this many times the requests.
 * With --cluster, redis-benchmark runs a thread per master, and a threaded
 * run notices that a test is over only on its 250 ms timer: a test of t
 * seconds reads up to 0.25 / t too slow, so its tests must not be short.
 */
const CLUSTER_REQUESTS_FACTOR = 3;
/** CPU already busy at start (all CPUs together) above which the report warns. */
const BUSY_WARNING_PERCENT = 10;
const busyWarning = (percent: number): string =>
  `WARNING: other processes kept ${percent}% of the CPUs busy before the bench started; figures are noisy`;

/** How much of everything; `--quick` is a smoke run, not a measurement to quote. */
interface Profile {
  rounds: number;
  requestsP1: number;
  requestsP16: number;
  /** redis-benchmark -n at -P 16 for the untimed warm-up of each target. */
  warmupRequests: number;
  lockWarmupMs: number;
  lockMs: number;
  latencyWarmup: number;
  latencyRoundTrips: number;
  /** Per key and target, untimed then timed; small, as a hop that holds MULTI makes each take its --hold-ms. */
  interactiveWarmup: number;
  interactiveTransactions: number;
  memory: MemoryProfile;
}

// Sized for ~2-5 s per redis-benchmark test (GET, SET, INCR: three per
// run) against direct Redis on a 2-core machine; a proxied target takes
// longer. The full run takes 6-10 minutes there.
const FULL: Profile = {
  rounds: 3,
  requestsP1: 150_000,
  requestsP16: 1_500_000,
  warmupRequests: 200_000,
  lockWarmupMs: 500,
  lockMs: 5_000,
  latencyWarmup: 2_000,
  latencyRoundTrips: 20_000,
  interactiveWarmup: 200,
  interactiveTransactions: 2_000,
  memory: MEMORY_FULL,
};

const QUICK: Profile = {
  ...FULL,
  rounds: 1,
  requestsP1: 20_000,
  requestsP16: 200_000,
  warmupRequests: 20_000,
  lockWarmupMs: 200,
  lockMs: 1_000,
  latencyWarmup: 500,
  latencyRoundTrips: 5_000,
  interactiveWarmup: 50,
  interactiveTransactions: 300,
  memory: MEMORY_QUICK,
};

const USAGE = `Usage: npm run bench -- [options]

  --rounds N          rounds of every load, interleaved over the targets (default ${FULL.rounds})
  --quick             smoke run: 1 round, smaller request counts, 1 s lock loads
  --json FILE         also write raw and median figures, the machine and the verdicts
  --requests-p1 N     redis-benchmark -n at pipeline 1 (default ${FULL.requestsP1}, quick ${QUICK.requestsP1};
                      ${CLUSTER_REQUESTS_FACTOR} times that in the cluster part)
  --requests-p16 N    redis-benchmark -n at pipeline 16 (default ${FULL.requestsP16}, quick ${QUICK.requestsP16};
                      ${CLUSTER_REQUESTS_FACTOR} times that in the cluster part)
  --lock-seconds S    duration of each lock load (default ${FULL.lockMs / 1000}, quick ${QUICK.lockMs / 1000})
  --without PARTS     leave out haproxy, nutcracker, relay and/or cluster (comma-separated), as if not installed
  --baseline DIR      also run the proxy built in DIR (another checkout with its own dist/cli.js, e.g. a
                      git worktree of an older commit after npm ci there) as target "baseline", compared
                      with the proxy in the pass-through, lock and latency tables
  -h, --help
`;

/** A broken set-up: the message is enough, no stack. */
class BenchError extends Error {}

function positive(name: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (!Number.isFinite(value) || value <= 0) throw new BenchError(`--${name} wants a positive number, got ${text}`);
  return value;
}

/** --baseline DIR: another checkout's build of the proxy, the target 'baseline'. */
interface Baseline {
  /** Absolute. */
  dir: string;
  build: ProxyBuild;
}

interface Options {
  profile: Profile;
  json: string | null;
  without: Set<string>;
  baseline: Baseline | null;
}

/**
 * The checkout --baseline names, refused at once when it has no build: the
 * bench would otherwise find out only after starting Redis and the peers.
 * A relative DIR is taken from where `npm run bench` was typed (INIT_CWD),
 * not from the package root npm runs the script in.
 */
function baselineOf(text: string | undefined): Baseline | null {
  if (text === undefined) return null;
  const dir = path.resolve(process.env.INIT_CWD ?? process.cwd(), text);
  const cli = cliOf(dir);
  if (!existsSync(cli)) {
    throw new BenchError(
      `--baseline ${text}: ${cli} is missing; DIR must be a checkout of redis-lock-proxy with its own build ` +
        `(e.g. git worktree add /tmp/before <commit> && (cd /tmp/before && npm ci))`,
    );
  }
  return { dir, build: { name: 'redis-lock-proxy (baseline)', cli } };
}

function parseOptions(argv: string[]): Options {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: BENCH_FLAGS,
    }).values;
  } catch (error) {
    throw new BenchError(`${(error as Error).message}\n\n${USAGE}`);
  }
  if (parsed.help) {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  const base = parsed.quick ? QUICK : FULL;
  const without = new Set((parsed.without ?? '').split(',').filter((w) => w !== ''));
  for (const peer of without) {
    if (peer !== 'haproxy' && peer !== 'nutcracker' && peer !== 'relay' && peer !== 'cluster') {
      throw new BenchError(`--without takes haproxy, nutcracker, relay and/or cluster, not ${peer}`);
    }
  }
  const lockSeconds = positive('lock-seconds', parsed['lock-seconds']);
  return {
    profile: {
      ...base,
      rounds: Math.round(positive('rounds', parsed.rounds) ?? base.rounds),
      requestsP1: Math.round(positive('requests-p1', parsed['requests-p1']) ?? base.requestsP1),
      requestsP16: Math.round(positive('requests-p16', parsed['requests-p16']) ?? base.requestsP16),
      lockMs: lockSeconds !== undefined ? lockSeconds * 1000 : base.lockMs,
    },
    json: parsed.json ?? null,
    without,
    baseline: baselineOf(parsed.baseline),
  };
}

function log(line: string): void {
  process.stderr.write(line + '\n');
}

const int = (v: number): string => Math.round(v).toLocaleString('en-US');
const since = (t0: number): string => `${((Date.now() - t0) / 1000).toFixed(1)} s`;

interface Tools {
  redisServer: string;
  redisBenchmark: string;
  haproxy: string | null;
  nutcracker: string | null;
  /** Creates the cluster of the cluster part; null: no cluster part. */
  redisCli: string | null;
}

function findTools(without: Set<string>): Tools {
  const redisServer = findExecutable('redis-server');
  const redisBenchmark = findExecutable('redis-benchmark');
  if (!redisServer || !redisBenchmark) {
    throw new BenchError('redis-server and redis-benchmark are needed: apt-get install redis-server redis-tools');
  }
  const { cli } = ownBuild();
  if (!existsSync(cli)) throw new BenchError(`${cli} is missing: npm run build first (npm run bench does)`);
  return {
    redisServer,
    redisBenchmark,
    haproxy: without.has('haproxy') ? null : findExecutable('haproxy'),
    nutcracker: without.has('nutcracker') ? null : findExecutable('nutcracker'),
    redisCli: without.has('cluster') ? null : findExecutable('redis-cli'),
  };
}

/**
 * Share of all CPUs busy over one second before anything starts. On a small
 * machine another process's load changes every figure, so the report says
 * when the machine was not idle.
 */
async function busyCpuPercent(): Promise<number> {
  const sample = (): { idle: number; total: number } => {
    const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal: idle and iowait count as idle.
    return { idle: fields[3] + (fields[4] ?? 0), total: fields.slice(0, 8).reduce((a, b) => a + b, 0) };
  };
  const a = sample();
  await sleep(1_000);
  const b = sample();
  return b.total > a.total ? 100 * (1 - (b.idle - a.idle) / (b.total - a.total)) : 0;
}

async function describeMachine(tools: Tools, fdLimit: number) {
  return {
    busyCpuPercentAtStart: Math.round(await busyCpuPercent()),
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model ?? 'unknown',
    memoryMiB: Math.round(os.totalmem() / MiB),
    kernel: `${os.type()} ${os.release()} ${os.arch()}`,
    node: process.version,
    redis: (await versionOf(tools.redisServer, ['--version'])).replace(/^Redis server v=(\S+).*$/, '$1'),
    redisBenchmark: await versionOf(tools.redisBenchmark, ['--version']),
    haproxy: tools.haproxy ? (await versionOf(tools.haproxy, ['-v'])).replace(/^HAProxy version (\S+).*$/, 'HAProxy $1') : null,
    nutcracker: tools.nutcracker ? (await versionOf(tools.nutcracker, ['--version'])).replace(/^This is nutcracker-/, 'nutcracker ') : null,
    openFilesLimit: fdLimit,
  };
}

interface Setup {
  redis: Managed;
  proxy: Managed;
  /** Every long-running process, checked after each round. */
  running: Managed[];
  targets: Target[];
  /** nutcracker refuses MULTI/EXEC, so it cannot carry a lock block. */
  lockTargets: Target[];
  /** The lock load with plain blocks (lock-load.ts): the same load's pass-through, on the targets it is compared with. */
  plainTargets: Target[];
  /** The process of each hop (every target but direct): whose CPU a load costs. */
  hops: PerTarget<number>;
  /** Why a peer is missing, per missing peer. */
  absent: PerTarget<string>;
}

/**
 * The baseline's proxy, started like the one under test. An older build may
 * lack a flag or its dependencies (no npm ci there): say which build failed.
 */
async function startBaseline(redisPort: number, baseline: Baseline): Promise<Managed> {
  try {
    return await startProxy(redisPort, [], baseline.build);
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new BenchError(`the baseline ${baseline.build.cli} did not start (is it built, with npm ci run in ${baseline.dir}?): ${reason}`);
  }
}

async function startTargets(tools: Tools, options: Options, dir: string, fdLimit: number): Promise<Setup> {
  const { without } = options;
  const redis = await startRedis(tools.redisServer, dir);
  const proxy = await startProxy(redis.port);
  const baseline = options.baseline ? await startBaseline(redis.port, options.baseline) : null;
  const scripted = await startProxy(redis.port, ['--lock-method', 'script']);
  const haproxy = tools.haproxy ? await startHaproxy(tools.haproxy, redis.port, dir, fdLimit) : null;
  if (haproxy && haproxyMaxconn(fdLimit) < 10_000) {
    log(`bench: haproxy maxconn ${haproxyMaxconn(fdLimit)}, not 10000: it needs 2 files per connection and the limit is ${fdLimit}`);
  }
  const nutcracker = tools.nutcracker ? await startNutcracker(tools.nutcracker, redis.port, dir) : null;
  const relay = without.has('relay') ? null : await startRelay(redis.port);

  const targets: Target[] = [
    { name: 'direct', port: redis.port },
    { name: 'proxy', port: proxy.port },
    ...(baseline ? [{ name: 'baseline' as const, port: baseline.port }] : []),
    ...(haproxy ? [{ name: 'haproxy' as const, port: haproxy.port }] : []),
    ...(nutcracker ? [{ name: 'nutcracker' as const, port: nutcracker.port }] : []),
    ...(relay ? [{ name: 'relay' as const, port: relay.port }] : []),
  ];
  const absent: PerTarget<string> = {};
  const missing = (peer: string): string =>
    without.has(peer) ? `${peer} left out (--without)` : `${peer} not installed (apt-get install ${peer})`;
  if (!haproxy) absent.haproxy = missing('haproxy');
  if (!nutcracker) absent.nutcracker = missing('nutcracker');
  if (!relay) absent.relay = missing('relay');
  for (const why of Object.values(absent)) log(`bench: ${why}; its columns are marked absent`);
  log(`bench: targets ${targets.map((t) => `${t.name}=127.0.0.1:${t.port}`).join(', ')}`);
  return {
    redis,
    proxy,
    running: [
      redis,
      proxy,
      ...(baseline ? [baseline] : []),
      scripted,
      ...(haproxy ? [haproxy] : []),
      ...(nutcracker ? [nutcracker] : []),
      ...(relay ? [relay] : []),
    ],
    targets,
    lockTargets: [
      ...targets.filter((t) => t.name === 'direct' || t.name === 'proxy' || t.name === 'baseline'),
      { name: 'script' as const, port: scripted.port },
      ...targets.filter((t) => t.name === 'haproxy' || t.name === 'relay'),
    ],
    plainTargets: targets.filter((t) => t.name === 'direct' || t.name === 'proxy' || t.name === 'haproxy' || t.name === 'relay'),
    hops: {
      proxy: proxy.pid,
      ...(baseline ? { baseline: baseline.pid } : {}),
      ...(haproxy ? { haproxy: haproxy.pid } : {}),
      ...(nutcracker ? { nutcracker: nutcracker.pid } : {}),
      ...(relay ? { relay: relay.pid } : {}),
    },
    absent,
  };
}

/**
 * What a throughput load aims at. A cluster target also has its masters'
 * shards: redis-benchmark then runs with --cluster (`port` is its seed), and
 * the lock load aims at the shards.
 */
type LoadTarget = Target & { shards?: Shard[] };

/** Untimed: the proxy's JIT and every target's buffers settle before the first round counts. */
async function warmUp(tools: Tools, profile: Profile, targets: LoadTarget[], lockTargets: LoadTarget[]): Promise<void> {
  const t0 = Date.now();
  for (const target of targets) {
    const cluster = target.shards !== undefined;
    await runRedisBenchmark(tools.redisBenchmark, {
      port: target.port,
      requests: profile.warmupRequests,
      pipeline: 16,
      clients: CLIENTS,
      cluster,
    });
  }
  for (const target of lockTargets) {
    const { port, shards } = target;
    await runLockLoad({ port, shards, connections: CLIENTS, depth: 16, warmupMs: 0, durationMs: profile.lockWarmupMs });
  }
  log(`bench: warm-up done (${since(t0)})`);
}

function record<T>(per: PerTarget<T[]>, name: TargetName, value: T): void {
  (per[name] ??= []).push(value);
}

/** redis-benchmark -n of a run at pipeline `p`. */
function requestsOf(profile: Profile, p: Pipeline, cluster: boolean): number {
  return (p === 'p1' ? profile.requestsP1 : profile.requestsP16) * (cluster ? CLUSTER_REQUESTS_FACTOR : 1);
}

/** One redis-benchmark run of a round, logged. */
async function benchmarkRun(tools: Tools, profile: Profile, tag: string, p: Pipeline, target: LoadTarget): Promise<BenchmarkResult> {
  const t0 = Date.now();
  const cluster = target.shards !== undefined;
  const requests = requestsOf(profile, p, cluster);
  const r = await runRedisBenchmark(tools.redisBenchmark, { port: target.port, requests, pipeline: DEPTH[p], clients: CLIENTS, cluster });
  log(`${tag} redis-benchmark ${p.toUpperCase()} ${target.name}: ${TESTS.map((t) => `${t} ${int(r[t])}`).join(', ')} /s (${since(t0)})`);
  return r;
}

/** One lock load of a round (with plain blocks: its pass-through), logged. */
async function lockRun(
  profile: Profile,
  tag: string,
  p: Pipeline,
  target: LoadTarget,
  blocks: 'lock' | 'plain' = 'lock',
): Promise<LockLoadResult> {
  const r = await runLockLoad({
    port: target.port,
    shards: target.shards,
    connections: CLIENTS,
    depth: DEPTH[p],
    warmupMs: profile.lockWarmupMs,
    durationMs: profile.lockMs,
    blocks,
  });
  const errors = r.errors > 0 ? `, ${r.errors} ERROR REPLIES` : '';
  const { p50, p99, p999 } = r.latency;
  log(
    `${tag} ${blocks} load ${p.toUpperCase()} ${target.name}: ${int(r.rps)} requests/s, ${int(r.locksPerSecond)} ${blocks} blocks/s, ` +
      `latency p50 ${int(p50)} µs, p99 ${int(p99)} µs, p99.9 ${int(p999)} µs${errors}`,
  );
  return r;
}

/** Every load against every target, round after round. */
async function runRounds(tools: Tools, setup: Setup, profile: Profile, results: Results): Promise<void> {
  for (let round = 1; round <= profile.rounds; round++) {
    const tag = `[round ${round}/${profile.rounds}]`;
    for (const p of PIPELINES) {
      for (const target of setup.targets) {
        const run = (): Promise<BenchmarkResult> => benchmarkRun(tools, profile, tag, p, target);
        const hop = setup.hops[target.name];
        if (hop === undefined) {
          record(results.passThrough[p], target.name, await run());
          continue;
        }
        // Every request of the run: -n of each of its tests.
        const [r, cpu] = await withCpu(hop, requestsOf(profile, p, false) * TESTS.length, run);
        record(results.passThrough[p], target.name, r);
        record(results.cpu[p], target.name, cpu);
        const us = (v: number): string => v.toFixed(v < 1 ? 3 : 2);
        log(
          `${tag}   CPU of ${target.name}: ${us(cpu.user)} µs user, ${us(cpu.system)} µs system per request (${cpu.seconds.toFixed(1)} s of CPU)`,
        );
      }
    }
    for (const p of PIPELINES) {
      for (const target of setup.lockTargets) record(results.lock[p], target.name, await lockRun(profile, tag, p, target));
      for (const target of setup.plainTargets) record(results.plain[p], target.name, await lockRun(profile, tag, p, target, 'plain'));
    }
    // All targets in one run, their round trips interleaved (see latency.ts).
    const latency = await runLatency({ targets: setup.targets, warmup: profile.latencyWarmup, roundTrips: profile.latencyRoundTrips });
    for (const target of setup.targets) {
      const r = latency[target.name];
      if (r === undefined) throw new Error(`no latency figures for ${target.name}`);
      record(results.latency, target.name, r);
      log(`${tag} latency ${target.name}: p50 ${r.p50.toFixed(1)} µs, p99 ${r.p99.toFixed(1)} µs, p99.9 ${r.p999.toFixed(1)} µs`);
    }
    // Likewise, on the targets that carry MULTI (see interactive.ts).
    const interactiveTargets = setup.lockTargets.filter((t) => INTERACTIVE_TARGET_NAMES.includes(t.name));
    const interactive = await runInteractive({
      targets: interactiveTargets,
      warmup: profile.interactiveWarmup,
      transactions: profile.interactiveTransactions,
    });
    for (const target of interactiveTargets) {
      const r = interactive[target.name];
      if (r === undefined) throw new Error(`no interactive transaction figures for ${target.name}`);
      record(results.interactive, target.name, r);
      const steps = STEPS.map((step) => `${step} ${r.lock[step].p50.toFixed(1)}/${r.plain[step].p50.toFixed(1)}`).join(', ');
      log(`${tag} interactive ${target.name}: p50 µs PING ${r.ping.p50.toFixed(1)}, lock/plain key ${steps}`);
    }
    for (const managed of setup.running) managed.assertAlive();
  }
}

/** The hops whose memory is measured: the proxy, the build before it, HAProxy; each started afresh per test. */
function memoryHops(tools: Tools, options: Options, redisPort: number, dir: string, fdLimit: number): MemoryHop[] {
  const withAdmin = (adminPort: number | undefined): string[] =>
    adminPort === undefined ? [] : ['--admin-listen', `127.0.0.1:${adminPort}`];
  const hops: MemoryHop[] = [{ name: 'proxy', node: true, start: (admin) => startProxy(redisPort, withAdmin(admin)) }];
  const baseline = options.baseline;
  if (baseline) hops.push({ name: 'baseline', node: true, start: (admin) => startProxy(redisPort, withAdmin(admin), baseline.build) });
  const haproxy = tools.haproxy;
  if (haproxy) hops.push({ name: 'haproxy', node: false, start: () => startHaproxy(haproxy, redisPort, dir, fdLimit) });
  return hops;
}

interface ClusterSetup {
  cluster: BenchCluster;
  proxy: ClusterProxy;
  /** direct: seeded with a master, the lock load on the masters; proxy: seeded with --listen, the lock load on the node listeners. */
  targets: LoadTarget[];
}

/** The cluster and the proxy in front of it; what started goes into `running` at once, so that a failure half-way stops it too. */
async function startClusterTargets(tools: Tools, redisCli: string, dir: string, running: Managed[]): Promise<ClusterSetup> {
  const t0 = Date.now();
  const cluster = await startCluster(tools.redisServer, redisCli, dir);
  running.push(...cluster.nodes.map((node) => node.managed));
  const proxy = await startClusterProxy(cluster);
  running.push(proxy.managed);
  const ports = (shards: Shard[]): string => shards.map((s) => s.port).join(', ');
  log(
    `bench: cluster of ${cluster.nodes.length} nodes (masters ${ports(cluster.shards)}) and the proxy (seed 127.0.0.1:${proxy.port}, ` +
      `listeners ${ports(proxy.shards)} for the masters) ready (${since(t0)})`,
  );
  return {
    cluster,
    proxy,
    targets: [
      { name: 'direct', port: cluster.shards[0].port, shards: cluster.shards },
      { name: 'proxy', port: proxy.port, shards: proxy.shards },
    ],
  };
}

/** Both throughput loads against both cluster targets, round after round; each redis-benchmark run with its routing check. */
async function runClusterRounds(
  tools: Tools,
  setup: ClusterSetup,
  running: Managed[],
  profile: Profile,
  results: ClusterResults,
): Promise<void> {
  for (let round = 1; round <= profile.rounds; round++) {
    const tag = `[cluster round ${round}/${profile.rounds}]`;
    for (const p of PIPELINES) {
      for (const target of setup.targets) {
        const [r, routing] = await withRouting(setup.cluster, setup.proxy, () => benchmarkRun(tools, profile, tag, p, target));
        record(results.passThrough[p], target.name, r);
        record(results.routing, target.name, routing);
        log(`${tag}   the nodes accepted ${routing.atNodes} connections, ${bypassing(routing)} not opened by the proxy`);
      }
    }
    for (const p of PIPELINES) {
      for (const target of setup.targets) record(results.lock[p], target.name, await lockRun(profile, tag, p, target));
    }
    for (const managed of running) managed.assertAlive();
  }
}

/**
 * The cluster part, after everything else: its own Redis Cluster and the
 * proxy with --cluster, both stopped again at the end. Like a memory test, a
 * failure is reported rather than fatal.
 */
async function measureCluster(tools: Tools, without: Set<string>, profile: Profile, dir: string, results: ClusterResults): Promise<void> {
  const redisCli = tools.redisCli;
  if (redisCli === null) {
    const reason = without.has('cluster') ? 'left out (--without cluster)' : 'redis-cli not installed (apt-get install redis-tools)';
    results.missing = { skipped: true, reason };
    log(`bench: cluster part ${reason}`);
    return;
  }
  const running: Managed[] = [];
  const ran = await outcome('cluster part', async () => {
    const setup = await startClusterTargets(tools, redisCli, dir, running);
    await warmUp(tools, profile, setup.targets, setup.targets);
    await runClusterRounds(tools, setup, running, profile, results);
  });
  await Promise.all(running.map((managed) => managed.stop()));
  if (!ran.ok) results.missing = { skipped: false, reason: ran.reason };
}

async function main(): Promise<void> {
  const started = Date.now();
  const options = parseOptions(process.argv.slice(2));
  const { profile, json, without, baseline } = options;
  const tools = findTools(without);
  const fdLimit = openFilesLimit();
  const machine = await describeMachine(tools, fdLimit);
  log(`bench: ${machine.cpus} CPUs (${machine.cpuModel}), Node ${machine.node}, Redis ${machine.redis}, open files ${fdLimit}`);
  log(`bench: ${machine.haproxy ?? 'haproxy absent'}; ${machine.nutcracker ?? 'nutcracker absent'}`);
  if (machine.busyCpuPercentAtStart > BUSY_WARNING_PERCENT) log(busyWarning(machine.busyCpuPercentAtStart));
  const baselineInfo = baseline ? { dir: baseline.dir, revision: await revisionOf(baseline.dir) } : null;
  if (baselineInfo) log(`bench: baseline ${baselineInfo.dir} (${baselineInfo.revision ?? 'not a git checkout'})`);

  cleanupDir = await mkdtemp(path.join(os.tmpdir(), 'redis-lock-proxy-bench-'));
  const setup = await startTargets(tools, options, cleanupDir, fdLimit);
  await warmUp(tools, profile, setup.targets, setup.lockTargets);
  const results = emptyResults();
  await runRounds(tools, setup, profile, results);
  results.memory.afterLoads = readProcMemory(setup.proxy.pid);
  const hops = memoryHops(tools, options, setup.redis.port, cleanupDir, fdLimit);
  results.memory.hops = await measureMemory(hops, setup.redis.port, profile.memory, fdLimit, log, outcome);
  await measureCluster(tools, without, profile, cleanupDir, results.cluster);

  const medians = computeMedians(results);
  const verdicts = evaluateTargets(medians, results, setup.absent, profile.memory);
  const clusterRequests = { p1: requestsOf(profile, 'p1', true), p16: requestsOf(profile, 'p16', true) };
  const peers = [machine.haproxy ?? 'haproxy absent', machine.nutcracker ?? 'nutcracker absent'].join('; ');
  process.stdout.write(
    `\nredis-lock-proxy bench, ${new Date(started).toISOString()}: ${machine.cpus} CPUs (${machine.cpuModel}), ` +
      `Node ${machine.node}, Redis ${machine.redis}; ${peers}\n` +
      (machine.busyCpuPercentAtStart > BUSY_WARNING_PERCENT ? busyWarning(machine.busyCpuPercentAtStart) + '\n' : '') +
      '\n' +
      renderReport(results, medians, verdicts, {
        rounds: profile.rounds,
        clients: CLIENTS,
        lockConnections: CLIENTS,
        latencyRoundTrips: profile.latencyRoundTrips,
        interactiveTransactions: profile.interactiveTransactions,
        memory: profile.memory,
        clusterRequests,
        absent: setup.absent,
        baseline: baselineInfo,
      }) +
      '\n',
  );

  const seconds = (Date.now() - started) / 1000;
  if (json !== null) {
    const absent = setup.absent;
    const document = {
      startedAt: new Date(started).toISOString(),
      seconds,
      machine,
      profile: { ...profile, clusterRequests },
      absent,
      // Only with --baseline, so that the document of a run without one is as before.
      ...(baselineInfo ? { baseline: baselineInfo } : {}),
      raw: results,
      medians,
      verdicts,
    };
    await writeFile(json, JSON.stringify(document, null, 2) + '\n');
    log(`bench: wrote ${json}`);
  }
  log(`bench: done in ${(seconds / 60).toFixed(1)} min`);
}

/** Runs a memory test or the cluster part; an error becomes its outcome so the report still prints. */
async function outcome<T>(what: string, run: () => Promise<T>): Promise<Outcome<T>> {
  try {
    return { ok: true, value: await run() };
  } catch (error) {
    // Ctrl-C stopped the processes under it: that is no result to report.
    if (interrupted) throw error;
    const reason = error instanceof Error ? error.message : String(error);
    log(`bench: ${what} failed: ${reason}`);
    return { ok: false, skipped: false, reason: reason.split('\n')[0] };
  }
}

let cleanupDir: string | null = null;
let interrupted = false;

async function cleanup(): Promise<void> {
  await stopAll();
  if (cleanupDir !== null) await rm(cleanupDir, { recursive: true, force: true });
  cleanupDir = null;
}

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (interrupted) return;
    interrupted = true;
    log(`bench: ${signal}, stopping`);
    void cleanup().finally(() => process.exit(130));
  });
}
// Whatever happens, no redis-server or proxy outlives the bench.
process.on('exit', killAllNow);

main().then(
  async () => {
    await cleanup();
    process.exit(0);
  },
  async (error: unknown) => {
    if (interrupted) return;
    const detail = error instanceof Error ? (error.stack ?? error.message) : String(error);
    log(error instanceof BenchError ? `bench: ${error.message}` : `bench failed: ${detail}`);
    await cleanup();
    process.exit(1);
  },
);
