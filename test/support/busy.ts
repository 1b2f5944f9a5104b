/**
 * A busy machine, on purpose: processes that keep CPUs busy while a test runs, so that races a
 * quiet machine hides (a proxy that reads a moment later than it writes, say) show in the test,
 * not only on a loaded CI machine.
 */
import { spawn } from 'node:child_process';

/** Runs `body` while `processes` other processes spin on the CPUs (two: as many as a small CI machine has). */
export async function whileBusy<T>(body: () => Promise<T>, processes = 2): Promise<T> {
  const spinners = Array.from({ length: processes }, () => spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' }));
  try {
    return await body();
  } finally {
    for (const spinner of spinners) spinner.kill('SIGKILL');
  }
}
