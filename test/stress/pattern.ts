/**
 * The bytes of the integrity stress's values: every value is a run of 32-byte records that name
 * the client, the key, the value's version and the record's own offset in it, so that any
 * misplaced byte says whose it is and where it came from:
 *
 *     c0017k0003v000042o000000004096~
 *
 * A value of length L is that run cut at L. Bytes are made on demand for any range, so a
 * multi-MiB value is never held whole by the stress.
 */

export const RECORD_BYTES = 32;

/** Identifies one value: whose, which key, which version of it. */
export interface ValueId {
  readonly client: number;
  readonly key: number;
  readonly version: number;
}

const OFFSET_DIGITS = 12;
/** Where the offset's digits start in a record: after `cCCCCkKKKKvVVVVVVo`. */
const OFFSET_AT = 18;

/** The record of `id` at offset 0; others differ only in their offset digits. */
function recordTemplate(id: ValueId): Buffer {
  const text = `c${pad(id.client, 4)}k${pad(id.key, 4)}v${pad(id.version, 6)}o${pad(0, OFFSET_DIGITS)}~`;
  if (text.length !== RECORD_BYTES - 1) throw new Error(`record of ${text.length + 1} bytes`);
  return Buffer.from(`${text}\n`, 'latin1');
}

function pad(n: number, width: number): string {
  return String(n % 10 ** width).padStart(width, '0');
}

/**
 * Writes bytes [from, from + length) of value `id` into `target` at `at`. Returns `target`.
 * (One record is built per call, and only its offset digits are rewritten record by record.)
 */
export function fillValue(target: Buffer, at: number, id: ValueId, from: number, length: number): Buffer {
  const record = recordTemplate(id);
  let out = at;
  let offset = from;
  const end = from + length;
  while (offset < end) {
    const recordStart = offset - (offset % RECORD_BYTES);
    writeDigits(record, OFFSET_AT, recordStart);
    const inRecord = offset - recordStart;
    const take = Math.min(RECORD_BYTES - inRecord, end - offset);
    record.copy(target, out, inRecord, inRecord + take);
    out += take;
    offset += take;
  }
  return target;
}

/** Value bytes [from, from + length) of `id`, as a new buffer. */
export function valueBytes(id: ValueId, from: number, length: number): Buffer {
  return fillValue(Buffer.allocUnsafe(length), 0, id, from, length);
}

function writeDigits(record: Buffer, at: number, n: number): void {
  for (let i = at + OFFSET_DIGITS - 1; i >= at; i--) {
    record[i] = 0x30 + (n % 10);
    n = Math.floor(n / 10);
  }
}

const RECORD_TEXT = /c(\d{4})k(\d{4})v(\d{6})o(\d{12})~/g;

/**
 * Says whose value bytes appear in `bytes` (stress records, whole ones): "client 17 key 3
 * version 42 offset 4096", the first few distinct ones; '' when there are none.
 */
export function describeOrigins(bytes: Buffer, limit = 3): string {
  const seen = new Set<string>();
  for (const match of bytes.toString('latin1').matchAll(RECORD_TEXT)) {
    seen.add(`client ${Number(match[1])} key ${Number(match[2])} version ${Number(match[3])} offset ${Number(match[4])}`);
    if (seen.size >= limit) break;
  }
  return [...seen].join('; ');
}

/** The clients whose records appear in `bytes`. */
export function clientsIn(bytes: Buffer): Set<number> {
  const clients = new Set<number>();
  for (const match of bytes.toString('latin1').matchAll(RECORD_TEXT)) clients.add(Number(match[1]));
  return clients;
}
