/**
 * The bound on a reply of the proxy's own (--own-reply-timeout-ms): it measures Redis's silence
 * only. Bytes from Redis start it again (heard), and it does not run while the proxy does not
 * read from Redis (the reply stream stops it then, and starts it afresh after). When its timer
 * fires, the bound has passed only if Redis has been silent for all of it: bytes that came
 * meanwhile moved the start, and the timer waits for the rest. (Node also counts a timer from the
 * event loop's time at the start of the current iteration, so it may fire a little early.) A reply
 * is never given up on before a whole bound of silence.
 */

/** What the bound is for: `late` is told how long Redis was silent; `fault` gets an exception of it. */
export interface SilenceBoundPort<T> {
  late(what: T, waitedMs: number): void;
  fault(error: unknown): void;
}

export class SilenceBound<T> {
  /** What is timed now, if anything. */
  private timed: T | null = null;
  private timer: NodeJS.Timeout | undefined;
  /** When Redis last sent something, or the bound started: the silence it measures. */
  private started = 0;

  constructor(
    private readonly boundMs: number,
    private readonly port: SilenceBoundPort<T>,
  ) {}

  /** `what` is due now (null: nothing): the bound runs for it, unless it already does. */
  time(what: T | null): void {
    if (what === this.timed) return;
    this.stop();
    if (what === null) return;
    this.timed = what;
    this.started = performance.now();
    this.arm(this.boundMs);
  }

  /** Redis sent something: its silence starts again. */
  heard(): void {
    if (this.timed !== null) this.started = performance.now();
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.timed = null;
  }

  private arm(ms: number): void {
    this.timer = setTimeout(() => {
      const waited = performance.now() - this.started;
      if (waited < this.boundMs) return this.arm(Math.ceil(this.boundMs - waited));
      this.timer = undefined;
      try {
        this.port.late(this.timed as T, Math.round(waited));
      } catch (error) {
        this.port.fault(error);
      }
    }, ms);
    this.timer.unref();
  }
}
