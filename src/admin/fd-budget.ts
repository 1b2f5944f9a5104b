/**
 * Whether the admin server may take one more file descriptor. It shares the process's limit
 * (RLIMIT_NOFILE) with the data path, where each client costs two (its connection and its
 * upstream connection): an admin connection must never take the last ones, or clients are
 * refused while someone floods the admin port.
 *
 * Linux only (/proc/self/limits and /proc/self/fd); elsewhere the limit is not known, and only
 * the admin server's connection cap bounds what it takes. The open descriptors are counted at
 * most once a second (a directory listing of up to tens of thousands of entries), and those the
 * admin server accepted since are added to the count.
 */
import { readdirSync, readFileSync } from 'node:fs';

/** How long a count of the open descriptors stands. */
const COUNT_MAX_AGE_MS = 1000;

export class FdBudget {
  private counted = 0;
  private countedAt = 0;
  private acceptedSince = 0;

  /**
   * `limit`: the soft limit on open files, undefined when not known. `reserve`: how many must stay
   * free for clients; by default 5% of the limit, at least 64.
   */
  constructor(
    readonly limit: number | undefined,
    readonly reserve = limit === undefined ? 0 : Math.max(64, Math.floor(limit * 0.05)),
    private readonly countOpen: () => number = countOpenDescriptors,
  ) {}

  /** The budget of this process, from /proc (no limit known elsewhere). */
  static ofThisProcess(): FdBudget {
    return new FdBudget(openFilesLimit());
  }

  /** Whether one more descriptor leaves `reserve` free; counts it when it does. */
  take(): boolean {
    if (this.limit === undefined) return true;
    if (Date.now() - this.countedAt > COUNT_MAX_AGE_MS) {
      this.counted = this.countOpen();
      this.countedAt = Date.now();
      this.acceptedSince = 0;
    }
    // The connection being decided on is already open: it is in a fresh count, or one more.
    const open = this.counted + this.acceptedSince + 1;
    if (this.limit - open < this.reserve) return false;
    this.acceptedSince++;
    return true;
  }
}

/** `Max open files` (soft) from /proc/self/limits; undefined where there is none, or unlimited. */
function openFilesLimit(): number | undefined {
  try {
    const line = /^Max open files\s+(\S+)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
    const soft = line === null ? NaN : Number(line[1]);
    return Number.isSafeInteger(soft) && soft > 0 ? soft : undefined;
  } catch {
    return undefined;
  }
}

function countOpenDescriptors(): number {
  return readdirSync('/proc/self/fd').length;
}
