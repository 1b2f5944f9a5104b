/**
 * Deleting a lock key only if it is still the lock that was read and shown: checked and deleted
 * in one script, so nothing can happen to the key in between. Every lock attempt changes the
 * value (INCRBY), and a lock taken again starts with a new expiry, so a key whose value is the
 * same and whose expiry has not gone up is the one that was read, not a lock someone took (or
 * tried, or re-armed) in the meantime.
 *
 * Whether the key has an expiry at all is part of what was shown: a lock read without one
 * (abandoned) that has one at the delete is live now (most likely released and taken again),
 * and a live lock that lost its expiry is abandoned now. Either is left alone, and said apart
 * from other changes, so the operator is told what the lock has become.
 */
import type { Redis } from 'ioredis';
import { escapeKey } from '../key-text.js';
import { READ_BATCH, type LockRow } from './read.js';

/**
 * How far (ms) the expiry may seem to have gone up before it counts as raised: the script's TIME
 * is read microseconds after its PTTL and rounded down, and a row's expiresAt is never early.
 */
const EXPIRY_SLACK_MS = 5;

/**
 * KEYS[1] is deleted only if it still holds ARGV[1] and, with ARGV[2] = -1, still has no
 * expiry; otherwise it must still have one, expiring no later than ARGV[2] (ms on Redis's clock,
 * as the row's expiresAt: TIME + PTTL). Comparing where the expiry lies, not the PTTL, catches a
 * re-arm however long after the read it came. Returns 1 deleted, -1 already gone, and when left
 * alone: 0 changed (another value, or the expiry went up), 2 it has an expiry now (read without
 * one), 3 it has none now (read with one).
 *
 * TIME is not deterministic: servers before Redis 5 replicate a script that calls it only
 * as its effects, after redis.replicate_commands(); later ones always do (and 7.0+ keep the call
 * as a no-op).
 */
const DELETE_IF_UNCHANGED = `
if redis.replicate_commands then redis.replicate_commands() end
local value = redis.call('GET', KEYS[1])
if value == false then return -1 end
if value ~= ARGV[1] then return 0 end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[2] == '-1' then
  if pttl ~= -1 then return 2 end
else
  if pttl == -1 then return 3 end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  if now + pttl > tonumber(ARGV[2]) + ${EXPIRY_SLACK_MS} then return 0 end
end
redis.call('DEL', KEYS[1])
return 1
`;

/**
 * What became of one conditional delete: deleted; already gone; or left alone because it
 * changed (another value, or its expiry went up), became live (it has an expiry now, and had
 * none when read) or became abandoned (it has no expiry now, and had one when read).
 */
export type DeleteResult = 'deleted' | 'gone' | 'changed' | 'now-live' | 'now-abandoned' | Error;

const SCRIPT_RESULTS: Readonly<Record<number, DeleteResult>> = {
  1: 'deleted',
  [-1]: 'gone',
  0: 'changed',
  2: 'now-live',
  3: 'now-abandoned',
};

/**
 * Deletes each row's key only if it is still exactly as read: the same value, and no expiry
 * still (an abandoned lock) or one that has not gone up. Atomic per key, pipelined in batches.
 * The results are in the rows' order.
 */
export async function deleteUnchanged(redis: Redis, rows: readonly LockRow[]): Promise<DeleteResult[]> {
  const results: DeleteResult[] = [];
  for (let start = 0; start < rows.length; start += READ_BATCH) {
    const batch = rows.slice(start, start + READ_BATCH);
    const pipeline = redis.pipeline();
    for (const row of batch) {
      if (row.value === undefined) continue;
      pipeline.eval(DELETE_IF_UNCHANGED, 1, row.key, row.value, row.expiresAt === undefined ? '-1' : String(row.expiresAt));
    }
    const replies = (await pipeline.exec()) ?? [];
    let next = 0;
    for (const row of batch) {
      if (row.value === undefined) {
        results.push(new Error('not a string value, so not a lock this command deletes'));
        continue;
      }
      const [error, result] = replies[next++] ?? [new Error(`no reply to the delete of ${escapeKey(row.key)}`), null];
      if (error) results.push(error);
      else results.push(SCRIPT_RESULTS[result as number] ?? new Error(`unexpected reply to the delete script: ${String(result)}`));
    }
  }
  return results;
}
