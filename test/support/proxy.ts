/**
 * Starts the proxy in the test process, in front of a test Redis, with rules
 * from YAML text or files, and a logger whose lines the test can read.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { chooseRules, type ListenerTls, type UpstreamTls } from '../../src/config.js';
import { RuleStore } from '../../src/rules/store.js';
import { startProxy, type ProxyServer } from '../../src/server.js';
import type { ProxyContext } from '../../src/session.js';
import { ClusterManager } from '../../src/cluster/manager.js';
import type { NodeDirectory } from '../../src/cluster/rewrite.js';
import { Stats } from '../../src/stats.js';
import { UpstreamConnector } from '../../src/upstream/connect.js';
import { parseUpstreamUrl } from '../../src/upstream/target.js';
import { freePortRange } from './redis.js';

/** The shipped rules: every affected Stalwart release line. */
export const STALWART_RULES = path.resolve(import.meta.dirname, '../../rules/stalwart');

/** Rules for tests: Stalwart's, plus text prefixes `lock:` (enforce) and `watch:` (observe). */
export const TEST_RULES = `rules:
  - name: test-lock
    prefix: "lock:"
  - name: test-observe
    prefix: "watch:"
    mode: observe
`;

export interface TestProxy {
  readonly port: number;
  readonly stats: Stats;
  readonly server: ProxyServer;
  readonly rules: RuleStore;
  /** The rule files in force (in a temporary directory the test may rewrite). */
  readonly ruleFiles: readonly string[];
  /** Parsed log lines written so far. */
  logs(): Array<Record<string, unknown>>;
  close(): Promise<void>;
}

export interface TestProxyOptions {
  upstream: string;
  /** YAML rule texts, written to a temporary directory (default: Stalwart's rules and TEST_RULES). */
  rules?: string[];
  holdMs?: number;
  connectTimeoutMs?: number;
  mode?: 'enforce' | 'observe';
  idleTimeoutMs?: number;
  lockPipelining?: boolean;
  maxConnections?: number;
  upstreamTls?: UpstreamTls;
  listenerTls?: ListenerTls;
  /** Cluster mode: --cluster-announce-host. */
  announceHost?: string;
  /** --stalwart: load only the rule files for this release. */
  stalwart?: string;
}

/** Rule files in a temporary directory, and a logger whose lines the test can read. */
function testSetup(opts: Pick<TestProxyOptions, 'rules' | 'stalwart'>) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-rules-'));
  const files = (opts.rules ?? [TEST_RULES]).map((text, i) => {
    const file = path.join(dir, `${i}.yaml`);
    fs.writeFileSync(file, text);
    return file;
  });
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(...chunk.toString().split('\n').filter((l) => l !== ''));
      done();
    },
  });
  const log = pino({ level: 'debug' }, sink);
  const stats = new Stats();
  const choice = chooseRules(opts.rules === undefined ? [STALWART_RULES, ...files] : files, opts.stalwart);
  const rules = new RuleStore(choice.paths, log, stats, choice.release);
  const contextFor = (upstream: UpstreamConnector, o: TestProxyOptions, nodes: NodeDirectory | null = null): ProxyContext => ({
    upstream,
    rules: () => rules.current,
    mode: o.mode ?? 'enforce',
    holdMs: o.holdMs ?? 10,
    connectTimeoutMs: o.connectTimeoutMs ?? 2000,
    idleTimeoutMs: o.idleTimeoutMs ?? 0,
    lockPipelining: o.lockPipelining ?? false,
    cluster: nodes === null ? null : { nodes, announceHost: o.announceHost ?? null },
    log,
    stats,
  });
  return {
    files,
    log,
    stats,
    rules,
    contextFor,
    logs: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>),
    cleanUp: () => {
      rules.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

export async function startTestProxy(opts: TestProxyOptions): Promise<TestProxy> {
  const setup = testSetup(opts);
  const server: ProxyServer = await startProxy(
    { listen: { host: '127.0.0.1', port: 0 }, tls: opts.listenerTls, maxConnections: opts.maxConnections },
    setup.contextFor(new UpstreamConnector(parseUpstreamUrl(opts.upstream), opts.upstreamTls ?? null), opts),
  );
  return testProxy(setup, server, () => server.close());
}

/** What a test sees of a started proxy; `closeServers` stops its listeners. */
function testProxy(setup: ReturnType<typeof testSetup>, server: ProxyServer, closeServers: () => Promise<unknown>): TestProxy {
  return {
    port: server.address.port,
    stats: setup.stats,
    server,
    rules: setup.rules,
    ruleFiles: setup.files,
    logs: setup.logs,
    close: async () => {
      await closeServers();
      setup.cleanUp();
    },
  };
}

export interface ClusterTestProxy extends TestProxy {
  readonly cluster: ClusterManager;
  /** Listener ports start here (nodes in address order). */
  readonly basePort: number;
}

/**
 * The proxy in cluster mode: the seed listener on a free port, node
 * listeners from a free range of ports.
 */
export async function startClusterTestProxy(opts: TestProxyOptions & { refreshMs?: number }): Promise<ClusterTestProxy> {
  const setup = testSetup(opts);
  const seeds = opts.upstream.split(',').map(parseUpstreamUrl);
  const basePort = await freePortRange(16);
  const starting = ClusterManager.start({
    seeds,
    upstreamTls: opts.upstreamTls ?? null,
    listenHost: '127.0.0.1',
    reservedPorts: [],
    listenerTls: opts.listenerTls ?? null,
    basePort,
    portMap: new Map(),
    refreshMs: opts.refreshMs ?? 10_000,
    connectTimeoutMs: opts.connectTimeoutMs ?? 2000,
    shutdownTimeoutMs: 1000,
    maxConnections: opts.maxConnections ?? 10_000,
    contextFor: (upstream, nodes) => setup.contextFor(upstream, opts, nodes),
    log: setup.log,
    stats: setup.stats,
  });
  const cluster = await starting.catch((err: unknown) => {
    setup.cleanUp();
    throw err;
  });
  const server = await startProxy(
    { listen: { host: '127.0.0.1', port: 0 }, tls: opts.listenerTls, maxConnections: opts.maxConnections },
    setup.contextFor(new UpstreamConnector(seeds[0], opts.upstreamTls ?? null, cluster), opts, cluster),
  );
  return { ...testProxy(setup, server, () => Promise.all([server.close(), cluster.close()])), basePort, cluster };
}
