/**
 * Keys and other untrusted text as printable text, for logs, tables and command lines. Keys are
 * binary and may carry user data (a report lock holds a domain someone else chose), so nothing
 * from Redis is printed raw: a terminal would obey control sequences (C0 and C1 controls, CSI
 * U+009B) and bidirectional overrides (U+202E) in it, and a shell would run what a pasted key
 * says.
 *
 * - `escapeKey`: printable ASCII stands for itself, every other byte is written \xNN, and so are
 *   `\` itself and the two characters a shell acts on even inside single quotes (`'` ends the
 *   quote; csh expands `!` there). `unescapeKey` reads that form back.
 * - `keyArgument`: that form in single quotes, a word any shell passes on as it is.
 * - `printableText`: text as a human column or a log shows it, every byte that is not printable
 *   ASCII written \xNN.
 */

/** Longest key prefix shown in a log line. */
const KEY_LOG_BYTES = 64;

/** Bytes escapeKey writes as \xNN although they are printable ASCII: `!`, `'` and `\`. */
const ESCAPED_PRINTABLE = new Set([0x21, 0x27, 0x5c]);

/** Every byte of the key, escaped; any printed key can be given back to `unescapeKey`. */
export function escapeKey(key: Uint8Array): string {
  return escapeBytes(key, key.length);
}

/**
 * The key as `locks --release` takes it, ready to paste into a shell: the escaped form (which
 * holds no `'` and no `!`) in single quotes, where no shell expands anything.
 */
export function keyArgument(key: Uint8Array): string {
  return `'${escapeKey(key)}'`;
}

/** The key escaped, at most 64 bytes of it, with the rest counted: for log lines. */
export function describeKey(key: Uint8Array): string {
  const shown = Math.min(key.length, KEY_LOG_BYTES);
  const text = escapeBytes(key, shown);
  return key.length > shown ? `${text}...(+${key.length - shown} bytes)` : text;
}

function escapeBytes(key: Uint8Array, count: number): string {
  let text = '';
  for (let i = 0; i < count; i++) {
    const byte = key[i];
    if (isPrintableAscii(byte) && !ESCAPED_PRINTABLE.has(byte)) text += String.fromCharCode(byte);
    else text += hexEscape(byte);
  }
  return text;
}

/**
 * Text for a human column (what a lock is for, a node's name, a flag): its printable ASCII as it
 * is, every other byte of its UTF-8 form as \xNN. Nothing that reaches a terminal this way can
 * move the cursor, change colours or reorder what follows (CSI U+009B is \xc2\x9b, a
 * right-to-left override U+202E is \xe2\x80\xae).
 */
export function printableText(text: string): string {
  // Fast path: most text (rule names, addresses, Stalwart's descriptions) is printable ASCII.
  if (/^[\x20-\x7e]*$/.test(text)) return text;
  let out = '';
  for (const byte of Buffer.from(text, 'utf8')) out += isPrintableAscii(byte) ? String.fromCharCode(byte) : hexEscape(byte);
  return out;
}

function isPrintableAscii(byte: number): boolean {
  return byte >= 0x20 && byte < 0x7f;
}

function hexEscape(byte: number): string {
  return '\\x' + byte.toString(16).padStart(2, '0');
}

/**
 * The inverse of escapeKey (and of describeKey for keys up to 64 bytes): `\xNN` is the byte NN,
 * printable ASCII stands for itself. For convenience, other characters stand for their UTF-8
 * bytes. Throws on a `\` that does not start `\xNN`, and on describeKey's cut-short form
 * (`...(+N bytes)` after 64 bytes).
 */
export function unescapeKey(text: string): Buffer {
  const bytes: number[] = [];
  for (let i = 0; i < text.length;) {
    const code = text.charCodeAt(i);
    if (code === 0x5c) {
      const hex = /^\\x([0-9a-fA-F]{2})/.exec(text.slice(i, i + 4));
      if (hex === null) {
        throw new Error(
          `invalid escape ${JSON.stringify(text.slice(i, i + 4))} at position ${i}: write bytes as \\xNN, and \\ itself as \\x5c`,
        );
      }
      bytes.push(parseInt(hex[1], 16));
      i += 4;
    } else if (code >= 0x20 && code < 0x7f) {
      bytes.push(code);
      i += 1;
    } else {
      const char = String.fromCodePoint(text.codePointAt(i) ?? code);
      bytes.push(...Buffer.from(char, 'utf8'));
      i += char.length;
    }
  }
  const cut = /\.\.\.\(\+\d+ bytes\)$/.exec(text);
  if (cut !== null && unescapedLength(text.slice(0, cut.index)) === KEY_LOG_BYTES) {
    throw new Error(`${JSON.stringify(text)} is a key cut short for a log line; give the whole key`);
  }
  return Buffer.from(bytes);
}

/** A key given in hex (`17000000000000 04d2`, spaces allowed), as `--json` prints it in `key_hex`. */
export function keyFromHex(text: string): Buffer {
  const digits = text.replace(/\s+/g, '');
  if (digits === '' || !/^([0-9a-fA-F]{2})+$/.test(digits)) {
    throw new Error(`${JSON.stringify(text)} is not a key in hex: give an even number of hex digits (key_hex in --json)`);
  }
  return Buffer.from(digits, 'hex');
}

function unescapedLength(text: string): number {
  try {
    return unescapeKey(text).length;
  } catch {
    return -1;
  }
}

/** Longest text prefix (before its `:`) that keyPrefixLabel names as text. */
const PREFIX_TEXT_MAX = 32;
const TEXT_PREFIX = /^[A-Za-z0-9_.-]+$/;
/** `0x00` to `0xff`, made once: a label per counted block allocates nothing. */
const BYTE_LABELS = Array.from({ length: 256 }, (_, byte) => '0x' + byte.toString(16).padStart(2, '0'));

/**
 * What a key starts with, as a metric label of bounded variety: a text namespace up to and with
 * its `:` (`lock:`, `purge:`), made of letters, digits, `_`, `.` and `-` and at most 32
 * characters long; otherwise its first byte in hex (`0x17`, Stalwart's raw prefix bytes), or
 * `empty`. Never more of the key, which may hold user data.
 */
export function keyPrefixLabel(key: Uint8Array): string {
  if (key.length === 0) return 'empty';
  const colon = key.indexOf(0x3a);
  if (colon > 0 && colon <= PREFIX_TEXT_MAX) {
    const text = Buffer.from(key.buffer, key.byteOffset, colon).toString('latin1');
    if (TEXT_PREFIX.test(text)) return `${text}:`;
  }
  return BYTE_LABELS[key[0]];
}
