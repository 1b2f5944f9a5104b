/**
 * `locks`: how rows are shown. A table for people, with every key as a quoted shell word that
 * `--release` takes back and every other column escaped to printable ASCII (what a lock is for
 * can hold a domain someone else chose); or one JSON object per line, in ASCII (anything else
 * written \uXXXX), so that it too is safe on a terminal. And the one-line summaries the release
 * messages use.
 */
import { describeKey, escapeKey, keyArgument, printableText } from '../key-text.js';
import type { Io } from './command.js';
import { flagsOf, isFlagged, type LockRow } from '../lock-keys/read.js';

const COLUMNS = ['KEY', 'RULE', 'COUNTER', 'TTL', 'WHAT', 'FLAG'];

/** The rows as a table, or with --json one object per line. `byNode`: a NODE column (a cluster's masters). */
export function printRows(rows: readonly LockRow[], json: boolean, io: Io, byNode = false): void {
  if (json) {
    for (const row of rows) io.stdout(`${asciiJson(rowJson(row))}\n`);
    return;
  }
  if (rows.length === 0) return;
  io.stdout(table(rows, byNode));
}

/** The rows as a table under a header line, columns padded to their widest cell. */
export function table(rows: readonly LockRow[], byNode = false): string {
  const header = byNode ? ['NODE', ...COLUMNS] : COLUMNS;
  const all = [header, ...rows.map((row) => (byNode ? [printableText(row.node), ...rowCells(row)] : rowCells(row)))];
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
  return [keyArgument(row.key), printableText(row.rule), counterText(row), ttlText(row.pttl), printableText(row.what), flagsText(row)];
}

function counterText(row: LockRow): string {
  if (row.counter !== undefined) return String(row.counter);
  if (row.deadline !== undefined) return String(row.deadline);
  if (row.value === undefined) return '(not a string)';
  return describeKey(row.value);
}

function ttlText(pttl: number): string {
  if (pttl === -1) return 'none';
  return `${(pttl / 1000).toFixed(1)}s`;
}

function flagsText(row: LockRow): string {
  return printableText(flagsOf(row).join('; '));
}

/** A row as JSON: the key escaped as the table prints it (without the quotes), and in hex for --release-hex. */
export function rowJson(row: LockRow): Record<string, unknown> {
  return {
    key: escapeKey(row.key),
    key_hex: row.key.toString('hex'),
    node: row.node,
    rule: row.rule,
    counter: jsonInteger(row.counter),
    deadline: row.deadline === undefined ? null : Number(row.deadline),
    value: row.counter === undefined && row.value !== undefined ? escapeKey(row.value) : null,
    pttl_ms: row.pttl,
    what: row.what,
    flagged: isFlagged(row),
    abandoned: row.abandoned,
    rearmed: row.rearmed ?? null,
    flags: flagsOf(row),
  };
}

function jsonInteger(value: bigint | undefined): number | string | null {
  if (value === undefined) return null;
  return value <= BigInt(Number.MAX_SAFE_INTEGER) && value >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(value) : String(value);
}

/** JSON with every character outside printable ASCII written \uXXXX: the same value, safe on a terminal. */
export function asciiJson(value: unknown): string {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** One row on one line: rule, what, counter, TTL and flags, escaped. */
export function rowSummary(row: LockRow): string {
  const parts = [row.rule, row.what, `counter ${counterText(row)}`, `ttl ${ttlText(row.pttl)}`, ...flagsOf(row)];
  return printableText(parts.join(', '));
}

/** The listing's last line. `masters`: how many a cluster's keys were read from; `rechecked`: whether re-arms were looked for. */
export function summary(rows: readonly LockRow[], options: { masters?: number; rechecked: boolean }): string {
  const where = options.masters === undefined ? '' : ` on ${options.masters} master(s)`;
  const unchecked = options.rechecked ? '' : '; re-arms not looked for (--recheck-ms 0)';
  if (rows.length === 0) return `no lock keys found${where}\n`;
  const abandoned = rows.filter((row) => row.abandoned).length;
  const rearmed = rows.filter((row) => row.rearmed !== undefined).length;
  return `${rows.length} lock key(s)${where}: ${abandoned} abandoned (no expiry), ${rearmed} re-armed (traffic bypasses the proxy)${unchecked}\n`;
}

/** One result line: the text, or with --json the record. */
export function printResult(io: Io, json: boolean, text: string, record: Record<string, unknown>): void {
  io.stdout(json ? `${asciiJson(record)}\n` : `${text}\n`);
}
