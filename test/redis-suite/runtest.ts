/**
 * One unit of Redis's own test suite (`./runtest --single unit/...`) in its
 * external-server mode, against a host and port, and what it printed, read
 * into one result per test.
 *
 * The suite's test server prints a line per test (tests/test_helper.tcl):
 *   [ok]: NAME (12 ms)          (6.0: without the time)
 *   [err]: NAME in tests/unit/x.tcl
 *   <details, over several lines>
 *   [skip]: NAME                (a tag or --skiptest left it out)
 *   [ignore]: NAME              (a tag it needs is missing: not run)
 *   [exception]: ...            (the unit stopped; the tests after it never ran)
 *   [TIMEOUT]: clients state report follows.
 */
import { spawn } from 'node:child_process';

export type Outcome = 'ok' | 'err';

export interface TestResult {
  name: string;
  outcome: Outcome;
  /** For a failure: what the suite said of it (its first lines). */
  detail?: string;
}

export interface UnitRun {
  unit: string;
  results: TestResult[];
  /** Why the unit did not finish as the suite finishes one, when it did not: an exception, a timeout, a crash. */
  aborted?: string;
  seconds: number;
  /** Everything it printed (colours removed), for a report on failure. */
  output: string;
}

export interface RuntestOptions {
  /** Where `runtest` and `tests/` are (the unit's working directory). */
  dir: string;
  unit: string;
  host: string;
  port: number;
  /** The suite's own ports (its test server takes the 32 below it). */
  baseport: number;
  /** The whole unit's bound; past it the unit is killed and reported as aborted. */
  timeoutMs: number;
}

const DETAIL_LINES = 6;

export function runUnit(opts: RuntestOptions): Promise<UnitRun> {
  const started = Date.now();
  // What ./runtest does, without its search for a tclsh.
  const args = [
    'tests/test_helper.tcl',
    '--host',
    opts.host,
    '--port',
    String(opts.port),
    '--tags',
    '-slow',
    '--single',
    opts.unit,
    '--baseport',
    String(opts.baseport),
  ];
  return new Promise((resolve) => {
    // Its own process group: the suite starts a test server and a test client of its own.
    const child = spawn('tclsh', args, { cwd: opts.dir, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    const chunks: Buffer[] = [];
    child.stdout.on('data', (chunk: Buffer) => chunks.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => chunks.push(chunk));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup(child.pid);
    }, opts.timeoutMs);
    const finish = (code: number | null, signal: NodeJS.Signals | null, error?: Error): void => {
      clearTimeout(timer);
      killGroup(child.pid); // the test client, should the server have left it behind
      const output = stripColours(Buffer.concat(chunks).toString('utf8'));
      const parsed = parseRuntestOutput(output);
      let aborted = parsed.aborted;
      if (error) aborted = `tclsh could not run: ${error.message}`;
      else if (timedOut) aborted ??= `did not finish within ${opts.timeoutMs / 1000} s`;
      else if (code !== 0 && !aborted && !parsed.results.some((r) => r.outcome === 'err'))
        aborted = `runtest exited with ${code ?? signal} and no failed test (${lastLine(output)})`;
      resolve({ unit: opts.unit, results: parsed.results, aborted, seconds: (Date.now() - started) / 1000, output });
    };
    child.once('error', (err) => finish(null, null, err));
    child.once('close', (code, signal) => finish(code, signal));
  });
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

export function stripColours(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.replace(/\x1b\[[0-9;]*m/g, '');
}

/** The results of one unit's output, and why it stopped early if it did. */
export function parseRuntestOutput(output: string): { results: TestResult[]; aborted?: string } {
  const results: TestResult[] = [];
  let aborted: string | undefined;
  const lines = output.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].replace(/\r$/, '');
    const tagged = /^\[(ok|err|exception|TIMEOUT)\]: (.*)$/.exec(line);
    if (!tagged) continue;
    const [, tag, rest] = tagged;
    if (tag === 'ok') {
      results.push({ name: rest.replace(/ \(\d+ ms\)$/, ''), outcome: 'ok' });
    } else if (tag === 'err') {
      const details: string[] = [];
      for (let j = i + 1; j < lines.length && details.length < DETAIL_LINES && !/^\[[a-zA-Z0-9/ ]+\]:? /.test(lines[j]); j++)
        if (lines[j].trim() !== '') details.push(lines[j].trim());
      results.push({ name: testName(rest), outcome: 'err', detail: details.join('\n') });
    } else {
      aborted ??= `[${tag}]: ${rest}`;
    }
  }
  return { results, aborted };
}

/** `NAME in tests/unit/x.tcl` -> NAME (a name may itself hold " in "). */
function testName(errLine: string): string {
  const at = errLine.lastIndexOf(' in tests/');
  return at >= 0 ? errLine.slice(0, at) : errLine;
}

function lastLine(output: string): string {
  const lines = output.trim().split('\n');
  return lines[lines.length - 1] ?? '';
}
