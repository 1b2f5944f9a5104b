/**
 * `locks --release-abandoned [--yes | --dry-run]`: deleting the abandoned locks, those without an
 * expiry. Behind the proxy every other lock ends by itself within its lease, a contended one
 * (counter above 1) included, so nothing else is ever deleted here.
 *
 * The keys are read batch by batch as SCAN returns them, and each batch's abandoned locks are
 * deleted right after it was read, each only if it still holds the value read and still has no
 * expiry (checked in the same script as the delete): a lock released and taken again while the
 * scan went on has an expiry, and stays.
 */
import type { RuleSet } from '../rules/types.js';
import type { Io } from './command.js';
import type { LockNodes } from '../lock-keys/nodes.js';
import { deleteUnchanged } from '../lock-keys/delete.js';
import { forEachRowBatch, type PassEnd, type PassLimits } from '../lock-keys/pass.js';
import { keyArgument } from '../key-text.js';
import { printResult, rowJson, rowSummary } from './locks-output.js';
import { resultLine, type ReleaseOptions } from './locks-release.js';

/** What one run did, for its last line and exit code. */
interface Tally {
  abandoned: number;
  deleted: number;
  /** Taken, tried or re-armed since it was read: no longer abandoned, rightly left alone. */
  changed: number;
  /** The delete failed (an error). */
  failed: number;
}

/**
 * Lists (without --yes) or deletes (with it) the abandoned locks. Exit code 1 without --yes
 * (nothing deleted) or when a delete failed; a lock that changed since it was read is no longer
 * abandoned, and leaving it is what was asked. The scan's own end is returned for the caller to
 * report (a time budget that ran out).
 */
export async function releaseAbandoned(
  nodes: LockNodes,
  rules: RuleSet,
  limits: PassLimits,
  options: ReleaseOptions,
  io: Io,
): Promise<{ code: number; end: PassEnd }> {
  const tally: Tally = { abandoned: 0, deleted: 0, changed: 0, failed: 0 };
  const end = await forEachRowBatch(nodes.nodes, rules, limits, async (rows, node) => {
    const abandoned = rows.filter((row) => row.abandoned);
    tally.abandoned += abandoned.length;
    if (abandoned.length === 0) return;
    if (!options.yes) {
      for (const row of abandoned) {
        printResult(io, options.json, `would delete ${keyArgument(row.key)}: ${rowSummary(row)}`, {
          action: 'would-delete',
          ...rowJson(row),
        });
      }
      return;
    }
    const results = await deleteUnchanged(node.redis, abandoned);
    abandoned.forEach((row, i) => {
      const [text, record] = resultLine(row, results[i]);
      const result = results[i];
      if (result === 'deleted') tally.deleted++;
      else if (result instanceof Error) tally.failed++;
      else if (result !== 'gone') tally.changed++; // changed, or taken again (it has an expiry now)
      printResult(io, options.json, text, record);
    });
  });

  if (tally.abandoned === 0) {
    if (!options.json) io.stdout(`no abandoned locks (${end.keys} lock key(s) checked)\n`);
    return { code: 0, end };
  }
  if (!options.yes) {
    const they = tally.abandoned === 1 ? 'it' : `these ${tally.abandoned}`;
    if (options.dryRun) {
      if (!options.json) io.stdout(`dry run: nothing deleted (${tally.abandoned} abandoned of ${end.keys} lock key(s))\n`);
      return { code: 0, end };
    }
    io.stderr(`locks: nothing deleted: add --yes to delete ${they} (each only if it still has no expiry)\n`);
    return { code: 1, end };
  }
  if (!options.json) {
    io.stdout(
      `${tally.deleted} abandoned lock(s) deleted, ${tally.changed} left alone (taken or tried since they were read), ` +
        `${tally.failed} failed, of ${end.keys} lock key(s) checked\n`,
    );
  }
  return { code: tally.failed > 0 ? 1 : 0, end };
}
