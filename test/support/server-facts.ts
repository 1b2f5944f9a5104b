/**
 * What the server a test runs against can do, asked of that server (never assumed from the
 * version a project is meant to run): the same test file then runs in front of Redis 6.0, 7.0,
 * 8.x and Valkey, checks everything each can do, and skips with the reason only what cannot
 * exist there (`ctx.skip(...facts.skipUnless('reset'))`).
 *
 *     const facts = await serverFacts(env.admin);          // in a test or a hook
 *     it('...', async (ctx) => {
 *       ctx.skip(...facts.skipUnless('expire-nx'));
 *
 * Each feature is asked as directly as the server allows: a command by COMMAND INFO, EXPIRE's NX
 * by running it on a key that does not exist (which writes nothing), a setting by CONFIG GET, an
 * ACL rule's syntax by what ACL GETUSER describes.
 */
import { startRedis } from './redis.js';
import { RawClient } from './resp.js';

export type ServerFeature =
  /** `EXPIRE key seconds NX` (Redis 7.0+, Valkey): the transaction way of sending a lock block exists. */
  | 'expire-nx'
  /** `redis.acl_check_cmd` in scripts (Redis 7.0+): the script asks the ACLs rather than read the expiry first. */
  | 'script-acl-check'
  /** The RESET command (Redis 6.2+). */
  | 'reset'
  /** The GETEX command (Redis 6.2+). */
  | 'getex'
  /** Pub/sub channel permissions in ACL rules, `&pattern` (Redis 6.2+): before, every user may use every channel. */
  | 'acl-channels'
  /** CLUSTER SHARDS (Redis 7.0+); before, a client finds the nodes with CLUSTER NODES or SLOTS. */
  | 'cluster-shards'
  /** The `busy-reply-threshold` setting (Redis 7.0+; before, and still as an alias, `lua-time-limit`). */
  | 'busy-reply-threshold'
  /** The `enable-debug-command` setting (Redis 7.0+; before, DEBUG is always allowed). */
  | 'enable-debug-command'
  /** TLS: the server was built with it (its `tls-port` setting exists). */
  | 'tls';

export interface ServerFacts {
  /** `redis 6.0.16`, `valkey 8.1.1`: what the server says it is. */
  readonly server: string;
  /** `redis_version` from INFO server, as [major, minor, patch] (Valkey reports the Redis version it is compatible with). */
  readonly version: readonly [number, number, number];
  has(feature: ServerFeature): boolean;
  /** `[true, why]` where the server lacks the feature, else `[false]`: the arguments of ctx.skip(). */
  skipUnless(feature: ServerFeature): [boolean, string?];
  /** The ACL rules that open every channel to a user: `&*` where the server has channel permissions, none before (every channel is open). */
  allChannels(): string[];
}

/** Why a test cannot run where the feature is missing; the server's own name follows. */
const LACKS: Record<ServerFeature, string> = {
  'expire-nx': 'the transaction way needs EXPIRE ... NX (Redis 7.0+), which this server has not',
  'script-acl-check': 'scripts cannot ask the ACLs (redis.acl_check_cmd, Redis 7.0+) on this server',
  reset: 'RESET (Redis 6.2+) is not a command of this server',
  getex: 'GETEX (Redis 6.2+) is not a command of this server',
  'acl-channels': 'this server has no channel permissions in ACL rules (Redis 6.2+)',
  'cluster-shards': 'CLUSTER SHARDS (Redis 7.0+) is not a command of this server',
  'busy-reply-threshold': 'busy-reply-threshold (Redis 7.0+) is not a setting of this server',
  'enable-debug-command': 'enable-debug-command (Redis 7.0+) is not a setting of this server',
  tls: 'this redis-server was built without TLS',
};

/** Something that sends one command and gives its raw reply: a RawClient. */
export interface CommandLink {
  call(...args: string[]): Promise<string>;
}

/**
 * Asks the server behind `link` (a connection as the default user, not in a transaction, not
 * subscribed; a cluster node answers too). Nothing is written.
 */
export async function serverFacts(link: CommandLink): Promise<ServerFacts> {
  const info = await link.call('INFO', 'server');
  const field = (name: string): string | undefined => new RegExp(`\\r\\n${name}:([^\\r]*)\\r\\n`).exec(`\r\n${info}`)?.[1];
  const version = field('redis_version');
  if (version === undefined) throw new Error(`INFO server names no redis_version: ${JSON.stringify(info.slice(0, 200))}`);
  const [major = 0, minor = 0, patch = 0] = version.split('.').map(Number);
  const name = field('server_name') ?? 'redis';
  const server = `${name} ${field(`${name}_version`) ?? version}`;

  // COMMAND INFO answers nil for a command the server does not know.
  const commands = await link.call('COMMAND', 'INFO', 'reset', 'getex');
  const known = (command: string): boolean => commands.toLowerCase().includes(`$${command.length}\r\n${command}\r\n`);
  // On a key that does not exist EXPIRE writes nothing; before 7.0, NX is a syntax error, which
  // Redis finds before it sends a cluster node's client to the node that serves the key (or says
  // that no node does).
  const probeKey = `redis-lock-proxy-test:probe:${process.pid}:${Date.now()}`;
  const expireNx = /^(:0|-MOVED |-ASK |-CLUSTERDOWN )/.test(await link.call('EXPIRE', probeKey, '1', 'NX'));
  const setting = async (name: string): Promise<boolean> => !/^\*0\r\n$/.test(await link.call('CONFIG', 'GET', name));
  // ACL GETUSER describes the rules the server has: "channels" from 6.2 on.
  const user = await link.call('ACL', 'GETUSER', 'default');
  const shards = await link.call('COMMAND', 'INFO', 'cluster');
  const available = new Map<ServerFeature, boolean>([
    ['expire-nx', expireNx],
    // redis.acl_check_cmd came with EXPIRE's NX, in 7.0 (src/lock/script.ts).
    ['script-acl-check', major >= 7],
    ['reset', known('reset')],
    ['getex', known('getex')],
    ['acl-channels', user.includes('$8\r\nchannels\r\n')],
    // Redis 7 lists CLUSTER's subcommands in COMMAND INFO; before, CLUSTER SHARDS is unknown.
    ['cluster-shards', shards.includes('cluster|shards')],
    ['busy-reply-threshold', await setting('busy-reply-threshold')],
    ['enable-debug-command', await setting('enable-debug-command')],
    ['tls', await setting('tls-port')],
  ]);
  const has = (feature: ServerFeature): boolean => available.get(feature) ?? false;
  return {
    server,
    version: [major, minor, patch],
    has,
    skipUnless: (feature) => (has(feature) ? [false] : [true, `${LACKS[feature]}: ${server}`]),
    allChannels: () => (has('acl-channels') ? ['&*'] : []),
  };
}

/**
 * The facts of the servers this test process starts (the local redis-server on the PATH, or a
 * container of REDIS_TEST_IMAGE), for a file that must know them before it starts its own: asked
 * of a throwaway server, once per process.
 */
export function startedServerFacts(): Promise<ServerFacts> {
  const memo = globalThis as { startedServerFacts?: Promise<ServerFacts> };
  return (memo.startedServerFacts ??= (async () => {
    const redis = await startRedis();
    try {
      const link = await RawClient.connect(redis.port);
      try {
        return await serverFacts(link);
      } finally {
        await link.close();
      }
    } finally {
      await redis.stop();
    }
  })());
}
