/**
 * `locks --release KEY... | --release-hex HEX... [--release-live]`: deleting named locks. Each key
 * is read and shown first; then, with --yes or once the person at the terminal says yes (never
 * with --dry-run), each is deleted only if it is still the lock that was shown: the same value,
 * an expiry still absent or one that has not gone up (lock-keys/delete.ts). A lock taken, tried
 * or re-armed since it was shown stays.
 *
 * A live lock (one with an expiry) is refused unless --release-live is given, whatever --yes
 * says: it ends by itself, and while it is held its holder is running the task, so deleting it
 * lets another node take the lock and run the task a second time. Only an abandoned lock (no
 * expiry) never ends, and only that one is deleted on a yes alone.
 */
import { escapeKey, keyArgument, printableText } from '../key-text.js';
import { isoTime } from '../rules/key-description.js';
import type { RuleSet } from '../rules/types.js';
import type { Io } from './command.js';
import type { LockNode, LockNodes } from '../lock-keys/nodes.js';
import { deleteUnchanged, type DeleteResult } from '../lock-keys/delete.js';
import { describeLockKey, readBatch, type LockRow } from '../lock-keys/read.js';
import { printResult, rowJson, rowSummary } from './locks-output.js';

/** The options releasing goes by. */
export interface ReleaseOptions {
  /** One JSON object per line instead of text. */
  readonly json: boolean;
  /** Delete without asking. */
  readonly yes: boolean;
  /** Show what would be deleted, delete nothing. */
  readonly dryRun: boolean;
}

/** The options of deleting named locks. */
export interface NamedReleaseOptions extends ReleaseOptions {
  /** Delete live locks (with an expiry) too; without it they are refused. */
  readonly releaseLive: boolean;
}

/**
 * Shows each key, then deletes the unchanged ones if confirmed. Exit code 1 when a key is not
 * a lock, is a live lock and --release-live was not given, was not deleted (changed since shown,
 * an error), or nothing was confirmed.
 */
export async function releaseNamed(
  nodes: LockNodes,
  rules: RuleSet,
  keys: readonly Buffer[],
  options: NamedReleaseOptions,
  io: Io,
): Promise<number> {
  const out = (text: string, record: Record<string, unknown>) => printResult(io, options.json, text, record);
  let failed = 0;
  const shown: Array<{ row: LockRow; node: LockNode }> = [];
  for (const key of keys) {
    const word = keyArgument(key);
    const rule = rules.match(key);
    if (rule === undefined) {
      failed++;
      out(`refused ${word}: no rule names this key, so it is not a lock; not deleted`, {
        action: 'refused',
        key: escapeKey(key),
        reason: 'no rule names this key',
      });
      continue;
    }
    const node = await nodes.nodeFor(key);
    const [row] = await readBatch(node.redis, rules, [{ key, rule }], node.name);
    if (row === undefined) {
      const what = describeLockKey(key, rules);
      out(`not found ${word} (${printableText(what)}): nothing to delete`, {
        action: 'not-found',
        key: escapeKey(key),
        rule: rule.name,
        what,
      });
      continue;
    }
    if (!row.abandoned && !options.releaseLive) {
      failed++;
      out(`refused ${word}: ${liveRefusal(row)}`, {
        action: 'refused',
        ...rowJson(row),
        reason: 'live lock: it expires by itself; --release-live deletes it',
        expires_at: expiryTime(row),
      });
      continue;
    }
    const verb = options.dryRun ? 'would delete' : 'will delete';
    out(`${verb} ${word}: ${rowSummary(row)}`, { action: options.dryRun ? 'would-delete' : 'will-delete', ...rowJson(row) });
    shown.push({ row, node });
  }
  if (shown.length === 0) return failed > 0 ? 1 : 0;
  if (options.dryRun) {
    if (!options.json) io.stdout(`dry run: nothing deleted\n`);
    return failed > 0 ? 1 : 0;
  }
  const live = shown.filter(({ row }) => !row.abandoned).length;
  if (!(await confirmed(shown.length, live, options, io))) return 1;

  for (const { row, node } of shown) {
    const [result] = await deleteUnchanged(node.redis, [row]);
    const [text, record, ok] = resultLine(row, result);
    if (!ok) failed++;
    printResult(io, options.json, text, record);
  }
  return failed > 0 ? 1 : 0;
}

/**
 * Why a live lock is not deleted: what it is, when it ends by itself, what deleting it would do,
 * and the flag that deletes it anyway.
 */
function liveRefusal(row: LockRow): string {
  const contended = row.counter !== undefined && row.counter > 1n ? ` and contended (counter ${row.counter}: others tried to take it)` : '';
  return (
    `${rowSummary(row)}: a live lock, held${contended}; it expires by itself in ${(row.pttl / 1000).toFixed(1)}s ` +
    `(at ${expiryTime(row)}, Redis's clock). Deleting it lets another node take the lock while its holder still runs the task, ` +
    'so the task runs twice. Not deleted: wait for it to expire, or add --release-live to delete it anyway'
  );
}

/** When a live lock expires, as ISO 8601 on Redis's clock, rounded up to the second. */
function expiryTime(row: LockRow): string | null {
  return row.expiresAt === undefined ? null : isoTime(BigInt(Math.ceil(row.expiresAt / 1000)));
}

/** --yes, or a yes from the terminal; says why nothing is deleted otherwise. `live`: how many of them are live. */
async function confirmed(count: number, live: number, options: ReleaseOptions, io: Io): Promise<boolean> {
  if (options.yes) return true;
  const these = count === 1 ? 'this lock' : `these ${count} locks`;
  if (io.confirm === undefined) {
    io.stderr(`locks: nothing deleted: add --yes to delete ${these} (or run it in a terminal to be asked)\n`);
    return false;
  }
  const liveNote = live === 0 ? '' : count === 1 ? ' (live: its task may run twice)' : ` (${live} live: their tasks may run twice)`;
  if (await io.confirm(`Delete ${these}${liveNote}, each only if unchanged since shown? [y/N] `)) return true;
  io.stderr('locks: nothing deleted\n');
  return false;
}

/**
 * What became of one conditional delete: its line, its record for --json, and whether it did what
 * was asked (deleted, or found already gone).
 */
export function resultLine(row: LockRow, result: DeleteResult): [string, Record<string, unknown>, boolean] {
  const word = keyArgument(row.key);
  if (result instanceof Error) {
    return [`error ${word}: ${result.message}`, { action: 'error', ...rowJson(row), error: result.message }, false];
  }
  switch (result) {
    case 'deleted':
      return [`deleted ${word}: ${rowSummary(row)}`, { action: 'deleted', ...rowJson(row) }, true];
    case 'gone':
      return [`not found ${word}: already gone`, { action: 'not-found', ...rowJson(row) }, true];
    case 'changed':
      return [
        `skipped ${word}: changed since it was read (taken, tried or re-armed meanwhile); left alone`,
        { action: 'skipped', ...rowJson(row), reason: 'changed' },
        false,
      ];
    case 'now-live':
      return [
        `skipped ${word}: it has an expiry now and had none when read (most likely released and taken again): a live lock; left alone`,
        { action: 'skipped', ...rowJson(row), reason: 'now-live' },
        false,
      ];
    case 'now-abandoned':
      return [
        `skipped ${word}: its expiry was removed since it was read: now abandoned, not the lock shown; left alone (run the command again to see it as it is)`,
        { action: 'skipped', ...rowJson(row), reason: 'now-abandoned' },
        false,
      ];
  }
}
