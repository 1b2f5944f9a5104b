/**
 * `locks`: how far a scan has got, on one line of standard error rewritten in place, only when
 * standard error is a terminal (a pipe or a log file gets nothing). The share of the keyspace
 * gone through is an estimate: SCAN visits about COUNT buckets of the main table per call, and
 * DBSIZE counts the keys.
 */
import type { Redis } from 'ioredis';
import { printableText } from '../key-text.js';
import type { LockNode } from '../lock-keys/nodes.js';
import type { ScanProgress } from '../lock-keys/scan.js';
import type { Io } from './command.js';

/** At most this often a new line (the terminal need not redraw for every SCAN call). */
const REDRAW_MS = 250;
/** Erase to the end of the line (CSI K). */
const ERASE_LINE = '\x1b[K';

export interface Progress {
  /** What forEachRowBatch calls after each SCAN call; undefined when progress is not shown. */
  readonly onProgress: ((node: LockNode, progress: ScanProgress) => void) | undefined;
  /** Says something else on the line (waiting to read again, ...). */
  note(text: string): void;
  /** Clears the line. */
  done(): void;
}

/** Progress for `nodes` on a terminal, or none. */
export async function startProgress(io: Io, nodes: readonly LockNode[], count: number): Promise<Progress> {
  if (!io.stderrIsTerminal) return { onProgress: undefined, note: () => {}, done: () => {} };
  const sizes = new Map<string, number>();
  for (const node of nodes) sizes.set(node.name, await keyCount(node.redis));
  const started = Date.now();
  let drawn = 0;
  let shown = false;
  const draw = (text: string) => {
    io.stderr(`\r${text}${ERASE_LINE}`);
    shown = true;
  };
  return {
    onProgress(node, progress) {
      if (Date.now() - drawn < REDRAW_MS) return;
      drawn = Date.now();
      const size = sizes.get(node.name) ?? 0;
      const share = size > 0 ? ` (~${Math.min(99, Math.floor((progress.calls * count * 100) / size))}% of its ${size} keys)` : '';
      const where = nodes.length > 1 ? ` on ${printableText(node.name)}` : '';
      const seconds = ((Date.now() - started) / 1000).toFixed(0);
      draw(`locks: scanning${where}: ${progress.calls} SCAN call(s)${share}, ${progress.found} lock key(s) so far, ${seconds}s`);
    },
    note: draw,
    done() {
      if (shown) io.stderr(`\r${ERASE_LINE}`);
      shown = false;
    },
  };
}

/** DBSIZE, or 0 when the server refuses it (an ACL without it): then no share is shown. */
async function keyCount(redis: Redis): Promise<number> {
  try {
    return Number(await redis.dbsize());
  } catch {
    return 0;
  }
}

/** `io` whose standard output first clears the progress line, so that a result never lands after it. */
export function clearingProgress(io: Io, progress: Progress | undefined): Io {
  if (progress === undefined) return io;
  return {
    ...io,
    stdout: (text) => {
      progress.done();
      io.stdout(text);
    },
  };
}
