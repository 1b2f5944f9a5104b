/**
 * The abandoned-lock scan (--lock-scan-interval-ms, off by default): every interval the proxy
 * reads the lock keys its rules name, as `locks` does (SCAN, never KEYS; every master of a
 * cluster; the master of the moment behind Sentinel), at most --lock-scan-max-keys of them,
 * and keeps per rule how many there are, how many look abandoned and how many have no expiry,
 * for /metrics. So an alert can fire before a user notices a stuck task.
 *
 * One scan at a time: the next starts an interval after the last ended, so a slow Redis is
 * never asked twice at once.
 */
import type { UpstreamTls } from '../config.js';
import type { Logger } from '../log.js';
import { openLockNodes } from '../lock-keys/nodes.js';
import { scanNodes } from '../lock-keys/read.js';
import type { RuleSet } from '../rules/types.js';
import type { UpstreamTarget } from '../upstream/target.js';

/** SCAN COUNT hint per call: large pages, few round trips. */
const SCAN_COUNT = 1000;

export interface RuleLockCounts {
  keys: number;
  abandoned: number;
  noExpiry: number;
}

/** What the last scans found, for the metrics. */
export interface LockScanState {
  /** Per rule loaded at the last successful scan (rules without keys at zero). */
  readonly byRule: ReadonlyMap<string, RuleLockCounts>;
  readonly scans: number;
  readonly failures: number;
  /** The last successful scan stopped at --lock-scan-max-keys. */
  readonly truncated: boolean;
  /** Unix seconds of the last successful scan; 0 before the first. */
  readonly lastSuccess: number;
}

export interface LockScanOptions {
  readonly target: UpstreamTarget;
  readonly tls: UpstreamTls | null;
  readonly timeoutMs: number;
  readonly intervalMs: number;
  readonly maxKeys: number;
  readonly rules: () => RuleSet;
  /** Where the upstream is now, when that changes (Sentinel's master, a live cluster master); undefined: the target's own address. */
  readonly locate?: () => { host: string; port: number } | undefined;
  readonly log: Logger;
}

export class LockScanner {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private current: Promise<void> | undefined;
  private state: LockScanState = { byRule: new Map(), scans: 0, failures: 0, truncated: false, lastSuccess: 0 };

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
    let nodes;
    try {
      nodes = await openLockNodes(options.target, options.tls, options.timeoutMs, options.locate?.());
      const byRule = new Map(rules.rules.map((rule) => [rule.name, { keys: 0, abandoned: 0, noExpiry: 0 }]));
      const { rows, truncated } = await scanNodes(nodes.nodes, rules, { count: SCAN_COUNT, maxKeys: options.maxKeys });
      for (const row of rows) {
        const counts = byRule.get(row.rule) ?? { keys: 0, abandoned: 0, noExpiry: 0 };
        counts.keys++;
        if (row.abandoned) counts.abandoned++;
        if (row.pttl === -1) counts.noExpiry++;
        byRule.set(row.rule, counts);
      }
      this.state = {
        byRule,
        scans: this.state.scans + 1,
        failures: this.state.failures,
        truncated,
        lastSuccess: Math.floor(Date.now() / 1000),
      };
    } catch (error) {
      this.state = { ...this.state, failures: this.state.failures + 1 };
      options.log.warn({ err: (error as Error).message, upstream: options.target.display }, 'lock scan failed');
    } finally {
      nodes?.close();
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
