/**
 * `locks`: how rows are shown: a table with keys escaped as `--release` takes them back, or one
 * JSON object per line, and the one-line summaries the release messages use.
 */
import { describeKey, escapeKey } from '../key-text.js';
import type { Io } from './command.js';
import { isFlagged, type LockRow } from '../lock-keys/read.js';

const COLUMNS = ['KEY', 'RULE', 'COUNTER', 'TTL', 'WHAT', 'FLAG'];

/** The rows as a table, or with --json one object per line. `byNode`: a NODE column (a cluster's masters). */
export function printRows(rows: readonly LockRow[], json: boolean, io: Io, byNode = false): void {
  if (json) {
    for (const row of rows) io.stdout(`${JSON.stringify(rowJson(row))}\n`);
    return;
  }
  if (rows.length === 0) return;
  io.stdout(table(rows, byNode));
}

/** The rows as a table under a header line, columns padded to their widest cell. */
export function table(rows: readonly LockRow[], byNode = false): string {
  const header = byNode ? ['NODE', ...COLUMNS] : COLUMNS;
  const all = [header, ...rows.map((row) => (byNode ? [row.node, ...rowCells(row)] : rowCells(row)))];
  const widths = header.map((_, c) => Math.max(...all.map((line) => line[c].length)));
  return all
    .map((line) =>
      line
        .map((cell, c) => (c === line.length - 1 ? cell : cell.padEnd(widths[c])))
        .join('  ')
        .trimEnd(),
    )
    .join('\n')
    .concat('\n');
}

function rowCells(row: LockRow): string[] {
  return [escapeKey(row.key), row.rule, counterText(row), ttlText(row.pttl), row.what, row.flags.join('; ')];
}

function counterText(row: LockRow): string {
  if (row.counter !== undefined) return String(row.counter);
  if (row.value === undefined) return '(not a string)';
  return describeKey(row.value);
}

function ttlText(pttl: number): string {
  if (pttl === -1) return 'none';
  return `${(pttl / 1000).toFixed(1)}s`;
}

/** A row as JSON: keys escaped as the table prints them, plus hex. */
export function rowJson(row: LockRow): Record<string, unknown> {
  const counter =
    row.counter === undefined
      ? null
      : row.counter <= BigInt(Number.MAX_SAFE_INTEGER) && row.counter >= BigInt(Number.MIN_SAFE_INTEGER)
        ? Number(row.counter)
        : String(row.counter);
  return {
    key: escapeKey(row.key),
    key_hex: row.key.toString('hex'),
    node: row.node,
    rule: row.rule,
    counter,
    deadline: row.deadline === undefined ? null : Number(row.deadline),
    value: row.counter === undefined && row.value !== undefined ? escapeKey(row.value) : null,
    pttl_ms: row.pttl,
    what: row.what,
    flagged: isFlagged(row),
    flags: row.flags,
  };
}

/** One row on one line: rule, what, counter, TTL and flags. */
export function rowSummary(row: LockRow): string {
  const parts = [row.rule, row.what, `counter ${counterText(row)}`, `ttl ${ttlText(row.pttl)}`];
  if (row.flags.length > 0) parts.push(row.flags.join('; '));
  return parts.join(', ');
}

/** The listing's last line; `masters`: how many a cluster's keys were read from. */
export function summary(rows: readonly LockRow[], masters?: number): string {
  const where = masters === undefined ? '' : ` on ${masters} master(s)`;
  if (rows.length === 0) return `no lock keys found${where}\n`;
  const flagged = rows.filter(isFlagged).length;
  return `${rows.length} lock key(s)${where}, ${flagged} flagged\n`;
}

/** One result line: the text, or with --json the record. */
export function printResult(io: Io, json: boolean, text: string, record: Record<string, unknown>): void {
  io.stdout(json ? `${JSON.stringify(record)}\n` : `${text}\n`);
}
