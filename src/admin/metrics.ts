/**
 * Prometheus view of `Stats`. Nothing here runs on the proxy's hot path: the
 * proxy only bumps plain numbers in `Stats`, and every metric below copies
 * them in its collect hook when /metrics is scraped.
 *
 * Totals kept outside prom-client are exposed as real counters (`# TYPE ...
 * counter`): collect() resets the counter and adds the current total, which
 * is synchronous, so two concurrent scrapes cannot interleave inside it.
 * The connect latency histogram comes from buckets counted in `Stats`, which
 * prom-client's Histogram cannot be loaded from, so it is a small collector
 * of its own that hands the registry ready-made cumulative samples.
 */
import { collectDefaultMetrics, Counter, Gauge, Registry, type Metric } from 'prom-client';
import { CONNECT_BUCKETS, type Stats } from '../stats.js';
import type { Readiness } from './server.js';
import type { LockScanState, RuleLockCounts } from './lock-scan.js';

const PREFIX = 'redis_lock_proxy_';

export interface MetricsOptions {
  /** The version and what the loaded rules are for; `build_info` is exposed only when given. */
  build?: () => { version: string; ruleReleases: string };
  /** Number of rules currently loaded; `rules_loaded` is exposed only when given. */
  rulesLoaded?: () => number;
  /** Rule files currently loaded; `rule_file_info{file}` is exposed only when given. */
  ruleFiles?: () => readonly string[];
  /** With --cluster: node listeners by role; the cluster metrics are exposed only when given. */
  clusterNodes?: () => ReadonlyArray<{ role: string | null; listening: boolean }>;
  /** Whether the proxy can serve, as /readyz says; `ready` is exposed only when given. */
  ready?: () => Promise<Readiness>;
  /** The lock scan's findings (--lock-scan-interval-ms); its metrics are exposed only when given. */
  lockScan?: () => LockScanState;
  /** With --sentinel: whether a majority of the sentinels named the master in use at the last poll. */
  sentinelMajority?: () => boolean;
}

/** A fresh registry (never the global one) with every proxy metric and the default process metrics. */
export function createMetricsRegistry(stats: Stats, opts: MetricsOptions = {}): Registry {
  const registry = new Registry();
  const registers = [registry];

  const gauge = (name: string, help: string, read: () => number): void => {
    new Gauge({
      name: PREFIX + name,
      help,
      registers,
      collect() {
        this.set(read());
      },
    });
  };

  const counter = (name: string, help: string, read: () => number): void => {
    new Counter({
      name: PREFIX + name,
      help,
      registers,
      collect() {
        this.reset();
        addTo(this, read());
      },
    });
  };

  /** A counter whose series are listed afresh at each scrape. */
  const labelledCounter = <L extends string>(
    name: string,
    help: string,
    labelNames: readonly L[],
    read: (emit: (labels: Record<L, string>, value: number) => void) => void,
  ): void => {
    new Counter<L>({
      name: PREFIX + name,
      help,
      labelNames,
      registers,
      collect() {
        this.reset();
        read((labels, value) => addTo(this, value, labels));
      },
    });
  };

  gauge('connections_open', 'Client connections currently open.', () => stats.connectionsOpen);
  counter('connections_total', 'Client connections accepted.', () => stats.connectionsTotal);
  counter(
    'connections_rejected_total',
    'Client connections refused at accept time because of --max-connections.',
    () => stats.connectionsRejected,
  );
  counter('commands_forwarded_total', 'Commands forwarded upstream as the client sent them.', () => stats.commandsForwarded);
  counter('client_bytes_received_total', 'Bytes read from clients.', () => stats.bytesFromClients);
  counter('upstream_bytes_received_total', 'Bytes read from the upstream Redis.', () => stats.bytesFromUpstream);
  counter('upstream_connect_failures_total', 'Upstream connection attempts that failed.', () => stats.upstreamConnectFailures);
  registerMetric(
    registry,
    new StatsHistogram(PREFIX + 'upstream_connect_seconds', 'Time to connect to the upstream Redis, in seconds.', stats),
  );

  labelledCounter(
    'blocks_total',
    'Lock blocks that matched a rule (seen), sent with the fix (rewritten), forwarded unchanged in observe mode (observed), or whose connection was closed before their replies came (closed: the lock script outcome unknown, or a bound closed it).',
    ['rule', 'outcome'],
    (emit) => {
      for (const [rule, counts] of stats.byRule) {
        emit({ rule, outcome: 'seen' }, counts.seen);
        emit({ rule, outcome: 'rewritten' }, counts.rewritten);
        emit({ rule, outcome: 'observed' }, counts.observed);
        emit({ rule, outcome: 'closed' }, counts.closed);
      }
    },
  );
  labelledCounter(
    'blocks_rewritten_total',
    "Lock blocks sent with the fix, by way: transaction (NX added to the EXPIRE inside the client's own transaction), transaction-script (the EXPIRE as a conditional-expiry script inside the client's own transaction, servers without NX), script (the whole block as one Lua script).",
    ['method'],
    (emit) => {
      emit({ method: 'transaction' }, stats.rewrittenBy.transaction);
      emit({ method: 'transaction-script' }, stats.rewrittenBy['transaction-script']);
      emit({ method: 'script' }, stats.rewrittenBy.script);
    },
  );
  labelledCounter(
    'verify_blocks_total',
    "Lock blocks of `redis-lock-proxy verify`'s own connections (named redis-lock-proxy-verify), counted apart from blocks_total and lock_attempts_total.",
    ['rule', 'outcome'],
    (emit) => {
      for (const [rule, counts] of stats.verify.byRule) {
        emit({ rule, outcome: 'seen' }, counts.seen);
        emit({ rule, outcome: 'rewritten' }, counts.rewritten);
        emit({ rule, outcome: 'observed' }, counts.observed);
        emit({ rule, outcome: 'closed' }, counts.closed);
      }
    },
  );
  labelledCounter(
    'block_fallbacks_total',
    'Lock blocks whose script wrote nothing (it was refused, or Redis did not run it) and that were sent unchanged, by error prefix.',
    ['rule', 'reason'],
    (emit) => {
      for (const [rule, counts] of stats.byRule) {
        for (const [reason, value] of counts.fallbacks) emit({ rule, reason }, value);
      }
    },
  );
  labelledCounter(
    'block_releases_total',
    'Held MULTI blocks released unchanged before they could match, by reason.',
    ['reason'],
    (emit) => {
      for (const [reason, value] of stats.releases) emit({ reason }, value);
    },
  );
  labelledCounter(
    'blocks_unfixed_total',
    "Lock blocks on an enforcing rule's keys that ran unchanged, so that their lock was re-armed, by reason: hold-timeout (the script way's frames came further apart than --hold-ms), not-a-lock-block (another command broke a held block), not-first (Redis 6: the pair came after other commands of its transaction), eval-refused (Redis 6: the user may not run EVAL), pttl-refused (Redis 6: the user may not run PTTL), version-unknown (the server's version was not known yet), split-frame.",
    ['rule', 'reason'],
    (emit) => {
      for (const [rule, counts] of stats.byRule) {
        for (const [reason, value] of counts.unfixed) emit({ rule, reason }, value);
      }
    },
  );
  counter(
    'upstream_timeouts_total',
    'Client connections closed because Redis sent nothing for --upstream-timeout-ms while a reply was due.',
    () => stats.upstreamTimeouts,
  );
  counter(
    'upstream_not_resp_total',
    'Client connections refused because what the upstream sent first was not RESP (not a Redis).',
    () => stats.upstreamNotResp,
  );
  counter(
    'session_faults_total',
    'Client connections closed, as a network failure would close them, because of a fault on their data path (an exception: a reply or request the proxy could not handle). The process and every other connection go on; the log line has the cause.',
    () => stats.sessionFaults,
  );
  counter(
    'own_replies_timed_out_total',
    "Connections closed because Redis did not answer a command of the proxy's own within --own-reply-timeout-ms.",
    () => stats.ownRepliesTimedOut,
  );
  labelledCounter(
    'admin_connections_refused_total',
    'Admin HTTP connections closed as they came: over the connection cap (connections), or to keep file descriptors for clients (file-descriptors).',
    ['reason'],
    (emit) => {
      for (const reason of ['connections', 'file-descriptors']) emit({ reason }, stats.adminRefusals.get(reason) ?? 0);
    },
  );
  counter('script_reloads_total', 'Times the script was missing from the script cache and was sent in full.', () => stats.scriptReloads);
  labelledCounter('rule_reloads_total', 'Rule reloads, by result.', ['result'], (emit) => {
    emit({ result: 'ok' }, stats.ruleReloads);
    emit({ result: 'failed' }, stats.ruleReloadFailures);
  });
  labelledCounter(
    'lock_attempts_total',
    "Lock attempts by shape: incrby-expire (MULTI/INCRBY/EXPIRE/EXEC, affected releases), set-nx (SET NX EX, fixed ones), on the keys of a loaded rule or of any shipped release line's rule, whatever is rewritten.",
    ['rule', 'shape'],
    (emit) => {
      for (const [rule, counts] of stats.attempts) {
        emit({ rule, shape: 'incrby-expire' }, counts.oldShape);
        emit({ rule, shape: 'set-nx' }, counts.fixedShape);
      }
    },
  );
  labelledCounter(
    'lock_shaped_unmatched_total',
    'Lock-shaped traffic no rule covers: whole MULTI/INCR|INCRBY/EXPIRE|PEXPIRE/EXEC blocks on one key that no loaded rule names, sent unchanged, by key prefix (a text prefix up to its ":", else the first byte in hex; at most 64 prefixes, then "other").',
    ['prefix'],
    (emit) => {
      for (const [prefix, value] of stats.uncovered) emit({ prefix }, value);
    },
  );

  const { build } = opts;
  if (build !== undefined) {
    new Gauge({
      name: PREFIX + 'build_info',
      help: 'The running build (always 1): its version, the Node.js version, and the releases the loaded rules are for.',
      labelNames: ['version', 'node_version', 'rule_releases'],
      registers,
      collect() {
        this.reset();
        const info = build();
        this.set({ version: info.version, node_version: process.version, rule_releases: info.ruleReleases }, 1);
      },
    });
  }

  const { ready, lockScan } = opts;
  if (ready !== undefined) {
    new Gauge({
      name: PREFIX + 'ready',
      help: 'Whether the proxy can serve (1) or not (0), as /readyz answers: rules loaded, and the upstream answers PING.',
      registers,
      async collect() {
        this.set((await ready()).ok ? 1 : 0);
      },
    });
  }
  if (lockScan !== undefined) {
    // The lock scan's findings per rule, and its own health.
    const perRule = (name: string, help: string, read: (counts: RuleLockCounts) => number) => {
      new Gauge({
        name: PREFIX + name,
        help,
        labelNames: ['rule'],
        registers,
        collect() {
          this.reset();
          for (const [rule, counts] of lockScan().byRule) this.set({ rule }, read(counts));
        },
      });
    };
    perRule('lock_keys', 'Lock keys in Redis that the rule names, at the last lock scan.', (c) => c.keys);
    perRule(
      'lock_keys_without_expiry',
      'Of those, the abandoned ones: without an expiry, they never go away by themselves (locks --release-abandoned deletes them).',
      (c) => c.abandoned,
    );
    perRule(
      'lock_keys_rearmed',
      'Of those, the ones re-armed since the scan before: their expiry went up while their counter did (or a SET NX lock outlived its deadline). Through the proxy that never happens: traffic bypasses the proxy, or a proxy observes only.',
      (c) => c.rearmed,
    );
    labelledCounter('lock_scans_total', 'Lock scans, by result.', ['result'], (emit) => {
      emit({ result: 'ok' }, lockScan().scans);
      emit({ result: 'failed' }, lockScan().failures);
    });
    gauge(
      'lock_scan_truncated',
      'Whether the last lock scan stopped early, at --lock-scan-max-keys or --lock-scan-budget-ms (1), or went through the whole keyspace (0).',
      () => (lockScan().stoppedEarly === undefined ? 0 : 1),
    );
    gauge('lock_scan_duration_seconds', 'How long the last successful lock scan took, in seconds.', () => lockScan().lastDurationSeconds);
    gauge(
      'lock_scan_last_success_timestamp_seconds',
      'When the last lock scan succeeded (Unix seconds; 0: none yet).',
      () => lockScan().lastSuccess,
    );
  }

  const { sentinelMajority } = opts;
  if (sentinelMajority !== undefined) {
    gauge(
      'sentinel_majority',
      'With --sentinel: whether a majority of the configured sentinels named the master in use at the last poll (1), or not (0: the proxy keeps that master, unconfirmed).',
      () => (sentinelMajority() ? 1 : 0),
    );
  }

  const { rulesLoaded, ruleFiles, clusterNodes } = opts;
  if (clusterNodes !== undefined) {
    new Gauge({
      name: PREFIX + 'cluster_nodes',
      help: 'Cluster nodes the proxy listens for, by role and whether the listener is bound.',
      labelNames: ['role', 'listening'],
      registers,
      collect() {
        this.reset();
        for (const node of clusterNodes()) this.inc({ role: node.role ?? 'unknown', listening: String(node.listening) });
      },
    });
    counter('cluster_redirects_rewritten_total', 'MOVED and ASK replies whose node address was rewritten.', () => stats.redirectsRewritten);
    counter(
      'cluster_topology_replies_rewritten_total',
      'CLUSTER SLOTS, SHARDS, NODES and REPLICAS replies whose node addresses were rewritten.',
      () => stats.topologyRepliesRewritten,
    );
    labelledCounter('cluster_topology_refreshes_total', 'Cluster topology refreshes, by result.', ['result'], (emit) => {
      emit({ result: 'ok' }, stats.clusterRefreshes);
      emit({ result: 'failed' }, stats.clusterRefreshFailures);
    });
    counter(
      'cluster_views_set_aside_total',
      "Nodes' views of the cluster not believed: they serve too few slots, and most nodes asked do not share them.",
      () => stats.clusterViewsSetAside,
    );
    labelledCounter(
      'cluster_unknown_nodes_total',
      'Node addresses in replies that the topology does not have, passed on as Redis wrote them, by where.',
      ['in'],
      (emit) => {
        emit({ in: 'redirect' }, stats.unknownNodesInRedirects);
        emit({ in: 'topology' }, stats.unknownNodesInTopology);
      },
    );
  }
  if (rulesLoaded !== undefined) gauge('rules_loaded', 'Rules currently loaded.', rulesLoaded);
  if (ruleFiles !== undefined) {
    new Gauge({
      name: PREFIX + 'rule_file_info',
      help: 'Rule files currently loaded (always 1).',
      labelNames: ['file'],
      registers,
      collect() {
        this.reset();
        for (const file of ruleFiles()) this.set({ file }, 1);
      },
    });
  }

  collectDefaultMetrics({ register: registry, prefix: PREFIX });
  return registry;
}

/** Adds a non-negative finite total to a freshly reset counter; anything else is left out. */
function addTo<L extends string>(metric: Counter<L>, value: number, labels?: Record<L, string>): void {
  // A counter cannot go down, and prom-client throws on NaN/Infinity: a bad
  // total would break the whole scrape, so it is dropped instead. Zero is
  // still added so that labelled series show up from their first scrape.
  if (!(value >= 0 && Number.isFinite(value))) return;
  if (labels === undefined) metric.inc(value);
  else metric.inc(labels, value);
}

/** A sample as the registry reads it from `get()`; `metricName` overrides the metric's own name. */
interface Sample {
  metricName: string;
  labels: Record<string, string | number>;
  value: number;
}

/**
 * A histogram whose buckets are counted in `Stats` (per bucket, not
 * cumulative, one more than CONNECT_BUCKETS for the overflow). It has the
 * members the registry uses (name, help, type, aggregator, get, reset) and
 * produces `_bucket{le}` (cumulative, ending with +Inf), `_sum` and `_count`.
 */
class StatsHistogram {
  readonly type = 'histogram';
  readonly aggregator = 'sum';

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly stats: Stats,
  ) {}

  async get(): Promise<{ name: string; help: string; type: string; aggregator: string; values: Sample[] }> {
    const { connectBuckets, connectSecondsSum, connectCount } = this.stats;
    const values: Sample[] = [];
    let cumulative = 0;
    CONNECT_BUCKETS.forEach((le, i) => {
      cumulative += connectBuckets[i];
      values.push({ metricName: `${this.name}_bucket`, labels: { le }, value: cumulative });
    });
    cumulative += connectBuckets[CONNECT_BUCKETS.length];
    values.push({ metricName: `${this.name}_bucket`, labels: { le: '+Inf' }, value: cumulative });
    values.push({ metricName: `${this.name}_sum`, labels: {}, value: connectSecondsSum });
    values.push({ metricName: `${this.name}_count`, labels: {}, value: connectCount });
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  /** Registry.resetMetrics() calls this; the counts belong to Stats, so there is nothing to reset. */
  reset(): void {}
}

/**
 * prom-client types `registerMetric` as taking one of its own metric classes,
 * but the registry only reads the members StatsHistogram has (and its
 * declared `type` is a numeric enum while the runtime, which prints it after
 * `# TYPE`, uses strings), hence the cast.
 */
function registerMetric(registry: Registry, metric: StatsHistogram): void {
  registry.registerMetric(metric as unknown as Metric);
}
