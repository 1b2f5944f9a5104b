/**
 * Structured JSON logs (pino), one line per event. Values are never logged;
 * keys only through `describeKey` (key-text.ts), escaped and truncated,
 * because they are binary and may carry user data.
 *
 * Lines go to standard output asynchronously: a slow reader (journald, a pipe) never holds up
 * the proxy. The process ends through `exitAfterLog`, never a bare process.exit(): pino's own
 * exit hook writes what is left synchronously and retries for ever when stdout is a pipe whose
 * reader is gone (sonic-boom's flushSync on EPIPE), which would keep the proxy from exiting.
 */
import { pino, type DestinationStream, type Logger } from 'pino';

export type { Logger };

/** The process's log destination, once a logger was made. */
let output: (DestinationStream & ReturnType<typeof pino.destination>) | undefined;
/** Writing to it failed (a reader that is gone: EPIPE, or EIO): lines are dropped from then on. */
let outputFailed = false;

export function createLogger(level: string): Logger {
  if (output === undefined) {
    output = pino.destination({ dest: 1, sync: false });
    // A log that cannot be written must not take the proxy down (pino already drops lines after EPIPE).
    output.on('error', () => (outputFailed = true));
  }
  return pino({ name: 'redis-lock-proxy', level, base: { pid: process.pid } }, output);
}

/**
 * Ends the process with `code` once the log lines written so far are out, or after `graceMs` at
 * most: a reader that is gone or stalls costs their lines, never the exit.
 */
export function exitAfterLog(code: number, graceMs: number): void {
  const destination = output;
  const exit = (): void => {
    // Destroyed, the destination is skipped by pino's exit hook (nothing left to write for ever).
    destination?.destroy();
    process.exit(code);
  };
  if (destination === undefined || outputFailed) return exit();
  setTimeout(exit, graceMs);
  destination.once('close', exit);
  destination.once('error', exit);
  destination.end();
}
