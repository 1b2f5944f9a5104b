/**
 * The start of a connection's upstream side: the connect (timed by --connect-timeout-ms, counted
 * in upstream_connect_seconds), the upstream URL's AUTH/SELECT (at connect and after a RESET,
 * before anything of the client's), and the refusals a client gets when none of that works: an
 * unreachable upstream, one that refuses the AUTH/SELECT, one whose first bytes are not RESP.
 */
import type net from 'node:net';
import { isReplyTypeByte } from '../resp/reply-scanner.js';
import type { Logger } from '../log.js';
import type { ProxyContext } from './context.js';
import type { ReplyStream } from './reply-stream.js';
import { askWayAhead } from './server-way.js';

/** Bytes of what a non-RESP upstream sent first that the client's error shows. */
const NOT_RESP_SHOWN = 16;

/** What the start needs of its session. */
export interface UpstreamStartPort {
  writeUpstream(bytes: Buffer): void;
  /** The client's bytes wait for the setup's replies. */
  awaitSetup(): void;
  /** The setup is answered: the client's bytes go on. */
  resumeClient(): void;
  /** Tells the client why it cannot be served, as a RESP error, and closes its connection. */
  refuseClient(message: string): void;
  /** A reply of the proxy's own cannot be read: the connection's state is unknown. */
  lost(reason: string): void;
  readonly log: Logger;
}

export class UpstreamStart {
  /** The upstream connection is made. */
  connected = false;
  private readonly started = performance.now();
  /** Nothing from Redis yet: its first bytes must be RESP. */
  private silentSoFar = true;

  constructor(
    private readonly port: UpstreamStartPort,
    private readonly upstream: net.Socket,
    private readonly address: string,
    private readonly replies: ReplyStream,
    private readonly ctx: ProxyContext,
  ) {}

  /** Sends AUTH/SELECT from the upstream URL, if any; client bytes wait for their replies. Returns true if sent. */
  sendSetup(): boolean {
    const commands = this.ctx.upstream.setup;
    if (commands.length === 0) return false;
    this.port.awaitSetup();
    for (const command of commands) {
      this.port.writeUpstream(command);
      this.replies.capture((reply) => this.setupAnswered(reply));
    }
    return true;
  }

  private setupAnswered(reply: Buffer): void {
    if (reply[0] !== 0x2b /* + */ && reply[0] !== 0x2d /* - */) {
      // AUTH and SELECT answer +OK or an error: anything else is another command's reply.
      this.port.lost(`AUTH/SELECT answered with a reply of type ${JSON.stringify(String.fromCharCode(reply[0]))}`);
      return;
    }
    if (reply[0] === 0x2d /* - */) {
      const message = reply.toString('latin1').trim().slice(1, 200);
      this.port.log.error({ upstream: this.ctx.upstream.describe(), error: message }, 'upstream rejected the connection setup');
      this.port.refuseClient(`upstream ${this.ctx.upstream.describe()} rejected the proxy's AUTH/SELECT: ${message}`);
      return;
    }
    if (!this.replies.capturing) this.port.resumeClient();
  }

  /** The upstream connection is made (its ready event). */
  ready(): void {
    this.connected = true;
    this.upstream.setTimeout(0);
    this.ctx.stats.upstreamConnected((performance.now() - this.started) / 1000);
    askWayAhead(this.ctx, this.address);
  }

  /** The socket's timeout: before the connection is made, --connect-timeout-ms passed. */
  timedOut(): void {
    if (this.connected) return;
    this.upstream.destroy(new Error(`connect timed out after ${this.ctx.connectTimeoutMs} ms`));
  }

  /** The connection could not be made: the client is told why. */
  failed(err: Error): void {
    this.ctx.serverMethods.forget(this.address); // the server may be restarting
    this.ctx.stats.upstreamConnectFailures++;
    this.ctx.refusals.refused(this.ctx.upstream.describe(), this.address, err.message);
    this.port.refuseClient(`upstream ${this.ctx.upstream.describe()} is unreachable: ${err.message}`);
  }

  /**
   * Whether `chunk`, from Redis, may be passed on: Redis's first bytes must be RESP (a newline is
   * what a master sends a replica, SYNC, while its snapshot is being made); an HTTP server, or a
   * TLS port spoken to in clear, is refused, as nothing it says can be passed on.
   */
  speaksResp(chunk: Buffer): boolean {
    if (!this.silentSoFar) return true;
    this.silentSoFar = false;
    if (isReplyTypeByte(chunk[0]) || chunk[0] === 0x0a) return true;
    const shown = JSON.stringify(
      chunk
        .subarray(0, NOT_RESP_SHOWN)
        .toString('latin1')
        .replace(/[^\x20-\x7e]/g, '?'),
    );
    const reason = `does not speak RESP (it answered ${shown}...)`;
    this.ctx.stats.upstreamNotResp++;
    this.ctx.refusals.refused(this.ctx.upstream.describe(), this.address, reason, 'upstream does not speak RESP');
    this.port.refuseClient(`upstream ${this.ctx.upstream.describe()} ${reason}`);
    return false;
  }
}
