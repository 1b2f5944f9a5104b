#!/usr/bin/env node
/**
 * Entry point.
 *
 *   redis-lock-proxy [options]            run the proxy
 *   redis-lock-proxy verify --via ADDR    prove the fix through a running proxy
 *   redis-lock-proxy locks --upstream URL list (and release) lock keys
 *
 * Signals: SIGTERM/SIGINT shut down gracefully (a second one exits at once),
 * SIGHUP reloads the rules.
 */
import { readFileSync } from 'node:fs';
import { createMetricsRegistry } from './admin/metrics.js';
import { startAdminServer } from './admin/server.js';
import { resolveConfig, USAGE, type Config } from './config.js';
import { createLogger, type Logger } from './log.js';
import { describeRules, RuleStore } from './rules/store.js';
import { startProxy, type ProxyServer } from './server.js';
import type { ProxyContext } from './session.js';
import { Stats } from './stats.js';
import { ClusterManager } from './cluster/manager.js';
import type { NodeDirectory } from './cluster/rewrite.js';
import { UpstreamConnector } from './upstream/connect.js';
import { probeUpstream } from './upstream/probe.js';
import { SentinelMonitor } from './upstream/sentinel.js';

function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
  return pkg.version;
}

/** Readiness is probed at most this often; scrapers may poll /readyz quickly. */
const READY_CACHE_MS = 1000;

async function startSentinel(config: Config, log: Logger): Promise<SentinelMonitor | null> {
  if (config.sentinel === null) return null;
  return SentinelMonitor.start({
    sentinels: [...config.sentinel.sentinels],
    masterName: config.sentinel.masterName,
    username: config.sentinel.username,
    password: config.sentinel.password,
    log,
  });
}

async function run(config: Config): Promise<void> {
  const log = createLogger(config.logLevel);
  const stats = new Stats();
  const rules = new RuleStore(config.rulePaths, log, stats, config.release);
  if (config.upstreamTls?.insecure) log.warn('upstream TLS certificate verification is disabled (--upstream-insecure)');
  for (const warning of config.warnings) log.warn(warning);
  const sentinel = await startSentinel(config, log);
  const contextFor = (upstream: UpstreamConnector, nodes: NodeDirectory | null): ProxyContext => ({
    upstream,
    rules: () => rules.current,
    mode: config.mode,
    holdMs: config.holdMs,
    connectTimeoutMs: config.connectTimeoutMs,
    idleTimeoutMs: config.idleTimeoutMs,
    lockPipelining: config.lockPipelining,
    cluster: nodes === null ? null : { nodes, announceHost: config.cluster?.announceHost ?? null },
    log,
    stats,
  });

  // Cluster mode: a listener per node; the --listen listener is the seed, going to any live node.
  const cluster = config.cluster === null ? null : await startCluster(config, contextFor, log, stats);
  const upstream = new UpstreamConnector(config.upstream, config.upstreamTls, cluster ?? sentinel);
  const seed = await startProxy(
    { listen: config.listen, tls: config.listenerTls, maxConnections: config.maxConnections },
    contextFor(upstream, cluster),
  ).catch(async (err: Error) => {
    await cluster?.close();
    throw new Error(`listen ${config.listen.host}:${config.listen.port}: ${err.message}`);
  });
  const server = cluster === null ? seed : withNodeListeners(seed, cluster);

  sentinel?.on('switch', (from, to) => {
    const closed = seed.closeSessionsTo(`${from.host}:${from.port}`);
    log.warn({ from: `${from.host}:${from.port}`, to: `${to.host}:${to.port}`, closed }, 'master changed; closed the connections to the old master');
  });

  let lastProbe = { at: 0, result: { ok: false, detail: 'not probed yet' } };
  const ready = async (): Promise<{ ok: boolean; detail: string }> => {
    if (rules.current.rules.length === 0) return { ok: false, detail: 'no rules loaded' };
    if (Date.now() - lastProbe.at > READY_CACHE_MS) {
      lastProbe = { at: Date.now(), result: await probeUpstream(upstream, Math.min(config.connectTimeoutMs, 1500)) };
    }
    return lastProbe.result;
  };
  const admin =
    config.adminListen === null
      ? null
      : await startAdminServer(config.adminListen, {
          registry: createMetricsRegistry(stats, {
            rulesLoaded: () => rules.current.rules.length,
            ruleFiles: () => rules.current.files,
            clusterNodes: cluster === null ? undefined : () => cluster.nodes(),
          }),
          ready,
          log,
        }).catch((err: Error) => {
          throw new Error(`admin-listen ${config.adminListen?.host}:${config.adminListen?.port}: ${err.message} (another port, or --admin-listen off)`);
        });

  // Every signal handler is in place before the proxy says it is listening: a supervisor may
  // send SIGHUP or SIGTERM the moment it reads that line.
  if (config.watchRules) rules.watch();
  process.on('SIGHUP', () => rules.reload('SIGHUP'));
  const shutdown = handleShutdownSignals(config, log, server, async () => {
    rules.close();
    await admin?.close();
    await sentinel?.close();
  });
  stopWithLauncher(log, shutdown);

  const byMode = { enforce: 0, observe: 0 };
  for (const rule of rules.current.rules) byMode[config.mode === 'observe' ? 'observe' : rule.mode]++;
  log.info(
    {
      listen: `${seed.address.host}:${seed.address.port}`,
      ...(cluster === null ? {} : { clusterNodes: cluster.nodes().map((node) => `${node.address} (${node.role}) on ${node.listenPort}`) }),
      tls: config.listenerTls !== null,
      upstream: upstream.describe(),
      admin: admin === null ? 'off' : `${admin.address.host}:${admin.address.port}`,
      mode: config.mode,
      ...describeRules(rules.current, config.mode),
      enforce: byMode.enforce,
      observe: byMode.observe,
      version: packageVersion(),
    },
    'redis-lock-proxy listening',
  );

}

async function startCluster(
  config: Config,
  contextFor: (upstream: UpstreamConnector, nodes: NodeDirectory) => ProxyContext,
  log: Logger,
  stats: Stats,
): Promise<ClusterManager> {
  const cluster = config.cluster as NonNullable<Config['cluster']>;
  return ClusterManager.start({
    seeds: cluster.seeds,
    upstreamTls: config.upstreamTls,
    listenHost: config.listen.host,
    reservedPorts: [config.listen.port],
    listenerTls: config.listenerTls,
    basePort: cluster.basePort,
    portMap: cluster.portMap,
    refreshMs: cluster.refreshMs,
    connectTimeoutMs: config.connectTimeoutMs,
    shutdownTimeoutMs: config.shutdownTimeoutMs,
    maxConnections: config.maxConnections,
    contextFor,
    log,
    stats,
  });
}

/** The seed listener and the node listeners, shut down together. */
function withNodeListeners(seed: ProxyServer, cluster: ClusterManager): Pick<ProxyServer, 'sessionCount' | 'shutdown'> {
  return {
    get sessionCount() {
      return seed.sessionCount + cluster.sessionCount;
    },
    async shutdown(timeoutMs: number) {
      await Promise.all([seed.shutdown(timeoutMs), cluster.shutdown(timeoutMs)]);
    },
  };
}

/** Installs the SIGTERM/SIGINT handlers; returns the shutdown they start, for other triggers. */
function handleShutdownSignals(
  config: Config,
  log: Logger,
  server: Pick<ProxyServer, 'sessionCount' | 'shutdown'>,
  cleanup: () => Promise<void>,
): (signal: string) => void {
  let stopping = false;
  const onSignal = (signal: string): void => {
    if (stopping) {
      log.warn({ signal }, 'second signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    log.info({ signal, connections: server.sessionCount, timeoutMs: config.shutdownTimeoutMs }, 'shutting down: finishing in-flight requests');
    void server
      .shutdown(config.shutdownTimeoutMs)
      .then(cleanup)
      .then(() => {
        log.info('shut down');
        process.exit(0);
      });
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));
  return onSignal;
}

/** How often the parent process is looked for, when the proxy was started by npm. */
const LAUNCHER_CHECK_MS = 1000;

/**
 * `npx redis-lock-proxy` (npm exec) runs the proxy as a child of npm, and a SIGTERM sent to npm
 * does not reach it: npm exits and the proxy would go on, orphaned, holding its ports. So when
 * npm started it, the proxy shuts down as on SIGTERM once its parent is gone. Services should
 * start `node dist/cli.js` (or the installed command) directly, so that its PID is the proxy's.
 */
function stopWithLauncher(log: Logger, shutdown: (signal: string) => void): void {
  if (process.env.npm_command === undefined) return;
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    log.warn({ launcher: `npm ${process.env.npm_command}`, parent }, 'the npm process that started the proxy is gone; shutting down');
    shutdown('launcher exit');
  }, LAUNCHER_CHECK_MS);
  timer.unref();
}

interface Io {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
}

/** `verify` and `locks`: operator tools in their own modules, loaded only when used. */
async function runSubcommand(name: 'verify' | 'locks', argv: string[]): Promise<number> {
  const io: Io = { stdout: (t) => process.stdout.write(t), stderr: (t) => process.stderr.write(t), env: process.env };
  const module = name === 'verify' ? await import('./ops/verify.js') : await import('./ops/locks.js');
  return module.run(argv, io);
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  try {
    if (argv[0] === 'verify' || argv[0] === 'locks') {
      process.exitCode = await runSubcommand(argv[0], argv.slice(1));
      return;
    }
    const request = resolveConfig(argv, process.env);
    switch (request.kind) {
      case 'help':
        process.stdout.write(USAGE);
        return;
      case 'version':
        process.stdout.write(`${packageVersion()}\n`);
        return;
      case 'print-config':
        process.stdout.write(request.text);
        return;
      case 'run':
        await run(request.config);
        return;
    }
  } catch (err) {
    const error = err as NodeJS.ErrnoException;
    process.stderr.write(`redis-lock-proxy: ${error.message}\n`);
    // Exit now: a listener or sentinel connection opened before the failure would keep the process alive.
    process.exit(error.code === 'ECONFIG' || error.code === 'ERULEFILE' ? 2 : 1);
  }
}

void main();
