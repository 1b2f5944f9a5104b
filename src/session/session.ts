/**
 * One client connection and its own upstream connection (1:1): their lifecycle (connect,
 * half-close both ways, shutdown, idle timeout), flow control, and the loop over client chunks.
 *
 * Client to server: bytes go upstream as they arrive, in order; frames are classified from
 * their heads once those are complete (TransactionState), but forwarding never waits to learn
 * them. Only a MULTI that may start a lock block is held, by LockBlocks (lock/block-flow.ts).
 * While a command of the proxy's own is in flight (the script, or the upstream URL's AUTH/SELECT
 * at connect and after RESET), client bytes wait, so Redis executes everything in the order
 * the client sent it, also when the script cannot run.
 *
 * Server to client: ReplyStream counts replies and takes the proxy's own aside. When counting
 * would be uncertain (subscribe mode, MONITOR, CLIENT REPLY, replication, malformed input), the
 * connection is a plain pipe from then on. With --cluster, NodeReplies rewrites node addresses.
 */
import type net from 'node:net';
import { formatAddress } from '../address.js';
import { NodeReplies } from '../cluster/node-replies.js';
import { joined, LockBlocks, type LockBlockPort } from '../lock/block-flow.js';
import { countFixedShape } from '../lock/fixed-shape.js';
import type { Logger } from '../log.js';
import { Cmd } from '../resp/commands.js';
import { END, HEAD, MALFORMED, RequestScanner } from '../resp/request-scanner.js';
import { setupCommands } from '../upstream/target.js';
import { countedApart, namesVerifyConnection } from '../verify-connection.js';
import type { ProxyContext } from './context.js';
import { ReplyStream, type ReplyStreamPort } from './reply-stream.js';
import { FrameMeaning, TransactionState } from './transaction-state.js';
import { WriteBatch } from './write-batch.js';

let nextSessionId = 1;

export class Session implements LockBlockPort, ReplyStreamPort {
  readonly id = nextSessionId++;
  /** The upstream address dialled (the master of the moment, with sentinel). */
  readonly upstreamAddress: string;
  private logger: Logger | undefined;
  private readonly upstream: net.Socket;
  private readonly scanner = new RequestScanner();
  private readonly tx = new TransactionState();
  private readonly blocks: LockBlocks;
  private readonly replies: ReplyStream;
  private readonly nodes: NodeReplies | null;
  /** Bytes are forwarded without being looked at, for the rest of the connection. */
  private piping = false;
  private connected = false;
  private closed = false;
  private readonly connectStarted = performance.now();
  /** Shutting down: close as soon as nothing is in flight. */
  private draining = false;
  /**
   * Bytes of the current frame, from earlier chunks, kept back because they may still be a MULTI
   * that starts a lock block (at most the 11 bytes before its last; any other frame is forwarded).
   */
  private partial: Buffer[] = [];
  /** Client chunks that arrived while the proxy's own command was in flight. */
  private stalled: Buffer[] = [];
  /** The proxy's own command in flight ('setup' or 'script'), or null. */
  private awaiting: 'setup' | 'script' | null = null;
  private clientEnded = false;
  /** The client named its connection as verify's: its lock blocks are counted apart. */
  private verifyConnection = false;
  private upstreamFull = false;
  private clientFull = false;
  /** Writes made while one chunk is processed leave together. */
  private readonly toUpstream: WriteBatch;
  private readonly toClient: WriteBatch;

  constructor(
    private readonly client: net.Socket,
    private readonly ctx: ProxyContext,
    /** Called once when both sockets are closed. */
    private readonly onClosed: (session: Session) => void = () => {},
  ) {
    ctx.stats.connectionsOpen++;
    ctx.stats.connectionsTotal++;
    this.toClient = new WriteBatch(client, (bytes) => this.sendClient(bytes));
    const { socket, readyEvent, address, host } = ctx.upstream.connect();
    this.upstream = socket;
    this.upstreamAddress = address;
    this.toUpstream = new WriteBatch(socket, (bytes) => this.sendUpstream(bytes));
    this.nodes = ctx.cluster ? new NodeReplies(ctx.cluster, client, host, ctx.upstream.target.tls, ctx.stats) : null;
    this.replies = new ReplyStream(this, this.nodes?.rewriteRedirect ?? null);
    this.blocks = new LockBlocks(
      this,
      this.replies,
      countedApart(ctx, () => this.verifyConnection),
      this.nodes,
    );
    // Without rules there is nothing to rewrite, unless cluster replies need their addresses rewritten.
    if (ctx.rules().rules.length === 0 && !ctx.cluster) this.enterPipe();
    if (ctx.log.isLevelEnabled('debug')) this.log.debug({ upstream: address }, 'client connected');

    socket.setTimeout(ctx.connectTimeoutMs);
    socket.on(readyEvent, () => this.onUpstreamConnect());
    this.startSetup();
    if (ctx.idleTimeoutMs > 0) {
      client.setTimeout(ctx.idleTimeoutMs);
      client.on('timeout', () => this.onIdle());
    }
    client.on('data', (chunk: Buffer) => this.onClientData(chunk));
    client.on('end', () => this.onClientEnd());
    client.on('error', (err) => {
      if (ctx.log.isLevelEnabled('debug')) this.log.debug({ err: err.message }, 'client socket error');
    });
    client.on('close', () => this.onClose());
    client.on('drain', () => {
      this.clientFull = false;
      this.updateFlow();
    });
    socket.on('timeout', () => this.onUpstreamTimeout());
    socket.on('data', (chunk: Buffer) => this.onUpstreamData(chunk));
    socket.on('end', () => this.onUpstreamEnd());
    socket.on('error', (err) => this.onUpstreamError(err));
    socket.on('close', () => this.onClose());
    socket.on('drain', () => {
      this.upstreamFull = false;
      this.updateFlow();
    });
  }

  /** This connection's logger, made on first use: most connections never log, and child loggers cost memory. */
  get log(): Logger {
    const { remoteAddress, remotePort } = this.client;
    this.logger ??= this.ctx.log.child({
      conn: this.id,
      client: remoteAddress === undefined ? 'local' : formatAddress(remoteAddress, remotePort ?? 0),
    });
    return this.logger;
  }

  // ---------------------------------------------------------------- lifecycle

  /** Sends AUTH/SELECT from the upstream URL, if any; client bytes wait for their replies. Returns true if sent. */
  private startSetup(): boolean {
    const commands = setupCommands(this.ctx.upstream.target);
    if (commands.length === 0) return false;
    this.awaiting = 'setup';
    for (const command of commands) {
      this.writeUpstream(command);
      this.replies.capture((reply) => this.onSetupReply(reply));
    }
    this.updateFlow();
    return true;
  }

  private onSetupReply(reply: Buffer): void {
    if (reply[0] === 0x2d /* - */) {
      const message = reply.toString('latin1').trim().slice(1, 200);
      this.log.error({ upstream: this.ctx.upstream.describe(), error: message }, 'upstream rejected the connection setup');
      this.refuseClient(`upstream ${this.ctx.upstream.describe()} rejected the proxy's AUTH/SELECT: ${message}`);
      return;
    }
    if (!this.replies.capturing) this.resumeClient();
  }

  private onUpstreamConnect(): void {
    this.connected = true;
    this.upstream.setTimeout(0);
    this.ctx.stats.upstreamConnected((performance.now() - this.connectStarted) / 1000);
  }

  private onUpstreamTimeout(): void {
    if (this.connected) return;
    this.upstream.destroy(new Error(`connect timed out after ${this.ctx.connectTimeoutMs} ms`));
  }

  private onUpstreamError(err: Error): void {
    if (!this.connected) {
      this.ctx.stats.upstreamConnectFailures++;
      this.ctx.refusals.refused(this.ctx.upstream.describe(), this.upstreamAddress, err.message);
      this.refuseClient(`upstream ${this.ctx.upstream.describe()} is unreachable: ${err.message}`);
      return;
    }
    this.log.warn({ upstream: this.upstreamAddress, err: err.message }, 'upstream connection lost');
    this.client.destroy();
  }

  /** Redis closed its side: everything it sent has been passed on; then the client side closes. */
  private onUpstreamEnd(): void {
    this.replies.flush();
    this.endClient();
  }

  /** Closes the client side once everything written to it is out, as Redis does after its last reply. */
  private endClient(last?: string): void {
    if (this.client.writableEnded) return;
    this.toClient.flush();
    if (last !== undefined) this.client.write(last);
    this.client.end(() => this.client.destroy());
  }

  /** No bytes either way for --idle-timeout-ms: close, unless a reply is pending or the connection is subscribed. */
  private onIdle(): void {
    if (this.replies.pending || this.awaiting !== null || this.piping) return;
    this.log.debug('closing idle connection');
    this.destroy();
  }

  /** Shutdown: close once nothing is in flight; a plain pipe (pub/sub, MONITOR) looks idle, so at once. */
  beginShutdown(): void {
    this.draining = true;
    this.closeIfDrained();
  }

  private closeIfDrained(): void {
    if (!this.draining || this.closed) return;
    const inFlight = this.replies.pending || this.awaiting !== null || this.blocks.holding || this.partial.length > 0;
    if (this.replies.capturing || (!this.piping && inFlight)) return;
    this.endClient();
    this.toUpstream.flush();
    this.upstream.end();
  }

  /** Closes the connection at once (for example: its upstream is no longer the master). */
  destroy(): void {
    this.client.destroy();
    this.upstream.destroy();
  }

  /** Tells the client why it cannot be served, as a RESP error, and closes its connection. */
  private refuseClient(message: string): void {
    const oneLine = message.replace(/[\r\n]+/g, ' ');
    this.endClient(`-ERR redis-lock-proxy: ${oneLine}\r\n`);
    this.upstream.destroy();
  }

  private onClientEnd(): void {
    this.clientEnded = true;
    if (this.awaiting === null) this.finishClientEnd();
  }

  /** The client sends no more: what it sent goes on as it is (Redis drops an unfinished block itself). */
  private finishClientEnd(): void {
    this.flushPending('client-closed');
    this.toUpstream.flush();
    this.upstream.end();
  }

  private onClose(): void {
    if (this.closed) return;
    this.closed = true;
    this.blocks.stopTimer();
    this.ctx.stats.connectionsOpen--;
    // A side being ended still has its last bytes on the way: it closes itself once they are out.
    if (!this.client.writableEnded) this.client.destroy();
    if (!this.upstream.writableEnded) this.upstream.destroy();
    if (this.ctx.log.isLevelEnabled('debug')) this.log.debug('connection closed');
    this.onClosed(this);
  }

  // ------------------------------------------------------------ flow control

  writeUpstream(bytes: Buffer): void {
    if (bytes.length > 0) this.toUpstream.add(bytes);
  }

  writeClient(bytes: Buffer): void {
    // Once the client side is ended (a refusal, an abandoned pipeline), nothing more is sent to it.
    if (bytes.length > 0 && !this.client.writableEnded) this.toClient.add(bytes);
  }

  private sendUpstream(bytes: Buffer): void {
    if (!this.upstream.write(bytes)) {
      this.upstreamFull = true;
      this.updateFlow();
    }
  }

  private sendClient(bytes: Buffer): void {
    if (!this.client.write(bytes)) {
      this.clientFull = true;
      this.updateFlow();
    }
  }

  /** A slow side pauses the other; a command of the proxy's in flight pauses the client. */
  private updateFlow(): void {
    if (this.awaiting !== null || this.upstreamFull) this.client.pause();
    else this.client.resume();
    if (this.clientFull) this.upstream.pause();
    else this.upstream.resume();
  }

  // ------------------------------- what LockBlocks and ReplyStream ask (their ports)

  blockSent(frames: number, complete: boolean): void {
    this.replies.expect(frames);
    this.tx.blockSent(frames, complete);
  }

  holdClient(): void {
    this.awaiting = 'script';
    this.updateFlow();
  }

  /** The proxy's own command is answered: forward what the client sent meanwhile. */
  resumeClient(): void {
    this.awaiting = null;
    this.toUpstream.begin();
    while (this.awaiting === null && this.stalled.length > 0) {
      const chunk = this.stalled.shift() as Buffer;
      this.processClientChunk(chunk);
    }
    this.toUpstream.end();
    if (this.awaiting === null && this.clientEnded) this.finishClientEnd();
    this.updateFlow();
    if (this.draining) this.closeIfDrained();
  }

  abandon(): void {
    this.replies.dropCaptures();
    this.endClient();
    this.upstream.destroy();
  }

  get clientGone(): boolean {
    return this.client.destroyed;
  }

  untracked(reason: string, tooManyReplies: boolean): void {
    if (tooManyReplies) this.log.debug('more replies than requests; no longer interpreting this connection');
    else this.log.warn({ reason }, 'cannot follow the reply stream; no longer interpreting this connection');
    this.flushPending(tooManyReplies ? 'unexpected-reply' : 'unreadable-reply');
    this.enterPipe();
  }

  /** The proxy's own reply cannot be found: the connection's state is unknown. Never fake it. */
  lost(reason: string): void {
    this.log.error({ reason }, 'cannot follow the reply stream while a script reply is due; closing the connection');
    this.destroy();
  }

  // -------------------------------------------------------- client to server

  private onClientData(chunk: Buffer): void {
    this.ctx.stats.bytesFromClients += chunk.length;
    if (this.awaiting !== null) {
      this.stalled.push(chunk);
      return;
    }
    this.toUpstream.begin();
    this.processClientChunk(chunk);
    this.toUpstream.end();
  }

  private processClientChunk(chunk: Buffer): void {
    if (this.piping) {
      this.writeUpstream(chunk);
      return;
    }
    const blocks = this.blocks;
    if (blocks.holding) blocks.touched();
    const scanner = this.scanner;
    scanner.newChunk();
    let pos = 0;
    /** Start of the bytes of this chunk not yet forwarded or held. */
    let from = 0;
    while (pos < chunk.length) {
      pos = scanner.next(chunk, pos);
      const event = scanner.event;
      if (event === 0) break;
      if (event & MALFORMED) {
        this.log.debug({ reason: scanner.malformedReason }, 'malformed request: passing it to Redis unread');
        this.flushPending('malformed');
        this.enterPipe();
        this.writeUpstream(chunk.subarray(from));
        return;
      }
      if (event & HEAD) {
        if (blocks.holding) {
          if (!blocks.accept(scanner, this.ctx.rules())) {
            blocks.release('not-a-lock-block');
            this.forwardFrame();
          }
        } else if (this.tx.canStartBlock && LockBlocks.isStart(scanner) && this.frameKeptBack(scanner)) {
          from = this.startHolding(chunk, from);
        } else {
          this.flushPartial();
          this.forwardFrame();
        }
        if (scanner.cmd === Cmd.Reset && scanner.argc === 1 && (event & END) !== 0 && !blocks.holding && !this.piping) {
          // RESET logs the connection out and selects db 0: apply the URL's AUTH/SELECT again, after it.
          this.writeUpstream(chunk.subarray(from, pos));
          from = pos;
          if (this.startSetup()) {
            if (pos < chunk.length) this.stalled.unshift(chunk.subarray(pos));
            return;
          }
        }
        // forwardFrame() may have made the connection a plain pipe.
        if (this.piping) {
          this.writeUpstream(chunk.subarray(from));
          return;
        }
      }
      if (event & END && blocks.holding && blocks.isComplete) {
        blocks.hold(chunk.subarray(from, pos));
        from = pos;
        const asking = this.tx.afterAsking;
        this.tx.blockRewritten();
        if (blocks.complete(asking)) {
          // The script is in flight: the rest of this chunk waits for its reply.
          if (pos < chunk.length) this.stalled.unshift(chunk.subarray(pos));
          return;
        }
      }
    }
    this.endOfChunk(chunk, from);
  }

  /**
   * Puts a chunk's unprocessed tail where it belongs: held (in a block), kept back (it may still
   * be a MULTI to hold; Redis would wait for those bytes too), or forwarded now, for Redis to
   * answer as it does (say, the unauthenticated limits that act on a request's first line).
   */
  private endOfChunk(chunk: Buffer, from: number): void {
    if (from >= chunk.length) return;
    const scanner = this.scanner;
    const blocks = this.blocks;
    if (blocks.holding) {
      blocks.hold(chunk.subarray(from));
      if (scanner.awaitingHead && !blocks.couldStillAccept(scanner)) blocks.release('not-a-lock-block');
      else blocks.awaitMore();
      return;
    }
    if (scanner.awaitingHead && this.tx.canStartBlock && LockBlocks.couldStillStart(scanner) && this.frameKeptBack(scanner)) {
      const start = scanner.frameStart >= from ? scanner.frameStart : from;
      this.writeUpstream(chunk.subarray(from, start));
      this.partial.push(chunk.subarray(start));
      return;
    }
    this.flushPartial();
    this.writeUpstream(from === 0 ? chunk : chunk.subarray(from));
  }

  /** Whether none of the current frame has gone upstream yet: it starts in this chunk, or was kept back. */
  private frameKeptBack(scanner: RequestScanner): boolean {
    return scanner.frameStart >= 0 || this.partial.length > 0;
  }

  /** Starts holding at the MULTI whose head the scanner just read; returns the new `from`. */
  private startHolding(chunk: Buffer, from: number): number {
    const start = this.scanner.frameStart;
    if (start >= 0) {
      this.writeUpstream(chunk.subarray(from, start));
      this.blocks.start([]);
      return start;
    }
    this.blocks.start(this.partial); // the MULTI began in an earlier chunk
    this.partial = [];
    return from;
  }

  private flushPartial(): void {
    if (this.partial.length === 0) return;
    this.writeUpstream(joined(this.partial));
    this.partial = [];
  }

  /** Forwards everything held or kept back as it is (before the connection becomes a plain pipe). */
  private flushPending(reason: string): void {
    if (this.blocks.holding) this.blocks.release(reason);
    this.flushPartial();
  }

  /** The frame whose head the scanner holds goes upstream: the replies it brings and the state it changes. */
  private forwardFrame(): void {
    const meaning = this.tx.frame(this.scanner);
    if (meaning === FrameMeaning.NoReply) return;
    if (meaning === FrameMeaning.Untrackable) {
      this.enterPipe();
      return;
    }
    if (this.tx.userChanged) this.blocks.forgetProof();
    if (this.scanner.cmd === Cmd.Client) this.verifyConnection = namesVerifyConnection(this.scanner) ?? this.verifyConnection;
    if (this.scanner.cmd === Cmd.Set && this.scanner.argc === 6) countFixedShape(this.scanner, this.ctx.rules(), this.ctx.stats);
    this.ctx.stats.commandsForwarded++;
    const rewrite = this.nodes?.replyRewrite(this.scanner, this.tx);
    if (rewrite === undefined) this.replies.expect(1);
    else this.replies.capture((reply) => this.writeClient(rewrite(reply)));
  }

  /** Stops interpreting this connection: from here on bytes pass untouched both ways. */
  private enterPipe(): void {
    this.piping = true;
    this.blocks.stopTimer();
    // Replies stop being counted, unless a reply of the proxy's own is still due: then after it.
    this.replies.stopCounting();
  }

  // -------------------------------------------------------- server to client

  private onUpstreamData(chunk: Buffer): void {
    this.ctx.stats.bytesFromUpstream += chunk.length;
    if (this.replies.passingThrough) {
      this.writeClient(chunk);
      return;
    }
    this.toClient.begin();
    this.replies.process(chunk);
    this.toClient.end();
    if (this.draining) this.closeIfDrained();
  }
}
