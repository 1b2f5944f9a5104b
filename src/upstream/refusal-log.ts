/**
 * While the upstream is down, every client connection is refused (each client gets an error
 * naming the upstream). Logging each one would flood the journal during a failover (thousands
 * of lines a second as pools reconnect), so the first refusal is logged at once, and those that
 * follow are counted and logged as one line per period, with the count and the errors.
 */
import type { Logger } from '../log.js';

/** How often a summary line of further refusals is logged while they go on. */
export const REFUSAL_SUMMARY_MS = 10_000;

interface Period {
  upstream: string;
  /** What the refusals are about: the first one's. */
  message: string;
  refused: number;
  /** Refusals by error text. */
  errors: Map<string, number>;
}

export class RefusalLog {
  /** The period being counted, or null when the last refusal is older than a period. */
  private period: Period | null = null;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly log: Logger,
    private readonly periodMs = REFUSAL_SUMMARY_MS,
  ) {}

  /**
   * A client connection was refused: `upstream` (as shown in logs) could not serve it at
   * `address`, by default because it could not be reached.
   */
  refused(upstream: string, address: string, error: string, message = 'upstream unreachable'): void {
    if (this.period === null) {
      this.log.warn({ upstream, address, err: error }, message);
      this.startPeriod(upstream, message);
      return;
    }
    this.period.refused++;
    this.period.errors.set(error, (this.period.errors.get(error) ?? 0) + 1);
  }

  close(): void {
    clearTimeout(this.timer);
    this.period = null;
  }

  private startPeriod(upstream: string, message: string): void {
    this.period = { upstream, message, refused: 0, errors: new Map() };
    this.timer = setTimeout(() => this.endPeriod(), this.periodMs);
    this.timer.unref();
  }

  private endPeriod(): void {
    const period = this.period as Period;
    this.period = null;
    if (period.refused === 0) return; // quiet: the next refusal is logged at once
    this.log.warn(
      { upstream: period.upstream, refused: period.refused, periodMs: this.periodMs, errors: Object.fromEntries(period.errors) },
      `${period.message}: more client connections refused`,
    );
    this.startPeriod(period.upstream, period.message); // still refusing: one line per period
  }
}
