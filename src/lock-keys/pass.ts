/**
 * One pass over the lock keys of every node (a cluster's masters, node after node): SCAN finds
 * them (scan.ts) and each batch is read into rows (read.ts) as soon as SCAN has returned it, so
 * what a caller does with a row (print it, delete it) happens right after the key was read,
 * never after the whole keyspace was scanned. The key count and the time budget hold for the
 * whole pass, all nodes together.
 */
import type { RuleSet } from '../rules/types.js';
import type { LockNode } from './nodes.js';
import { compareReads, READ_BATCH, readBatch, rereadRows, type LockRow } from './read.js';
import { lockKeyBatches, type ScanProgress, type StopReason } from './scan.js';

export interface PassLimits {
  /** SCAN COUNT hint per call. */
  readonly count: number;
  /** Lock keys to read at most, all nodes together. */
  readonly maxKeys?: number;
  /** Date.now() after which no further SCAN call is made. */
  readonly deadline?: number;
  /** Called after each SCAN call, with the node and that node's progress. */
  readonly onProgress?: (node: LockNode, progress: ScanProgress) => void;
}

/** How a pass ended: undefined when every node's keyspace was gone through. */
export interface PassEnd {
  readonly stoppedEarly: StopReason | undefined;
  /** Lock keys read, all nodes together. */
  readonly keys: number;
}

/** Calls `onRows` with each batch of rows (never empty) as soon as it is read. */
export async function forEachRowBatch(
  nodes: readonly LockNode[],
  rules: RuleSet,
  limits: PassLimits,
  onRows: (rows: LockRow[], node: LockNode) => Promise<void> | void,
): Promise<PassEnd> {
  let keys = 0;
  for (const node of nodes) {
    const left = limits.maxKeys === undefined ? undefined : limits.maxKeys - keys;
    const onProgress = limits.onProgress === undefined ? undefined : (progress: ScanProgress) => limits.onProgress?.(node, progress);
    const batches = lockKeyBatches(
      node.redis,
      rules,
      { count: limits.count, maxKeys: left, deadline: limits.deadline, onProgress },
      READ_BATCH,
    );
    for (;;) {
      const next = await batches.next();
      if (next.done) {
        if (next.value.stoppedEarly !== undefined) return { stoppedEarly: next.value.stoppedEarly, keys };
        break;
      }
      keys += next.value.length;
      const rows = await readBatch(node.redis, rules, next.value, node.name);
      if (rows.length > 0) await onRows(rows, node);
    }
  }
  return { stoppedEarly: undefined, keys };
}

/** Every row of a pass, collected. */
export async function scanNodes(nodes: readonly LockNode[], rules: RuleSet, limits: PassLimits): Promise<PassEnd & { rows: LockRow[] }> {
  const rows: LockRow[] = [];
  const end = await forEachRowBatch(nodes, rules, limits, (batch) => void rows.push(...batch));
  return { ...end, rows };
}

/**
 * The rows read again, on the nodes they came from, each compared with its first read
 * (compareReads: a re-arm shows as an expiry that went up with the counter). Keys gone since
 * are left out; the rest keep the order they had.
 */
export async function recheckRows(nodes: readonly LockNode[], rules: RuleSet, rows: readonly LockRow[]): Promise<LockRow[]> {
  const later = new Map<string, LockRow>();
  for (const node of nodes) {
    const own = rows.filter((row) => row.node === node.name);
    for (let start = 0; start < own.length; start += READ_BATCH) {
      for (const row of await rereadRows(node.redis, rules, own.slice(start, start + READ_BATCH), node.name)) {
        later.set(`${node.name} ${row.key.toString('latin1')}`, row);
      }
    }
  }
  return rows.flatMap((row) => {
    const again = later.get(`${row.node} ${row.key.toString('latin1')}`);
    return again === undefined ? [] : [compareReads(row, again)];
  });
}
