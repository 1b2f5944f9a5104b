/**
 * Structured JSON logs (pino), one line per event. Values are never logged;
 * keys only through `describeKey` (key-text.ts), escaped and truncated,
 * because they are binary and may carry user data.
 */
import { pino, type Logger } from 'pino';

export type { Logger };

export function createLogger(level: string): Logger {
  return pino({ name: 'redis-lock-proxy', level, base: { pid: process.pid } });
}
