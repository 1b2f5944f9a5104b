/**
 * Keys as text, for logs, tables and command lines. Keys are binary and may carry user data, so
 * they are never printed raw: printable ASCII stands for itself, every other byte (and `\`) is
 * written \xNN. `unescapeKey` reads that form back.
 */

/** Longest key prefix shown in a log line. */
const KEY_LOG_BYTES = 64;

/** Every byte of the key, escaped; any printed key can be given back to `unescapeKey`. */
export function escapeKey(key: Uint8Array): string {
  return escapeBytes(key, key.length);
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
    if (byte >= 0x20 && byte < 0x7f && byte !== 0x5c) text += String.fromCharCode(byte);
    else text += '\\x' + byte.toString(16).padStart(2, '0');
  }
  return text;
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

function unescapedLength(text: string): number {
  try {
    return unescapeKey(text).length;
  } catch {
    return -1;
  }
}
