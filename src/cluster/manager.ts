/**
 * In front of a Redis Cluster (--cluster): one listener per cluster node, each a plain 1:1 proxy to that
 * node, plus the seed listener (--listen), which goes to any live node.
 *
 * Listener ports come from --cluster-port-map or, for the rest, from
 * --cluster-base-port upwards, in the order nodes are first seen (sorted by
 * address at start). A node keeps its port for the life of the process, also
 * when it leaves and comes back.
 *
 * The topology is asked again every --cluster-refresh-ms, and soon after a
 * client is sent a -MOVED. Only a view that can be believed (views.ts) is
 * applied. New nodes get listeners; a node missing from two such views in a
 * row is drained (its listener stops accepting, its connections finish what is
 * in flight), one that served slots only when those views serve every slot.
 * A failover needs nothing of the proxy: every node, master or replica,
 * has its listener, and clients follow the -MOVED replies (rewritten) to the
 * new master.
 *
 * Nodes come only from those views: an address that a reply names (a
 * redirect, CLUSTER SLOTS) is never listened for nor dialled on the reply's
 * word. It makes the proxy ask the topology again, and a redirect waits for
 * that (see askAgain).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { formatAddress } from '../address.js';
import type { ListenerTls, UpstreamTls } from '../config.js';
import { TopologyError } from '../errors.js';
import type { Logger } from '../log.js';
import { addShutdownCounts, startProxy, type ProxyServer, type ShutdownCount } from '../server.js';
import type { ProxyContext } from '../session/context.js';
import type { Stats } from '../stats.js';
import { UpstreamConnector, type UpstreamLocator } from '../upstream/connect.js';
import type { UpstreamTarget } from '../upstream/target.js';
import type { NodeDirectory } from './rewrite.js';
import { fetchTopology, type ClusterNodeInfo } from './topology.js';
import { believedView, SLOT_COUNT, type BelievedView, type ViewSource } from './views.js';

export interface ClusterManagerOptions {
  /** Seed URLs: where the topology is first asked; credentials and TLS apply to every node. */
  readonly seeds: readonly UpstreamTarget[];
  readonly upstreamTls: UpstreamTls | null;
  /** Host the node listeners bind (the --listen host). */
  readonly listenHost: string;
  /** Ports never given to a node (the seed listener's). */
  readonly reservedPorts: readonly number[];
  readonly listenerTls: ListenerTls | null;
  readonly basePort: number;
  /** Fixed listener ports by node address (`host:port`, as formatAddress writes it). */
  readonly portMap: ReadonlyMap<string, number>;
  readonly refreshMs: number;
  readonly connectTimeoutMs: number;
  readonly shutdownTimeoutMs: number;
  /** Per listener. */
  readonly maxConnections: number;
  /** The context for the sessions of one listener. */
  readonly contextFor: (upstream: UpstreamConnector, nodes: NodeDirectory) => ProxyContext;
  readonly log: Logger;
  readonly stats: Stats;
}

/** One upstream node and the listener in front of it. */
interface NodeListener {
  /** `host:port` the proxy dials. */
  readonly address: string;
  readonly host: string;
  readonly port: number;
  readonly listenPort: number;
  info: ClusterNodeInfo | null;
  server: ProxyServer | null;
  /** The attempt to listen in progress; it settles bound or failed. */
  starting: Promise<void> | null;
  /** Why the last attempt to listen failed, if it did. */
  bindError: string | null;
  /** Refreshes in a row that did not list this node. */
  missing: number;
}

/** Listeners at most: addresses come from Redis, but a broken view must not open thousands of ports. */
const MAX_NODES = 1000;
/** An unknown address a reply names is logged once in this long (each is counted all the same). */
const UNKNOWN_LOG_INTERVAL_MS = 10 * 60 * 1000;
/** Unknown addresses remembered as logged, at most: replies can name any number of them. */
const MAX_UNKNOWN_LOGGED = 100;
/** How long the port of a node that left stays its own. */
const RETIRED_PORT_KEEP_MS = 60 * 60 * 1000;
/** A -MOVED refreshes the topology at most this often. */
const REDIRECT_REFRESH_MS = 1000;

export class ClusterManager implements NodeDirectory, UpstreamLocator {
  private readonly byAddress = new Map<string, NodeListener>();
  private readonly byId = new Map<string, NodeListener>();
  private readonly byHostname = new Map<string, NodeListener>();
  /** Ports of nodes that left, kept a while so that a node coming back gets its old port. */
  private readonly retiredPorts = new Map<string, { port: number; at: number }>();
  /** Ports of the listeners open now, the seed listener's, and those of --cluster-port-map. */
  private readonly usedPorts = new Set<number>();
  private refreshTimer: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> | null = null;
  private lastRefreshStart = 0;
  /** The refresh that replies naming unknown nodes wait for (askAgain), until it starts. */
  private nextAsked: Promise<void> | null = null;
  /** Nodes whose last view was not believed: asked last. */
  private readonly unbelieved = new Set<string>();
  /** Unknown addresses logged, and when. */
  private readonly unknownLogged = new Map<string, number>();
  private closed = false;

  private constructor(private readonly options: ClusterManagerOptions) {
    for (const port of options.reservedPorts) this.usedPorts.add(port);
    for (const port of options.portMap.values()) this.usedPorts.add(port);
  }

  /** Discovers the cluster from the seeds and opens a listener per node. Fails with a clear error when no seed answers, or no seed's view can be believed. */
  static async start(options: ClusterManagerOptions): Promise<ClusterManager> {
    const manager = new ClusterManager(options);
    const seeds = options.seeds.map((seed) => ({ host: seed.host as string, port: seed.port as number, label: seed.display }));
    let view: BelievedView;
    try {
      view = await believedView(seeds, (seed) => manager.ask(seed), 'seed');
    } catch (err) {
      throw new TopologyError(`cluster: ${(err as Error).message}`, { cause: err });
    }
    const sorted = [...view.nodes].sort((a, b) => (a.host === b.host ? a.port - b.port : a.host < b.host ? -1 : 1));
    manager.apply({ ...view, nodes: sorted });
    await manager.listening();
    // Replies name these ports: one that is not the proxy's (another program has it) would send
    // clients elsewhere. At start-up that is a configuration error.
    const unbound = [...manager.byAddress.values()].filter((node) => node.server === null);
    if (unbound.length > 0) {
      await manager.close();
      const which = unbound.map(
        (node) => `${formatAddress(options.listenHost, node.listenPort)} for node ${node.address} (${node.bindError})`,
      );
      throw new TopologyError(
        `cluster: cannot listen on ${which.join(', ')}; choose free ports with --cluster-base-port or --cluster-port-map`,
      );
    }
    manager.refreshTimer = setInterval(() => void manager.refresh('interval'), options.refreshMs);
    manager.refreshTimer.unref();
    return manager;
  }

  // ------------------------------------------------------------ NodeDirectory

  portForId(id: string): number | undefined {
    return this.byId.get(id)?.listenPort;
  }

  portForAddress(host: string, port: number): number | undefined {
    const address = formatAddress(host, port);
    return (this.byAddress.get(address) ?? this.byHostname.get(address))?.listenPort;
  }

  noteRedirect(): void {
    if (Date.now() - this.lastRefreshStart >= REDIRECT_REFRESH_MS) void this.refresh('moved');
  }

  unknownNode(host: string, port: number, where: 'redirect' | 'topology'): void {
    if (where === 'redirect') this.options.stats.unknownNodesInRedirects++;
    else this.options.stats.unknownNodesInTopology++;
    const address = formatAddress(host, port);
    const now = Date.now();
    if (now - (this.unknownLogged.get(address) ?? -Infinity) >= UNKNOWN_LOG_INTERVAL_MS) {
      if (this.unknownLogged.size >= MAX_UNKNOWN_LOGGED) this.unknownLogged.clear();
      this.unknownLogged.set(address, now);
      this.options.log.warn({ node: address, in: where }, 'cluster: a reply names a node the topology does not have; passed on as it is');
    }
    void this.askAgain();
  }

  /**
   * A refresh that starts after this call (at most one a second, as for a
   * -MOVED): a node a reply names may have joined since the last one. Settles
   * once it is applied and new listeners are bound, or after the connect
   * timeout, whichever comes first.
   */
  askAgain(): Promise<void> {
    if (this.nextAsked === null) {
      const refreshed = (async () => {
        const wait = this.lastRefreshStart + REDIRECT_REFRESH_MS - Date.now();
        if (wait > 0) await sleep(wait, undefined, { ref: false });
        await this.refreshing; // one that started before the reply may not know the node
        this.nextAsked = null;
        await this.refresh('unknown-node');
        await this.listening();
      })();
      this.nextAsked = Promise.race([refreshed, sleep(this.options.connectTimeoutMs, undefined, { ref: false })]);
    }
    return this.nextAsked;
  }

  // ------------------------------------------------------------ seed listener

  /**
   * The node the seed listener sends a new connection to: a healthy master of the last believed
   * view if one is known.
   */
  locate(): { host: string; port: number } {
    let fallback: NodeListener | undefined;
    for (const node of this.byAddress.values()) {
      if (node.missing > 0 || this.unbelieved.has(node.address)) continue;
      if (node.info?.healthy && node.info.role === 'master') return node;
      if (node.info?.healthy !== false) fallback ??= node;
    }
    if (fallback !== undefined) return fallback;
    const seed = this.options.seeds[0];
    return { host: seed.host as string, port: seed.port as number };
  }

  describe(): string {
    return `cluster via ${this.options.seeds.map((seed) => seed.display).join(',')}`;
  }

  // ------------------------------------------------------------ inspection

  /** Node listeners, for logs, metrics and tests. */
  nodes(): Array<{
    address: string;
    listenPort: number;
    id: string | null;
    role: string | null;
    healthy: boolean | null;
    listening: boolean;
  }> {
    return [...this.byAddress.values()].map((node) => ({
      address: node.address,
      listenPort: node.listenPort,
      id: node.info?.id ?? null,
      role: node.info?.role ?? null,
      healthy: node.info?.healthy ?? null,
      listening: node.server !== null,
    }));
  }

  /** Resolves when every node listener has finished starting (bound or failed). */
  async listening(): Promise<void> {
    await Promise.all([...this.byAddress.values()].map((node) => node.starting));
  }

  // ------------------------------------------------------------ topology

  /** Asks the topology again (one refresh at a time) and applies it. */
  refresh(reason: string): Promise<void> {
    if (this.refreshing !== null || this.closed) return this.refreshing ?? Promise.resolve();
    this.lastRefreshStart = Date.now();
    this.refreshing = believedView(this.sources(), (source) => this.ask(source), 'node')
      .then((view) => {
        this.options.stats.clusterRefreshes++;
        if (!this.closed) this.apply(view);
      })
      .catch((err: Error) => {
        this.options.stats.clusterRefreshFailures++;
        this.options.log.warn({ reason, err: err.message }, 'cluster: topology refresh failed; keeping the current listeners');
      })
      .finally(() => (this.refreshing = null));
    return this.refreshing;
  }

  /** Whom a refresh asks: healthy masters first, then the other known nodes, those whose last view was not believed, then the seeds. */
  private sources(): ViewSource[] {
    const rank = (node: NodeListener): number => (this.unbelieved.has(node.address) ? 4 : healthRank(node));
    const known = [...this.byAddress.values()].sort((a, b) => rank(a) - rank(b));
    return [
      ...known.map((node) => ({ host: node.host, port: node.port, label: node.address })),
      ...this.options.seeds.map((s) => ({ host: s.host as string, port: s.port as number, label: s.display })),
    ];
  }

  /** The topology as one node sees it. */
  private ask(source: ViewSource): Promise<ClusterNodeInfo[]> {
    const o = this.options;
    return fetchTopology(o.seeds[0], o.upstreamTls, source.host, source.port, o.connectTimeoutMs);
  }

  private apply(view: BelievedView): void {
    this.noteSetAside(view);
    const seen = new Set<NodeListener>();
    for (const info of view.nodes) {
      const listener = this.byAddress.get(formatAddress(info.host, info.port)) ?? this.add(info);
      if (listener === null) continue;
      seen.add(listener);
      this.describeNode(listener, info);
      if (listener.server === null && listener.starting === null) this.listen(listener); // a bind that failed before
    }
    for (const listener of [...this.byAddress.values()]) {
      if (seen.has(listener)) {
        listener.missing = 0;
      } else if (!view.complete && (listener.info?.slots.length ?? 0) > 0) {
        // It served slots when last seen: only a view that serves every slot can say it left.
      } else if (++listener.missing >= 2) {
        this.retire(listener);
      }
    }
  }

  /** Views not believed are logged (once until the node's view is believed again) and counted; their nodes are asked last. */
  private noteSetAside(view: BelievedView): void {
    for (const [address, served] of view.setAside) {
      this.options.stats.clusterViewsSetAside++;
      if (this.unbelieved.has(address)) continue;
      this.unbelieved.add(address);
      this.options.log.warn(
        { node: address, slotsServed: served, of: SLOT_COUNT },
        "cluster: a node's view of the cluster is not believed (it serves too few slots, and most nodes do not share it)",
      );
    }
    for (const address of view.believedFrom) this.unbelieved.delete(address);
  }

  private describeNode(listener: NodeListener, info: ClusterNodeInfo): void {
    const before = listener.info;
    if (before !== null && before.id !== info.id) this.byId.delete(before.id);
    if (before?.hostname) this.byHostname.delete(formatAddress(before.hostname, listener.port));
    listener.info = info;
    this.byId.set(info.id, listener);
    if (info.hostname !== '') this.byHostname.set(formatAddress(info.hostname, info.port), listener);
    if (before !== null && before.role !== info.role) {
      this.options.log.info({ node: listener.address, id: info.id, was: before.role, now: info.role }, 'cluster: node changed role');
    }
  }

  /** Registers a node of a believed view and starts its listener; null when no port is left for it. */
  private add(info: ClusterNodeInfo): NodeListener | null {
    const { host, port } = info;
    const address = formatAddress(host, port);
    if (this.byAddress.size >= MAX_NODES) {
      this.options.log.error({ node: address, max: MAX_NODES }, 'cluster: too many nodes; not listening for this one');
      return null;
    }
    const listenPort = this.portFor(address, info);
    if (listenPort === null) {
      this.options.log.error({ node: address }, 'cluster: no free listener port left above --cluster-base-port');
      return null;
    }
    const listener: NodeListener = {
      address,
      host,
      port,
      listenPort,
      info: null,
      server: null,
      starting: null,
      bindError: null,
      missing: 0,
    };
    this.byAddress.set(address, listener);
    this.describeNode(listener, info);
    this.listen(listener);
    return listener;
  }

  private portFor(address: string, info: ClusterNodeInfo): number | null {
    const mapped =
      this.options.portMap.get(address) ?? (info.hostname ? this.options.portMap.get(formatAddress(info.hostname, info.port)) : undefined);
    if (mapped !== undefined) return mapped;
    const retired = this.retiredPorts.get(address);
    this.retiredPorts.delete(address);
    const port = retired?.port ?? this.freePort();
    if (port !== null) this.usedPorts.add(port);
    return port;
  }

  /**
   * The lowest port from --cluster-base-port up that no listener uses. The port
   * of a node that left is given to another only after RETIRED_PORT_KEEP_MS
   * (nodes that move, as Kubernetes pods do, would otherwise use up ports).
   */
  private freePort(): number | null {
    const kept = new Map<number, string>();
    for (const [address, { port, at }] of this.retiredPorts) {
      if (Date.now() - at < RETIRED_PORT_KEEP_MS) kept.set(port, address);
      else this.retiredPorts.delete(address);
    }
    for (let port = this.options.basePort; port <= 65535; port++) {
      if (!this.usedPorts.has(port) && !kept.has(port)) return port;
    }
    return null;
  }

  private listen(listener: NodeListener): void {
    const o = this.options;
    const seed = o.seeds[0];
    const target: UpstreamTarget = {
      ...seed,
      host: listener.host,
      port: listener.port,
      db: 0,
      display: `${seed.tls ? 'rediss' : 'redis'}://${formatAddress(listener.host, listener.port)}`,
    };
    const connector = new UpstreamConnector(target, o.upstreamTls, null);
    listener.starting = startProxy(
      { listen: { host: o.listenHost, port: listener.listenPort }, tls: o.listenerTls, maxConnections: o.maxConnections },
      o.contextFor(connector, this),
    )
      .then((server) => {
        listener.server = server;
        listener.bindError = null;
        if (this.closed || !this.byAddress.has(listener.address)) void server.close();
        else
          o.log.info(
            { node: listener.address, listen: formatAddress(o.listenHost, listener.listenPort), role: listener.info?.role },
            'cluster: listening for node',
          );
      })
      .catch((err: Error) => {
        listener.bindError = err.message;
        o.log.error(
          { node: listener.address, listen: formatAddress(o.listenHost, listener.listenPort), err: err.message },
          'cluster: cannot listen for node (retried at the next refresh)',
        );
      })
      .finally(() => (listener.starting = null));
  }

  /** A node left the cluster: stop accepting for it, let its connections finish. Its port stays reserved for it. */
  private retire(listener: NodeListener): void {
    this.byAddress.delete(listener.address);
    this.unbelieved.delete(listener.address);
    if (listener.info !== null && this.byId.get(listener.info.id) === listener) this.byId.delete(listener.info.id);
    if (listener.info?.hostname) this.byHostname.delete(formatAddress(listener.info.hostname, listener.port));
    if (![...this.options.portMap.values()].includes(listener.listenPort)) this.usedPorts.delete(listener.listenPort);
    this.retiredPorts.set(listener.address, { port: listener.listenPort, at: Date.now() });
    this.options.log.warn({ node: listener.address, listen: listener.listenPort }, 'cluster: node left the cluster; draining its listener');
    void listener.server?.shutdown(this.options.shutdownTimeoutMs);
  }

  // ------------------------------------------------------------ lifecycle

  /** Graceful: every node listener drains (see ProxyServer.shutdown). */
  async shutdown(timeoutMs: number): Promise<ShutdownCount> {
    this.stop();
    return addShutdownCounts(await Promise.all([...this.byAddress.values()].map((node) => node.server?.shutdown(timeoutMs))));
  }

  async close(): Promise<void> {
    this.stop();
    await Promise.all([...this.byAddress.values()].map((node) => node.server?.close()));
  }

  /** Open client connections over all node listeners. */
  get sessionCount(): number {
    let count = 0;
    for (const node of this.byAddress.values()) count += node.server?.sessionCount ?? 0;
    return count;
  }

  private stop(): void {
    this.closed = true;
    clearInterval(this.refreshTimer);
  }
}

function healthRank(node: NodeListener): number {
  if (node.info === null) return 2;
  return node.info.healthy ? (node.info.role === 'master' ? 0 : 1) : 3;
}
