/**
 * The end of a client's connection, closed the way Redis closes after its last reply, but so
 * that the client reads it: what was written goes out, then the end of the stream; meanwhile,
 * and until the client closes too, what it still sends is read and dropped (closing a socket with
 * unread bytes resets the connection, and a reset can cost the client the reply). A client that
 * has not taken everything within CLOSE_LINGER_MS, or not closed LINGER_AFTER_END_MS after it
 * did, is cut off.
 */
import type net from 'node:net';

/** How long a client may take to read what Redis sent last, once the connection is closing. */
const CLOSE_LINGER_MS = 10_000;
/** How long a client may go on sending after the end of the stream went out, before its connection is cut. */
const LINGER_AFTER_END_MS = 1_000;

export class ClientEnd {
  /**
   * The lingering close's deadline, and when it falls. It is cleared when the connection closes:
   * a timer's closure would keep the whole session (both sockets, the scanners, their buffers)
   * alive until it fires.
   */
  private cutOff: NodeJS.Timeout | undefined;
  private cutOffAt = Number.POSITIVE_INFINITY;

  /** `flush`: what is batched for the client goes out first. */
  constructor(
    private readonly client: net.Socket,
    private readonly flush: () => void,
  ) {}

  /** Ends the client's side, after `last` if given (a refusal's error line). */
  end(last?: string): void {
    if (this.client.writableEnded) return;
    this.flush();
    if (last !== undefined) this.client.write(last);
    this.client.end(() => this.cutOffWithin(LINGER_AFTER_END_MS));
    this.cutOffWithin(CLOSE_LINGER_MS);
  }

  /** The client closed: the lingering close is over. */
  stop(): void {
    clearTimeout(this.cutOff);
  }

  /** The client is cut off within `ms` from now, unless it closes first (or an earlier deadline stands). */
  private cutOffWithin(ms: number): void {
    const at = performance.now() + ms;
    if (at >= this.cutOffAt || this.client.destroyed) return;
    clearTimeout(this.cutOff);
    this.cutOffAt = at;
    this.cutOff = setTimeout(() => this.client.destroy(), ms);
    this.cutOff.unref();
  }
}
