/**
 * A complete RESP2/RESP3 reply as a tree, and back to bytes.
 *
 * Only for the few replies the proxy must edit (node addresses in CLUSTER
 * SLOTS, SHARDS and NODES): the hot path never decodes. Encoding a decoded
 * reply gives back the same bytes, so whatever is not edited reaches the
 * client exactly as Redis sent it.
 */

export type RespValue =
  /** `+ - : _ , # (`: the line after the type byte, as sent. */
  | { readonly type: number; line: string; kind: 'line' }
  /** `$ ! =`: the body; null for `$-1`. */
  | { readonly type: number; data: Buffer | null; kind: 'bulk' }
  /** `* ~ >` (elements) and `% |` (keys and values, alternating); null for `*-1`. */
  | { readonly type: number; items: RespValue[] | null; kind: 'aggregate' };

export class RespDecodeError extends Error {}

/** Decodes one complete reply; `end` in the result is where it ended. */
export function decodeReply(buf: Buffer, pos = 0): { value: RespValue; end: number } {
  const type = buf[pos];
  const cr = buf.indexOf(0x0d, pos + 1);
  if (type === undefined || cr === -1 || buf[cr + 1] !== 0x0a) throw new RespDecodeError('incomplete reply');
  const line = buf.toString('latin1', pos + 1, cr);
  let next = cr + 2;
  switch (type) {
    case 0x2b: // +
    case 0x2d: // -
    case 0x3a: // :
    case 0x5f: // _
    case 0x2c: // ,
    case 0x23: // #
    case 0x28: // (
      return { value: { type, line, kind: 'line' }, end: next };
    case 0x24: // $
    case 0x21: // !
    case 0x3d: {
      // =
      const length = Number(line);
      if (length < 0) return { value: { type, data: null, kind: 'bulk' }, end: next };
      if (next + length + 2 > buf.length) throw new RespDecodeError('incomplete reply');
      return { value: { type, data: buf.subarray(next, next + length), kind: 'bulk' }, end: next + length + 2 };
    }
    case 0x2a: // *
    case 0x7e: // ~
    case 0x3e: // >
    case 0x25: // %
    case 0x7c: {
      // |
      const count = Number(line);
      if (count < 0) return { value: { type, items: null, kind: 'aggregate' }, end: next };
      const items: RespValue[] = [];
      const total = type === 0x25 || type === 0x7c ? 2 * count : count;
      for (let i = 0; i < total; i++) {
        const item = decodeReply(buf, next);
        items.push(item.value);
        next = item.end;
      }
      return { value: { type, items, kind: 'aggregate' }, end: next };
    }
    default:
      throw new RespDecodeError(`unexpected reply type byte 0x${type.toString(16)}`);
  }
}

/** Encodes a reply tree back into RESP bytes. */
export function encodeReply(value: RespValue): Buffer {
  const parts: Buffer[] = [];
  encodeInto(value, parts);
  return Buffer.concat(parts);
}

function encodeInto(value: RespValue, parts: Buffer[]): void {
  const type = String.fromCharCode(value.type);
  switch (value.kind) {
    case 'line':
      parts.push(Buffer.from(`${type}${value.line}\r\n`, 'latin1'));
      return;
    case 'bulk':
      if (value.data === null) {
        parts.push(Buffer.from(`${type}-1\r\n`, 'latin1'));
        return;
      }
      parts.push(Buffer.from(`${type}${value.data.length}\r\n`, 'latin1'), value.data, CRLF);
      return;
    case 'aggregate': {
      if (value.items === null) {
        parts.push(Buffer.from(`${type}-1\r\n`, 'latin1'));
        return;
      }
      const pairs = value.type === 0x25 || value.type === 0x7c;
      parts.push(Buffer.from(`${type}${pairs ? value.items.length / 2 : value.items.length}\r\n`, 'latin1'));
      for (const item of value.items) encodeInto(item, parts);
      return;
    }
  }
}

const CRLF = Buffer.from('\r\n');

/** The text of a string reply (simple, bulk or verbatim without its `txt:` tag), or null. */
export function textOf(value: RespValue | undefined): string | null {
  if (value === undefined) return null;
  if (value.kind === 'line' && value.type === 0x2b) return value.line;
  if (value.kind !== 'bulk' || value.data === null || value.type === 0x21) return null;
  const text = value.data.toString('latin1');
  return value.type === 0x3d ? text.slice(4) : text;
}

/** Replaces the text of a string reply, keeping its type (and a verbatim string's tag). */
export function setText(value: RespValue, text: string): void {
  if (value.kind === 'line') value.line = text;
  else if (value.kind === 'bulk' && value.data !== null) {
    const tag = value.type === 0x3d ? value.data.subarray(0, 4).toString('latin1') : '';
    value.data = Buffer.from(tag + text, 'latin1');
  }
}

/** The integer of an integer reply, or of a string holding one; null otherwise. */
export function integerOf(value: RespValue | undefined): number | null {
  if (value === undefined) return null;
  const text = value.kind === 'line' && value.type === 0x3a ? value.line : textOf(value);
  return text !== null && /^-?\d+$/.test(text) ? Number(text) : null;
}

/** Sets an integer reply (or a string holding an integer) to `n`, keeping its type. */
export function setInteger(value: RespValue, n: number): void {
  if (value.kind === 'line') value.line = String(n);
  else setText(value, String(n));
}

/**
 * The key/value pairs of a map: a RESP3 map, or a RESP2 flat array of
 * alternating keys and values (as Redis sends maps to RESP2 clients).
 */
export function pairsOf(value: RespValue | undefined): Array<[string, RespValue]> | null {
  if (value === undefined || value.kind !== 'aggregate' || value.items === null || value.items.length % 2 !== 0) return null;
  const pairs: Array<[string, RespValue]> = [];
  for (let i = 0; i < value.items.length; i += 2) {
    const key = textOf(value.items[i]);
    if (key === null) return null;
    pairs.push([key, value.items[i + 1]]);
  }
  return pairs;
}
