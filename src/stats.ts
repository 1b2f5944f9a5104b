/**
 * Process-wide counters. The hot path only increments plain numbers here;
 * the admin server reads them when /metrics is scraped (src/admin/metrics.ts),
 * so no metrics library work happens per frame.
 */

/** What happened to lock blocks matched by one rule. */
export class RuleCounters {
  /** Blocks that matched the rule, whatever happened to them next. */
  seen = 0;
  /** Blocks sent with the fix: inside the client's transaction (NX, or the expiry script), or as the script. */
  rewritten = 0;
  /** Blocks forwarded unchanged because the rule (or the whole proxy) is in observe mode. */
  observed = 0;
  /** Blocks whose script could not run and were sent unchanged, by error prefix (NOPERM, BUSY, ...). */
  readonly fallbacks = new Map<string, number>();
  /** Blocks whose connection was closed before their replies came (the script's outcome unknown, or a bound). */
  closed = 0;
  /**
   * Blocks on the rule's keys that ran unchanged although the rule enforces, by reason
   * (lock/streamed-blocks.ts UnfixedReason): the lock was re-armed.
   */
  readonly unfixed = new Map<string, number>();
}

/**
 * Lock attempts on one rule's keys, by shape. The rule is a loaded one, or else the shipped rule of
 * whichever Stalwart release line names the key (lock/attempt-census.ts): what is counted does not
 * depend on what is rewritten.
 */
export class AttemptCounts {
  /** MULTI / INCR[BY] / [P]EXPIRE / EXEC: the affected releases. */
  oldShape = 0;
  /** SET key value NX EX|PX n: Stalwart 0.16.16 and later. */
  fixedShape = 0;
}

/** Key prefixes counted apart in `uncovered`; later ones are counted together as OTHER_PREFIX. */
export const MAX_UNCOVERED_PREFIXES = 64;
export const OTHER_PREFIX = 'other';

/** Upper bounds (seconds) of the upstream connect latency buckets. */
export const CONNECT_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5] as const;

export class Stats {
  connectionsOpen = 0;
  connectionsTotal = 0;
  /** Connections refused at accept time because of --max-connections. */
  connectionsRejected = 0;
  /** Frames (commands) forwarded upstream as the client sent them. */
  commandsForwarded = 0;
  /** Bytes read from clients and from the upstream. */
  bytesFromClients = 0;
  bytesFromUpstream = 0;
  upstreamConnectFailures = 0;
  /** Upstream connect latency: count per bucket of CONNECT_BUCKETS (not cumulative), sum and count. */
  readonly connectBuckets = new Array<number>(CONNECT_BUCKETS.length + 1).fill(0);
  connectSecondsSum = 0;
  connectCount = 0;
  /** Lock blocks that matched a rule, whatever happened to them next. */
  blocksSeen = 0;
  /** Blocks sent with the fix (either way). */
  blocksRewritten = 0;
  /** Blocks sent with the fix, by the way they were sent (lock/lock-method.ts LockMethod). */
  readonly rewrittenBy = { transaction: 0, 'transaction-script': 0, script: 0 };
  /** Blocks whose connection was closed before their replies came: the script's outcome unknown, or a bound. */
  blocksClosed = 0;
  /** Connections closed because a reply to a command of the proxy's own did not come within --own-reply-timeout-ms. */
  ownRepliesTimedOut = 0;
  /** Client connections closed because Redis sent nothing for --upstream-timeout-ms while a reply was due. */
  upstreamTimeouts = 0;
  /** Client connections refused because what the upstream sent first was not RESP. */
  upstreamNotResp = 0;
  /** Client connections closed by a fault on their data path (an exception), the process going on. */
  sessionFaults = 0;
  /** Blocks forwarded unchanged in observe mode. */
  blocksObserved = 0;
  /** Blocks whose script could not run, sent unchanged instead, by error prefix (NOPERM, BUSY, ...). */
  readonly fallbacks = new Map<string, number>();
  /** Held MULTI blocks released unchanged before they could match, by reason. */
  readonly releases = new Map<string, number>();
  /** Times the script was missing from the script cache and was sent in full. */
  scriptReloads = 0;
  /** Per-rule block counts, by rule name. */
  readonly byRule = new Map<string, RuleCounters>();
  /** Lock attempts by shape, per rule: a loaded rule, or a shipped release line's (see AttemptCounts). */
  readonly attempts = new Map<string, AttemptCounts>();
  /**
   * Whole lock-shaped blocks on keys that no loaded rule names, by key prefix (keyPrefixLabel):
   * at most MAX_UNCOVERED_PREFIXES prefixes, the rest under OTHER_PREFIX.
   */
  readonly uncovered = new Map<string, number>();
  /** With --cluster: -MOVED/-ASK replies whose node address was rewritten. */
  redirectsRewritten = 0;
  /** With --cluster: CLUSTER SLOTS/SHARDS/NODES/REPLICAS replies rewritten. */
  topologyRepliesRewritten = 0;
  /** With --cluster: topology refreshes that succeeded and that failed. */
  clusterRefreshes = 0;
  clusterRefreshFailures = 0;
  /** With --cluster: nodes' views of the cluster that were not believed (cluster/views.ts). */
  clusterViewsSetAside = 0;
  /** With --cluster: node addresses in redirects and in topology replies that the topology does not have (passed on as they are). */
  unknownNodesInRedirects = 0;
  unknownNodesInTopology = 0;
  /** Rule reloads that succeeded and that were refused. */
  ruleReloads = 0;
  ruleReloadFailures = 0;
  /** Admin connections closed as they came, by reason: the connection cap, or file descriptors kept for clients. */
  readonly adminRefusals = new Map<string, number>();
  private verifyStats: Stats | undefined;

  /**
   * The lock-block counters of `verify`'s own connections (verify-connection.ts), apart from the
   * application's: a readiness probe must not look like a node still taking locks the old way.
   */
  get verify(): Stats {
    this.verifyStats ??= new Stats();
    return this.verifyStats;
  }

  rule(name: string): RuleCounters {
    return entry(this.byRule, name, () => new RuleCounters());
  }

  blockSeen(rule: string): void {
    this.blocksSeen++;
    this.rule(rule).seen++;
    this.attempt(rule).oldShape++;
  }

  /** A lock attempt on the keys of `rule` (a loaded rule's or a shipped one's). */
  attempt(rule: string): AttemptCounts {
    return entry(this.attempts, rule, () => new AttemptCounts());
  }

  /** A whole lock-shaped block on a key no loaded rule names; `prefix` from keyPrefixLabel. */
  blockUncovered(prefix: string): void {
    const label = this.uncovered.has(prefix) || this.uncovered.size < MAX_UNCOVERED_PREFIXES ? prefix : OTHER_PREFIX;
    increment(this.uncovered, label);
  }

  blockRewritten(rule: string, method: keyof Stats['rewrittenBy']): void {
    this.blocksRewritten++;
    this.rewrittenBy[method]++;
    this.rule(rule).rewritten++;
  }

  blockClosed(rule: string): void {
    this.blocksClosed++;
    this.rule(rule).closed++;
  }

  blockObserved(rule: string): void {
    this.blocksObserved++;
    this.rule(rule).observed++;
  }

  blockFallback(rule: string, reason: string): void {
    increment(this.fallbacks, reason);
    increment(this.rule(rule).fallbacks, reason);
  }

  /**
   * A held MULTI went upstream unchanged. `rule`: the rule whose key the block's increment named,
   * when it got that far. At the hold deadline every frame held so far fitted the block (one that
   * did not would have released it at once), so such a release is a lock block the fix missed,
   * counted per rule; a MULTI typed by hand (redis-cli waits for its +OK) never names a rule.
   */
  countRelease(reason: string): void {
    increment(this.releases, reason);
  }

  /** A block on the keys of `rule`, which enforces, ran unchanged (`reason`: why). */
  blockUnfixed(rule: string, reason: string): void {
    increment(this.rule(rule).unfixed, reason);
  }

  adminConnectionRefused(reason: string): void {
    increment(this.adminRefusals, reason);
  }

  upstreamConnected(seconds: number): void {
    let bucket = 0;
    while (bucket < CONNECT_BUCKETS.length && seconds > CONNECT_BUCKETS[bucket]) bucket++;
    this.connectBuckets[bucket]++;
    this.connectSecondsSum += seconds;
    this.connectCount++;
  }
}

/** The map's value for `key`, made the first time. */
function entry<T>(map: Map<string, T>, key: string, make: () => T): T {
  let value = map.get(key);
  if (value === undefined) {
    value = make();
    map.set(key, value);
  }
  return value;
}

function increment(map: Map<string, number>, key: string): void {
  map.set(key, (map.get(key) ?? 0) + 1);
}
