/**
 * Encoding the commands the proxy sends on its own (the lock script call, AUTH/SELECT at
 * connect, ASKING again): a RESP array of bulk strings, as clients write commands.
 *
 * The lock script call goes out for every lock block, so its fixed part (EVALSHA, the hash,
 * the key count) is encoded once (`encodeHead`) and each call adds only its own arguments,
 * written into one buffer (`appendBulks`).
 */

const CRLF = Buffer.from('\r\n');

/** One command; text arguments as UTF-8, bytes as they are. */
export function encodeCommand(...args: ReadonlyArray<string | Buffer>): Buffer {
  return appendBulks(encodeHead(args.length), args.map(toBytes));
}

/** The start of a command of `count` arguments, with its first (fixed) arguments. */
export function encodeHead(count: number, ...fixed: ReadonlyArray<string | Buffer>): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${count}\r\n`)];
  for (const arg of fixed) {
    const bytes = toBytes(arg);
    parts.push(Buffer.from(`$${bytes.length}\r\n`), bytes, CRLF);
  }
  return Buffer.concat(parts);
}

/** `head` followed by `args` as bulk strings, in one buffer allocated once. */
export function appendBulks(head: Buffer, args: readonly Buffer[]): Buffer {
  let length = head.length;
  for (let i = 0; i < args.length; i++) length += decimalLength(args[i].length) + args[i].length + 5; // $ CR LF ... CR LF
  const out = Buffer.allocUnsafe(length);
  let pos = head.copy(out, 0);
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    out[pos++] = 0x24; // $
    pos += out.write(String(arg.length), pos, 'latin1');
    out[pos++] = 0x0d;
    out[pos++] = 0x0a;
    pos += arg.copy(out, pos);
    out[pos++] = 0x0d;
    out[pos++] = 0x0a;
  }
  return out;
}

function toBytes(arg: string | Buffer): Buffer {
  return typeof arg === 'string' ? Buffer.from(arg, 'utf8') : arg;
}

function decimalLength(n: number): number {
  let digits = 1;
  while (n >= 10) {
    n = Math.floor(n / 10);
    digits++;
  }
  return digits;
}

/** ASKING, sent again where a command of the proxy's own used up the client's (it lasts one command). */
export const ASKING = encodeCommand('ASKING');
