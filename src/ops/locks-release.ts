/**
 * `locks --release KEY... | --release-hex HEX...`: deleting named locks. Each key is read and
 * shown first; then, with --yes or once the person at the terminal says yes (never with
 * --dry-run), each is deleted only if it is still the lock that was shown: the same value, and
 * an expiry that has not gone up (lock-keys/delete.ts). A lock taken, tried or re-armed since it
 * was shown stays.
 */
import { escapeKey, keyArgument, printableText } from '../key-text.js';
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

/**
 * Shows each key, then deletes the unchanged ones if confirmed. Exit code 1 when a key is not
 * a lock, was not deleted (changed since shown, an error), or nothing was confirmed.
 */
export async function releaseNamed(
  nodes: LockNodes,
  rules: RuleSet,
  keys: readonly Buffer[],
  options: ReleaseOptions,
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
    const verb = options.dryRun ? 'would delete' : 'will delete';
    out(`${verb} ${word}: ${rowSummary(row)}`, { action: options.dryRun ? 'would-delete' : 'will-delete', ...rowJson(row) });
    shown.push({ row, node });
  }
  if (shown.length === 0) return failed > 0 ? 1 : 0;
  if (options.dryRun) {
    if (!options.json) io.stdout(`dry run: nothing deleted\n`);
    return failed > 0 ? 1 : 0;
  }
  if (!(await confirmed(shown.length, options, io))) return 1;

  for (const { row, node } of shown) {
    const [result] = await deleteUnchanged(node.redis, [row]);
    const [text, record, ok] = resultLine(row, result);
    if (!ok) failed++;
    printResult(io, options.json, text, record);
  }
  return failed > 0 ? 1 : 0;
}

/** --yes, or a yes from the terminal; says why nothing is deleted otherwise. */
async function confirmed(count: number, options: ReleaseOptions, io: Io): Promise<boolean> {
  if (options.yes) return true;
  if (io.confirm === undefined) {
    io.stderr(
      `locks: nothing deleted: add --yes to delete ${count === 1 ? 'this lock' : `these ${count} locks`} (or run it in a terminal to be asked)\n`,
    );
    return false;
  }
  if (await io.confirm(`Delete ${count === 1 ? 'this lock' : `these ${count} locks`}, each only if unchanged since shown? [y/N] `))
    return true;
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
        { action: 'skipped', ...rowJson(row) },
        false,
      ];
  }
}
