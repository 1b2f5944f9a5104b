/**
 * Facts about the lock block on the wire, shared by its matcher and both ways of sending it:
 *
 *     MULTI
 *     INCR k            | INCRBY k <int64>
 *     EXPIRE k <secs>   | PEXPIRE k <ms>      (no NX/XX/GT/LT)
 *     EXEC
 *
 * and what a matched block asks for (LockCall).
 */

/** MULTI, INCR[BY], [P]EXPIRE, EXEC. */
export const BLOCK_FRAMES = 4;

/** The block's command names, upper case, as the script call names them too. */
export const BLOCK_COMMANDS = {
  MULTI: Buffer.from('MULTI'),
  INCR: Buffer.from('INCR'),
  INCRBY: Buffer.from('INCRBY'),
  EXPIRE: Buffer.from('EXPIRE'),
  PEXPIRE: Buffer.from('PEXPIRE'),
  EXEC: Buffer.from('EXEC'),
} as const;

/** What a matched block asks for. */
export interface LockCall {
  key: Buffer;
  /** INCR or INCRBY */
  increment: 'INCR' | 'INCRBY';
  /** Delta as sent (INCRBY), or "1" for INCR. */
  delta: Buffer;
  /** EXPIRE or PEXPIRE */
  expire: 'EXPIRE' | 'PEXPIRE';
  ttl: Buffer;
}

/** Redis's replies to MULTI and to the two queued commands, then the EXEC array of two. */
export const REPLIES_HEAD = Buffer.from('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n');
