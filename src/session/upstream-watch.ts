/**
 * --upstream-timeout-ms: a connection whose Redis has sent nothing for that long while a reply
 * is due is closed, as HAProxy's `timeout server` or Envoy's `op_timeout` would: Redis, or the
 * network to it, has stalled, and the client should learn it rather than wait for ever. It is
 * "nothing for that long", not "one command for that long": a large reply that keeps coming, or
 * a deep pipeline Redis works through, is progress.
 *
 * It counts only time in which Redis alone owes a reply: a reply is due once its command is whole
 * and written upstream (not while the client is still sending it: the session's awaitingReply),
 * and the clock stops while the proxy does not read from Redis for the client's sake (a client
 * slow to read: pause), starting afresh when it reads again, as HAProxy's `timeout server` does
 * not run while its buffer is full.
 *
 * Replies that may legitimately take as long as other clients make them are exempt: while a
 * blocking command (BLPOP, XREAD, WAIT, ...) is unanswered, and on a connection whose replies
 * are not counted (subscriptions, MONITOR).
 *
 * One timer per connection, made on first use and re-armed (refresh) rather than made again, so
 * a request costs at most a re-arm; none at all with the setting off.
 */

/** What the watch needs of its session. */
export interface UpstreamWatchPort {
  /** A reply is due (its command whole and sent), counted (not a pipe), and the connection is not closing. */
  readonly awaitingReply: boolean;
  /** Redis sent nothing for `ms` while a reply was due. */
  upstreamSilent(ms: number): void;
  /** An exception in the timer: it ends the session, never the process. */
  fault(error: unknown): void;
}

export class UpstreamWatch {
  private timer: NodeJS.Timeout | undefined;
  private armed = false;
  /** A blocking command is unanswered: no timeout until every reply due is in. */
  private blocking = false;
  /** The proxy does not read from Redis for now: the clock does not run. */
  private paused = false;

  constructor(
    private readonly timeoutMs: number,
    private readonly port: UpstreamWatchPort,
  ) {}

  /** Requests went upstream: replies are due, and the clock runs if it does not. */
  sent(): void {
    if (this.armed || this.blocking) return;
    this.armed = true;
    if (this.timer === undefined) {
      this.timer = setTimeout(() => {
        try {
          this.fired();
        } catch (error) {
          this.port.fault(error);
        }
      }, this.timeoutMs);
      this.timer.unref();
    } else {
      this.timer.refresh();
    }
  }

  /** A blocking command went upstream. */
  blockingSent(): void {
    this.blocking = true;
  }

  /**
   * Bytes from Redis were handed on: progress. Once nothing is due any more, a blocking command
   * is answered too, and the clock stops: the next request starts it afresh, so its reply gets
   * the whole timeout and not what an earlier one left of it.
   */
  heard(): void {
    if (!this.port.awaitingReply) {
      this.blocking = false;
      this.armed = false;
    } else if (this.armed) {
      (this.timer as NodeJS.Timeout).refresh();
    }
  }

  /** Reading from Redis pauses for the client's sake (true), or goes on (false): the clock runs again from the start. */
  pause(paused: boolean): void {
    if (paused === this.paused) return;
    this.paused = paused;
    if (!paused && this.armed) (this.timer as NodeJS.Timeout).refresh();
  }

  /** The connection is closed. */
  stop(): void {
    clearTimeout(this.timer);
    this.armed = false;
  }

  private fired(): void {
    if (this.paused) return; // armed still: resuming starts the clock again
    this.armed = false;
    if (this.blocking || !this.port.awaitingReply) return;
    this.port.upstreamSilent(this.timeoutMs);
  }
}
