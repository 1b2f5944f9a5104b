/**
 * The running proxy, built from a Config: the rules in force, the upstream (plain, Sentinel or
 * a cluster's node listeners), the client listener, and the admin server. The command line and
 * the tests both start the proxy here, so what the tests run is what operators run.
 */
import { readFileSync } from 'node:fs';
import { formatAddress, type Address } from './address.js';
import { createMetricsRegistry } from './admin/metrics.js';
import { rulesView } from './admin/rules-view.js';
import { startAttemptReport } from './admin/attempt-report.js';
import type { LockScanner } from './admin/lock-scan.js';
import { startAdminServer, type AdminServer } from './admin/server.js';
import type { ClusterManager } from './cluster/manager.js';
import type { NodeDirectory } from './cluster/rewrite.js';
import type { Config } from './config.js';
import { ConfigError } from './errors.js';
import { describeInherited, NO_INHERITED_SOCKETS, type InheritedSocket, type InheritedSockets } from './listen-fds.js';
import { changedSettings, OPTIONS, overriddenFileSettings, type OptionName, type OptionSpec } from './settings.js';
import { HELLO, methodFromHello, ServerMethods } from './lock/lock-method.js';
import { chooseMethod, type MethodChoice } from './lock/method-choice.js';
import type { Logger } from './log.js';
import { loadCensus } from './rules/census.js';
import { describeRules, releasesText, RuleStore } from './rules/store.js';
import { effectiveMode } from './rules/types.js';
import { addShutdownCounts, startProxy, type ProxyServer, type ShutdownCount } from './server.js';
import type { ProxyContext } from './session/context.js';
import { Stats } from './stats.js';
import { UpstreamConnector } from './upstream/connect.js';
import { askHello, probeUpstream } from './upstream/probe.js';
import { RefusalLog } from './upstream/refusal-log.js';
import { refuseSelfLoop } from './upstream/self-loop.js';
import type { SentinelMonitor } from './upstream/sentinel.js';
import { VerifyRuns } from './verify-connection.js';

/** Readiness is probed at most this often; scrapers may poll /readyz quickly. */
const READY_CACHE_MS = 1000;

export interface App {
  /** Where clients connect (the seed listener with --cluster), port 0 resolved. */
  readonly address: Address;
  /** The admin server's address, or null when it is off. */
  readonly adminAddress: Address | null;
  readonly rules: RuleStore;
  readonly stats: Stats;
  /** The lock scan, when --lock-scan-interval-ms is set. */
  readonly lockScan: LockScanner | null;
  /** With --cluster: the node listeners. */
  readonly cluster: ClusterManager | null;
  /** Client connections open, on every listener. */
  readonly sessionCount: number;
  /** The configuration in force: the one started with, and what reloads changed since. */
  readonly config: Config;
  /** What the start-up log line says: addresses, upstream, mode, rules, version. */
  describe(): Record<string, unknown>;
  /**
   * Reloads the rules (a rule file changed). Given `read` (SIGHUP), reads the configuration again
   * and applies what can change while running (RELOADABLE: the rules, the mode, hold-ms, ...);
   * a changed setting that needs a restart is named in a warning, and stays as it was.
   */
  reload(trigger: string, read?: () => Config): void;
  /** Whether the upstream answers PING (with the URL's AUTH/SELECT), as /readyz probes it. */
  probeUpstream(): Promise<{ ok: boolean; detail: string }>;
  /**
   * Stops accepting, lets connections finish what is in flight (closing those still busy after
   * `timeoutMs`), then stops the rest: rule watching, the admin server, Sentinel. From its start
   * /readyz says not ready. Resolves with how many connections were open, and how many of them
   * were cut at the deadline.
   */
  shutdown(timeoutMs: number): Promise<ShutdownCount>;
  /** Closes everything at once. */
  close(): Promise<void>;
}

/** The settings a reload (SIGHUP) applies; any other that changed is named as needing a restart. */
export const RELOADABLE: readonly OptionName[] = [
  'rules',
  'stalwart',
  'mode',
  'hold-ms',
  'watch-rules',
  'lock-attempt-report-ms',
  'shutdown-timeout-ms',
];

/**
 * Starts the proxy. `sockets`: listening sockets systemd passed (socket activation), which stand
 * in for --listen and --admin-listen.
 */
export async function startApp(started: Config, log: Logger, sockets: InheritedSockets = NO_INHERITED_SOCKETS): Promise<App> {
  /** The configuration in force; a reload replaces it. */
  let config = started;
  if (sockets.client !== null && config.cluster !== null) {
    throw new ConfigError(
      `--cluster cannot take its listener from systemd (${describeInherited(sockets.client)}): ` +
        'the node listeners are bound next to --listen at run time; start it without the socket unit',
    );
  }
  if (sockets.ignored !== null) log.warn({ reason: sockets.ignored }, 'LISTEN_FDS ignored: listening on the listen settings');
  /** Set once a shutdown begins: /readyz then says not ready, while the connections drain. */
  let shuttingDown = false;
  const stats = new Stats();
  const refusals = new RefusalLog(log);
  const rules = new RuleStore({ paths: config.rulePaths, release: config.release, mode: config.mode }, log, stats);
  const census = loadCensus(log);
  if (config.upstreamTls?.insecure) log.warn('upstream TLS certificate verification is disabled (--upstream-insecure)');
  logOverridden(log, config, undefined);
  for (const warning of config.warnings) log.warn(warning);
  // One for the process: every listener's connections to an address learn for each other.
  const serverMethods = new ServerMethods();
  // One for the process: verify asks the admin endpoint whether its connection came through any listener.
  const verifyRuns = new VerifyRuns();
  const contextFor = (upstream: UpstreamConnector, nodes: NodeDirectory | null): ProxyContext => ({
    upstream,
    rules: () => rules.current,
    census,
    // Read for every block, so that a reload applies to open connections too.
    get mode() {
      return rules.mode;
    },
    get holdMs() {
      return config.holdMs;
    },
    connectTimeoutMs: config.connectTimeoutMs,
    idleTimeoutMs: config.idleTimeoutMs,
    ownReplyTimeoutMs: config.ownReplyTimeoutMs,
    upstreamTimeoutMs: config.upstreamTimeoutMs,
    lockMethod: config.lockMethod,
    serverMethods,
    cluster: nodes === null ? null : { nodes, announceHost: config.cluster?.announceHost ?? null },
    log,
    stats,
    refusals,
    verifyRuns,
  });

  // Behind Sentinel the URL's host is replaced by the master's: nothing to compare.
  // (On a socket systemd passed, checked once it is listened on: its address is known only then.)
  if (config.sentinel === null && sockets.client === null) await refuseSelfLoop(config.listen, config.cluster?.seeds ?? [config.upstream]);
  const sentinel = await startSentinel(config, log);
  // With --cluster: a listener per node; the --listen listener is the seed, going to any live node.
  // (Cluster and Sentinel never go together: the config refuses that.)
  const cluster = config.cluster === null ? null : await startCluster(config, contextFor, log, stats);
  const locator = cluster ?? sentinel;
  const upstream = new UpstreamConnector(config.upstream, config.upstreamTls, locator);
  // The way lock blocks go, asked of the server now: a way it cannot run stops the start.
  const methodAtStart = await lockMethodAtStart(config, upstream, serverMethods, log).catch(async (err: Error) => {
    await Promise.all([cluster?.close(), sentinel?.close()]);
    throw err;
  });
  const seed = await startProxy(
    { listen: sockets.client ?? config.listen, tls: config.listenerTls, maxConnections: config.maxConnections },
    contextFor(upstream, cluster),
  ).catch(async (err: Error) => {
    await Promise.all([cluster?.close(), sentinel?.close()]);
    if (sockets.client !== null) throw new Error(`listen on ${describeInherited(sockets.client)}: ${err.message}`, { cause: err });
    const hint =
      (err as NodeJS.ErrnoException).code === 'EADDRINUSE' ? ' (another program listens there: stop it, or choose another --listen)' : '';
    throw new Error(`listen ${formatAddress(config.listen.host, config.listen.port)}: ${err.message}${hint}`, { cause: err });
  });
  if (sockets.client !== null) {
    if (config.sentinel === null) {
      await refuseSelfLoop(seed.address, [config.upstream]).catch(async (err: Error) => {
        await seed.close();
        throw err;
      });
    }
    logInheritedListener(log, 'listen', sockets.client, seed.address, config.listen);
  }

  sentinel?.on('switch', (from, to) => {
    const closed = seed.closeSessionsTo(formatAddress(from.host, from.port));
    log.warn(
      { from: formatAddress(from.host, from.port), to: formatAddress(to.host, to.port), closed },
      'master changed; closed the connections to the old master',
    );
  });

  let lastProbe = { at: 0, result: { ok: false, detail: 'not probed yet' } };
  const ready = async (): Promise<{ ok: boolean; detail: string }> => {
    // A load balancer or probe must stop sending clients here as soon as the drain begins.
    if (shuttingDown) return { ok: false, detail: 'shutting down: finishing in-flight requests, accepting no new connections' };
    if (rules.current.rules.length === 0) return { ok: false, detail: 'no rules loaded' };
    if (Date.now() - lastProbe.at > READY_CACHE_MS) {
      lastProbe = { at: Date.now(), result: await probeUpstream(upstream, Math.min(config.connectTimeoutMs, 1500)) };
    }
    // Without a majority of the sentinels the proxy keeps serving the master in use (it answers,
    // or the probe says it does not), and says that it could not confirm it.
    const agreement = sentinel?.agreement();
    if (agreement === undefined || agreement.majority) return lastProbe.result;
    return { ok: lastProbe.result.ok, detail: `${lastProbe.result.detail}; sentinel: ${agreement.detail}` };
  };
  // Sentinel, a cluster and the lock scan talk to Redis through ioredis, loaded only for them: it
  // and its dependencies are a fifth of a plain proxy's resident memory.
  const lockScan =
    config.lockScanIntervalMs === 0
      ? null
      : new (await import('./admin/lock-scan.js')).LockScanner({
          target: config.upstream,
          tls: config.upstreamTls,
          timeoutMs: config.connectTimeoutMs,
          intervalMs: config.lockScanIntervalMs,
          maxKeys: config.lockScanMaxKeys,
          budgetMs: config.lockScanBudgetMs,
          rules: () => rules.current,
          // Behind Sentinel its master, in a cluster a live master (any node lists them all).
          locate: locator === null ? undefined : () => locator.locate(),
          log,
        });
  let admin: AdminServer | null = null;
  // An admin socket systemd passed is used even with --admin-listen off: the operator set it up.
  const adminListen = sockets.admin ?? config.adminListen;
  if (adminListen !== null) {
    admin = await startAdminServer(adminListen, {
      registry: createMetricsRegistry(stats, {
        build: () => ({ version: packageVersion(), ruleReleases: releasesText(rules.current) }),
        rulesLoaded: () => rules.current.rules.length,
        ruleFiles: () => rules.current.files,
        clusterNodes: cluster === null ? undefined : () => cluster.nodes(),
        ready,
        lockScan: lockScan === null ? undefined : () => lockScan.latest,
        sentinelMajority: sentinel === null ? undefined : () => sentinel.agreement().majority,
      }),
      ready,
      rules: () =>
        rulesView(rules.current, rules.mode, packageVersion(), verifyRuns.instance, {
          setting: config.lockMethod,
          atStart: methodAtStart,
          upstreams: serverMethods.known(),
        }),
      verifyRuns,
      log,
      onRefused: (reason) => stats.adminConnectionRefused(reason),
    }).catch(async (err: Error) => {
      await Promise.all([seed.close(), cluster?.close(), sentinel?.close()]);
      if ('fd' in adminListen) throw new Error(`admin server on ${describeInherited(adminListen)}: ${err.message}`, { cause: err });
      const where = formatAddress(adminListen.host, adminListen.port);
      throw new Error(`admin-listen ${where}: ${err.message} (another port, or --admin-listen off)`, { cause: err });
    });
    if (sockets.admin !== null) logInheritedListener(log, 'admin-listen', sockets.admin, admin.address, config.adminListen);
  }
  if (config.watchRules) rules.watch();
  lockScan?.start();
  const report = (intervalMs: number) => (intervalMs === 0 ? () => {} : startAttemptReport(stats, log, intervalMs));
  let stopReport = report(config.lockAttemptReportMs);

  /** Reads the configuration again and applies what can change while running (see RELOADABLE). */
  const reconfigure = (trigger: string, read: () => Config): void => {
    let next: Config;
    try {
      next = read();
    } catch (err) {
      stats.ruleReloadFailures++;
      log.error({ trigger, err: (err as Error).message }, 'configuration reload refused; the settings and rules in force stay');
      return;
    }
    const changed = changedSettings(config.given, next.given);
    if (!rules.reload(trigger, { paths: next.rulePaths, release: next.release, mode: next.mode })) return;
    logOverridden(log, next, trigger);
    const needRestart = changed.filter((name) => !RELOADABLE.includes(name));
    const applied = changed.filter((name) => RELOADABLE.includes(name));
    if (next.watchRules !== rules.watched) {
      if (next.watchRules) rules.watch();
      else rules.unwatch();
    }
    if (next.lockAttemptReportMs !== config.lockAttemptReportMs) {
      stopReport();
      stopReport = report(next.lockAttemptReportMs);
    }
    // The RELOADABLE settings take their new values; the others keep those the proxy runs with
    // (and a next reload names them again while they differ).
    config = {
      ...config,
      rulePaths: next.rulePaths,
      release: next.release,
      mode: next.mode,
      holdMs: next.holdMs,
      watchRules: next.watchRules,
      lockAttemptReportMs: next.lockAttemptReportMs,
      shutdownTimeoutMs: next.shutdownTimeoutMs,
      given: { ...config.given, ...Object.fromEntries(applied.map((name) => [name, next.given[name]])) },
    };
    if (applied.length > 0)
      log.info({ trigger, settings: Object.fromEntries(applied.map((n) => [n, next.given[n]])) }, 'settings reloaded');
    if (needRestart.length > 0) {
      log.warn({ trigger, settings: needRestart }, 'settings changed that apply only when the proxy is restarted; the running values stay');
    }
  };

  const stopRest = async (): Promise<void> => {
    rules.close();
    refusals.close();
    stopReport(); // the one running now
    await Promise.all([admin?.close(), sentinel?.close(), lockScan?.stop()]);
  };
  return {
    address: seed.address,
    adminAddress: admin?.address ?? null,
    rules,
    stats,
    lockScan,
    cluster,
    get sessionCount() {
      return seed.sessionCount + (cluster?.sessionCount ?? 0);
    },
    get config() {
      return config;
    },
    describe: () => ({
      ...describeApp(config, seed, cluster, upstream, admin, rules),
      lockMethod: config.lockMethod,
      lockWay: methodAtStart,
    }),
    reload(trigger: string, read?: () => Config) {
      if (read === undefined) rules.reload(trigger);
      else reconfigure(trigger, read);
    },
    probeUpstream: () => probeUpstream(upstream, Math.min(config.connectTimeoutMs, 1500)),
    async shutdown(timeoutMs: number) {
      shuttingDown = true;
      const counts = addShutdownCounts(await Promise.all([seed.shutdown(timeoutMs), cluster?.shutdown(timeoutMs)]));
      await stopRest();
      return counts;
    },
    async close() {
      await Promise.all([seed.close(), cluster?.close()]);
      await stopRest();
    },
  };
}

/**
 * Says that a socket systemd passed stands in for a listen setting: the setting's own address is
 * not listened on. A warning when the two differ, since the operator may expect either.
 */
function logInheritedListener(
  log: Logger,
  setting: 'listen' | 'admin-listen',
  socket: InheritedSocket,
  bound: Address,
  configured: Address | null,
): void {
  const listening = formatAddress(bound.host, bound.port);
  const notUsed = configured === null ? 'off' : formatAddress(configured.host, configured.port);
  const differs = configured === null || notUsed !== listening;
  log[differs ? 'warn' : 'info'](
    { [setting]: notUsed, listening, socket: describeInherited(socket) },
    `listening on the socket systemd passed (LISTEN_FDS); the ${setting} setting is not used`,
  );
}

async function startSentinel(config: Config, log: Logger): Promise<SentinelMonitor | null> {
  if (config.sentinel === null) return null;
  const { SentinelMonitor } = await import('./upstream/sentinel.js');
  return SentinelMonitor.start({
    sentinels: [...config.sentinel.sentinels],
    masterName: config.sentinel.masterName,
    username: config.sentinel.username,
    password: config.sentinel.password,
    log,
  });
}

async function startCluster(
  config: Config,
  contextFor: (upstream: UpstreamConnector, nodes: NodeDirectory) => ProxyContext,
  log: Logger,
  stats: Stats,
): Promise<ClusterManager> {
  const cluster = config.cluster as NonNullable<Config['cluster']>;
  const { ClusterManager } = await import('./cluster/manager.js');
  return ClusterManager.start({
    seeds: cluster.seeds,
    upstreamTls: config.upstreamTls,
    listenHost: config.listen.host,
    reservedPorts: config.listen.port === 0 ? [] : [config.listen.port],
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

/**
 * Asks the upstream its version (HELLO, changing nothing) where lock blocks may take the
 * transaction way, and says which way they take and why; the version is kept for the address.
 * @throws ConfigError for --lock-method transaction on a server without EXPIRE ... NX.
 */
async function lockMethodAtStart(config: Config, upstream: UpstreamConnector, methods: ServerMethods, log: Logger): Promise<MethodChoice> {
  if (config.lockMethod === 'script') return chooseMethod('script', null, upstream.describe());
  const answer = await askHello(upstream, HELLO, Math.min(config.connectTimeoutMs, 1500));
  const version = answer === null ? null : methodFromHello(answer.reply);
  if (answer !== null && version?.method && methods.learnt(answer.address, version.method, version.detail, version.hasReset)) {
    log.debug(
      { upstream: answer.address, server: version.detail, method: version.method, asked: 'start' },
      'lock method chosen from the server version',
    );
  }
  return chooseMethod(config.lockMethod, version, upstream.describe());
}

function describeApp(
  config: Config,
  seed: ProxyServer,
  cluster: ClusterManager | null,
  upstream: UpstreamConnector,
  admin: AdminServer | null,
  rules: RuleStore,
): Record<string, unknown> {
  const byMode = { enforce: 0, observe: 0 };
  for (const rule of rules.current.rules) byMode[effectiveMode(rule, rules.mode)]++;
  return {
    listen: formatAddress(seed.address.host, seed.address.port),
    ...(cluster === null ? {} : { clusterNodes: cluster.nodes().map((node) => `${node.address} (${node.role}) on ${node.listenPort}`) }),
    tls: config.listenerTls !== null,
    upstream: upstream.describe(),
    admin: admin === null ? 'off' : formatAddress(admin.address.host, admin.address.port),
    mode: rules.mode,
    ...describeRules(rules.current, rules.mode),
    enforce: byMode.enforce,
    observe: byMode.observe,
    version: packageVersion(),
  };
}

/**
 * Says which source won where the config file gives a setting that a flag or a variable gives
 * otherwise: an operator who edits the file and reloads must not take the flag's value for the
 * file's. At start as information, on a reload as a warning.
 */
function logOverridden(log: Logger, config: Config, trigger: string | undefined): void {
  const overridden = overriddenFileSettings(config.given);
  if (overridden.length === 0) return;
  const shown = (name: OptionName, value: unknown) => ((OPTIONS[name] as OptionSpec).secret ? '***' : value);
  const settings = Object.fromEntries(
    overridden.map((o) => [o.name, { inForce: shown(o.name, o.value), from: o.by, notApplied: shown(o.name, o.fileValue), in: o.file }]),
  );
  const message = 'config file settings overridden by flags or environment variables: their values in the file do not apply';
  if (trigger === undefined) log.info({ settings }, message);
  else log.warn({ trigger, settings }, message);
}

let version: string | undefined;

/** The package's version (read once: build_info asks at every scrape). */
export function packageVersion(): string {
  version ??= (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version;
  return version;
}
