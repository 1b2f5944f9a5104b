/**
 * The Lua script that replaces a matched lock block, the command that runs
 * it, and the translation of its reply back into the four replies the client
 * expects from MULTI / INCR[BY] / [P]EXPIRE / EXEC.
 */
import { createHash } from 'node:crypto';
import { appendBulks, encodeHead } from '../resp/encode.js';
import { BLOCK_COMMANDS } from './block-matcher.js';
import { REPLIES_HEAD } from './block-replies.js';

/**
 * KEYS[1]: the key. ARGV: increment command, delta, expiry command, expiry.
 *
 * The increment runs with pcall so that an execution error (wrong type, not
 * an integer, overflow) lands inside the array exactly where EXEC would have
 * put it. Any other error (OOM, READONLY, NOPERM, ...) is one that Redis
 * would have raised while queueing the original block, which then behaves
 * differently (EXECABORT); the script returns it as its own error, having
 * written nothing, and the proxy sends the original block instead.
 *
 * The expiry is applied only when the key has none after the increment
 * (EXPIRE ... NX): that is a key the increment just created, or one that lost
 * its expiry (healed). A lock somebody holds keeps the expiry its owner set.
 * Redis before 7.0 has no NX; there the script asks PTTL instead.
 *
 * The script calls no read-only command on the normal path: inside a script
 * those make Redis track the key for a client that has CLIENT TRACKING on,
 * and the client would receive invalidation pushes the original block never
 * caused. Counters beyond 2^53 cannot cross Lua's doubles exactly, so their
 * exact value is read back with GETEX (a GET flagged as a write command).
 */
export const LOCK_SCRIPT = `-- redis-lock-proxy: expire-on-create
local key = KEYS[1]
local n
if ARGV[1] == 'INCR' then n = redis.pcall('INCR', key) else n = redis.pcall('INCRBY', key, ARGV[2]) end
if type(n) == 'table' then
  local e = n.err
  if not (string.find(e, 'WRONGTYPE ', 1, true) == 1
      or string.find(e, 'ERR value is not an integer', 1, true) == 1
      or string.find(e, 'ERR increment or decrement would overflow', 1, true) == 1) then
    return n
  end
end
local applied = redis.pcall(ARGV[3], key, ARGV[4], 'NX')
if type(applied) == 'table' then
  applied = 0
  if redis.call('PTTL', key) == -1 then applied = redis.call(ARGV[3], key, ARGV[4]) end
end
if type(n) == 'number' and (n >= 9007199254740992 or n <= -9007199254740992) then n = redis.call('GETEX', key) end
return {n, applied}
`;

export const LOCK_SCRIPT_SHA = createHash('sha1').update(LOCK_SCRIPT).digest('hex');

/** What the script is asked to do, from a matched block. */
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

/** What every script call starts with: EVALSHA (or EVAL with the source), the script, one key. */
const EVALSHA_HEAD = encodeHead(8, 'EVALSHA', LOCK_SCRIPT_SHA, '1');
const EVAL_HEAD = encodeHead(8, 'EVAL', LOCK_SCRIPT, '1');

/** The RESP command that runs the script: EVALSHA normally, EVAL when the script cache lost it. */
export function encodeLockCall(call: LockCall, withSource: boolean): Buffer {
  return appendBulks(withSource ? EVAL_HEAD : EVALSHA_HEAD, [
    call.key,
    BLOCK_COMMANDS[call.increment],
    call.delta,
    BLOCK_COMMANDS[call.expire],
    call.ttl,
  ]);
}

export type ScriptOutcome =
  /** The script ran: these are the client's four replies. */
  | { kind: 'replies'; bytes: Buffer; counter: string; applied: boolean }
  /** The script did not run (or refused to): send the original block. */
  | { kind: 'error'; message: string }
  /** A reply the proxy cannot interpret; the script may have run. */
  | { kind: 'unexpected'; message: string };

/** Reads one `<prefix><text>\r\n` line starting at `pos`; returns the text end, or -1. */
function lineEnd(reply: Buffer, pos: number): number {
  const cr = reply.indexOf(0x0d, pos);
  return cr === -1 || reply[cr + 1] !== 0x0a ? -1 : cr;
}

/** Turns the script's reply (one complete RESP frame) into the client's replies. */
export function translateScriptReply(reply: Buffer): ScriptOutcome {
  const type = reply[0];
  if (type === 0x2d /* - */ || type === 0x21 /* ! */) {
    return { kind: 'error', message: reply.toString('latin1').replace(/\r\n$/, '').slice(0, 200) };
  }
  const unexpected = (): ScriptOutcome => ({
    kind: 'unexpected',
    message: `unexpected script reply ${JSON.stringify(reply.subarray(0, 80).toString('latin1'))}`,
  });
  if (!reply.subarray(0, 4).equals(REPLIES_HEAD.subarray(REPLIES_HEAD.length - 4))) return unexpected();

  // First element: the counter (integer, or a bulk string for huge values), or the increment's error.
  let pos = 4;
  let end = lineEnd(reply, pos);
  if (end === -1) return unexpected();
  let first: Buffer;
  let counter: string;
  if (reply[pos] === 0x3a /* : */ || reply[pos] === 0x2d /* - */) {
    first = reply.subarray(pos, end + 2);
    counter = reply[pos] === 0x3a ? reply.toString('latin1', pos + 1, end) : '';
    pos = end + 2;
  } else if (reply[pos] === 0x24 /* $ */) {
    const length = Number(reply.toString('latin1', pos + 1, end));
    const start = end + 2;
    counter = reply.toString('latin1', start, start + length);
    if (!/^-?\d+$/.test(counter)) return unexpected();
    first = Buffer.from(`:${counter}\r\n`, 'latin1');
    pos = start + length + 2;
  } else {
    return unexpected();
  }

  // Second element: whether the expiry was applied.
  end = lineEnd(reply, pos);
  if (end === -1 || reply[pos] !== 0x3a || end + 2 !== reply.length) return unexpected();
  const applied = reply.toString('latin1', pos + 1, end);
  if (applied !== '0' && applied !== '1') return unexpected();
  return {
    kind: 'replies',
    bytes: Buffer.concat([REPLIES_HEAD, first, reply.subarray(pos)]),
    counter,
    applied: applied === '1',
  };
}
