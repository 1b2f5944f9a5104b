/**
 * The handful of commands whose presence changes what the proxy may do.
 * Everything else is `Cmd.Other`: forwarded untouched, one reply expected.
 *
 * Classification works on raw name bytes without allocating, because it runs
 * for every frame on the pass-through path.
 */
export const Cmd = {
  /** Any command the proxy does not need to know about. */
  Other: 0,
  /** `*0`, `*-1` or a blank inline line: Redis executes nothing and sends no reply. */
  Empty: 1,
  Multi: 2,
  Exec: 3,
  Discard: 4,
  Watch: 5,
  Unwatch: 6,
  Reset: 7,
  Incr: 8,
  Incrby: 9,
  Expire: 10,
  Pexpire: 11,
  /** CLIENT: only `CLIENT REPLY` matters (it suppresses replies). */
  Client: 12,
  /**
   * Commands after which replies can no longer be counted one per request:
   * the (un)subscribe family (one reply per channel, and pushes in RESP2 look
   * like replies), MONITOR (an endless stream), REPLCONF (no reply at all to
   * its ACK and GETACK options: replication.c replconfCommand).
   */
  Uncountable: 13,
  /** CLUSTER: SLOTS, SHARDS, NODES and REPLICAS replies carry node addresses (rewritten with --cluster). */
  Cluster: 15,
  /** ASKING: lets the next command run on a node importing its slot. */
  Asking: 16,
  /** SET: `SET key value NX EX n` is how fixed releases take a lock (counted, never changed). */
  Set: 17,
  /** SYNC and PSYNC: the connection becomes a replica's, carrying the replication stream (RESET is refused there). */
  Replication: 18,
  /** QUIT: Redis answers, then closes the connection, reading nothing more. */
  Quit: 19,
  /**
   * Commands that may wait for other clients before Redis answers (the blocking list, sorted set
   * and stream reads, WAIT): --upstream-timeout-ms does not apply while one is unanswered.
   */
  Blocking: 20,
} as const;
export type Cmd = (typeof Cmd)[keyof typeof Cmd];

interface NameEntry {
  readonly lower: Uint8Array;
  readonly cmd: Cmd;
}

const NAMES: Array<[string, Cmd]> = [
  ['multi', Cmd.Multi],
  ['exec', Cmd.Exec],
  ['discard', Cmd.Discard],
  ['watch', Cmd.Watch],
  ['unwatch', Cmd.Unwatch],
  ['reset', Cmd.Reset],
  ['incr', Cmd.Incr],
  ['incrby', Cmd.Incrby],
  ['expire', Cmd.Expire],
  ['pexpire', Cmd.Pexpire],
  ['client', Cmd.Client],
  ['subscribe', Cmd.Uncountable],
  ['psubscribe', Cmd.Uncountable],
  ['ssubscribe', Cmd.Uncountable],
  ['unsubscribe', Cmd.Uncountable],
  ['punsubscribe', Cmd.Uncountable],
  ['sunsubscribe', Cmd.Uncountable],
  ['monitor', Cmd.Uncountable],
  ['replconf', Cmd.Uncountable],
  ['sync', Cmd.Replication],
  ['psync', Cmd.Replication],
  ['cluster', Cmd.Cluster],
  ['asking', Cmd.Asking],
  ['set', Cmd.Set],
  ['quit', Cmd.Quit],
  ['blpop', Cmd.Blocking],
  ['brpop', Cmd.Blocking],
  ['brpoplpush', Cmd.Blocking],
  ['blmove', Cmd.Blocking],
  ['blmpop', Cmd.Blocking],
  ['bzpopmin', Cmd.Blocking],
  ['bzpopmax', Cmd.Blocking],
  ['bzmpop', Cmd.Blocking],
  ['xread', Cmd.Blocking],
  ['xreadgroup', Cmd.Blocking],
  ['wait', Cmd.Blocking],
  ['waitaof', Cmd.Blocking],
];

/** Longest name worth looking at; longer names are always `Cmd.Other`. */
export const MAX_CLASSIFIED_NAME = 12;

/** Candidates indexed by name length, so most names are rejected by one array lookup. */
const BY_LENGTH: NameEntry[][] = (() => {
  const table: NameEntry[][] = Array.from({ length: MAX_CLASSIFIED_NAME + 1 }, () => []);
  for (const [name, cmd] of NAMES) table[name.length].push({ lower: Buffer.from(name, 'latin1'), cmd });
  return table;
})();

/** True when `buf[start..start+len)` equals the lower-case ASCII word `lower`, ignoring letter case. */
export function equalsIgnoreCase(buf: Uint8Array, start: number, lower: Uint8Array): boolean {
  for (let i = 0; i < lower.length; i++) {
    // OR-ing 0x20 lower-cases A-Z and is the identity on a-z; no other byte maps onto a letter.
    if ((buf[start + i] | 0x20) !== lower[i]) return false;
  }
  return true;
}

/** Classifies a command name held in `buf[start..start+len)`. */
export function classifyCommand(buf: Uint8Array, start: number, len: number): Cmd {
  if (len > MAX_CLASSIFIED_NAME) return Cmd.Other;
  const candidates = BY_LENGTH[len];
  for (let i = 0; i < candidates.length; i++) {
    if (equalsIgnoreCase(buf, start, candidates[i].lower)) return candidates[i].cmd;
  }
  return Cmd.Other;
}

/** How many leading arguments (name included) the proxy needs to see to act on a command of `argc` arguments. */
export function argsNeeded(cmd: Cmd, argc: number): number {
  switch (cmd) {
    case Cmd.Set:
      // Only `SET key value NX EX n` (6 arguments, the options in any order) is looked at: its key and options.
      return argc === 6 ? 6 : 1;
    case Cmd.Client:
      // CLIENT SETNAME name: the name says whether the connection is verify's (verify-connection.ts).
      return argc === 3 ? 3 : 2;
    case Cmd.Incr:
    case Cmd.Cluster:
      return 2;
    case Cmd.Incrby:
    case Cmd.Expire:
    case Cmd.Pexpire:
      return 3;
    default:
      return 1;
  }
}
