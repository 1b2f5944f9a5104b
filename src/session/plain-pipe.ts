/**
 * A connection that has become a plain pipe: when replies cannot be counted (subscribe mode,
 * MONITOR, CLIENT REPLY, REPLCONF, replication, malformed input), bytes pass untouched both ways.
 * A RESET ends such a pipe, as it ends all of that in Redis, except after replication or
 * malformed input; frames are therefore still found in the pipe, to count replies again after a
 * RESET and apply the upstream URL's AUTH/SELECT again. Outside a pipe, the URL's AUTH/SELECT
 * follow a RESET once it has run too (afterReset).
 */
import { Cmd } from '../resp/commands.js';
import { END, HEAD, MALFORMED, type RequestScanner } from '../resp/request-scanner.js';
import type { ProxyContext } from './context.js';
import type { ReplyStream } from './reply-stream.js';
import { ResetMarker } from './reset-marker.js';
import type { ServerWay } from './server-way.js';
import type { TransactionState } from './transaction-state.js';

/** What the pipe needs of its connection. */
export interface PlainPipePort {
  writeUpstream(bytes: Buffer): void;
  /** The rest of a chunk waits for a reply of the proxy's own (the session feeds it back later). */
  stall(rest: Buffer): void;
  /** Sends the upstream URL's AUTH/SELECT (after RESET); true when sent, and the client's next bytes then wait. */
  startSetup(): boolean;
  holdClient(): void;
  resumeClient(): void;
}

export class PlainPipe {
  /** Bytes are forwarded without being interpreted. */
  active = false;
  /**
   * In the pipe, frames are still found to see a RESET: lock blocks are fixed again after it, and
   * the upstream URL's AUTH/SELECT follow it. Not in a pipe a RESET cannot end, nor in a pipe
   * without rules whose URL has no AUTH/SELECT (a RESET changes nothing the proxy does there).
   */
  private resetEnds = false;
  /** The pipe stays after a RESET: the connection was opened while no rule was loaded. */
  readonly withoutRules: boolean;

  /** `scanner`: the connection's request scanner, which the pipe goes on using to find a RESET. */
  constructor(
    private readonly port: PlainPipePort,
    private readonly replies: ReplyStream,
    private readonly scanner: RequestScanner,
    private readonly tx: TransactionState,
    private readonly server: ServerWay,
    private readonly ctx: ProxyContext,
  ) {
    // Without rules there is nothing to rewrite, unless cluster replies need their addresses rewritten.
    this.withoutRules = ctx.rules().rules.length === 0 && !ctx.cluster;
  }

  /**
   * Bytes pass untouched both ways from here, until a RESET if `resettable` (it is not after
   * replication, or input or replies the proxy cannot read).
   */
  enter(resettable: boolean): void {
    this.active = true;
    // A RESET matters where lock blocks may follow it, or the URL's AUTH/SELECT must.
    this.resetEnds = resettable && (!this.withoutRules || this.ctx.upstream.setup.length > 0);
    // Replies stop being counted, unless a reply of the proxy's own is still due: then after it.
    this.replies.stopCounting(this.resetEnds);
  }

  /**
   * A chunk (from `from`) of a plain pipe goes upstream as it is. Where a RESET ends the pipe, the
   * scanner goes on finding frames from `pos`; after a RESET, the proxy's marker command follows
   * it (reset-marker.ts), and the client's next bytes wait until its refusal has come back.
   */
  chunk(chunk: Buffer, from: number, pos: number): void {
    const scanner = this.scanner;
    // A RESET ends the pipe only where its marker's refusal can be found among the replies.
    while (this.resetEnds && this.replies.framesFollowed && pos < chunk.length) {
      pos = scanner.next(chunk, pos);
      const event = scanner.event;
      if (event === 0) break;
      if (event & MALFORMED) {
        this.resetEnds = false; // Redis answers with a protocol error and closes
        break;
      }
      // A one-argument frame reports its head and end at once.
      if ((event & END) === 0 || (event & HEAD) === 0 || scanner.cmd !== Cmd.Reset || scanner.argc !== 1 || !this.server.hasReset())
        continue;
      this.port.writeUpstream(chunk.subarray(from, pos));
      this.reset();
      if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
      return;
    }
    this.port.writeUpstream(from === 0 ? chunk : chunk.subarray(from));
  }

  /** Whether the frame whose head `scanner` holds is a RESET that the upstream URL's AUTH/SELECT follow once it has run. */
  resetBeforeSetup(scanner: RequestScanner): boolean {
    return scanner.cmd === Cmd.Reset && scanner.argc === 1 && this.server.hasReset() && this.ctx.upstream.setup.length > 0;
  }

  /**
   * A RESET's answer, outside a pipe: where it ran (`+RESET`) the URL's AUTH/SELECT go again;
   * where it was refused (Redis 6.2 checks ACLs on RESET) the connection is as it was, its user
   * too, and they do not. The client's bytes waited for it.
   */
  afterReset(first: number): void {
    if (first !== 0x2b /* + */ || !this.port.startSetup()) this.port.resumeClient();
  }

  /**
   * A RESET went upstream while the connection was a plain pipe. Whether Redis answers it cannot
   * be told from here (CLIENT REPLY SKIP), nor where its answer lies (the replies before it are
   * not counted), but Redis runs it: the marker command follows, and the client waits. Once the
   * marker's refusal is back, the state is Redis's initial one: the upstream URL's AUTH/SELECT go
   * again, and the replies are counted again (unless the pipe stays: no rule was loaded).
   */
  private reset(): void {
    this.tx.frame(this.scanner); // out of any transaction, nothing watched
    const marker = new ResetMarker();
    this.port.writeUpstream(marker.command);
    this.port.holdClient();
    this.replies.awaitMarker(marker, () => {
      if (!this.withoutRules) this.active = false;
      const setupSent = this.port.startSetup();
      if (this.withoutRules) this.replies.stopCounting(this.resetEnds); // still a pipe, once the setup's replies are in
      if (!setupSent) this.port.resumeClient();
    });
  }
}
