/**
 * `npm run redis-suite`: Redis's own test suite, in its external-server mode,
 * through the proxy, beside the same suite run directly against the same
 * server line (the baseline), unit by unit. A test fails the run only when it
 * fails through the proxy, passes directly, and is not on the excluded list
 * (excluded.yaml, each with its reason).
 *
 * Each server line gets two lanes that run at once, each with a redis-server
 * of its own started as the suite's own CI starts it: `direct`, and `proxy`
 * (the proxy's dist/cli.js in front of its server). Between units each server
 * is put back as it was (servers.ts).
 *
 * A unit with such failures runs through the proxy once more, and only a test
 * that fails both times counts; one that fails once is reported as flaky.
 *
 * Its last line is `redis suite: N passed, M failed`: N tests passed through
 * the proxy, M failed there that passed directly (a unit that stopped early
 * counts as one).
 */
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import process from 'node:process';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import { findOnPath } from '../support/find-on-path.js';
import { serverBuildsMode, serverTree, SERVER_TREES } from '../support/server-builds.js';
import { SUITE_FLAGS } from './flags.js';
import { EXCLUDED_FILE, readExclusions, type Exclusion } from './excluded.js';
import { runUnit, type UnitRun } from './runtest.js';
import { reset, snapshot, startProxy, startServer, type Process, type ServerState } from './servers.js';
import { confirmed, unitVerdict, type UnitVerdict } from './verdict.js';

const ROOT = path.resolve(import.meta.dirname, '../..');
const CLI = path.join(ROOT, 'dist', 'cli.js');
const LANE_STAGGER_MS = 1_000;

const USAGE = `Usage: npm run redis-suite -- [options]

  --server PATH    a redis-server binary; the suite comes from the source tree of its version
                   (.ci/redis-servers.sh fetches them) or from --source. Without --server: every
                   server line .ci/redis-servers.sh provides (${SERVER_TREES.join(', ')}), each with
                   its own build, or with the redis-server on PATH where that is the same version
  --source DIR     the server's source tree (runtest and tests/); default: found by version
  --units LIST     only these units (comma-separated, e.g. unit/multi,unit/pubsub)
  --no-direct      skip the baseline (every failure through the proxy counts)
  --unit-timeout S the bound on one unit, in seconds (default 900)

REDIS_SERVERS=required makes a server line that is missing a failure (CI); off runs none.
Exit status: 0 nothing failed through the proxy that passed directly; 1 something did, or a
required server line is missing; 2 bad options.`;

interface Line {
  version: string;
  binary: string;
  source: string;
}

interface LineResult {
  line: Line;
  verdicts: UnitVerdict[];
  directPassed: number;
  directFailed: number;
  seconds: number;
}

async function main(): Promise<number> {
  const { values } = parseArgs({ options: SUITE_FLAGS });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const unitTimeoutMs = Number(values['unit-timeout']) * 1000;
  if (!(unitTimeoutMs > 0)) return usageError(`--unit-timeout: ${JSON.stringify(values['unit-timeout'])} is not a positive number`);
  if (!existsSync(CLI)) return usageError(`${CLI} is missing: npm run build first (npm run redis-suite does)`);
  const exclusions = readExclusions();

  let lines: Line[];
  let missing: string[] = [];
  if (values.server) {
    const line = lineOf(values.server, values.source);
    if (typeof line === 'string') return usageError(line);
    lines = [line];
  } else {
    if (values.source) return usageError('--source goes with --server');
    const mode = serverBuildsMode();
    if (mode === 'off') {
      console.log('redis suite: off (REDIS_SERVERS=off)');
      return 0;
    }
    ({ lines, missing } = defaultLines());
    for (const reason of missing) console.log(`redis suite: ${mode === 'required' ? 'MISSING (required)' : 'skipped'}: ${reason}`);
    if (mode !== 'required') missing = [];
  }

  const results: LineResult[] = [];
  for (const line of lines) {
    const units = values.units ? values.units.split(',').map((u) => u.trim()) : suiteUnits(line.source);
    results.push(await runLine(line, units, !values['no-direct'], unitTimeoutMs, exclusions));
  }
  return report(results, missing);
}

function usageError(message: string): number {
  console.error(`redis-suite: ${message}\n\n${USAGE}`);
  return 2;
}

/** The server's version, from `redis-server --version` ("... v=7.0.15 ..."). */
function versionOf(binary: string): string | undefined {
  try {
    return /\bv=(\d+\.\d+\.\d+)/.exec(execFileSync(binary, ['--version'], { encoding: 'utf8' }))?.[1];
  } catch {
    return undefined;
  }
}

function lineOf(binary: string, source: string | undefined): Line | string {
  const version = versionOf(binary);
  if (!version) return `--server ${binary}: not a redis-server that tells its version (redis-server --version)`;
  if (source) {
    if (!existsSync(path.join(source, 'tests', 'test_helper.tcl'))) return `--source ${source}: no tests/test_helper.tcl there`;
    return { version, binary, source };
  }
  const found = serverTree(`redis-${version}`);
  if (found.tree) return { version, binary, source: found.tree.dir };
  return `--server ${binary} is Redis ${version}, and ${found.missing}; or give --source`;
}

function defaultLines(): { lines: Line[]; missing: string[] } {
  const lines: Line[] = [];
  const missing: string[] = [];
  const onPath = 'redis-server';
  const pathVersion = versionOf(onPath);
  for (const name of SERVER_TREES) {
    const found = serverTree(name);
    if (!found.tree) {
      missing.push(found.missing);
      continue;
    }
    const { tree } = found;
    if (tree.builtServer) lines.push({ version: tree.version, binary: tree.builtServer, source: tree.dir });
    else if (pathVersion === tree.version) lines.push({ version: tree.version, binary: onPath, source: tree.dir });
    else missing.push(`${name}: not built, and the redis-server on PATH is ${pathVersion ?? 'missing'}`);
  }
  return { lines, missing };
}

/** The suite's own list of units (tests/test_helper.tcl's `set ::all_tests {...}`). */
function suiteUnits(source: string): string[] {
  const helper = readFileSync(path.join(source, 'tests', 'test_helper.tcl'), 'utf8');
  const list = /set ::all_tests \{([^}]*)\}/.exec(helper)?.[1];
  if (!list) throw new Error(`${source}/tests/test_helper.tcl: no "set ::all_tests {...}" list`);
  return list.split(/\s+/).filter((unit) => unit !== '');
}

interface Lane {
  name: 'direct' | 'proxy';
  dir: string;
  baseport: number;
  server: Process;
  proxy?: Process;
  state: ServerState;
}

async function runLine(line: Line, units: string[], withDirect: boolean, timeoutMs: number, exclusions: Exclusion[]): Promise<LineResult> {
  const started = Date.now();
  console.log(`\n=== Redis ${line.version} (${line.binary}), suite from ${line.source}`);
  const work = mkdtempSync(path.join(os.tmpdir(), `redis-suite-${line.version}-`));
  const lanes: Lane[] = [];
  try {
    // Ports for the suite's own test servers, far apart, below the ephemeral range.
    const names = withDirect ? (['proxy', 'direct'] as const) : (['proxy'] as const);
    for (const [i, name] of names.entries()) lanes.push(await startLane(line, work, name, 21_000 + i * 2_000));
    const verdicts: UnitVerdict[] = [];
    let directPassed = 0;
    let directFailed = 0;
    for (const unit of units) {
      // The second lane starts a moment later: before 7.0 the suite's test server takes the first
      // free port from a fixed one (11111) whatever --baseport says, and two at once could race for it.
      const runs = await Promise.all(lanes.map((lane, i) => sleep(i * LANE_STAGGER_MS).then(() => runInLane(line, lane, unit, timeoutMs))));
      const [throughProxy, direct] = runs;
      let verdict = unitVerdict(line.version, throughProxy, direct, exclusions);
      if (verdict.failed.length > 0) {
        const again = await runInLane(line, lanes[0], unit, timeoutMs);
        verdict = confirmed(verdict, unitVerdict(line.version, again, direct, exclusions));
      }
      verdicts.push(verdict);
      if (direct) {
        directPassed += direct.results.filter((r) => r.outcome === 'ok').length;
        directFailed += direct.results.filter((r) => r.outcome === 'err').length + (direct.aborted ? 1 : 0);
      }
      printUnit(verdict, throughProxy, direct);
    }
    return { line, verdicts, directPassed, directFailed, seconds: (Date.now() - started) / 1000 };
  } finally {
    for (const lane of lanes) {
      await lane.proxy?.stop();
      await lane.server.stop();
    }
    rmSync(work, { recursive: true, force: true });
  }
}

/** A lane's own copy of the suite (its tests/tmp, its test server's ports) and its own server. */
async function startLane(line: Line, work: string, name: Lane['name'], baseport: number): Promise<Lane> {
  const dir = path.join(work, name);
  cpSync(path.join(line.source, 'tests'), path.join(dir, 'tests'), { recursive: true });
  cpSync(path.join(line.source, 'runtest'), path.join(dir, 'runtest'));
  // The suite runs src/redis-cli, src/redis-benchmark and the like: the server's own siblings.
  const binary = line.binary.includes('/') ? line.binary : findOnPath(line.binary);
  if (binary === undefined) throw new Error(`${line.binary} is not on PATH`);
  const bin = path.dirname(binary);
  mkdirSync(path.join(dir, 'src'));
  for (const tool of readdirSync(bin).filter((file) => /^redis-[a-z-]+$/.test(file)))
    symlinkSync(path.join(bin, tool), path.join(dir, 'src', tool));
  const server = await startServer(line.binary, line.version, dir, name);
  const proxy = name === 'proxy' ? await startProxy(CLI, server.port, dir, name) : undefined;
  return { name, dir, baseport, server, proxy, state: await snapshot(server.port) };
}

async function runInLane(line: Line, lane: Lane, unit: string, timeoutMs: number): Promise<UnitRun> {
  if (!lane.server.alive()) {
    // A unit took the server down (it should not in external mode): a new one, for the units after it.
    await lane.proxy?.stop();
    lane.server = await startServer(line.binary, line.version, lane.dir, lane.name);
    lane.proxy = lane.name === 'proxy' ? await startProxy(CLI, lane.server.port, lane.dir, lane.name) : undefined;
  }
  await reset(lane.server.port, lane.state);
  const port = lane.proxy ? lane.proxy.port : lane.server.port;
  const run = await runUnit({ dir: lane.dir, unit, host: '127.0.0.1', port, baseport: lane.baseport, timeoutMs });
  if (!lane.server.alive()) run.aborted ??= 'the server exited during the unit';
  return run;
}

function printUnit(verdict: UnitVerdict, proxy: UnitRun, direct: UnitRun | undefined): void {
  const directText = direct ? `, directly ${count(direct, 'ok')} passed ${count(direct, 'err')} failed` : '';
  console.log(
    `${verdict.unit}: through the proxy ${count(proxy, 'ok')} passed ${count(proxy, 'err')} failed${directText}` +
      ` (${proxy.seconds.toFixed(0)} s)`,
  );
  for (const f of verdict.failed)
    console.log(`  FAILED through the proxy only: ${f.test}${f.detail ? `\n    ${f.detail.replace(/\n/g, '\n    ')}` : ''}`);
  for (const f of verdict.flaky)
    console.log(
      `  FLAKY through the proxy (failed in one of two runs; a race to list in excluded.yaml, or a defect): ${f.test}${f.detail ? `\n    ${f.detail.replace(/\n/g, '\n    ')}` : ''}`,
    );
  for (const f of verdict.failedDirectlyToo) console.log(`  failed directly too (not the proxy's): ${f.test}`);
  for (const f of verdict.excludedFailing) console.log(`  excluded, failed as listed: ${f.test}`);
  for (const name of verdict.excludedPassing)
    console.log(`  EXCLUDED BUT PASSED (remove it from ${path.relative(ROOT, EXCLUDED_FILE)}?): ${name}`);
  if (verdict.aborted) console.log(`  stopped early through the proxy: ${verdict.aborted}`);
  if (verdict.abortedDirectly) console.log(`  stopped early directly: ${verdict.abortedDirectly}`);
  if (verdict.failed.length > 0) {
    const tail = proxy.output.trim().split('\n').slice(-15).join('\n    ');
    console.log(`  the end of its output through the proxy:\n    ${tail}`);
  }
}

function count(run: UnitRun, outcome: 'ok' | 'err'): number {
  return run.results.filter((r) => r.outcome === outcome).length;
}

function report(results: LineResult[], missing: string[]): number {
  let passed = 0;
  let failed = missing.length;
  console.log('');
  for (const { line, verdicts, directPassed, directFailed, seconds } of results) {
    const sum = (pick: (v: UnitVerdict) => number): number => verdicts.reduce((n, v) => n + pick(v), 0);
    const linePassed = sum((v) => v.passed);
    // A line that passed nothing, through the proxy or directly, checked nothing: the suite itself could not run.
    const ranNothing = linePassed === 0 || (directPassed === 0 && directFailed > 0) ? 1 : 0;
    const lineFailed = sum((v) => v.failed.length) + ranNothing;
    if (ranNothing)
      console.log(`redis suite ${line.version}: NO TEST PASSED ${linePassed === 0 ? 'through the proxy' : 'directly'}: counted as failed`);
    passed += linePassed;
    failed += lineFailed;
    const direct = directPassed + directFailed > 0 ? `; directly ${directPassed} passed, ${directFailed} failed` : '';
    console.log(
      `redis suite ${line.version}: ${verdicts.length} units, through the proxy ${linePassed} passed, ${lineFailed} failed` +
        ` (the proxy's), ${sum((v) => v.flaky.length)} flaky, ${sum((v) => v.failedDirectlyToo.length)} failed directly too,` +
        ` ${sum((v) => v.excludedFailing.length)} excluded, ${sum((v) => v.excludedPassing.length)} excluded but passed${direct}` +
        ` (${(seconds / 60).toFixed(1)} min)`,
    );
  }
  for (const reason of missing) console.log(`redis suite: missing server line counted as failed: ${reason}`);
  console.log(`redis suite: ${passed} passed, ${failed} failed`);
  return failed > 0 ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(`redis-suite: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    console.log('redis suite: 0 passed, 1 failed');
    process.exit(1);
  },
);
