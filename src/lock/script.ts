/**
 * The lock block as one Lua script: the way for servers without `EXPIRE ... NX` (Redis before
 * 7.0), and the one --lock-method script chooses. The command that runs it, and the translation
 * of its reply back into the four replies the client expects from MULTI / INCR[BY] / [P]EXPIRE /
 * EXEC.
 *
 * The script is total: it either writes nothing and says why (an error reply; the proxy then
 * sends the original block, which Redis answers in its own words), or it runs the increment and
 * reports everything after it in its reply. It never fails after the increment, so the original
 * block is never sent where the increment may have run.
 *
 * 1. What Redis would refuse while queueing the block is refused before anything is written: on
 *    Redis 7.0+ `redis.acl_check_cmd` asks for MULTI, the increment, the expiry and EXEC as the
 *    connection's user. Before 7.0 scripts cannot ask: the expiry is read first (PTTL), so that
 *    a refused read writes nothing; where there is no key yet, the expiry is tried on it first
 *    (on a missing key it writes nothing, and answers 0), so that a user refused the expiry is
 *    refused before the increment creates a lock that would have none (Redis would have refused
 *    the whole block). Trying the expiry counts as the script's first write, after which Redis
 *    before 7.0 no longer checks maxmemory (scripting.c: lua_write_dirty): so an increment that
 *    cannot run (its delta is not an integer) meets that check first, and out of memory the
 *    script returns the OOM having written nothing, as Redis refuses the block's own increment.
 *    A user refused MULTI or EXEC, or EXPIRE on a key that exists, is not told apart there: see
 *    docs/behaviour.md#how-the-block-is-sent.
 * 2. The increment runs with pcall. An error of its execution (wrong type, not an integer,
 *    overflow) lands inside the array exactly where EXEC would put it; any other error (OOM,
 *    READONLY, ...) is one Redis raises before running a command, and is returned as it is.
 * 3. The expiry is applied only when the key has none (EXPIRE ... NX, or the PTTL read first):
 *    a key the increment just created, or one that lost its expiry (healed). An error of the
 *    expiry comes back inside the array.
 * 4. Counters beyond 2^53 cannot cross Lua's doubles exactly, so their exact value is read back
 *    with GETEX (a GET flagged as a write command, so a client with CLIENT TRACKING on is sent no
 *    invalidation the block never caused), or GET where GETEX is refused or missing (before
 *    6.2). If neither may run, the first element is nil: the increment ran but its value cannot
 *    be given, and the proxy closes the connection as a network failure would.
 *
 * On the normal path the script calls no read-only command on Redis 7.0+: inside a script
 * those make Redis track the key for a client with CLIENT TRACKING on.
 */
import { createHash } from 'node:crypto';
import { appendBulks, encodeHead } from '../resp/encode.js';
import { BLOCK_COMMANDS, REPLIES_HEAD, type LockCall } from './block-shape.js';

export const LOCK_SCRIPT = `-- redis-lock-proxy: expire-on-create
local key, incr, delta, expire, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local check = redis.acl_check_cmd
-- A command refused in the script: its error, worded so that the proxy can tell the cause (before
-- 7.0 an ACL refusal is "@user_script: 11: The user executing the script can't run this command").
local function refusal(command, reply)
  local e = string.gsub(reply.err or '', '^@user_script:%s*%d+:%s*', '')
  if string.find(e, "can't run this command", 1, true) or string.find(e, 'no permissions', 1, true) then
    return redis.error_reply('NOPERM ' .. string.lower(command) .. ': ' .. e)
  end
  return redis.error_reply(e)
end
local before
if check then
  local allowed
  if incr == 'INCR' then allowed = check('INCR', key) else allowed = check('INCRBY', key, delta) end
  local denied
  if not allowed then denied = incr
  elseif not check('MULTI') then denied = 'MULTI'
  elseif not check(expire, key, ttl, 'NX') then denied = expire
  elseif not check('EXEC') then denied = 'EXEC' end
  if denied then
    return redis.error_reply('NOPERM ' .. string.lower(denied) .. ': the lock block is not allowed for this user')
  end
else
  before = redis.pcall('PTTL', key)
  if type(before) == 'table' then return refusal('PTTL', before) end
  if before == -2 then
    local full = redis.pcall('INCRBY', key, 'x')
    if type(full) == 'table' and full.err and string.find(full.err, 'OOM', 1, true) then return refusal('INCRBY', full) end
    local refused = redis.pcall(expire, key, ttl)
    if type(refused) == 'table' then return refusal(expire, refused) end
  end
end
local n
if incr == 'INCR' then n = redis.pcall('INCR', key) else n = redis.pcall('INCRBY', key, delta) end
if type(n) == 'table' then
  local e = n.err
  if not (string.find(e, 'WRONGTYPE', 1, true) == 1
      or string.find(e, 'ERR value is not an integer', 1, true) == 1
      or string.find(e, 'ERR increment or decrement would overflow', 1, true) == 1) then
    return refusal(incr, n)
  end
end
local applied = 0
if check then
  applied = redis.pcall(expire, key, ttl, 'NX')
elseif before < 0 then
  applied = redis.pcall(expire, key, ttl)
end
if type(n) == 'number' and (n >= 9007199254740992 or n <= -9007199254740992) then
  local exact = redis.pcall('GETEX', key)
  if type(exact) ~= 'string' then exact = redis.pcall('GET', key) end
  if type(exact) ~= 'string' then return {false, applied} end
  n = exact
end
return {n, applied}
`;

export const LOCK_SCRIPT_SHA = createHash('sha1').update(LOCK_SCRIPT).digest('hex');

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
  | { kind: 'replies'; bytes: Buffer }
  /** The script wrote nothing (it refused, or Redis did not run it): send the original block. */
  | { kind: 'error'; message: string }
  /** The increment may have run but the reply cannot say how: the connection must be closed. */
  | { kind: 'unknown'; message: string };

/** Reads one `<prefix><text>\r\n` line starting at `pos`; returns the text end, or -1. */
function lineEnd(reply: Buffer, pos: number): number {
  const cr = reply.indexOf(0x0d, pos);
  return cr === -1 || reply[cr + 1] !== 0x0a ? -1 : cr;
}

/** Turns the script's reply (one complete RESP frame) into the client's replies. */
/** EXPIRE's answer where the key exists. */
const EXPIRY_SET = Buffer.from(':1\r\n');

export function translateScriptReply(reply: Buffer): ScriptOutcome {
  const type = reply[0];
  if (type === 0x2d /* - */ || type === 0x21 /* ! */) {
    return { kind: 'error', message: reply.toString('latin1').replace(/\r\n$/, '').slice(0, 200) };
  }
  const unknown = (why: string): ScriptOutcome => ({
    kind: 'unknown',
    message: `${why}: ${JSON.stringify(reply.subarray(0, 80).toString('latin1'))}`,
  });
  if (!reply.subarray(0, 4).equals(REPLIES_HEAD.subarray(REPLIES_HEAD.length - 4))) return unknown('unexpected script reply');

  // First element: the counter (an integer, or a bulk string for huge values), or the increment's error.
  let pos = 4;
  let end = lineEnd(reply, pos);
  if (end === -1) return unknown('unexpected script reply');
  let first: Buffer;
  if (reply[pos] === 0x3a /* : */ || reply[pos] === 0x2d /* - */) {
    first = reply.subarray(pos, end + 2);
    pos = end + 2;
  } else if (reply[pos] === 0x24 /* $ */ && reply[pos + 1] !== 0x2d /* $-1: nil */) {
    const length = Number(reply.toString('latin1', pos + 1, end));
    const start = end + 2;
    const counter = reply.toString('latin1', start, start + length);
    if (!/^-?\d+$/.test(counter)) return unknown('unexpected script reply');
    first = Buffer.from(`:${counter}\r\n`, 'latin1');
    pos = start + length + 2;
  } else if (reply[pos] === 0x24 || reply[pos] === 0x5f /* _ */) {
    return unknown('the counter was incremented but may not be read by this user');
  } else {
    return unknown('unexpected script reply');
  }

  // Second element: whether the expiry was applied, or its error. Right after the increment the
  // key exists, so Redis alone answers an expiry `:1`: the client gets that where the script
  // left a held lock's expiry alone (`:0`).
  end = lineEnd(reply, pos);
  if (end === -1 || end + 2 !== reply.length) return unknown('unexpected script reply');
  const second = reply.subarray(pos, end + 2);
  const valid = second[0] === 0x2d || (second.length === 4 && second[0] === 0x3a && (second[1] === 0x30 || second[1] === 0x31));
  if (!valid) return unknown('unexpected script reply');
  return { kind: 'replies', bytes: Buffer.concat([REPLIES_HEAD, first, second[0] === 0x3a ? EXPIRY_SET : second]) };
}
