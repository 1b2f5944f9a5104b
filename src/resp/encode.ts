/**
 * Encoding the commands the proxy sends on its own (the lock script call, AUTH/SELECT at
 * connect, ASKING again): a RESP array of bulk strings, as clients write commands.
 */

const CRLF = Buffer.from('\r\n');

/** One command; text arguments as UTF-8, bytes as they are. */
export function encodeCommand(...args: ReadonlyArray<string | Buffer>): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)];
  for (const arg of args) {
    const bytes = typeof arg === 'string' ? Buffer.from(arg, 'utf8') : arg;
    parts.push(Buffer.from(`$${bytes.length}\r\n`), bytes, CRLF);
  }
  return Buffer.concat(parts);
}
