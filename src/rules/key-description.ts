/**
 * A rule's `describe:` template: what a key of its layout stands for, in words, for `locks`.
 *
 *     describe: "index task due {due:time} (account {account}, document {document})"
 *
 * `{name}` is the layout's field of that name: integers in decimal, a domain as text, bytes as
 * text with their trailing NUL padding dropped (other non-printable bytes as \xNN).
 * `{name:time}` reads an integer field as a Unix time in seconds and writes it in ISO 8601 UTC;
 * `{name:task-time}` reads a Stalwart task's due time: Unix seconds up to 0.14, and from 0.15 on
 * a TaskEpoch, whose top 32 bits count seconds from Stalwart's epoch (2021-09-22T03:06:40Z) and
 * whose low 32 bits are an attempt and a sequence number. The two never overlap (Unix seconds
 * stay below 2^32 until 2106; a TaskEpoch is at least 2^32), so one template reads both.
 */
import { escapeKey } from '../key-text.js';
import type { FieldType, FieldValue, KeyLayout } from './key-layout.js';

type Format = 'plain' | 'time' | 'task-time';
type Piece = string | { readonly name: string; readonly format: Format };

export interface KeyDescription {
  readonly template: string;
  readonly pieces: readonly Piece[];
}

const PLACEHOLDER = /\{([^{}]*)\}/g;
const FORMATS: readonly Format[] = ['plain', 'time', 'task-time'];
/** The fields that can hold a time: the integers wide enough for one (a u8 cannot). */
const TIME_FIELD_TYPES: readonly FieldType[] = ['u32', 'u64', 'leb128', 'decimal'];
/** Stalwart's epoch (Snowflake ids, 0.15's TaskEpoch): 2021-09-22T03:06:40Z in Unix seconds. */
const STALWART_EPOCH_SECONDS = 1_632_280_000n;
/** Latest time `{x:time}` writes as a date (year 9999); larger values are written as numbers. */
const MAX_TIME_SECONDS = 253_402_300_799n;

/** Validates a template against the layout's field names; `problem` builds the error to throw. */
export function parseDescription(template: string, layout: KeyLayout | undefined, problem: (text: string) => Error): KeyDescription {
  if (template.trim() === '') throw problem('is empty: remove the field or say what the key is');
  const fields = new Map<string, FieldType>();
  for (const part of layout?.parts ?? []) if (part.type !== 'literal') fields.set(part.name, part.type);
  const pieces: Piece[] = [];
  let last = 0;
  for (const match of template.matchAll(PLACEHOLDER)) {
    pushText(pieces, template.slice(last, match.index), problem);
    const [name, format = 'plain', extra] = match[1].split(':');
    if (extra !== undefined || !(FORMATS as readonly string[]).includes(format)) {
      throw problem(`"{${match[1]}}": write {field}, {field:time} or {field:task-time}`);
    }
    const type = fields.get(name);
    if (type === undefined) {
      const known = [...fields.keys()];
      throw problem(`"{${match[1]}}" names no field of the key${known.length > 0 ? ` (fields: ${known.join(', ')})` : ' (the rule has no key: layout)'}`);
    }
    if (format !== 'plain' && !TIME_FIELD_TYPES.includes(type)) {
      throw problem(`"{${match[1]}}": only an integer field can be written as a time`);
    }
    pieces.push({ name, format: format as Format });
    last = match.index + match[0].length;
  }
  pushText(pieces, template.slice(last), problem);
  return Object.freeze({ template, pieces: Object.freeze(pieces) });
}

function pushText(pieces: Piece[], text: string, problem: (text: string) => Error): void {
  if (/[{}]/.test(text)) throw problem(`unbalanced "{" or "}" in ${JSON.stringify(text)}`);
  if (text !== '') pieces.push(text);
}

/** The description of a key with these decoded fields. */
export function describeFields(description: KeyDescription, fields: ReadonlyMap<string, FieldValue>): string {
  let text = '';
  for (const piece of description.pieces) {
    if (typeof piece === 'string') text += piece;
    else text += formatField(fields.get(piece.name), piece.format);
  }
  return text;
}

function formatField(value: FieldValue | undefined, format: Format): string {
  if (value === undefined) return '?';
  if (typeof value === 'bigint') {
    if (format === 'time') return isoTime(value);
    if (format === 'task-time') return isoTime(value < 2n ** 32n ? value : (value >> 32n) + STALWART_EPOCH_SECONDS);
    return value.toString();
  }
  if (typeof value === 'string') return value;
  let end = value.length;
  while (end > 0 && value[end - 1] === 0) end--;
  return escapeKey(value.subarray(0, end)).replaceAll('"', '\\x22');
}

/** Unix seconds as ISO 8601 UTC, without milliseconds; out-of-range values as the number. */
export function isoTime(seconds: bigint): string {
  if (seconds < 0n || seconds > MAX_TIME_SECONDS) return seconds.toString();
  return new Date(Number(seconds) * 1000).toISOString().replace('.000Z', 'Z');
}
