/**
 * A real Redis Cluster for tests: 6 local `redis-server` processes (3 masters,
 * 3 replicas) created with `redis-cli --cluster create`, plus the operations
 * cluster-mode tests need: resharding one slot with the real MIGRATING /
 * IMPORTING protocol, manual failover, and "is everything settled?" checks.
 *
 * Each node is a server process (server-process.ts) with cluster mode on.
 * Every admin command runs on a short-lived connection of its own, so no
 * helper connection lingers in a node's CLIENT LIST. With REDIS_TEST_IMAGE the
 * nodes are containers of that image on the host's network, so the addresses
 * they announce are the ones the test process reaches.
 */
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { freePort, isPortFree } from './ports.js';
import { HOST, shortLivedClient, startServerProcess, type ServerAccess, type ServerProcess } from './server-process.js';

export interface ClusterNode {
  port: number;
  host: '127.0.0.1';
  /** Cluster node id (CLUSTER MYID); survives failovers. */
  id: string;
  /** Everything the server printed so far. */
  logs(): string;
}

export interface ClientInfo {
  id: string;
  addr: string;
  laddr: string;
  name: string;
  cmd: string;
  /** e.g. `N` (normal), `S` (a replica's link on its master), `M` (the master's link on a replica). */
  flags: string;
}

export interface MigrateSlotOptions {
  /** Sleep this long while the slot is MIGRATING/IMPORTING, before any key moves. */
  pauseAfterMigratingMs?: number;
  /** Runs while the slot is MIGRATING/IMPORTING, before any key moves (before the pause). */
  onMigrating?: () => Promise<void>;
}

export interface TestCluster {
  /** All 6 nodes, in start order; roles change with failovers, the objects do not. */
  nodes: ClusterNode[];
  /** Nodes that currently say they are masters, sorted by their first slot (slotless ones last). */
  masters(): Promise<ClusterNode[]>;
  /** Nodes that currently say they are replicas, in the order of their masters in masters(). */
  replicas(): Promise<ClusterNode[]>;
  /** The master owning the key's slot, as every node agrees (throws if they do not). */
  nodeFor(key: string | Buffer): Promise<ClusterNode>;
  /** Hash slot computed locally: CRC16/XMODEM of the key (or of its {hashtag}) mod 16384. */
  slotOf(key: string | Buffer): number;
  /** One command on its own connection. Redis error replies reject with ioredis' ReplyError, unwrapped. */
  command(node: ClusterNode, ...args: Array<string | Buffer | number>): Promise<unknown>;
  /** CLIENT LIST of `node`, without the connection that asked. */
  clientList(node: ClusterNode): Promise<ClientInfo[]>;
  /**
   * Waits until every node is ok, agrees on the slot map, and every replica is
   * linked and caught up. Call it while nothing writes: offsets chasing a
   * steady stream of writes may never be seen equal.
   */
  waitHealthy(timeoutMs?: number): Promise<void>;
  /** Moves one slot and its keys from `from` to `to`, then waits until the cluster is healthy again. */
  migrateSlot(slot: number, from: ClusterNode, to: ClusterNode, opts?: MigrateSlotOptions): Promise<void>;
  /** CLUSTER FAILOVER on `replica`; resolves once it is master and the cluster is healthy again. */
  failover(replica: ClusterNode): Promise<void>;
  /** Kills all nodes and removes their directories; safe to call twice. */
  stop(): Promise<void>;
}

export interface StartClusterOptions {
  /** `--cluster-announce-hostname` for every node (e.g. `localhost`). */
  announceHostname?: string;
  /** `--cluster-preferred-endpoint-type`: what MOVED/ASK and CLUSTER SLOTS name a node by. */
  preferredEndpointType?: 'ip' | 'hostname' | 'unknown-endpoint';
  /**
   * TLS only (PEM file paths): each node's port is a TLS port (plain TCP is
   * off), the cluster bus and replication use TLS too, and clients need no
   * certificate. The cluster bus asks for one all the same (whatever
   * tls-auth-clients says): nodes present `clientCert`, which must allow
   * client authentication. The helper's own connections trust `ca`.
   */
  tls?: { cert: string; key: string; ca: string; clientCert: string; clientKey: string };
  /** `--requirepass` and `--masterauth` on every node; the helper authenticates with it. */
  password?: string;
}

const NODE_COUNT = 6;
const SLOTS = 16384;
/** The cluster bus listens on port + 10000, so a client port must leave room for it. */
const BUS_PORT_OFFSET = 10_000;
// The cluster's own waits, each longer than one server's start for a reason:
/** `redis-cli --cluster create` assigns slots, joins six nodes and waits until they agree. */
const CREATE_TIMEOUT_MS = 30_000;
/** Six nodes agreeing on the slot map, replicas synced (each full sync forks), offsets caught up. */
const HEALTHY_TIMEOUT_MS = 20_000;
/** CLUSTER FAILOVER: the replica catches up, asks the masters for their votes, takes over. */
const FAILOVER_TIMEOUT_MS = 15_000;
const COMMAND_TIMEOUT_MS = 5_000;
const MIGRATE_TIMEOUT_MS = 2_000;
const MIGRATE_BATCH = 100;
const POLL_INTERVAL_MS = 50;
/** Six nodes' output per cluster, all kept in the test process. */
const MAX_LOG_CHARS = 200_000;

export async function startCluster(opts: StartClusterOptions = {}): Promise<TestCluster> {
  const started: ClusterNode[] = [];
  const stopAll = () => Promise.all(started.map(stopNode)).then(() => undefined);
  try {
    const usedPorts = new Set<number>();
    const access: ServerAccess = {
      tls: opts.tls !== undefined ? { ca: await readFile(opts.tls.ca) } : undefined,
      password: opts.password,
    };
    // One after another, so `started` always lists exactly what to stop if a
    // later node (or the cluster creation) fails.
    for (let i = 0; i < NODE_COUNT; i++) started.push(await startNode(usedPorts, opts, access));
    await createCluster(started, opts);
    let stopping: Promise<void> | undefined;
    const cluster = makeCluster(started, () => (stopping ??= stopAll()));
    await cluster.waitHealthy();
    return cluster;
  } catch (err) {
    await stopAll();
    throw err;
  }
}

/** A node started on its own: in no cluster until a CLUSTER MEET brings it in. */
export interface SpareNode extends ClusterNode {
  /** Kills it and removes its directory; safe to call twice. */
  stop(): Promise<void>;
}

/**
 * A cluster-enabled node of no cluster, configured as the cluster's nodes are.
 * `portBelow`: its port is lower than that (so that it sorts before the nodes
 * of a cluster by address).
 */
export async function startSpareNode(opts: { portBelow?: number } = {}): Promise<SpareNode> {
  const server = await startServerProcess({
    name: 'spare cluster node',
    pickPort: () => (opts.portBelow === undefined ? pickPort(new Set()) : pickPortBelow(opts.portBelow)),
    args: (port, dir) => nodeArgs(port, dir, {}),
    maxLogChars: MAX_LOG_CHARS,
  });
  return registered({ port: server.port, host: server.host, id: '', logs: server.logs, stop: server.stop }, server, {});
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

async function startNode(usedPorts: Set<number>, opts: StartClusterOptions, access: ServerAccess): Promise<ClusterNode> {
  const server = await startServerProcess({
    name: 'cluster node',
    ...access,
    pickPort: () => pickPort(usedPorts),
    args: (port, dir) => nodeArgs(port, dir, opts),
    maxLogChars: MAX_LOG_CHARS,
  });
  return registered({ port: server.port, host: server.host, id: '', logs: server.logs }, server, access);
}

/** A node just started: its process and access remembered, its id asked (the process is stopped if it does not answer). */
async function registered<T extends ClusterNode>(node: T, server: ServerProcess, access: ServerAccess): Promise<T> {
  processOf.set(node, server);
  accessOf.set(node, access);
  try {
    node.id = String(await command(node, 'CLUSTER', 'MYID'));
  } catch (err) {
    await server.stop();
    throw err;
  }
  return node;
}

/** A free client port whose bus port (port + 10000) is free too and no other node's port. */
async function pickPort(usedPorts: Set<number>): Promise<number> {
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = await freePort();
    const bus = port + BUS_PORT_OFFSET;
    if (bus > 65_535 || usedPorts.has(port) || usedPorts.has(bus)) continue;
    usedPorts.add(port).add(bus);
    if (await isPortFree(bus)) return port;
  }
  throw new Error('could not find a free port p with p + 10000 also free');
}

/** A free port below `limit` (and above 16000, below the ephemeral range) whose bus port is free too. */
async function pickPortBelow(limit: number): Promise<number> {
  const low = 16_000;
  if (limit <= low) throw new Error(`no port below ${limit} to pick`);
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = low + Math.floor(Math.random() * (limit - low));
    if ((await isPortFree(port)) && (await isPortFree(port + BUS_PORT_OFFSET))) return port;
  }
  throw new Error(`could not find a free port p below ${limit} with p + 10000 also free`);
}

function nodeArgs(port: number, dir: string, opts: StartClusterOptions): string[] {
  return [
    ...(opts.tls === undefined
      ? ['--port', String(port)]
      : [
          '--port',
          '0',
          '--tls-port',
          String(port),
          // With tls-cluster the bus port is still port + 10000, the TLS port's.
          '--tls-cluster',
          'yes',
          '--tls-replication',
          'yes',
          '--tls-cert-file',
          opts.tls.cert,
          '--tls-key-file',
          opts.tls.key,
          '--tls-ca-cert-file',
          opts.tls.ca,
          '--tls-client-cert-file',
          opts.tls.clientCert,
          '--tls-client-key-file',
          opts.tls.clientKey,
          '--tls-auth-clients',
          'no',
        ]),
    ...(opts.password !== undefined ? ['--requirepass', opts.password, '--masterauth', opts.password] : []),
    '--bind',
    HOST,
    '--dir',
    dir,
    '--cluster-enabled',
    'yes',
    '--cluster-config-file',
    'nodes.conf',
    '--cluster-node-timeout',
    '2000',
    '--appendonly',
    'no',
    '--save',
    '',
    '--daemonize',
    'no',
    // Disk-based full syncs: after a diskless (socket) sync, which is 7.0's
    // default, the master holds back the command stream until the replica's
    // first REPLCONF ACK. Disk-based syncs stream right away, and the empty
    // dataset makes the RDB file trivial.
    '--repl-diskless-sync',
    'no',
    // CLUSTER SLOTS leaves out replicas whose replication offset is still 0,
    // and on an idle master the offset only moves with its pings to the
    // replicas (default every 10 s). Pinging every second makes replicas
    // show up about a second after the cluster is created, not ten.
    '--repl-ping-replica-period',
    '1',
    ...(opts.announceHostname !== undefined ? ['--cluster-announce-hostname', opts.announceHostname] : []),
    ...(opts.preferredEndpointType !== undefined ? ['--cluster-preferred-endpoint-type', opts.preferredEndpointType] : []),
  ];
}

/** Set for every node as it is started. */
const processOf = new WeakMap<ClusterNode, ServerProcess>();
const accessOf = new WeakMap<ClusterNode, ServerAccess>();

function stopNode(node: ClusterNode): Promise<void> {
  return processOf.get(node)?.stop() ?? Promise.resolve();
}

async function createCluster(nodes: ClusterNode[], opts: StartClusterOptions): Promise<void> {
  const addrs = nodes.map((n) => `${n.host}:${n.port}`);
  const connection = [
    ...(opts.tls !== undefined ? ['--tls', '--cacert', opts.tls.ca] : []),
    ...(opts.password !== undefined ? ['-a', opts.password, '--no-auth-warning'] : []),
  ];
  try {
    await promisify(execFile)('redis-cli', [...connection, '--cluster', 'create', ...addrs, '--cluster-replicas', '1', '--cluster-yes'], {
      timeout: CREATE_TIMEOUT_MS,
    });
  } catch (err) {
    const e = err as Error & { stdout?: string; stderr?: string };
    throw new Error(`redis-cli --cluster create ${addrs.join(' ')} failed: ${e.message}\n${e.stdout ?? ''}${e.stderr ?? ''}`, {
      cause: err,
    });
  }
}

// ---------------------------------------------------------------------------
// The cluster handle
// ---------------------------------------------------------------------------

function makeCluster(nodes: ClusterNode[], stop: () => Promise<void>): TestCluster {
  const byId = (id: string) => nodes.find((n) => n.id === id);

  /** Each node's own line of its CLUSTER NODES: authoritative for its role and its slots. */
  const selfViews = () =>
    Promise.all(
      nodes.map(async (node) => {
        const line = String(await command(node, 'CLUSTER', 'NODES'))
          .split('\n')
          .find((l) => l.split(' ')[2]?.split(',').includes('myself'));
        if (!line) throw new Error(`${label(node)}: no "myself" line in CLUSTER NODES`);
        const fields = line.split(' ');
        const flags = fields[2].split(',');
        // Slot fields are "5461" or "0-5460"; "[slot->-id]" / "[slot-<-id]" mark migrations.
        const starts = fields
          .slice(8)
          .filter((f) => !f.startsWith('['))
          .map((f) => Number(f.split('-')[0]));
        return {
          node,
          master: flags.includes('master'),
          replica: flags.includes('slave'),
          masterId: fields[3],
          firstSlot: starts.length > 0 ? Math.min(...starts) : Infinity,
        };
      }),
    );

  const masters = async () => {
    const views = (await selfViews()).filter((v) => v.master);
    return views.sort((a, b) => a.firstSlot - b.firstSlot).map((v) => v.node);
  };

  const replicas = async () => {
    const views = await selfViews();
    const masterOrder = views
      .filter((v) => v.master)
      .sort((a, b) => a.firstSlot - b.firstSlot)
      .map((v) => v.node.id);
    const rank = (id: string) => (masterOrder.includes(id) ? masterOrder.indexOf(id) : Infinity);
    return views
      .filter((v) => v.replica)
      .sort((a, b) => rank(a.masterId) - rank(b.masterId))
      .map((v) => v.node);
  };

  const nodeFor = async (key: string | Buffer) => {
    const slot = Number(await command(nodes[0], 'CLUSTER', 'KEYSLOT', key));
    const owners = await Promise.all(nodes.map(async (n) => slotOwner(await slotMap(n), slot)));
    if (new Set(owners).size !== 1 || owners[0] === undefined) {
      const views = nodes.map((n, i) => `${n.port}: ${owners[i] ? byId(owners[i])?.port : 'none'}`);
      throw new Error(`nodes disagree on the owner of slot ${slot} (${views.join(', ')}); call waitHealthy() first`);
    }
    const owner = byId(owners[0]);
    if (!owner) throw new Error(`slot ${slot} is owned by unknown node ${owners[0]}`);
    return owner;
  };

  const clientList = async (node: ClusterNode) =>
    withConnection(node, async (r) => {
      const ownId = String(await r.call('CLIENT', 'ID'));
      const text = String(await r.call('CLIENT', 'LIST'));
      return text
        .split('\n')
        .filter((line) => line.trim() !== '')
        .map(parseClientLine)
        .filter((c) => c.id !== ownId);
    });

  const waitHealthy = async (timeoutMs = HEALTHY_TIMEOUT_MS) => {
    await waitFor(`the cluster to be healthy`, timeoutMs, () => healthProblem(nodes));
  };

  const migrateSlot = async (slot: number, from: ClusterNode, to: ClusterNode, opts: MigrateSlotOptions = {}) => {
    // Target first: once the source says MIGRATING it sends ASK to the target,
    // which must already accept ASKING for the slot.
    await adminCommand(to, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', from.id);
    await adminCommand(from, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', to.id);
    await opts.onMigrating?.();
    if (opts.pauseAfterMigratingMs) await sleep(opts.pauseAfterMigratingMs);
    for (;;) {
      // As buffers: keys are binary, and a utf8 round trip would corrupt them.
      const keys = (await withConnection(from, (r) => r.callBuffer('CLUSTER', 'GETKEYSINSLOT', slot, MIGRATE_BATCH))) as Buffer[];
      if (keys.length === 0) break;
      // No REPLACE: a key already on the target would be a bug worth seeing (BUSYKEY).
      const password = accessOf.get(to)?.password;
      const auth = password !== undefined ? ['AUTH', password] : [];
      await adminCommand(from, 'MIGRATE', to.host, to.port, '', 0, MIGRATE_TIMEOUT_MS, ...auth, 'KEYS', ...keys);
    }
    // Target first again (it bumps its config epoch, so its claim wins), then
    // the source (so it stops sending ASK), then everyone else, like redis-cli.
    const others = (await masters()).filter((m) => m !== from && m !== to);
    for (const node of [to, from, ...others]) {
      await adminCommand(node, 'CLUSTER', 'SETSLOT', slot, 'NODE', to.id);
    }
    await closeMigrateLinks(to);
    await waitFor(`slot ${slot} to be owned by ${label(to)} everywhere`, HEALTHY_TIMEOUT_MS, async () => {
      const problem = await healthProblem(nodes);
      if (problem) return problem;
      const owner = slotOwner(await slotMap(nodes[0]), slot);
      return owner === to.id ? undefined : `slot ${slot} is owned by ${owner}`;
    });
  };

  const failover = async (replica: ClusterNode) => {
    const role = (await command(replica, 'ROLE')) as unknown[];
    if (role[0] !== 'slave') throw new Error(`${label(replica)} is not a replica (ROLE says ${role[0]})`);
    await adminCommand(replica, 'CLUSTER', 'FAILOVER');
    await waitFor(
      `${label(replica)} to become master after CLUSTER FAILOVER`,
      FAILOVER_TIMEOUT_MS,
      async () => {
        const now = (await command(replica, 'ROLE')) as unknown[];
        return now[0] === 'master' ? undefined : `ROLE is still ${now[0]}`;
      },
      () => replica.logs(),
    );
    await waitHealthy();
  };

  return {
    nodes,
    masters,
    replicas,
    nodeFor,
    slotOf,
    command,
    clientList,
    waitHealthy,
    migrateSlot,
    failover,
    stop,
  };
}

// ---------------------------------------------------------------------------
// Health
// ---------------------------------------------------------------------------

/**
 * undefined if healthy, else what is not (naming the node). Healthy means:
 * - cluster_state:ok on every node;
 * - CLUSTER SLOTS identical on every node (compared by node ids, since the
 *   replica order in each entry differs from node to node);
 * - every replica's link is up, and it has applied all of its master's
 *   replication stream (slave_repl_offset == the master's master_repl_offset),
 *   so a failover right now loses no acknowledged write.
 */
async function healthProblem(nodes: ClusterNode[]): Promise<string | undefined> {
  const states = await Promise.all(
    nodes.map(async (node) => ({
      node,
      info: parseInfo(String(await command(node, 'CLUSTER', 'INFO'))),
      slots: normalizeSlots(await slotMap(node)),
      repl: parseInfo(String(await command(node, 'INFO', 'replication'))),
    })),
  );
  for (const { node, info } of states) {
    if (info.get('cluster_state') !== 'ok') return `${label(node)}: cluster_state:${info.get('cluster_state')}`;
  }
  const reference = states[0];
  for (const s of states) {
    if (s.slots !== reference.slots) {
      return `${label(s.node)} and ${label(reference.node)} disagree on CLUSTER SLOTS:\n${s.slots}\nvs\n${reference.slots}`;
    }
  }
  for (const { node, repl } of states) {
    if (repl.get('role') === 'master') {
      // Master side: every attached replica finished its sync.
      for (const [key, value] of repl) {
        if (/^slave\d+$/.test(key) && !value.includes('state=online')) return `${label(node)}: replica ${value}`;
      }
      continue;
    }
    if (repl.get('master_link_status') !== 'up') return `${label(node)}: master_link_status:${repl.get('master_link_status')}`;
    if (repl.get('master_sync_in_progress') !== '0') return `${label(node)}: sync in progress`;
    const master = states.find((s) => String(s.node.port) === repl.get('master_port'));
    if (!master) return `${label(node)}: replicates unknown port ${repl.get('master_port')}`;
    if (master.repl.get('role') !== 'master') return `${label(node)}: its master ${label(master.node)} is not a master`;
    const own = repl.get('slave_repl_offset');
    const theirs = master.repl.get('master_repl_offset');
    if (own !== theirs) return `${label(node)}: at offset ${own}, its master ${label(master.node)} at ${theirs}`;
  }
  // Every slot range should have its replica listed (CLUSTER SLOTS leaves failed ones out).
  const lonely = reference.slots.split('\n').find((line) => line.endsWith(' replicas='));
  if (lonely) return `no replica for ${lonely}`;
  return undefined;
}

interface SlotRange {
  start: number;
  end: number;
  masterId: string;
  replicaIds: string[];
}

async function slotMap(node: ClusterNode): Promise<SlotRange[]> {
  // Each entry: [start, end, [host, port, id, {meta}], ...replicas like that].
  const reply = (await command(node, 'CLUSTER', 'SLOTS')) as Array<[number, number, ...unknown[][]]>;
  return reply.map(([start, end, master, ...replicas]) => ({
    start,
    end,
    masterId: String(master[2]),
    replicaIds: replicas.map((r) => String(r[2])),
  }));
}

function normalizeSlots(ranges: SlotRange[]): string {
  return ranges
    .slice()
    .sort((a, b) => a.start - b.start)
    .map((r) => `${r.start}-${r.end} master=${r.masterId} replicas=${r.replicaIds.slice().sort().join(',')}`)
    .join('\n');
}

function slotOwner(ranges: SlotRange[], slot: number): string | undefined {
  return ranges.find((r) => r.start <= slot && slot <= r.end)?.masterId;
}

/**
 * MIGRATE keeps its connection to the target cached for 10 s, and it shows up
 * in the target's CLIENT LIST (cmd=restore-asking). Closing it keeps
 * clientList() about the clients a test made; MIGRATE reconnects when needed.
 */
async function closeMigrateLinks(target: ClusterNode): Promise<void> {
  const list = String(await command(target, 'CLIENT', 'LIST'));
  for (const client of list
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map(parseClientLine)) {
    if (client.cmd === 'restore-asking') await command(target, 'CLIENT', 'KILL', 'ID', client.id);
  }
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/** CRC16/XMODEM (poly 0x1021, init 0), the checksum Redis Cluster hashes keys with. */
function crc16(bytes: Buffer): number {
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) {
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
  }
  return crc;
}

/**
 * Redis' keyHashSlot(): if the key has a `{` followed later by a `}` with at
 * least one byte between them, only the bytes between the first `{` and the
 * first `}` after it are hashed; otherwise the whole key is.
 */
export function slotOf(key: string | Buffer): number {
  const bytes = typeof key === 'string' ? Buffer.from(key, 'utf8') : key;
  const open = bytes.indexOf(0x7b); // {
  if (open !== -1) {
    const close = bytes.indexOf(0x7d, open + 1); // }
    if (close > open + 1) return crc16(bytes.subarray(open + 1, close)) % SLOTS;
  }
  return crc16(bytes) % SLOTS;
}

async function command(node: ClusterNode, ...args: Array<string | Buffer | number>): Promise<unknown> {
  if (args.length === 0) throw new Error('command() needs a command name');
  const [name, ...rest] = args;
  return withConnection(node, (r) => r.call(String(name), ...rest));
}

/** command() for the helper's own steps: an error reply also names the node and the command. */
async function adminCommand(node: ClusterNode, ...args: Array<string | Buffer | number>): Promise<unknown> {
  try {
    return await command(node, ...args);
  } catch (err) {
    if ((err as Error).name !== 'ReplyError') throw err; // already names the node
    const what = args
      .slice(0, 4)
      .map((a) => (Buffer.isBuffer(a) ? '<binary>' : String(a)))
      .join(' ');
    throw new Error(`${label(node)}: ${what}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * Runs `fn` on a fresh connection to `node`, then QUITs it. QUIT (rather than
 * just closing the socket) means the server has dropped the client before the
 * next command, so it never shows in a later CLIENT LIST. Connection problems
 * and timeouts are rethrown naming the node; Redis error replies as they are.
 */
async function withConnection<T>(node: ClusterNode, fn: (r: Redis) => Promise<T>): Promise<T> {
  const access = accessOf.get(node);
  const client = shortLivedClient({ host: node.host, port: node.port, ...access }, COMMAND_TIMEOUT_MS);
  try {
    await client.connect();
    return await fn(client);
  } catch (err) {
    if ((err as Error).name === 'ReplyError') throw err;
    throw new Error(`${label(node)}: ${(err as Error).message}`, { cause: err });
  } finally {
    await client.quit().catch(() => client.disconnect());
  }
}

function parseClientLine(line: string): ClientInfo {
  const fields = new Map<string, string>();
  for (const pair of line.trim().split(' ')) {
    const eq = pair.indexOf('=');
    if (eq > 0) fields.set(pair.slice(0, eq), pair.slice(eq + 1));
  }
  const get = (k: string) => fields.get(k) ?? '';
  return { id: get('id'), addr: get('addr'), laddr: get('laddr'), name: get('name'), cmd: get('cmd'), flags: get('flags') };
}

/** `key:value` lines of INFO / CLUSTER INFO. */
function parseInfo(text: string): Map<string, string> {
  const map = new Map<string, string>();
  for (const line of text.split('\r\n')) {
    const colon = line.indexOf(':');
    if (colon > 0 && !line.startsWith('#')) map.set(line.slice(0, colon), line.slice(colon + 1));
  }
  return map;
}

/** Polls `problem` until it returns undefined; on timeout, throws with its last answer (or error). */
async function waitFor(what: string, timeoutMs: number, problem: () => Promise<string | undefined>, logs?: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = 'not checked yet';
  while (Date.now() < deadline) {
    try {
      const result = await problem();
      if (result === undefined) return;
      last = result;
    } catch (err) {
      last = `error: ${(err as Error).message}`;
    }
    await sleep(POLL_INTERVAL_MS);
  }
  const output = logs ? `\nOutput (last 4000 chars):\n${logs().slice(-4000)}` : '';
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}; last: ${last}${output}`);
}

function label(node: ClusterNode): string {
  return `node ${node.host}:${node.port}`;
}
