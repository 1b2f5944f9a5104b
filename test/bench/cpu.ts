/**
 * What a hop costs its host: the CPU time of its process per request, user
 * and system apart (DESIGN.md section 8).
 *
 * `utime` and `stime` of /proc/<pid>/stat (fields 14 and 15: every thread
 * of the process, its garbage collector's and thread pool's included) are
 * read right before and right after a load, and the difference is divided by
 * the requests of that load. They count in clock ticks (`getconf CLK_TCK`,
 * 100 per second on Linux), so one reading is good to 10 ms; the kernel
 * also splits a task's time into user and system by sampling at its timer
 * interrupt, so the split is statistical. Both errors shrink with the CPU
 * seconds a load takes: the report prints the least any figure was made
 * from, and a load of a few seconds of CPU makes them a few per cent at most.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

/** CPU time used by a process so far, in seconds. */
export interface ProcCpu {
  user: number;
  system: number;
}

/** One load's CPU cost on one hop process. */
export interface CpuPerRequest {
  /** µs of user CPU per request. */
  user: number;
  /** µs of system CPU per request. */
  system: number;
  /** CPU seconds (user + system) the load took from the process: what the figure is made from. */
  seconds: number;
  requests: number;
}

let ticksPerSecond: number | null = null;

/** USER_HZ: the unit of utime and stime. */
function clockTicksPerSecond(): number {
  if (ticksPerSecond === null) {
    const text = execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim();
    const value = Number(text);
    if (!Number.isInteger(value) || value <= 0) throw new Error(`getconf CLK_TCK printed ${JSON.stringify(text)}`);
    ticksPerSecond = value;
  }
  return ticksPerSecond;
}

/** utime and stime of `pid`, in seconds. */
export function readProcCpu(pid: number): ProcCpu {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // The command name (field 2) is in parentheses and may hold spaces: count fields after its ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state), so utime (14) and stime (15) are fields[11] and fields[12].
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  if (!Number.isFinite(utime) || !Number.isFinite(stime)) throw new Error(`cannot read utime/stime from /proc/${pid}/stat`);
  const hz = clockTicksPerSecond();
  return { user: utime / hz, system: stime / hz };
}

/** Runs `load` and measures the CPU process `pid` used meanwhile, per request of the load (`requests` of them). */
export async function withCpu<T>(pid: number, requests: number, load: () => Promise<T>): Promise<[T, CpuPerRequest]> {
  const before = readProcCpu(pid);
  const result = await load();
  const after = readProcCpu(pid);
  const user = after.user - before.user;
  const system = after.system - before.system;
  return [result, { user: (user * 1e6) / requests, system: (system * 1e6) / requests, seconds: user + system, requests }];
}
