/**
 * `locks --release KEY...` and `locks --release-abandoned [--yes]`: deleting locks. Named keys
 * are deleted once each is shown to be a lock; flagged ones only if they are still exactly as
 * they were read, checked atomically, so that a lock someone took in the meantime stays.
 */
import type { Redis } from 'ioredis';
import { escapeKey } from '../key-text.js';
import type { RuleSet } from '../rules/types.js';
import type { Io } from './command.js';
import type { LockNode, LockNodes } from '../lock-keys/nodes.js';
import { describeLockKey, isFlagged, READ_BATCH, readBatch, type LockRow } from '../lock-keys/read.js';
import { printResult, rowJson, rowSummary, table } from './locks-output.js';

/**
 * Deletes KEYS[1] only if it still holds ARGV[1] and its PTTL has not gone up from ARGV[2]
 * (-1: it must still have no expiry). Every lock attempt changes the counter and a new lock
 * starts with a fresh expiry, so an unchanged key is the one that was read, not a lock someone
 * took in the meantime. Returns 1 deleted, 0 changed (left alone), -1 already gone.
 */
const DELETE_IF_UNCHANGED = `
local value = redis.call('GET', KEYS[1])
if value == false then return -1 end
if value ~= ARGV[1] then return 0 end
local pttl = redis.call('PTTL', KEYS[1])
local seen = tonumber(ARGV[2])
if seen == -1 then
  if pttl ~= -1 then return 0 end
elseif pttl == -1 or pttl > seen then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
`;

type DeleteResult = 'deleted' | 'changed' | 'gone' | Error;

/** The options releasing goes by. */
export interface ReleaseOptions {
  /** One JSON object per line instead of text. */
  readonly json: boolean;
  /** --yes: --release-abandoned deletes, instead of listing what it would delete. */
  readonly yes: boolean;
}

/** --release KEY...: says what each key is, then deletes it. Exit code 1 when a key is not a lock. */
export async function releaseNamed(
  nodes: LockNodes,
  rules: RuleSet,
  keys: readonly Buffer[],
  options: ReleaseOptions,
  io: Io,
): Promise<number> {
  const out = (text: string, record: Record<string, unknown>) => printResult(io, options.json, text, record);
  let failed = 0;
  const targets: Array<{ key: Buffer; node: LockNode }> = [];
  for (const key of keys) {
    const shown = escapeKey(key);
    const rule = rules.match(key);
    if (rule === undefined) {
      failed++;
      out(`refused ${shown}: no rule names this key, so it is not a lock; not deleted`, {
        action: 'refused',
        key: shown,
        reason: 'no rule names this key',
      });
      continue;
    }
    const node = await nodes.nodeFor(key);
    const [row] = await readBatch(node.redis, rules, [{ key, rule }], node.name);
    if (row === undefined) {
      const what = describeLockKey(key, rules);
      out(`not found ${shown} (${what}): nothing to delete`, { action: 'not-found', key: shown, rule: rule.name, what });
      continue;
    }
    out(`will delete ${shown}: ${rowSummary(row)}`, { action: 'will-delete', ...rowJson(row) });
    targets.push({ key, node });
  }
  for (const { key, node } of targets) {
    const shown = escapeKey(key);
    const deleted = await node.redis.del(key);
    out(deleted === 1 ? `deleted ${shown}` : `not found ${shown}: already gone`, {
      action: deleted === 1 ? 'deleted' : 'not-found',
      key: shown,
    });
  }
  return failed > 0 ? 1 : 0;
}

/**
 * --release-abandoned [--yes]: lists the flagged locks; with --yes deletes those unchanged since.
 * Exit code 1 without --yes (nothing deleted) or when a key could not be deleted.
 */
export async function releaseAbandoned(nodes: LockNodes, rows: readonly LockRow[], options: ReleaseOptions, io: Io): Promise<number> {
  const { json, yes } = options;
  const flagged = rows.filter(isFlagged);
  if (flagged.length === 0) {
    if (!json) io.stdout(`no abandoned locks (${rows.length} lock key(s) checked)\n`);
    return 0;
  }
  if (!yes) {
    if (json) {
      for (const row of flagged) io.stdout(`${JSON.stringify({ action: 'would-delete', ...rowJson(row) })}\n`);
    } else {
      io.stdout(`would delete ${flagged.length} lock key(s):\n`);
      io.stdout(table(flagged, nodes.cluster));
    }
    io.stderr(`locks: nothing deleted: add --yes to delete these ${flagged.length} key(s)\n`);
    return 1;
  }

  const results = await deleteOnTheirNodes(nodes, flagged);
  let errors = 0;
  flagged.forEach((row, i) => {
    const result = results[i];
    if (result instanceof Error) errors++;
    const [text, record] = resultLine(row, result);
    printResult(io, json, text, record);
  });
  return errors > 0 ? 1 : 0;
}

/** What became of one flagged row: its line, and its record for --json. */
function resultLine(row: LockRow, result: DeleteResult): [string, Record<string, unknown>] {
  const shown = escapeKey(row.key);
  if (result instanceof Error) {
    return [`error ${shown}: ${result.message}`, { action: 'error', ...rowJson(row), error: result.message }];
  }
  const text = {
    deleted: `deleted ${shown}: ${rowSummary(row)}`,
    changed: `skipped ${shown}: changed since it was read (someone took or tried the lock); left alone`,
    gone: `not found ${shown}: already gone`,
  }[result];
  return [text, { action: result === 'changed' ? 'skipped' : result === 'gone' ? 'not-found' : 'deleted', ...rowJson(row) }];
}

/** deleteUnchanged on the node each row was read from; the results in the rows' order. */
async function deleteOnTheirNodes(nodes: LockNodes, rows: readonly LockRow[]): Promise<DeleteResult[]> {
  const results = new Array<DeleteResult>(rows.length);
  for (const node of nodes.nodes) {
    const own = rows.flatMap((row, i) => (row.node === node.name ? [i] : []));
    const done = await deleteUnchanged(
      node.redis,
      own.map((i) => rows[i]),
    );
    own.forEach((index, j) => (results[index] = done[j]));
  }
  return results;
}

/**
 * Deletes each row's key only if it is still exactly as read: same value, and an expiry that has
 * not gone up (or still none). Atomic per key (one Lua script), pipelined in batches.
 */
export async function deleteUnchanged(redis: Redis, rows: readonly LockRow[]): Promise<DeleteResult[]> {
  const results: DeleteResult[] = [];
  for (let start = 0; start < rows.length; start += READ_BATCH) {
    const batch = rows.slice(start, start + READ_BATCH);
    const pipeline = redis.pipeline();
    for (const row of batch) {
      if (row.value === undefined) continue;
      pipeline.eval(DELETE_IF_UNCHANGED, 1, row.key, row.value, String(row.pttl));
    }
    const replies = (await pipeline.exec()) ?? [];
    let next = 0;
    for (const row of batch) {
      if (row.value === undefined) {
        results.push(new Error('not a string value: delete it with --release'));
        continue;
      }
      const [error, result] = replies[next++] ?? [new Error(`no reply to the delete of ${escapeKey(row.key)}`), null];
      if (error) results.push(error);
      else results.push(result === 1 ? 'deleted' : result === -1 ? 'gone' : 'changed');
    }
  }
  return results;
}
