/**
 * How a connection's lock blocks go to Redis:
 *
 * - 'transaction': inside the client's own transaction, its [P]EXPIRE given NX as it streams past
 *   (streamed-blocks.ts, expire-nx.ts). Needs `EXPIRE ... NX`, which Redis has from 7.0 on (and
 *   every Valkey: it forked from 7.2).
 * - 'transaction-script': inside the client's own transaction too, for servers without NX (Redis
 *   6): the [P]EXPIRE goes as a small conditional-expiry script, beside a copy of it that Redis
 *   checks as it would check the client's own (expiry-script.ts, expiry-substitution.ts). Nothing
 *   is held but what follows that expiry, until Redis has said whether it queued the script.
 * - 'script': as one Lua script (script.ts), which works on any version; the block is held until
 *   it is whole (block-flow.ts). Only --lock-method script chooses it.
 *
 * With --lock-method auto (the default) the server's version decides: 'transaction' where it has
 * NX, else 'transaction-script'. It is asked on the
 * connection itself, because the proxy may hold no credentials of its own (the application
 * authenticates): `HELLO` without arguments answers the server's name and version and changes
 * nothing on the connection (networking.c helloCommand: no protocol version, no AUTH, no SETNAME),
 * and ACLs never refuse it (acl.c: commands flagged no-auth skip the command check). Before
 * Redis 6.2 it is an error (6.0 requires a protocol version, 5 has no HELLO): those servers have
 * no NX either.
 *
 * What one connection learns is kept for its upstream address (ServerMethods), so that the next
 * connections to it know at once. It is also asked ahead, in the background, on a connection of
 * the proxy's own (with the URL's AUTH/SELECT): when a connection to an address not known yet is
 * made, and when the upstream closed a connection the client did not end (a restart, a failover,
 * CLIENT KILL), since the server behind the address may have changed. A MULTI then rarely finds
 * the method unknown, and HELLO seldom goes on the client's connection right before it (where
 * MONITOR would show it between the client's commands); where the proxy holds no credentials,
 * the question ahead is refused and the client's connection asks, after its own AUTH.
 */
import { encodeCommand } from '../resp/encode.js';
import { decodeReply, pairsOf, textOf } from '../resp/value.js';

export type LockMethod = 'transaction' | 'transaction-script' | 'script';
/** The --lock-method setting: one method, or 'auto' (from the server's version). */
export type LockMethodSetting = LockMethod | 'auto';
export const LOCK_METHOD_SETTINGS: readonly LockMethodSetting[] = ['auto', 'transaction', 'script'];

/** Asks the server its name and version, changing nothing. */
export const HELLO = encodeCommand('HELLO');

/** The first server version with `EXPIRE ... NX` (and `redis.acl_check_cmd`). */
const NX_SINCE_MAJOR = 7;

export interface ServerVersion {
  /** The method for this server, or null when the connection cannot tell yet (not authenticated). */
  readonly method: LockMethod | null;
  /** What the server said: `redis 7.0.15`, or its error. */
  readonly detail: string;
  /**
   * Whether the server has RESET (Redis 6.2 and later, Valkey): HELLO without arguments, of the
   * same release, answers there, and is an error before; null when it cannot tell (NOAUTH).
   */
  readonly hasReset?: boolean | null;
}

/** Reads HELLO's reply (a RESP2 array of pairs or a RESP3 map; one complete frame): the way auto takes there. */
export function methodFromHello(reply: Buffer): ServerVersion {
  if (reply[0] === 0x2d /* - */) {
    const error = reply.toString('latin1', 1, Math.min(reply.length, 200)).replace(/\r\n$/, '');
    // Not authenticated yet: the block will be refused with NOAUTH anyway; ask again next time.
    if (error.startsWith('NOAUTH')) return { method: null, detail: error, hasReset: null };
    return { method: 'transaction-script', detail: error, hasReset: false };
  }
  let server = '';
  let version = '';
  try {
    for (const [name, value] of pairsOf(decodeReply(reply).value) ?? []) {
      if (name === 'server') server = textOf(value) ?? '';
      else if (name === 'version') version = textOf(value) ?? '';
    }
  } catch {
    // Not a map: treated as an unknown version below.
  }
  const major = /^(\d+)\./.exec(version)?.[1];
  const detail = `${server || 'unknown server'} ${version || 'unknown version'}`;
  const hasNx = major !== undefined && Number(major) >= NX_SINCE_MAJOR;
  return { method: hasNx ? 'transaction' : 'transaction-script', detail, hasReset: true };
}

/** The method each upstream address was last found to need (auto). */
export class ServerMethods {
  private readonly byAddress = new Map<string, LockMethod>();
  /** Addresses asked ahead right now. */
  private readonly asking = new Set<string>();
  /** What each server said it is (`redis 7.0.15`), for /rules. */
  private readonly servers = new Map<string, string>();
  /** Addresses whose server has no RESET (before Redis 6.2): a client's RESET there is an unknown command. */
  private readonly withoutReset = new Set<string>();
  /** Addresses whose server lacks what --lock-method transaction needs, said once each. */
  private readonly mismatchSaid = new Set<string>();
  /** Addresses whose question ahead was refused (no credentials of the proxy's own): the client connections ask. */
  private readonly refused = new Set<string>();

  get(address: string): LockMethod | null {
    return this.byAddress.get(address) ?? null;
  }

  /** What a connection to `address` found (what the server said, and whether it has RESET); true when it was not known yet. */
  learnt(address: string, method: LockMethod, server?: string, hasReset?: boolean | null): boolean {
    const known = this.byAddress.get(address);
    this.byAddress.set(address, method);
    if (server !== undefined) this.servers.set(address, server);
    if (hasReset === false) this.withoutReset.add(address);
    else if (hasReset === true) this.withoutReset.delete(address);
    return known === undefined;
  }

  /** Whether the server at `address` is known to have no RESET (before Redis 6.2). */
  lacksReset(address: string): boolean {
    return this.withoutReset.has(address);
  }

  /** Each upstream address known, its way and what its server said it is: for /rules. */
  known(): Record<string, { way: LockMethod; server: string | null }> {
    return Object.fromEntries([...this.byAddress].map(([address, way]) => [address, { way, server: this.servers.get(address) ?? null }]));
  }

  /** --lock-method transaction met a server without EXPIRE ... NX at `address`: true the first time (to be said once). */
  mismatch(address: string): boolean {
    if (this.mismatchSaid.has(address)) return false;
    this.mismatchSaid.add(address);
    return true;
  }

  /**
   * Asks ahead, in the background, unless the method is known, asked already, or refused there
   * since the address was last forgotten. `ask` answers what the server said, or null when it did
   * not answer (asked again at the next connection made). `found` is told what was learnt.
   */
  askAhead(address: string, ask: () => Promise<ServerVersion | null>, found: (version: ServerVersion) => void): void {
    if (this.byAddress.has(address) || this.asking.has(address) || this.refused.has(address)) return;
    this.asking.add(address);
    const settle = (version: ServerVersion | null): void => {
      this.asking.delete(address);
      if (version === null) return;
      if (version.method === null) this.refused.add(address);
      else if (this.learnt(address, version.method, version.detail, version.hasReset)) found(version);
    };
    void ask().then(settle, () => settle(null));
  }

  /** The server behind the address may have changed (it closed a connection on its own, or refused one). */
  forget(address: string): void {
    this.byAddress.delete(address);
    this.servers.delete(address);
    this.withoutReset.delete(address);
    this.refused.delete(address);
    this.mismatchSaid.delete(address);
  }
}
