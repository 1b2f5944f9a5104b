/**
 * Structured JSON logs (pino), one line per event. Values are never logged;
 * keys only through `describeKey`, escaped and truncated, because they are
 * binary and may carry user data.
 */
import { pino, type Logger } from 'pino';

export type { Logger };

export function createLogger(level: string): Logger {
  return pino({ name: 'redis-lock-proxy', level, base: { pid: process.pid } });
}

/** Longest key prefix shown in a log line. */
const KEY_LOG_BYTES = 64;

/** A key as printable ASCII: other bytes as \xNN, at most KEY_LOG_BYTES bytes, with the rest counted. */
export function describeKey(key: Uint8Array): string {
  const shown = Math.min(key.length, KEY_LOG_BYTES);
  let text = '';
  for (let i = 0; i < shown; i++) {
    const byte = key[i];
    if (byte >= 0x20 && byte < 0x7f && byte !== 0x5c) text += String.fromCharCode(byte);
    else text += '\\x' + byte.toString(16).padStart(2, '0');
  }
  if (key.length > shown) text += `...(+${key.length - shown} bytes)`;
  return text;
}
