/**
 * Flow control between a client and its upstream connection: a side that cannot take more pauses
 * the side that feeds it; the client is paused too while its bytes must wait (a command of the
 * proxy's own in flight, Redis's close after QUIT); reading from Redis pauses while replies wait
 * behind a line (--cluster). No bound blames Redis while the proxy itself does not read.
 */
import type net from 'node:net';

export class FlowControl {
  /** The client's socket took more than it could send on. */
  clientFull = false;
  /** The upstream socket took more than it could send on. */
  upstreamFull = false;
  /** Replies wait behind a redirect line (with --cluster): reading from Redis pauses. */
  repliesHeld = false;
  /** Reading from Redis is paused (the client is slow to read, or replies wait behind a line). */
  upstreamPaused = false;

  /** `changed`: a socket became full (the session updates the flow); `readsPaused`: told when reading from Redis pauses or goes on. */
  constructor(
    private readonly client: net.Socket,
    private readonly upstream: net.Socket,
    private readonly changed: () => void,
    private readonly readsPaused: (paused: boolean) => void,
  ) {}

  /** Writes `bytes` to the client; a full socket pauses reading from Redis. */
  toClient(bytes: Buffer): void {
    if (!this.client.write(bytes)) {
      this.clientFull = true;
      this.changed();
    }
  }

  /** Writes `bytes` to Redis; a full socket pauses reading from the client. */
  toUpstream(bytes: Buffer): void {
    if (!this.upstream.write(bytes)) {
      this.upstreamFull = true;
      this.changed();
    }
  }

  /** A side that was full took what was written: the other side may go on. */
  drained(side: 'client' | 'upstream'): void {
    if (side === 'client') this.clientFull = false;
    else this.upstreamFull = false;
    this.changed();
  }

  /**
   * Pauses or resumes each side. `clientWaits`: the client's bytes must wait; `closing`: nothing
   * more goes upstream, and what the client sends is read and dropped.
   */
  update(clientWaits: boolean, closing: boolean): void {
    if ((clientWaits || this.upstreamFull) && !closing) this.client.pause();
    else this.client.resume();
    const pause = this.clientFull || this.repliesHeld;
    if (pause) this.upstream.pause();
    else this.upstream.resume();
    if (pause !== this.upstreamPaused) {
      this.upstreamPaused = pause;
      this.readsPaused(pause);
    }
  }
}
