/**
 * One client connection and its own upstream connection (1:1), and the glue
 * between them.
 *
 * Client to server: bytes go upstream as they arrive, in order; frames are
 * classified from their heads once those are complete, but forwarding never
 * waits to learn them. The one exception is a `MULTI` that may start a lock
 * block: its bytes (a few, which Redis would wait for too) and the block's are
 * held until it is clear whether the block is one a rule names; a complete one
 * is replaced by one script call, anything else is released verbatim.
 *
 * While the proxy's own command (the script, or AUTH/SELECT at connect) is in
 * flight, nothing after it is forwarded: client bytes wait. That keeps the
 * order in which Redis executes commands exactly the order the client sent
 * them, even when the script cannot run and the original block is sent
 * instead.
 *
 * Server to client: replies are counted (not decoded) against what was
 * forwarded, so that the reply to the proxy's own command is found and
 * replaced by the replies the client expects.
 *
 * When reply counting would be uncertain (subscribe mode, MONITOR, CLIENT
 * REPLY, replication, malformed input), the session becomes a plain pipe for
 * the rest of the connection.
 */
import type net from 'node:net';
import type { TLSSocket } from 'node:tls';
import { Cmd, equalsIgnoreCase } from './resp/commands.js';
import { END, HEAD, MALFORMED, RequestScanner } from './resp/request-scanner.js';
import { ReplyScanner } from './resp/reply-scanner.js';
import { BlockMatcher, BlockStep } from './lock/block-matcher.js';
import { encodeLockCall, translateScriptReply, type LockCall } from './lock/script.js';
import type { Rule, RuleSet } from './rules/types.js';
import { describeKey } from './key-text.js';
import type { Logger } from './log.js';
import type { Stats } from './stats.js';
import type { UpstreamConnector } from './upstream/connect.js';
import { setupCommands } from './upstream/target.js';
import { RedirectLines } from './cluster/redirect-lines.js';
import {
  rewriteExecReply,
  rewriteRedirect,
  rewriteTopologyReply,
  topologyReplyOf,
  type Announce,
  type NodeDirectory,
  type QueuedTopology,
  type TopologyReply,
} from './cluster/rewrite.js';

/** Cluster mode: node addresses in replies are rewritten to the proxy's listeners. */
export interface ClusterReplies {
  readonly nodes: NodeDirectory;
  /** Host written into replies; null: the address the client connected to. */
  readonly announceHost: string | null;
}

export interface ProxyContext {
  readonly upstream: UpstreamConnector;
  /** The rules in force; read for every new block, so a reload applies to open connections. */
  rules(): RuleSet;
  /** 'observe' makes every rule observe-only. */
  readonly mode: 'enforce' | 'observe';
  /** How long a held MULTI waits for the rest of its block after the client's last byte. */
  readonly holdMs: number;
  readonly connectTimeoutMs: number;
  /** Close a client connection idle this long (0: never). */
  readonly idleTimeoutMs: number;
  /** Forward what follows a lock block without waiting for its script, once the script has worked on the connection. */
  readonly lockPipelining: boolean;
  /** Set in cluster mode. */
  readonly cluster?: ClusterReplies | null;
  readonly log: Logger;
  readonly stats: Stats;
}

const enum Mode {
  /** Frames are scanned and forwarded. */
  Normal,
  /** A MULTI and what followed it are held until the block matches or cannot. */
  Holding,
  /** Bytes are forwarded without being looked at, for the rest of the connection. */
  Pipe,
}

/** The reply to a command the proxy sent itself, and how many forwarded replies follow it. */
interface Capture {
  readonly handle: (reply: Buffer) => void;
  /** Replies of frames forwarded after the proxy's command (only with --lock-pipelining). */
  after: number;
}

/** A lock block whose script call is in flight. */
interface PendingBlock {
  readonly call: LockCall;
  readonly rule: Rule;
  /** The block as the client sent it, for the fallback. */
  readonly held: Buffer[];
  /** ASKING came right before the block: a retry or the fallback needs it again (it lasts one command). */
  readonly asking: boolean;
}

const REPLY = Buffer.from('reply');
const MULTI = Buffer.from('MULTI');
const ASKING = Buffer.from('*1\r\n$6\r\nASKING\r\n');
const MULTI_OK = Buffer.from('+OK\r\n');
const EXECABORT = Buffer.from('-EXECABORT Transaction discarded because of previous errors.\r\n');
/** Errors of Redis Cluster's key check: Redis gives INCR[BY] and [P]EXPIRE on the same key the same one. */
const CLUSTER_REDIRECT = /^-(MOVED|ASK|TRYAGAIN|CLUSTERDOWN)\b/;

let nextSessionId = 1;

export class Session {
  readonly id = nextSessionId++;
  private logger: Logger | undefined;
  private readonly upstream: net.Socket;
  /** The upstream address dialled (the master of the moment, with sentinel). */
  readonly upstreamAddress: string;
  private readonly scanner: RequestScanner;
  private readonly replies = new ReplyScanner();
  private readonly matcher = new BlockMatcher();
  private mode = Mode.Normal;
  private connected = false;
  private closed = false;
  private connectStarted = 0;
  /** Shutting down: close as soon as nothing is in flight. */
  private draining = false;

  // Client to server.
  /**
   * Bytes of the current frame, from earlier chunks, kept back because they may still be a MULTI
   * that starts a lock block (at most the 11 bytes before its last; any other frame is forwarded).
   */
  private partial: Buffer[] = [];
  /** Bytes of the block being held, kept until the block is rewritten or released. */
  private held: Buffer[] = [];
  private holdTimer: NodeJS.Timeout | undefined;
  private inMulti = false;
  /** Commands queued in the open transaction, and those among them whose reply names nodes (cluster mode). */
  private queued = 0;
  private queuedTopology: QueuedTopology[] = [];
  private watching = false;
  /** The last command forwarded was ASKING. */
  private afterAsking = false;
  /** Client chunks that arrived while the proxy's own command was in flight. */
  private stalled: Buffer[] = [];
  /** The proxy's own command in flight ('setup' or 'script'), or null. */
  private awaiting: 'setup' | 'script' | null = null;
  private clientEnded = false;
  private upstreamFull = false;
  private clientFull = false;

  // Server to client.
  /** Replies still expected for forwarded frames, before any capture. */
  private outstanding = 0;
  /** The proxy's own replies, expected after `outstanding` others, in order. */
  private captures: Capture[] = [];
  /** The script has worked on this connection for its current user (see --lock-pipelining). */
  private scriptProven = false;
  private captureParts: Buffer[] = [];
  private replyPipe = false;
  /** Cluster mode: replies are scanned for -MOVED/-ASK even when no longer counted. */
  private redirectScan = false;
  /** Cluster mode: -MOVED/-ASK lines rewritten on their way to the client. */
  private readonly redirects: RedirectLines | null = null;
  private announceCache: Announce | undefined;
  private readonly fallbackReasonsLogged = new Set<string>();
  /** Writes made while one chunk is processed leave together (see WriteBatch). */
  private readonly toUpstream: WriteBatch;
  private readonly toClient: WriteBatch;

  /** This connection's logger, made on first use: most connections never log, and child loggers cost memory. */
  private get log(): Logger {
    this.logger ??= this.ctx.log.child({ conn: this.id, client: `${this.client.remoteAddress ?? 'local'}:${this.client.remotePort ?? ''}` });
    return this.logger;
  }

  constructor(
    private readonly client: net.Socket,
    private readonly ctx: ProxyContext,
    /** Called once when both sockets are closed. */
    private readonly onClosed: (session: Session) => void = () => {},
  ) {
    ctx.stats.connectionsOpen++;
    ctx.stats.connectionsTotal++;
    this.scanner = new RequestScanner();
    this.toClient = new WriteBatch(client, (bytes) => this.sendClient(bytes));
    // Without rules there is nothing to rewrite, unless cluster replies need their addresses rewritten.
    if (ctx.rules().rules.length === 0 && !ctx.cluster) this.mode = Mode.Pipe;
    this.replyPipe = this.mode === Mode.Pipe;
    if (ctx.cluster) {
      const nodes = ctx.cluster.nodes;
      this.replies.trackErrors = true;
      this.redirectScan = true;
      this.redirects = new RedirectLines(
        this.replies,
        (bytes) => this.writeClient(bytes),
        (line) => {
          const rewritten = rewriteRedirect(line, nodes, this.announce());
          if (rewritten !== null) ctx.stats.redirectsRewritten++;
          return rewritten;
        },
      );
    }

    this.connectStarted = performance.now();
    const { socket, readyEvent, address } = ctx.upstream.connect();
    this.upstream = socket;
    this.upstreamAddress = address;
    this.toUpstream = new WriteBatch(socket, (bytes) => this.sendUpstream(bytes));
    if (ctx.log.isLevelEnabled('debug')) this.log.debug({ upstream: address }, 'client connected');
    this.upstream.setTimeout(ctx.connectTimeoutMs);
    this.upstream.on(readyEvent, () => this.onUpstreamConnect());
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

    this.upstream.on('timeout', () => this.onUpstreamTimeout());
    this.upstream.on('data', (chunk: Buffer) => this.onUpstreamData(chunk));
    this.upstream.on('end', () => this.onUpstreamEnd());
    this.upstream.on('error', (err) => this.onUpstreamError(err));
    this.upstream.on('close', () => this.onClose());
    this.upstream.on('drain', () => {
      this.upstreamFull = false;
      this.updateFlow();
    });
  }

  // ---------------------------------------------------------------- lifecycle

  /** Sends AUTH/SELECT from the upstream URL, if any; client bytes wait for their replies. Returns true if sent. */
  private startSetup(): boolean {
    const commands = setupCommands(this.ctx.upstream.target);
    if (commands.length === 0) return false;
    this.awaiting = 'setup';
    this.replyPipe = false;
    for (const cmd of commands) {
      this.writeUpstream(cmd);
      this.captures.push({ handle: (reply) => this.onSetupReply(reply), after: 0 });
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
    if (this.captures.length === 0) this.liftBarrier();
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
      this.log.warn({ upstream: this.ctx.upstream.describe(), address: this.upstreamAddress, err: err.message }, 'upstream unreachable');
      this.refuseClient(`upstream ${this.ctx.upstream.describe()} is unreachable: ${err.message}`);
      return;
    }
    this.log.warn({ upstream: this.upstreamAddress, err: err.message }, 'upstream connection lost');
    this.client.destroy();
  }

  /** Redis closed its side: everything it sent has been passed on; then the client side closes. */
  private onUpstreamEnd(): void {
    this.redirects?.flush();
    this.endClient();
  }

  /**
   * Closes the client side after everything written to it is out, as Redis
   * closes a connection after its last reply (a client that keeps its own side
   * open does not keep the socket alive).
   */
  private endClient(last?: string): void {
    if (this.client.writableEnded) return;
    this.toClient.flush();
    if (last !== undefined) this.client.write(last);
    this.client.end(() => this.client.destroy());
  }

  /** No bytes either way for --idle-timeout-ms: close, unless a reply is pending or the connection is subscribed. */
  private onIdle(): void {
    if (this.outstanding > 0 || this.captures.length > 0 || this.awaiting !== null || this.mode === Mode.Pipe) return;
    this.log.debug('closing idle connection');
    this.client.destroy();
    this.upstream.destroy();
  }

  /**
   * Shutdown: the connection closes as soon as nothing is in flight (no
   * reply pending, no block held or being rewritten). A plain pipe cannot be
   * told apart from idle (pub/sub, MONITOR), so it closes at once.
   */
  beginShutdown(): void {
    this.draining = true;
    this.closeIfDrained();
  }

  private closeIfDrained(): void {
    if (!this.draining || this.closed) return;
    const busy =
      this.captures.length > 0 ||
      (this.mode !== Mode.Pipe && (this.outstanding > 0 || this.awaiting !== null || this.mode === Mode.Holding || this.partial.length > 0));
    if (busy) return;
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

  /**
   * The client will send nothing more (it may still read). What it sent is
   * forwarded as it is: an unfinished block or frame then reaches Redis as it
   * would without the proxy, and Redis discards it when the connection closes.
   */
  private finishClientEnd(): void {
    this.flushPending('client-closed');
    this.toUpstream.flush();
    this.upstream.end();
  }

  private onClose(): void {
    if (this.closed) return;
    this.closed = true;
    this.stopHoldTimer();
    this.ctx.stats.connectionsOpen--;
    // A side being ended gracefully still has its last bytes on the way (a big reply before QUIT,
    // an error reply): it closes itself once they are out (see endClient).
    if (!this.client.writableEnded) this.client.destroy();
    if (!this.upstream.writableEnded) this.upstream.destroy();
    if (this.ctx.log.isLevelEnabled('debug')) this.log.debug('connection closed');
    this.onClosed(this);
  }

  // ------------------------------------------------------------ flow control

  private writeUpstream(bytes: Buffer): void {
    if (bytes.length > 0) this.toUpstream.add(bytes);
  }

  private writeClient(bytes: Buffer): void {
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
    if (this.mode === Mode.Pipe) {
      this.writeUpstream(chunk);
      return;
    }
    if (this.mode === Mode.Holding) this.holdTimer?.refresh();
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
        if (this.mode === Mode.Holding) {
          if (!this.matcher.accept(scanner, this.ctx.rules())) {
            this.release('not-a-lock-block');
            this.forwardFrame();
          }
        } else if (this.canStartBlock() && BlockMatcher.isBlockStart(scanner) && this.frameKeptBack(scanner)) {
          from = this.startHolding(chunk, from);
        } else {
          this.flushPartial();
          this.forwardFrame();
        }
        if (scanner.cmd === Cmd.Reset && scanner.argc === 1 && (event & END) !== 0 && this.mode === Mode.Normal) {
          // RESET logs the connection out and selects db 0: apply the URL's AUTH/SELECT again, after it.
          this.writeUpstream(chunk.subarray(from, pos));
          from = pos;
          if (this.startSetup()) {
            if (pos < chunk.length) this.stalled.unshift(chunk.subarray(pos));
            return;
          }
        }
        // forwardFrame() may have switched the connection to a plain pipe.
        if ((this.mode as Mode) === Mode.Pipe) {
          this.writeUpstream(chunk.subarray(from));
          return;
        }
      }
      if (event & END && this.mode === Mode.Holding && this.matcher.step === BlockStep.Complete) {
        this.held.push(chunk.subarray(from, pos));
        from = pos;
        if (this.onBlockComplete()) {
          // The script is in flight: the rest of this chunk waits for its reply.
          if (pos < chunk.length) this.stalled.unshift(chunk.subarray(pos));
          return;
        }
      }
    }
    this.endOfChunk(chunk, from);
  }

  /**
   * Puts the unprocessed tail of a chunk where it belongs: held (in a block), kept back (a frame
   * that may still be a MULTI to hold), or forwarded. Redis would wait for the bytes of an
   * unfinished MULTI or lock block too, so holding them delays nothing it would answer; any
   * other unfinished frame goes upstream now, for Redis to answer as it does (for example the
   * stricter limits for unauthenticated clients, which act on a request's first line).
   */
  private endOfChunk(chunk: Buffer, from: number): void {
    if (from >= chunk.length) return;
    const scanner = this.scanner;
    if (this.mode === Mode.Holding) {
      this.held.push(chunk.subarray(from));
      if (scanner.awaitingHead && !this.matcher.couldStillAccept(scanner)) {
        this.release('not-a-lock-block'); // this frame cannot be the block's next: nothing to wait for
        return;
      }
      if (this.holdTimer === undefined) this.startHoldTimer();
      return;
    }
    if (scanner.awaitingHead && this.canStartBlock() && scanner.couldStillBe(MULTI, 1) && this.frameKeptBack(scanner)) {
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

  private canStartBlock(): boolean {
    return !this.inMulti && !this.watching;
  }

  /** Starts holding at the MULTI whose head the scanner just read; returns the new `from`. */
  private startHolding(chunk: Buffer, from: number): number {
    const start = this.scanner.frameStart;
    if (start >= 0) {
      this.writeUpstream(chunk.subarray(from, start));
      this.held = [];
    } else {
      this.held = this.partial; // the MULTI began in an earlier chunk
      this.partial = [];
    }
    this.mode = Mode.Holding;
    this.matcher.reset();
    return start >= 0 ? start : from;
  }

  private flushPartial(): void {
    if (this.partial.length === 0) return;
    this.writeUpstream(joined(this.partial));
    this.partial = [];
  }

  /** Forwards everything held or partial as it is (before switching to a plain pipe). */
  private flushPending(reason: string): void {
    if (this.mode === Mode.Holding) this.release(reason);
    this.flushPartial();
  }

  /**
   * Accounts for the frame whose head the scanner holds, which is being
   * forwarded: one reply expected (none for an empty frame), and the
   * connection state it changes.
   */
  private forwardFrame(): void {
    const scanner = this.scanner;
    if (scanner.cmd === Cmd.Empty) return;
    if (scanner.inlineOpaque) {
      this.enterPipe(); // the proxy does not interpret inline quoting
      return;
    }
    // Redis refuses a command with the wrong number of arguments before running it, so state
    // changes only on the exact arities (MULTI x, for example, opens no transaction).
    const argc = scanner.argc;
    const queued = this.inMulti && queuedInMulti(scanner.cmd);
    switch (scanner.cmd) {
      case Cmd.Multi:
        if (argc === 1 && !this.inMulti) {
          this.inMulti = true;
          this.queued = 0;
          this.queuedTopology = [];
        }
        break;
      case Cmd.Exec:
      case Cmd.Discard:
        if (argc === 1 && this.inMulti) {
          this.inMulti = false;
          this.watching = false; // EXEC and DISCARD unwatch everything
          if (scanner.cmd === Cmd.Exec && this.queuedTopology.length > 0) {
            // The transaction queued CLUSTER SLOTS-like commands: their replies in EXEC's array are rewritten.
            const entries = this.queuedTopology;
            this.captureReply((reply, nodes, announce) => rewriteExecReply(entries, reply, nodes, announce));
            this.afterAsking = false;
            this.ctx.stats.commandsForwarded++;
            return;
          }
        }
        break;
      case Cmd.Watch:
        if (argc >= 2 && !this.inMulti) this.watching = true;
        break;
      case Cmd.Unwatch:
        if (argc === 1 && !this.inMulti) this.watching = false;
        break;
      case Cmd.Reset:
        if (argc === 1) {
          this.inMulti = false;
          this.queuedTopology = [];
          this.watching = false;
          this.scriptProven = false;
        }
        break;
      case Cmd.Auth:
        this.scriptProven = false; // another user may not be allowed to run scripts
        break;
      case Cmd.Uncountable:
        this.enterPipe();
        return;
      case Cmd.Client:
        // Inline arguments are not captured: any inline CLIENT could be CLIENT REPLY.
        if (scanner.inline || (argc >= 2 && scanner.keyLength === REPLY.length && equalsIgnoreCase(scanner.key, 0, REPLY))) {
          this.enterPipe();
          return;
        }
        break;
      case Cmd.Cluster: {
        const kind = this.ctx.cluster && argc >= 2 ? this.topologyKind() : undefined;
        if (kind === undefined) break;
        if (queued) {
          // Its reply comes inside EXEC's array.
          this.queuedTopology.push({ index: this.queued, kind });
          break;
        }
        this.captureReply((reply, nodes, announce) => rewriteTopologyReply(kind, reply, nodes, announce));
        this.afterAsking = false;
        this.ctx.stats.commandsForwarded++;
        return;
      }
    }
    if (queued) this.queued++;
    this.afterAsking = scanner.cmd === Cmd.Asking;
    this.expectReplies(1);
    this.ctx.stats.commandsForwarded++;
  }

  /**
   * For CLUSTER SLOTS, SHARDS, NODES and REPLICAS, which reply carries node
   * addresses; null for an inline CLUSTER, whose subcommand is not captured
   * (its reply's shape tells); undefined for other subcommands.
   */
  private topologyKind(): TopologyReply | null | undefined {
    const scanner = this.scanner;
    if (scanner.inline) return null;
    return topologyReplyOf(scanner.key.toString('latin1', 0, scanner.keyLength)) ?? undefined;
  }

  /** Takes the reply to the frame being forwarded aside, and sends the client its rewritten form. */
  private captureReply(rewrite: (reply: Buffer, nodes: NodeDirectory, announce: Announce) => Buffer): void {
    const cluster = this.ctx.cluster as ClusterReplies;
    this.captures.push({
      handle: (reply) => {
        const rewritten = rewrite(reply, cluster.nodes, this.announce());
        if (rewritten !== reply) this.ctx.stats.topologyRepliesRewritten++;
        this.writeClient(rewritten);
      },
      after: 0,
    });
    this.replyPipe = false;
  }

  /** Where this connection's replies point clients: the announce host, or the address the client connected to. */
  private announce(): Announce {
    if (this.announceCache === undefined) {
      const local = (this.client.localAddress ?? '127.0.0.1').replace(/^::ffff:(?=\d+\.)/, '');
      const upstream = this.upstreamAddress;
      const upstreamHost = upstream.startsWith('[') ? upstream.slice(1, upstream.indexOf(']')) : upstream.slice(0, upstream.lastIndexOf(':'));
      this.announceCache = {
        host: this.ctx.cluster?.announceHost ?? local,
        upstreamHost,
        tls: this.ctx.upstream.target.tls,
        listenerTls: (this.client as Partial<TLSSocket>).encrypted === true,
      };
    }
    return this.announceCache;
  }

  /** Replies to come for frames just forwarded: after the last proxy command in flight, if any. */
  private expectReplies(count: number): void {
    if (this.captures.length === 0) this.outstanding += count;
    else this.captures[this.captures.length - 1].after += count;
  }

  /** Stops interpreting this connection: from here on bytes pass untouched both ways. */
  private enterPipe(): void {
    this.mode = Mode.Pipe;
    this.stopHoldTimer();
    // Replies stop being counted, unless a pipelined script reply is still due: then after it.
    if (this.captures.length === 0) this.replyPipe = true;
  }

  // ----------------------------------------------------------- lock blocks

  private startHoldTimer(): void {
    this.holdTimer = setTimeout(() => this.onHoldTimeout(), this.ctx.holdMs);
    this.holdTimer.unref();
  }

  private stopHoldTimer(): void {
    if (this.holdTimer !== undefined) {
      clearTimeout(this.holdTimer);
      this.holdTimer = undefined;
    }
  }

  private onHoldTimeout(): void {
    this.holdTimer = undefined;
    if (this.mode !== Mode.Holding) return;
    this.toUpstream.begin();
    this.release('hold-timeout');
    this.toUpstream.end();
  }

  /** Sends the held bytes upstream unchanged and goes back to forwarding. */
  private release(reason: string): void {
    this.stopHoldTimer();
    this.mode = Mode.Normal;
    this.ctx.stats.countRelease(reason);
    const held = this.held;
    this.held = [];
    this.writeUpstream(joined(held));
    this.accountHeldFrames();
    this.afterAsking = false;
  }

  /** The frames of a released block reach Redis: one reply each, and MULTI/EXEC change the state. */
  private accountHeldFrames(): void {
    const step = this.matcher.step;
    const frames = 1 + (step >= BlockStep.Expire ? 1 : 0) + (step >= BlockStep.Exec ? 1 : 0) + (step >= BlockStep.Complete ? 1 : 0);
    this.expectReplies(frames);
    this.inMulti = step !== BlockStep.Complete;
    this.queued = frames - 1; // all but the MULTI (an EXEC completes the block, and the transaction)
    this.queuedTopology = [];
    if (step === BlockStep.Complete) this.watching = false;
  }

  /** A whole lock block is held. Returns true when its script was sent (the client side now waits). */
  private onBlockComplete(): boolean {
    this.stopHoldTimer();
    const rule = this.matcher.rule as Rule; // set whenever a block completes
    const call = this.matcher.call();
    this.ctx.stats.blockSeen(rule.name);
    if (rule.mode === 'observe' || this.ctx.mode === 'observe') {
      this.ctx.stats.blockObserved(rule.name);
      this.log.info({ rule: rule.name, key: describeKey(call.key) }, 'observe: lock block would be rewritten');
      this.release('observe');
      return false;
    }
    this.mode = Mode.Normal;
    const block: PendingBlock = { call, rule, held: this.held, asking: this.afterAsking };
    this.held = [];
    this.afterAsking = false;
    // With --lock-pipelining, once the script has worked on this connection, what follows the
    // block is forwarded at once instead of waiting for the script's reply.
    const pipelined = this.ctx.lockPipelining && this.scriptProven;
    if (pipelined) this.ctx.stats.blocksPipelined++;
    this.sendScript(block, false, pipelined);
    return !pipelined;
  }

  private sendScript(block: PendingBlock, withSource: boolean, pipelined: boolean): void {
    if (!pipelined) this.awaiting = 'script';
    this.replyPipe = false;
    if (withSource) this.askAgain(block);
    this.writeUpstream(encodeLockCall(block.call, withSource));
    this.captures.push({ handle: (reply) => this.onScriptReply(reply, block, withSource, pipelined), after: 0 });
    if (!pipelined) this.updateFlow();
  }

  private onScriptReply(reply: Buffer, block: PendingBlock, withSource: boolean, pipelined: boolean): void {
    const outcome = translateScriptReply(reply);
    switch (outcome.kind) {
      case 'replies':
        this.ctx.stats.blockRewritten(block.rule.name);
        this.scriptProven = true;
        this.writeClient(outcome.bytes);
        break;
      case 'error':
        if (pipelined) {
          if (this.ctx.cluster && CLUSTER_REDIRECT.test(outcome.message)) this.answerRedirected(reply, outcome.message, block);
          else this.abandonPipelining(outcome.message, block);
          return;
        }
        if (!withSource && outcome.message.startsWith('-NOSCRIPT')) {
          // The script cache was flushed (SCRIPT FLUSH, restart, failover): send the source. Nothing
          // else was sent after the EVALSHA, so nothing is reordered.
          this.ctx.stats.scriptReloads++;
          this.sendScript(block, true, false);
          return;
        }
        this.fallBack(outcome.message, block);
        break;
      case 'unexpected':
        this.log.error({ reply: outcome.message, key: describeKey(block.call.key) }, 'cannot interpret the script reply; closing the connection');
        this.client.destroy();
        this.upstream.destroy();
        return;
    }
    if (!pipelined) this.liftBarrier();
  }

  /** The script could not run: the original block goes upstream as the client sent it. */
  private fallBack(message: string, block: PendingBlock): void {
    const reason = this.noteFallback(message, block, 'lock script could not run; sending the original block unchanged (logged once per connection and reason)');
    this.ctx.stats.blockFallback(block.rule.name, reason);
    this.askAgain(block);
    this.writeUpstream(joined(block.held));
    this.expectReplies(4);
  }

  /**
   * The block followed an ASKING, which the first script call used up: a
   * retry or the fallback sends ASKING again, and its +OK stays with the proxy.
   */
  private askAgain(block: PendingBlock): void {
    if (!block.asking) return;
    this.writeUpstream(ASKING);
    this.captures.push({ handle: () => {}, after: 0 });
  }

  /**
   * A pipelined script call was refused by the cluster's key check (-MOVED,
   * -ASK, -TRYAGAIN, -CLUSTERDOWN). Redis refuses the block's INCR[BY] and
   * [P]EXPIRE on the same key with the same error and then aborts the EXEC,
   * having run nothing: the client gets exactly those replies.
   */
  private answerRedirected(reply: Buffer, message: string, block: PendingBlock): void {
    const reason = this.noteFallback(message, block, 'pipelined lock script redirected by the cluster; answering as Redis answers the block');
    this.ctx.stats.blockFallback(block.rule.name, reason);
    const error = (this.ctx.cluster && rewriteRedirect(reply, this.ctx.cluster.nodes, this.announce())) || reply;
    this.writeClient(Buffer.concat([MULTI_OK, error, error, EXECABORT]));
  }

  /**
   * A pipelined script call failed where the script had worked before (an ACL
   * change, SCRIPT FLUSH, a busy or out-of-memory server). What the client sent
   * after the block has already run, so sending the block now would reorder it:
   * the connection is closed instead, after the replies that precede the block,
   * as if the network had failed. The client's reconnection starts unproven, so
   * its first block takes the ordered path with the fallback.
   */
  private abandonPipelining(message: string, block: PendingBlock): void {
    const reason = this.noteFallback(message, block, 'pipelined lock script failed; closing the connection to keep the order of commands');
    this.ctx.stats.blockFallback(block.rule.name, `${reason} (connection closed)`);
    this.captures = [];
    this.endClient();
    this.upstream.destroy();
  }

  /** Logs a script failure once per connection and reason; returns the reason (the error's first word). */
  private noteFallback(message: string, block: PendingBlock, text: string): string {
    const reason = /^-(\S+)/.exec(message)?.[1] ?? 'ERR';
    if (!this.fallbackReasonsLogged.has(reason)) {
      this.fallbackReasonsLogged.add(reason);
      // A redirect is routine in a cluster (the client follows it), not a problem to report.
      this.log[CLUSTER_REDIRECT.test(message) ? 'debug' : 'warn']({ reason, error: message, rule: block.rule.name, key: describeKey(block.call.key) }, text);
    }
    return reason;
  }

  /** The proxy's own command is answered: forward what the client sent meanwhile. */
  private liftBarrier(): void {
    this.awaiting = null;
    this.toUpstream.begin();
    while (this.awaiting === null && this.stalled.length > 0) {
      const chunk = this.stalled.shift() as Buffer;
      this.processClientChunk(chunk);
    }
    this.toUpstream.end();
    if (this.mode === Mode.Pipe && this.captures.length === 0) this.replyPipe = true;
    if (this.awaiting === null && this.clientEnded) this.finishClientEnd();
    this.updateFlow();
    if (this.draining) this.closeIfDrained();
  }

  // -------------------------------------------------------- server to client

  private onUpstreamData(chunk: Buffer): void {
    this.ctx.stats.bytesFromUpstream += chunk.length;
    if (this.replyPipe && !this.redirectScan) {
      this.writeClient(chunk);
      return;
    }
    this.toClient.begin();
    this.processReplyChunk(chunk);
    this.toClient.end();
    if (this.draining) this.closeIfDrained();
  }

  private processReplyChunk(chunk: Buffer): void {
    const scanner = this.replies;
    scanner.newChunk();
    let pos = 0;
    /** Start of the bytes of this chunk not yet forwarded or captured. */
    let from = 0;
    while (pos < chunk.length && !this.client.destroyed) {
      if (this.replyPipe) {
        // Replies are no longer counted; in cluster mode, redirects still name nodes.
        if (!this.redirectScan) break;
        pos = scanner.scan(chunk, pos, Number.MAX_SAFE_INTEGER);
        if (scanner.error !== '') {
          this.redirectScan = false;
          break;
        }
        if (scanner.errorEnded && this.redirects !== null) from = this.redirects.lineEnded(chunk, from, pos);
        continue;
      }
      if (this.captures.length === 0 || this.outstanding > 0) {
        const limit = this.captures.length === 0 ? Number.MAX_SAFE_INTEGER : this.outstanding;
        pos = scanner.scan(chunk, pos, limit);
        if (scanner.error !== '') return this.replyDesync(chunk, from, scanner.error);
        this.outstanding -= scanner.replies;
        if (scanner.errorEnded && this.redirects !== null) from = this.redirects.lineEnded(chunk, from, pos);
        if (this.outstanding < 0) this.unexpectedReplies(chunk, from);
        continue;
      }
      // The next reply that is not a push answers the proxy's own command (or is one it rewrites).
      const frameBegin = scanner.atFrameBoundary ? pos : from;
      pos = scanner.scan(chunk, pos, 1, true);
      if (scanner.error !== '') return this.replyDesync(chunk, from, scanner.error);
      if (scanner.isPush) continue;
      this.writeClient(chunk.subarray(from, frameBegin));
      this.captureParts.push(chunk.subarray(frameBegin, pos));
      from = pos;
      if (scanner.atFrameBoundary) {
        const reply = this.captureParts.length === 1 ? this.captureParts[0] : Buffer.concat(this.captureParts);
        this.captureParts = [];
        const capture = this.captures.shift() as Capture;
        this.outstanding += capture.after;
        capture.handle(reply);
        // A connection that became a plain pipe while the proxy's command was in flight needs no more counting.
        if (this.mode === Mode.Pipe && this.captures.length === 0) this.replyPipe = true;
      }
    }
    if (from >= chunk.length) return;
    if (scanner.inErrorLine && this.redirects?.holdAtChunkEnd(chunk, from)) return;
    this.writeClient(from === 0 ? chunk : chunk.subarray(from));
  }

  /** More replies than requests: something the proxy did not account for. It stops interpreting. */
  private unexpectedReplies(chunk: Buffer, from: number): void {
    this.outstanding = 0;
    if (this.captures.length > 0) {
      this.replyDesync(chunk, from, 'more replies than requests');
      return;
    }
    this.log.debug('more replies than requests; no longer interpreting this connection');
    this.flushPending('unexpected-reply');
    this.enterPipe();
  }

  private replyDesync(chunk: Buffer, from: number, reason: string): void {
    this.redirectScan = false;
    if (this.captures.length === 0) {
      this.log.warn({ reason }, 'cannot follow the reply stream; no longer interpreting this connection');
      this.writeClient(chunk.subarray(from));
      this.flushPending('unreadable-reply');
      this.enterPipe();
      return;
    }
    // The proxy's own reply cannot be found: the connection's state is unknown. Never fake it.
    this.log.error({ reason }, 'cannot follow the reply stream while a script reply is due; closing the connection');
    this.client.destroy();
    this.upstream.destroy();
  }
}

/** Whether Redis queues `cmd` inside MULTI (the transaction's own commands run at once). */
function queuedInMulti(cmd: Cmd): boolean {
  return cmd !== Cmd.Multi && cmd !== Cmd.Exec && cmd !== Cmd.Discard && cmd !== Cmd.Watch && cmd !== Cmd.Reset && cmd !== Cmd.Empty;
}

/** One buffer for several (held bytes are small), so that they go out in one write. */
function joined(parts: Buffer[]): Buffer {
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}

/**
 * Collects the writes made while one chunk is processed, so that they leave in
 * one write (the usual case, no cork needed) or one writev, instead of one
 * system call each. Outside begin()/end() a write goes out at once.
 */
class WriteBatch {
  private readonly parts: Buffer[] = [];
  private depth = 0;

  constructor(
    private readonly socket: net.Socket,
    private readonly send: (bytes: Buffer) => void,
  ) {}

  begin(): void {
    this.depth++;
  }

  add(bytes: Buffer): void {
    if (this.depth === 0) this.send(bytes);
    else this.parts.push(bytes);
  }

  end(): void {
    if (--this.depth === 0) this.flush();
  }

  /** Sends what is collected now (before the socket is ended, for example). */
  flush(): void {
    const parts = this.parts;
    if (parts.length === 0) return;
    if (parts.length === 1) {
      // The usual case: one write, and the array is reused rather than replaced.
      const only = parts[0];
      parts.length = 0;
      this.send(only);
      return;
    }
    const all = parts.splice(0);
    this.socket.cork();
    for (const part of all) this.send(part);
    this.socket.uncork();
  }
}
