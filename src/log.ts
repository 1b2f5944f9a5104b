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

/** How a line gives its time (`time`): pino's milliseconds since 1970, or ISO 8601 in UTC for people reading the log. */
export const LOG_TIMES = ['epoch', 'iso'] as const;
export type LogTime = (typeof LOG_TIMES)[number];

export function createLogger(level: string, time: LogTime = 'epoch'): Logger {
  if (output === undefined) {
    output = pino.destination({ dest: 1, sync: false });
    // A log that cannot be written must not take the proxy down (pino already drops lines after EPIPE).
    output.on('error', () => (outputFailed = true));
  }
  const timestamp = time === 'iso' ? pino.stdTimeFunctions.isoTime : pino.stdTimeFunctions.epochTime;
  return pino({ name: 'redis-lock-proxy', level, base: { pid: process.pid }, timestamp }, output);
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
