/**
 * Load generators run in their own Node process: they must not share an
 * event loop (or a garbage collector) with the harness, which holds other
 * sockets and timers, and a busy generator must not slow the harness down.
 *
 * A worker is a bench module run as a script: its arguments arrive as one
 * JSON argv entry, its result leaves as one JSON line on stdout.
 */
import { realpathSync } from 'node:fs';
import process from 'node:process';
import { clearTimeout, setTimeout } from 'node:timers';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { spawnTracked } from './processes.js';

/** True when the module with this `import.meta.url` is the script Node was started with. */
export function isMain(moduleUrl: string): boolean {
  const script = process.argv[1];
  if (script === undefined) return false;
  try {
    return pathToFileURL(realpathSync(script)).href === moduleUrl;
  } catch {
    return false;
  }
}

/** Worker side: runs `job` on the JSON argument and prints its JSON result. */
export function workerMain<A, R>(job: (args: A) => Promise<R>): void {
  const args = JSON.parse(process.argv[2] ?? '{}') as A;
  job(args).then(
    (result) => {
      process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
    },
    (error: unknown) => {
      process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
      process.exit(1);
    },
  );
}

/** Harness side: runs the module at `moduleUrl` as a child and resolves with its result. */
export async function runWorker<R>(moduleUrl: string, args: object, timeoutMs: number): Promise<R> {
  const script = fileURLToPath(moduleUrl);
  const child = spawnTracked(`worker ${script}`, process.execPath, [script, JSON.stringify(args)], 0);
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    void child.stop();
  }, timeoutMs);
  const status = await child.exited;
  clearTimeout(timer);
  const lines = child.stdout().trim().split('\n');
  if (status !== 0) {
    const why = timedOut ? `did not finish within ${timeoutMs} ms` : `failed (${status})`;
    throw new Error(`${script} ${why}:\n${child.output()}`);
  }
  return JSON.parse(lines[lines.length - 1] ?? '') as R;
}
