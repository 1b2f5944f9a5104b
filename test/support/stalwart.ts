/**
 * Stalwart's lock traffic, byte for byte (see README.md#stalwart-releases and the comments in rules/stalwart/):
 * one contiguous buffer per attempt, binary keys with a one-byte prefix.
 */
import { cmd, RawClient } from './resp.js';

/** A task lock key: 0x17 + u64 big-endian task id (9 bytes). */
export function taskLockKey(id: bigint): Buffer {
  const key = Buffer.alloc(9);
  key[0] = 0x17;
  key.writeBigUInt64BE(id, 1);
  return key;
}

/** A queue message lock key: 0x15 + u64 big-endian queue id + 8-byte queue name (17 bytes). */
export function queueLockKey(id: bigint, name: string): Buffer {
  const key = Buffer.alloc(17);
  key[0] = 0x15;
  key.writeBigUInt64BE(id, 1);
  Buffer.from(name.padEnd(8, '\0').slice(0, 8), 'latin1').copy(key, 9);
  return key;
}

/** `MULTI / INCRBY key <delta> / EXPIRE key seconds / EXEC` as redis-rs writes it: one buffer. */
export function lockAttempt(key: Buffer | string, seconds: number, delta: bigint | number = 1): Buffer {
  return Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, String(delta)), cmd('EXPIRE', key, String(seconds)), cmd('EXEC')]);
}

/** The four replies of an attempt: `+OK +QUEUED +QUEUED *2 :<counter> :<expired>`. */
export function attemptReplies(counter: number | bigint | string, expiryApplied: 0 | 1): string {
  return `+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:${counter}\r\n:${expiryApplied}\r\n`;
}

/** The counter from an attempt's replies. */
export function counterOf(replies: Buffer): number {
  const match = /\*2\r\n:(-?\d+)\r\n/.exec(replies.toString('latin1'));
  if (!match) throw new Error(`no counter in ${JSON.stringify(replies.toString('latin1'))}`);
  return Number(match[1]);
}

/** One lock attempt with Stalwart's exact bytes on a fresh connection to `port`; returns the counter. */
export async function attemptCounter(port: number, key: Buffer, seconds: number): Promise<number> {
  const client = await RawClient.connect(port);
  try {
    client.write(lockAttempt(key, seconds));
    return counterOf(await client.readReplies(4));
  } finally {
    client.destroy();
  }
}
