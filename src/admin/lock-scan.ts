/**
 * The lock scan (--lock-scan-interval-ms, off by default): every interval the proxy reads the
 * lock keys its rules name, as `locks` does (one SCAN pass, never KEYS; every master of a
 * cluster; the master of the moment behind Sentinel), within --lock-scan-max-keys keys and
 * --lock-scan-budget-ms, and keeps per rule how many there are, how many are abandoned (no
 * expiry: they never go away) and how many were re-armed since the scan before (their expiry
 * went up with their counter: traffic that bypasses the proxy), for /metrics. So an alert can
 * fire before a user notices a stuck task.
 *
 * One scan at a time: the next starts an interval after the last ended, so a slow Redis is
 * never asked twice at once.
 */
import type { UpstreamTls } from '../config.js';
import type { Logger } from '../log.js';
import { openLockNodes } from '../lock-keys/nodes.js';
import { forEachRowBatch } from '../lock-keys/pass.js';
import { compareReads, type ReadSample } from '../lock-keys/read.js';
import type { StopReason } from '../lock-keys/scan.js';
import type { RuleSet } from '../rules/types.js';
import type { UpstreamTarget } from '../upstream/target.js';

/** SCAN COUNT hint per call: large pages, few round trips, each call short. */
const SCAN_COUNT = 1000;

export interface RuleLockCounts {
  keys: number;
  /** No expiry: they never go away by themselves. */
  abandoned: number;
  /** Re-armed since the scan before: their expiry went up while their counter did. */
  rearmed: number;
}

/** What the last scans found, for the metrics. */
export interface LockScanState {
  /** Per rule loaded at the last successful scan (rules without keys at zero). */
  readonly byRule: ReadonlyMap<string, RuleLockCounts>;
  readonly scans: number;
  readonly failures: number;
  /** Why the last successful scan stopped before it had gone through the keyspace; undefined: it did not. */
  readonly stoppedEarly: StopReason | undefined;
  /** Unix seconds of the last successful scan; 0 before the first. */
  readonly lastSuccess: number;
  /** How long the last successful scan took, in seconds. */
  readonly lastDurationSeconds: number;
}

export interface LockScanOptions {
  readonly target: UpstreamTarget;
  readonly tls: UpstreamTls | null;
  readonly timeoutMs: number;
  readonly intervalMs: number;
  readonly maxKeys: number;
  /** How long one scan may take; what it found by then counts, and it says it stopped early. */
  readonly budgetMs: number;
  readonly rules: () => RuleSet;
  /** Where the upstream is now, when that changes (Sentinel's master, a live cluster master); undefined: the target's own address. */
  readonly locate?: () => { host: string; port: number } | undefined;
  readonly log: Logger;
}

export class LockScanner {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private current: Promise<void> | undefined;
  private state: LockScanState = {
    byRule: new Map(),
    scans: 0,
    failures: 0,
    stoppedEarly: undefined,
    lastSuccess: 0,
    lastDurationSeconds: 0,
  };
  /** Each lock key's value and expiry at the last scan, by node and key, for re-arms seen at the next. */
  private previous = new Map<string, ReadSample>();

  constructor(private readonly options: LockScanOptions) {}

  get latest(): LockScanState {
    return this.state;
  }

  /** The first scan right away, then one an interval after each. */
  start(): void {
    this.schedule(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.current;
  }

  /** One scan now (also what the timer runs). */
  async scanOnce(): Promise<void> {
    const { options } = this;
    const rules = options.rules();
    const started = Date.now();
    let nodes;
    try {
      nodes = await openLockNodes(options.target, options.tls, options.timeoutMs, options.locate?.());
      const byRule = new Map(rules.rules.map((rule) => [rule.name, { keys: 0, abandoned: 0, rearmed: 0 }]));
      const samples = new Map<string, ReadSample>();
      const limits = { count: SCAN_COUNT, maxKeys: options.maxKeys, deadline: started + options.budgetMs };
      const end = await forEachRowBatch(nodes.nodes, rules, limits, (rows) => {
        for (const read of rows) {
          const id = `${read.node} ${read.key.toString('latin1')}`;
          const earlier = this.previous.get(id);
          const row = earlier === undefined ? read : compareReads(earlier, read);
          samples.set(id, { counter: row.counter, deadline: row.deadline, expiresAt: row.expiresAt });
          const counts = byRule.get(row.rule) ?? { keys: 0, abandoned: 0, rearmed: 0 };
          counts.keys++;
          if (row.abandoned) counts.abandoned++;
          if (row.rearmed !== undefined) counts.rearmed++;
          byRule.set(row.rule, counts);
        }
      });
      this.previous = samples;
      this.reportStop(end.stoppedEarly, end.keys);
      this.state = {
        byRule,
        scans: this.state.scans + 1,
        failures: this.state.failures,
        stoppedEarly: end.stoppedEarly,
        lastSuccess: Math.floor(Date.now() / 1000),
        lastDurationSeconds: (Date.now() - started) / 1000,
      };
    } catch (error) {
      this.state = { ...this.state, failures: this.state.failures + 1 };
      options.log.warn({ err: (error as Error).message, upstream: options.target.display }, 'lock scan failed');
    } finally {
      nodes?.close();
    }
  }

  /** Logs when scans start stopping early (and why), and when they go through the keyspace again. */
  private reportStop(reason: StopReason | undefined, keys: number): void {
    if (reason === this.state.stoppedEarly) return;
    const { log, maxKeys, budgetMs } = this.options;
    if (reason === undefined) log.info({ keys }, 'lock scan goes through the whole keyspace again');
    else {
      const limit = reason === 'max-keys' ? `--lock-scan-max-keys ${maxKeys}` : `--lock-scan-budget-ms ${budgetMs}`;
      log.warn({ reason, keys, limit }, 'lock scan stopped early; the lock-key gauges count only the keys it read');
    }
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.current = this.scanOnce().finally(() => this.schedule(this.options.intervalMs));
    }, delayMs);
    this.timer.unref();
  }
}
