/**
 * Facts about the lock block on the wire: how many frames it has, and the replies Redis gives
 * its MULTI and its queued commands. The script's translation (script.ts) and the block flow
 * (block-flow.ts) build what the client receives from these.
 */
import { BlockStep } from './block-matcher.js';

/** MULTI, INCR[BY], [P]EXPIRE, EXEC. */
export const BLOCK_FRAMES = 4;

/** Redis's reply to MULTI. */
const MULTI_OK = Buffer.from('+OK\r\n');
/** The replies to MULTI and to the two queued commands, then the EXEC array of two. */
export const REPLIES_HEAD = Buffer.from('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n');
/** EXEC after a queued command was refused (networking.c: "flagTransaction"). */
const EXECABORT = Buffer.from('-EXECABORT Transaction discarded because of previous errors.\r\n');

/** How many of the block's frames a matcher at `step` has taken, the MULTI included. */
export function framesTaken(step: BlockStep): number {
  return 1 + (step >= BlockStep.Expire ? 1 : 0) + (step >= BlockStep.Exec ? 1 : 0) + (step >= BlockStep.Complete ? 1 : 0);
}

/**
 * What Redis answers a block whose key another cluster node serves: MULTI's +OK, the same
 * redirect for the increment and the expiry (they name the same key), then EXECABORT.
 */
export function redirectedBlockReplies(redirect: Buffer): Buffer {
  return Buffer.concat([MULTI_OK, redirect, redirect, EXECABORT]);
}
