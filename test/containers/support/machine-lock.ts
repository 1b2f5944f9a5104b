/**
 * A lock shared by every test run on this machine, for tests that must use
 * fixed, engine-wide names (a manifest's secret, ConfigMap and pod names):
 * `mkdir` either creates the directory or fails, atomically. The holder's pid
 * is written inside, so that a lock left by a run that died is taken over.
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/** Waits (up to `timeoutMs`: other runs hold it for a test's length) for the lock; resolves with its release. */
export async function machineLock(name: string, timeoutMs = 600_000): Promise<() => void> {
  const dir = path.join(os.tmpdir(), `${name}.lock`);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      mkdirSync(dir);
      writeFileSync(path.join(dir, 'pid'), String(process.pid));
      return () => rmSync(dir, { recursive: true, force: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    if (holderIsGone(dir)) rmSync(dir, { recursive: true, force: true });
    else if (Date.now() > deadline) throw new Error(`${dir}: still held by pid ${holder(dir)} after ${timeoutMs} ms`);
    else await sleep(500);
  }
}

function holder(dir: string): number | undefined {
  try {
    return Number(readFileSync(path.join(dir, 'pid'), 'utf8'));
  } catch {
    return undefined;
  }
}

/** True when the pid written in the lock is no longer a process. A lock without a pid yet is being taken. */
function holderIsGone(dir: string): boolean {
  const pid = holder(dir);
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return false;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ESRCH';
  }
}
