/**
 * The lock pair fixed inside the client's own transaction on servers without `EXPIRE ... NX`
 * (Redis 6): the transaction-script way. The client's [P]EXPIRE frame is replaced by two
 * commands, queued where it would have been:
 *
 * 1. A copy of the expiry whose value is not a number (`EXPIRE k x`). Redis checks it at queueing
 *    exactly as it checks the client's own: the same command and key, so the same ACL verdict
 *    (command, first-argument rule and key pattern), the same cluster slot, the same refusals of a
 *    write (READONLY, MISCONF, NOREPLICAS). Its `+QUEUED` or refusal is what the client gets for
 *    its expiry. When EXEC runs it, it fails on its value before doing anything: `-ERR value is
 *    not an integer or out of range`, an element of EXEC's reply the client never sees (it is
 *    cut out as the reply streams, exec-reply.ts). On Redis 6.2 that error shows in INFO
 *    errorstats and in EXPIRE's failed_calls, once per lock block.
 * 2. The conditional expiry, `EVAL <script> 1 k <ttl>` (the source every time, so that an
 *    emptied script cache never fails it inside EXEC): it applies the expiry only when the key
 *    has none, and answers what Redis alone answers the expiry right after the increment.
 *
 * If Redis refuses to queue the script (a user without EVAL), the transaction is discarded and
 * replayed as the client sent it (expiry-substitution.ts), so that Redis answers it as it would
 * without the proxy.
 *
 * The script answers:
 * - `0` where the key has an expiry, which it leaves in place: the client is given `:1`, as Redis
 *   alone answers an expiry of a key that exists (exec-reply.ts restores it, as with NX);
 * - the expiry's own answer where the key has none (a lock the increment just created, or one
 *   that lost its expiry: healed), or its error;
 * - `2` where the user may not read the expiry (PTTL refused): then it does what the client asked,
 *   as Redis alone would, the lock is re-armed, and the proxy counts it so (`:2` is given as `:1`).
 *
 * PTTL inside a script makes a client with CLIENT TRACKING on track the key (Redis 6): one
 * invalidation more for the client's own lock key, as with the script way.
 */
import { appendBulks, encodeHead } from '../resp/encode.js';

export const EXPIRY_SCRIPT = `-- redis-lock-proxy: expire-if-none
local ttl = redis.pcall('PTTL', KEYS[1])
if type(ttl) == 'number' and ttl >= 0 then return 0 end
local set = redis.pcall(ARGV[1], KEYS[1], ARGV[2])
if type(ttl) ~= 'number' and type(set) == 'number' then return 2 end
return set
`;

/** The script's answer where it did what the client asked because the user may not read the expiry. */
export const REARMED_DIGIT = 0x32; // '2'

const EVAL_HEAD = encodeHead(6, 'EVAL', EXPIRY_SCRIPT, '1');
const NOT_A_NUMBER = Buffer.from('x');

/** The copy of the expiry that Redis checks but cannot run: `<EXPIRE|PEXPIRE> key x`. */
export function expiryProbe(command: Buffer, key: Buffer): Buffer {
  return appendBulks(encodeHead(3), [command, key, NOT_A_NUMBER]);
}

/** The conditional expiry: `EVAL <script> 1 key <EXPIRE|PEXPIRE> ttl`. */
export function conditionalExpiry(command: Buffer, key: Buffer, ttl: Buffer): Buffer {
  return appendBulks(EVAL_HEAD, [key, command, ttl]);
}
