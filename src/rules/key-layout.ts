/**
 * Key layouts: a rule's `key:` field, which spells out a binary key part by part, the way the
 * application builds it, instead of a regular expression:
 *
 * ```yaml
 * key:
 *   - hex: "17 00"          # literal bytes
 *   - u64: due              # 8 bytes, a big-endian unsigned integer named "due"
 *   - leb128: account       # an unsigned LEB128 u32 (1-5 bytes, shortest form)
 *   - leb128: document
 *   - u8: search_index
 * ```
 *
 * Part types (each part is a mapping with exactly one of these keys; `bytes` also takes `length`):
 * - `hex: "17 00"`, `text: "purge:"`: literal bytes (text as UTF-8);
 * - `u8`, `u32`, `u64`: fixed-width big-endian unsigned integers;
 * - `leb128`: an unsigned LEB128 u32: 7 bits per byte, least significant first, the high bit set
 *   on every byte but the last; 1 to 5 bytes, shortest form (as encoders write it);
 * - `decimal`: a u32 in ASCII decimal, no sign, no leading zeros (0 to 4294967295);
 * - `domain`: a domain name as the application holds it: 1 to 253 bytes of printable ASCII
 *   (no space) or UTF-8 sequences; never a control byte or NUL. It takes the rest of the key, so
 *   it comes last;
 * - `bytes: name` with `length: N`: N bytes of anything (e.g. a NUL-padded name).
 *
 * The value of a typed part is its field name, used by the rule's `describe` template
 * (`"task due {due:time}"`). A layout matches a key when the parts, read in order, use up exactly
 * the whole key. Every part is read without backtracking: a `decimal` takes every digit there
 * is, so what follows it must not start with a digit.
 */
import { isUtf8 } from 'node:buffer';

export type FieldType = 'u8' | 'u32' | 'u64' | 'leb128' | 'decimal' | 'domain' | 'bytes';

export type KeyPart =
  | { readonly type: 'literal'; readonly bytes: Buffer }
  | { readonly type: FieldType; readonly name: string; readonly length: number };

export interface KeyLayout {
  readonly parts: readonly KeyPart[];
  /** The literal bytes every matching key starts with. */
  readonly prefix: Buffer;
}

/** A decoded field: integers as bigint, `domain` as text, `bytes` as the raw bytes. */
export type FieldValue = bigint | string | Buffer;

/** Reports a problem with the layout: `where` is the field path, e.g. "key[2]". */
export type LayoutProblem = (where: string, problem: string) => Error;

const FIELD_TYPES: readonly FieldType[] = ['u8', 'u32', 'u64', 'leb128', 'decimal', 'domain', 'bytes'];
const PART_TYPES = ['hex', 'text', ...FIELD_TYPES] as const;
const FIXED_WIDTH: Partial<Record<FieldType, number>> = { u8: 1, u32: 4, u64: 8 };
const FIELD_NAME = /^[a-z][a-z0-9_]*$/;
const MAX_DOMAIN_BYTES = 253;
const MAX_BYTES_LENGTH = 1024;
const U32_MAX = 0xffff_ffffn;

// ---------------------------------------------------------------------------------------------
// Parsing (from the YAML value of `key:`)
// ---------------------------------------------------------------------------------------------

/** Validates `key:` as written in a rule file. `problem` builds the error to throw. */
export function parseKeyLayout(value: unknown, problem: LayoutProblem): KeyLayout {
  if (!Array.isArray(value) || value.length === 0) {
    throw problem('key', 'must be a non-empty list of parts, such as [{hex: "17"}, {u64: id}]');
  }
  const parts = value.map((item, i) => parsePart(item, `key[${i + 1}]`, problem));
  const names = new Set<string>();
  parts.forEach((part, i) => {
    const where = `key[${i + 1}]`;
    if (part.type === 'literal') return;
    if (names.has(part.name)) throw problem(where, `field name "${part.name}" is used twice`);
    names.add(part.name);
    const next = parts[i + 1];
    if (part.type === 'domain' && next !== undefined) {
      throw problem(where, 'a domain takes the rest of the key, so it must be the last part');
    }
    if (part.type === 'decimal' && next !== undefined && startsWithDigit(next)) {
      throw problem(`key[${i + 2}]`, 'cannot start with a digit right after a decimal (the decimal would take it)');
    }
  });
  if (parts[0].type !== 'literal') {
    throw problem('key[1]', 'must be literal bytes (hex or text): a rule names its keys by their first bytes');
  }
  const prefix: Buffer[] = [];
  for (const part of parts) {
    if (part.type !== 'literal') break;
    prefix.push(part.bytes);
  }
  return Object.freeze({ parts: Object.freeze(parts), prefix: Buffer.concat(prefix) });
}

function startsWithDigit(part: KeyPart): boolean {
  if (part.type === 'literal') return part.bytes[0] >= 0x30 && part.bytes[0] <= 0x39;
  return part.type === 'decimal';
}

function parsePart(item: unknown, where: string, problem: LayoutProblem): KeyPart {
  if (typeof item !== 'object' || item === null || Array.isArray(item)) {
    throw problem(where, `must be a mapping such as {hex: "17"} or {u64: id}; types: ${PART_TYPES.join(', ')}`);
  }
  const fields = item as Record<string, unknown>;
  const types = Object.keys(fields).filter((k) => k !== 'length');
  if (types.length !== 1 || !(PART_TYPES as readonly string[]).includes(types[0])) {
    const unknown = types.find((k) => !(PART_TYPES as readonly string[]).includes(k));
    const what = unknown !== undefined ? `unknown part type "${unknown}"` : `${types.length} part types`;
    throw problem(where, `${what}: give exactly one of ${PART_TYPES.join(', ')}`);
  }
  const type = types[0] as (typeof PART_TYPES)[number];
  const value = fields[type];
  if (type !== 'bytes' && Object.hasOwn(fields, 'length')) throw problem(where, '"length" goes only with bytes');
  if (typeof value !== 'string') {
    const hint = type === 'hex' ? ' (quote hex digits: hex: "17")' : '';
    throw problem(where, `${type}: must be a string, got ${JSON.stringify(value) ?? 'nothing'}${hint}`);
  }
  switch (type) {
    case 'hex':
      return { type: 'literal', bytes: parseHexBytes(value, (p) => problem(where, p)) };
    case 'text':
      if (value === '') throw problem(where, 'text: is empty');
      return { type: 'literal', bytes: Buffer.from(value, 'utf8') };
    default: {
      if (!FIELD_NAME.test(value)) {
        throw problem(where, `${type}: the field name must be lowercase letters, digits and "_", got ${JSON.stringify(value)}`);
      }
      return { type, name: value, length: fieldLength(type, fields['length'], where, problem) };
    }
  }
}

/** The fixed length of a field; 0 for the variable-length types. */
function fieldLength(type: FieldType, length: unknown, where: string, problem: LayoutProblem): number {
  if (type !== 'bytes') return FIXED_WIDTH[type] ?? 0;
  if (typeof length !== 'number' || !Number.isInteger(length) || length < 1 || length > MAX_BYTES_LENGTH) {
    throw problem(where, `bytes: needs "length", an integer from 1 to ${MAX_BYTES_LENGTH}`);
  }
  return length;
}

/** Hex digits, two per byte, optionally with whitespace between bytes ("de ad"). */
export function parseHexBytes(text: string, problem: (problem: string) => Error): Buffer {
  const groups = text.split(/\s+/).filter((group) => group !== '');
  for (const group of groups) {
    if (!/^[0-9a-fA-F]*$/.test(group)) {
      const hint = /^0x/i.test(group) ? ' (write the bytes without "0x", e.g. "17")' : '';
      throw problem(`not valid hex: ${JSON.stringify(text)}${hint}`);
    }
    if (group.length % 2 !== 0) {
      throw problem(
        `odd number of hex digits in ${JSON.stringify(text)}: each byte takes two digits ` +
          '(e.g. "0a", not "a"), and spaces may only go between bytes',
      );
    }
  }
  return Buffer.from(groups.join(''), 'hex');
}

// ---------------------------------------------------------------------------------------------
// Matching and decoding
// ---------------------------------------------------------------------------------------------

/**
 * True when the parts use up exactly the whole key. Called for the key of every lock block a
 * prefix matched, so it reads bytes in place and allocates nothing.
 */
export function matchesLayout(layout: KeyLayout, key: Uint8Array): boolean {
  let pos = 0;
  const parts = layout.parts;
  for (let i = 0; i < parts.length; i++) {
    pos = partEnd(parts[i], key, pos);
    if (pos < 0) return false;
  }
  return pos === key.length;
}

/** The fields of a key the layout matches, by name; undefined when it does not match. */
export function decodeLayout(layout: KeyLayout, key: Buffer): Map<string, FieldValue> | undefined {
  if (!matchesLayout(layout, key)) return undefined;
  const fields = new Map<string, FieldValue>();
  let pos = 0;
  for (const part of layout.parts) {
    const end = partEnd(part, key, pos);
    if (part.type !== 'literal') fields.set(part.name, fieldValue(part.type, key.subarray(pos, end)));
    pos = end;
  }
  return fields;
}

function fieldValue(type: FieldType, bytes: Buffer): FieldValue {
  switch (type) {
    case 'u8':
    case 'u32':
    case 'u64': {
      let n = 0n;
      for (const byte of bytes) n = (n << 8n) | BigInt(byte);
      return n;
    }
    case 'leb128': {
      let n = 0n;
      for (let i = bytes.length - 1; i >= 0; i--) n = (n << 7n) | BigInt(bytes[i] & 0x7f);
      return n;
    }
    case 'decimal':
      return BigInt(bytes.toString('latin1'));
    case 'domain':
      return bytes.toString('utf8');
    case 'bytes':
      return Buffer.from(bytes);
  }
}

/** Where `part`, read from `pos`, ends in `key`; -1 when the bytes there are not such a part. */
function partEnd(part: KeyPart, key: Uint8Array, pos: number): number {
  switch (part.type) {
    case 'literal':
      return literalEnd(part.bytes, key, pos);
    case 'leb128':
      return leb128End(key, pos);
    case 'decimal':
      return decimalEnd(key, pos);
    case 'domain':
      return domainEnd(key, pos);
    default:
      return pos + part.length <= key.length ? pos + part.length : -1;
  }
}

function literalEnd(bytes: Buffer, key: Uint8Array, pos: number): number {
  if (pos + bytes.length > key.length) return -1;
  for (let i = 0; i < bytes.length; i++) {
    if (key[pos + i] !== bytes[i]) return -1;
  }
  return pos + bytes.length;
}

/** A u32 in shortest-form LEB128: at most 5 bytes, no trailing zero group, a fifth byte <= 0x0f. */
function leb128End(key: Uint8Array, pos: number): number {
  for (let i = 0; i < 5; i++) {
    if (pos + i >= key.length) return -1;
    const byte = key[pos + i];
    if (byte < 0x80) {
      if (i > 0 && byte === 0) return -1; // a longer form than needed
      if (i === 4 && byte > 0x0f) return -1; // beyond 32 bits
      return pos + i + 1;
    }
  }
  return -1;
}

/** A u32 in decimal: "0", or 1-10 digits without a leading zero, at most 4294967295. */
function decimalEnd(key: Uint8Array, pos: number): number {
  let end = pos;
  while (end < key.length && key[end] >= 0x30 && key[end] <= 0x39) end++;
  const digits = end - pos;
  if (digits === 0 || digits > 10 || (digits > 1 && key[pos] === 0x30)) return -1;
  if (digits === 10) {
    let n = 0n;
    for (let i = pos; i < end; i++) n = n * 10n + BigInt(key[i] - 0x30);
    if (n > U32_MAX) return -1;
  }
  return end;
}

/** The rest of the key, if it is a domain name's bytes (see the module comment). */
function domainEnd(key: Uint8Array, pos: number): number {
  const length = key.length - pos;
  if (length < 1 || length > MAX_DOMAIN_BYTES) return -1;
  let highBytes = false;
  for (let i = pos; i < key.length; i++) {
    const byte = key[i];
    if (byte >= 0x80) highBytes = true;
    else if (byte <= 0x20 || byte === 0x7f) return -1; // control bytes, NUL, space, DEL
  }
  if (highBytes && !isUtf8(key.subarray(pos))) return -1;
  return key.length;
}

// ---------------------------------------------------------------------------------------------
// Building keys (verify's scratch keys)
// ---------------------------------------------------------------------------------------------

/** What a key is built from: each field's value by name. Integers as bigint, the rest as bytes. */
export type FieldValues = ReadonlyMap<string, bigint | Buffer>;

/** The key the layout describes with these field values; throws if a value does not fit. */
export function buildKey(layout: KeyLayout, values: FieldValues): Buffer {
  const out: Buffer[] = [];
  for (const part of layout.parts) {
    if (part.type === 'literal') {
      out.push(part.bytes);
      continue;
    }
    const value = values.get(part.name);
    if (value === undefined) throw new Error(`no value for field "${part.name}"`);
    out.push(encodeField(part.type, part.length, value, part.name));
  }
  const key = Buffer.concat(out);
  if (!matchesLayout(layout, key)) throw new Error('the values do not make a key of this layout');
  return key;
}

function encodeField(type: FieldType, length: number, value: bigint | Buffer, name: string): Buffer {
  if (Buffer.isBuffer(value)) {
    if (type !== 'domain' && type !== 'bytes') throw new Error(`field "${name}" takes an integer`);
    return value;
  }
  switch (type) {
    case 'u8':
    case 'u32':
    case 'u64': {
      const bytes = Buffer.alloc(length);
      let n = value;
      for (let i = length - 1; i >= 0; i--) {
        bytes[i] = Number(n & 0xffn);
        n >>= 8n;
      }
      return bytes;
    }
    case 'leb128': {
      const bytes: number[] = [];
      let n = value;
      do {
        const group = Number(n & 0x7fn);
        n >>= 7n;
        bytes.push(n === 0n ? group : group | 0x80);
      } while (n !== 0n);
      return Buffer.from(bytes);
    }
    case 'decimal':
      return Buffer.from(value.toString(), 'latin1');
    default:
      throw new Error(`field "${name}" takes bytes`);
  }
}
