/**
 * Starts the proxy in the test process, in front of a test Redis, exactly as the command line
 * does (startApp from a Config read from flags), with rules from YAML text and a logger whose
 * lines the test can read.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { startApp, type App } from '../../src/app.js';
import type { ClusterManager } from '../../src/cluster/manager.js';
import { resolveConfig, type Config, type ListenerTls, type UpstreamTls } from '../../src/config.js';
import type { RuleStore } from '../../src/rules/store.js';
import type { Stats } from '../../src/stats.js';
import { freePortRange } from './ports.js';
import { RawClient } from './resp.js';

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
  readonly app: App;
  readonly rules: RuleStore;
  /** The rule files in force (in a temporary directory the test may rewrite). */
  readonly ruleFiles: readonly string[];
  /** Parsed log lines written so far. */
  logs(): Array<Record<string, unknown>>;
  /** /metrics as text (the proxy was started with `admin: true`). */
  metrics(): Promise<string>;
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
  /** --lock-method (default: the proxy's own, auto). */
  lockMethod?: 'auto' | 'transaction' | 'script';
  maxConnections?: number;
  /** TLS towards a rediss:// upstream, as the proxy holds it (read files, not paths). */
  upstreamTls?: UpstreamTls;
  listenerTls?: ListenerTls;
  /** Cluster mode: --cluster-announce-host. */
  announceHost?: string;
  /** --stalwart: load only the rule files for this release. */
  stalwart?: string;
  /** Serve the admin endpoints (/metrics, /healthz, /readyz) on a free loopback port. */
  admin?: boolean;
  /** Any other flags, as the command line takes them. */
  flags?: string[];
}

export interface ClusterTestProxy extends TestProxy {
  readonly cluster: ClusterManager;
  /** Listener ports start here (nodes in address order). */
  readonly basePort: number;
}

/** The proxy on a free port in front of `opts.upstream`. */
export async function startTestProxy(opts: TestProxyOptions): Promise<TestProxy> {
  return start(opts, []);
}

/**
 * The proxy with --lock-method transaction, or undefined where the server has no EXPIRE ... NX
 * (before Redis 7.0), whose start refuses that way: the tests of that way skip there.
 */
export async function startTransactionProxy(opts: Omit<TestProxyOptions, 'lockMethod'>): Promise<TestProxy | undefined> {
  try {
    return await startTestProxy({ ...opts, lockMethod: 'transaction' });
  } catch (error) {
    if (/--lock-method transaction needs EXPIRE \.\.\. NX/.test((error as Error).message)) return undefined;
    throw error;
  }
}

/** The proxy in cluster mode: the seed listener on a free port, node listeners from a free range of ports. */
export async function startClusterTestProxy(opts: TestProxyOptions & { refreshMs?: number }): Promise<ClusterTestProxy> {
  const basePort = await freePortRange(16);
  const flags = ['--cluster', '--cluster-base-port', String(basePort), '--cluster-refresh-ms', String(opts.refreshMs ?? 10_000)];
  if (opts.announceHost !== undefined) flags.push('--cluster-announce-host', opts.announceHost);
  const proxy = await start(opts, flags);
  return { ...proxy, basePort, cluster: proxy.app.cluster as ClusterManager };
}

async function start(opts: TestProxyOptions, extra: string[]): Promise<TestProxy> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-rules-'));
  const files = (opts.rules ?? [TEST_RULES]).map((text, i) => {
    const file = path.join(dir, `${i}.yaml`);
    fs.writeFileSync(file, text);
    return file;
  });
  const { log, lines } = capturingLogger();
  const config = testConfig(opts, opts.rules === undefined ? [STALWART_RULES, ...files] : files, extra);
  const app = await startApp(config, log).catch((err: unknown) => {
    fs.rmSync(dir, { recursive: true, force: true });
    throw err;
  });
  return {
    port: app.address.port,
    stats: app.stats,
    app,
    rules: app.rules,
    ruleFiles: files,
    logs: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>),
    metrics: async () => {
      const address = app.adminAddress;
      if (address === null) throw new Error('the proxy has no admin server: start it with admin: true');
      return (await fetch(`http://127.0.0.1:${address.port}/metrics`)).text();
    },
    close: async () => {
      await app.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The Config the command line would build from these options (TLS material given directly). */
function testConfig(opts: TestProxyOptions, rulePaths: string[], extra: string[]): Config {
  const setting = (name: string, value: string | number) => [`--${name}`, String(value)];
  const flags = [
    ...setting('listen', '127.0.0.1:0'),
    ...setting('upstream', opts.upstream),
    ...setting('admin-listen', opts.admin ? '127.0.0.1:0' : 'off'),
    ...setting('hold-ms', opts.holdMs ?? 10),
    ...setting('connect-timeout-ms', opts.connectTimeoutMs ?? 2000),
    ...setting('idle-timeout-ms', opts.idleTimeoutMs ?? 0),
    ...setting('mode', opts.mode ?? 'enforce'),
    ...setting('shutdown-timeout-ms', 1000),
    ...rulePaths.flatMap((file) => setting('rules', file)),
    ...extra,
    ...(opts.flags ?? []),
  ];
  if (opts.lockMethod !== undefined) flags.push('--lock-method', opts.lockMethod);
  if (opts.maxConnections !== undefined) flags.push('--max-connections', String(opts.maxConnections));
  if (opts.stalwart !== undefined) flags.push('--stalwart', opts.stalwart);
  const request = resolveConfig(flags, {});
  if (request.kind !== 'run') throw new Error(`unexpected ${request.kind}`);
  return {
    ...request.config,
    upstreamTls: opts.upstreamTls ?? request.config.upstreamTls,
    listenerTls: opts.listenerTls ?? null,
  };
}

/** A debug-level logger whose lines the test can read. */
function capturingLogger() {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(
        ...chunk
          .toString()
          .split('\n')
          .filter((l) => l !== ''),
      );
      done();
    },
  });
  return { log: pino({ level: 'debug' }, sink), lines };
}

/**
 * Connects once to a proxy with --lock-method auto and waits until it has asked the server's
 * version on a connection of its own (at the start, or ahead of a connection), so that a test that
 * counts what Redis reads sees no such question later.
 */
export async function versionAskedAhead(proxy: TestProxy, timeoutMs = 10_000): Promise<void> {
  const asked = (): boolean =>
    proxy.logs().some((l) => l.msg === 'lock method chosen from the server version' && (l.asked === 'ahead' || l.asked === 'start'));
  const client = await RawClient.connect(proxy.port);
  try {
    const deadline = Date.now() + timeoutMs;
    while (!asked()) {
      if (Date.now() > deadline) throw new Error(`the proxy did not ask the server's version ahead within ${timeoutMs} ms`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  } finally {
    await client.close();
  }
}
