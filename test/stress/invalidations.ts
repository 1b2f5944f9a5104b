/**
 * The check of the push frames a RESP3 client of the integrity stress receives (tracking-client.ts).
 * When they come cannot be modelled (Redis 6.x writes them as the key changes, 7.x after the
 * command's reply, the proxy's script way changes the key inside a script), but what they are can:
 * with CLIENT TRACKING on in its default mode, a client is only told of keys it read, and a
 * stress client reads only keys of its own. So each push must be exactly
 *
 *     >2 $10 invalidate *N $len key ... (N >= 1)    or    >2 $10 invalidate _ (every key: a flush)
 *
 * naming only the client's own keys. A key of another client's is a byte that belongs to another
 * connection, and the report says whose it is.
 */
import { show } from './expected.js';
import { clientTag, lockKeyFor } from './workload.js';

const HEAD = Buffer.from('>2\r\n$10\r\ninvalidate\r\n', 'latin1');
const EVERY_KEY = Buffer.from('_\r\n', 'latin1');

export class InvalidationCheck {
  private readonly own: Set<string>;

  constructor(
    readonly client: number,
    ownKeys: readonly Buffer[],
  ) {
    this.own = new Set(ownKeys.map((key) => key.toString('latin1')));
  }

  /** What is wrong with the push frame `frame`, or null when it invalidates only keys of the client's own. */
  problem(frame: Buffer): string | null {
    if (!frame.subarray(0, HEAD.length).equals(HEAD)) return `a push that is no invalidation: ${show(frame)}`;
    const rest = frame.subarray(HEAD.length);
    if (rest.equals(EVERY_KEY)) return null;
    const keys = parseKeys(rest);
    if (keys === null) return `an invalidation push whose keys are no array of bulk strings: ${show(frame)}`;
    for (const key of keys) {
      if (this.own.has(key.toString('latin1'))) continue;
      return `an invalidation push named ${show(key)}, ${whose(key)}, not a key of client ${this.client}'s own: ${show(frame)}`;
    }
    return null;
  }
}

/** The keys of `*N $len key ...` filling `bytes` exactly (N >= 1), or null. */
function parseKeys(bytes: Buffer): Buffer[] | null {
  const header = (at: number, type: string): { n: number; next: number } | null => {
    const end = bytes.indexOf('\r\n', at);
    if (end === -1 || bytes[at] !== type.charCodeAt(0)) return null;
    const text = bytes.toString('latin1', at + 1, end);
    return /^(0|[1-9][0-9]{0,8})$/.test(text) ? { n: Number(text), next: end + 2 } : null;
  };
  const array = header(0, '*');
  if (array === null || array.n === 0) return null;
  const keys: Buffer[] = [];
  let pos = array.next;
  for (let i = 0; i < array.n; i++) {
    const bulk = header(pos, '$');
    if (bulk === null) return null;
    const end = bulk.next + bulk.n;
    if (bytes.length < end + 2 || bytes[end] !== 0x0d || bytes[end + 1] !== 0x0a) return null;
    keys.push(bytes.subarray(bulk.next, end));
    pos = end + 2;
  }
  return pos === bytes.length ? keys : null;
}

/** Whose key `key` is: `client 3's`, `client 3's task lock key`, or that it is no stress client's. */
export function whose(key: Buffer): string {
  const tagged = /\{c(\d{4})\}/.exec(key.toString('latin1'));
  if (tagged !== null) return `the key of client ${Number(tagged[1])}`;
  // A task lock key (0x17 + u64): the stress finds each client's from the id client << 32 on (workload.ts).
  if (key.length === 9 && key[0] === 0x17) {
    const client = Number(key.readBigUInt64BE(1) >> 32n);
    if (client < 10_000 && lockKeyFor(client).equals(key)) return `the task lock key of client ${client} (${clientTag(client)})`;
  }
  return 'no key of any stress client';
}
