/**
 * One client connection and its own upstream connection (1:1): their lifecycle (half-close both
 * ways, shutdown, idle timeout) and what waits for what. The upstream's start is upstream-start.ts,
 * the client's lingering end client-end.ts, which side pauses which flow-control.ts.
 *
 * Client to server: RequestFlow takes each chunk (request-flow.ts); while a command of the proxy's
 * own is in flight, client chunks wait here, so Redis executes everything in the order the client
 * sent it. Server to client: ReplyStream counts replies and takes the proxy's own aside; once the
 * connection is a plain pipe, bytes pass untouched. With --cluster, NodeReplies rewrites addresses.
 */
import type net from 'node:net';
import { formatAddress } from '../address.js';
import { NodeReplies } from '../cluster/node-replies.js';
import type { Logger } from '../log.js';
import type { ProxyContext } from './context.js';
import { ReplyStream, type ReplyStreamPort } from './reply-stream.js';
import { UpstreamStart, type UpstreamStartPort } from './upstream-start.js';
import { askWayAhead } from './server-way.js';
import { RequestFlow, type RequestFlowPort } from './request-flow.js';
import { UpstreamWatch } from './upstream-watch.js';
import { ClientEnd } from './client-end.js';
import { listenGuarded } from './guarded.js';
import { FlowControl } from './flow-control.js';
import { DeferredWrites, WriteBatch } from './write-batch.js';

let nextSessionId = 1;

/**
 * How long the client's bytes wait for Redis to close after QUIT once its reply is in (Redis closes
 * as soon as it has written it), before they go on after all.
 */
const CLOSE_WAIT_MS = 2_000;
/**
 * How long the upstream may stay open after the client's end went to it: Redis closes a
 * connection as soon as it reads its end, so only an upstream that is not Redis keeps it longer.
 */
const UPSTREAM_CLOSE_WAIT_MS = 10_000;

export class Session implements RequestFlowPort, ReplyStreamPort, UpstreamStartPort {
  readonly id = nextSessionId++;
  /** The upstream address dialled (the master of the moment, with sentinel). */
  readonly upstreamAddress: string;
  private logger: Logger | undefined;
  private readonly upstream: net.Socket;
  private readonly requests: RequestFlow;
  private readonly replies: ReplyStream;
  private closed = false;
  /** Shutting down: close as soon as nothing is in flight. */
  private draining = false;
  /** Client chunks that arrived while the proxy's own command was in flight. */
  private stalled: Buffer[] = [];
  /**
   * What client bytes wait for: the proxy's own command in flight ('setup', or 'block': the lock
   * flow's), Redis's close ('close', after QUIT or a protocol error), or nothing (null).
   */
  private awaiting: 'setup' | 'block' | 'close' | null = null;
  private clientEnded = false;
  /** The connection is closing (Redis closed it, or the proxy does): nothing more goes upstream; what the client sends is dropped. */
  private closing = false;
  /**
   * The lingering close of the client's side (client-end.ts). Every timer a session starts is
   * cleared when its connection closes: a timer's closure would keep the whole session (both
   * sockets, the scanners, their buffers) alive until it fires.
   */
  private readonly clientEnd: ClientEnd;
  /**
   * How long the client's bytes wait for Redis's close after QUIT (awaitClose), or the upstream
   * after the client's end, or after the session closed with its end on the way to Redis.
   */
  private closeWait: NodeJS.Timeout | undefined;
  /** Which side pauses which (flow-control.ts). */
  private readonly flow: FlowControl;
  /** A fault ended the session (fault()). */
  private faulted = false;
  /** The connect, the URL's AUTH/SELECT, and the refusals when they fail (upstream-start.ts). */
  private readonly start: UpstreamStart;
  /** --upstream-timeout-ms, when set. */
  private readonly watch: UpstreamWatch | null;
  /** Writes made while one chunk is processed leave together. */
  private readonly toUpstream: DeferredWrites;
  private readonly toClient: WriteBatch;

  constructor(
    private readonly client: net.Socket,
    private readonly ctx: ProxyContext,
    /** Called once when both sockets are closed. */
    private readonly onClosed: (session: Session) => void = () => {},
  ) {
    ctx.stats.connectionsOpen++;
    ctx.stats.connectionsTotal++;
    this.toClient = new WriteBatch(client, (bytes) => this.flow.toClient(bytes));
    this.clientEnd = new ClientEnd(client, () => this.toClient.flush());
    const { socket, readyEvent, address, host, ownReads } = ctx.upstream.connect({
      receive: (bytes) => this.onOwnRead(bytes),
      writeRefused: (error) => this.onUpstreamWriteRefused(error),
    });
    this.upstream = socket;
    this.upstreamAddress = address;
    this.flow = new FlowControl(
      client,
      socket,
      () => this.updateFlow(),
      (paused) => {
        // No bound blames Redis while the proxy itself does not read what Redis sends.
        this.replies.readsPaused(paused);
        this.watch?.pause(paused);
        if (!paused) this.awaitCloseOnceAnswered();
      },
    );
    // Deferred: what Redis sent before it closed is read before more is written to it (write-batch.ts).
    this.toUpstream = new DeferredWrites(socket, (bytes) => this.flow.toUpstream(bytes));
    const nodes = ctx.cluster ? new NodeReplies(ctx.cluster, client, host, ctx.upstream.target.tls, ctx.stats) : null;
    this.replies = new ReplyStream(this, nodes?.redirects ?? null, ctx.ownReplyTimeoutMs);
    this.requests = new RequestFlow(this, this.replies, ctx, nodes);
    this.watch = ctx.upstreamTimeoutMs > 0 ? new UpstreamWatch(ctx.upstreamTimeoutMs, this) : null;
    if (ctx.log.isLevelEnabled('debug')) this.log.debug({ upstream: address }, 'client connected');

    socket.setTimeout(ctx.connectTimeoutMs);
    this.start = new UpstreamStart(this, socket, address, this.replies, ctx);
    socket.on(readyEvent, () => this.start.ready());
    this.startSetup();
    if (ctx.idleTimeoutMs > 0) {
      client.setTimeout(ctx.idleTimeoutMs);
      this.listen(client, 'timeout', () => this.onIdle());
    }
    this.listen(client, 'data', (chunk: Buffer) => this.onClientData(chunk));
    this.listen(client, 'end', () => this.onClientEnd());
    client.on('error', (err) => {
      if (ctx.log.isLevelEnabled('debug')) this.log.debug({ err: err.message }, 'client socket error');
    });
    client.on('close', () => {
      this.clientEnd.stop();
      this.onClose();
    });
    this.listen(client, 'drain', () => this.flow.drained('client'));
    socket.on('timeout', () => this.start.timedOut());
    if (!ownReads) this.listen(socket, 'data', (chunk: Buffer) => this.onUpstreamData(chunk));
    this.listen(socket, 'end', () => this.onUpstreamEnd());
    this.listen(socket, 'error', (err: Error) => this.onUpstreamError(err));
    socket.on('close', () => this.onClose());
    this.listen(socket, 'drain', () => this.flow.drained('upstream'));
  }

  /** Listens to `event` so that an exception in `handle` ends this session (fault), never the process (guarded.ts). */
  private listen<A extends unknown[]>(emitter: net.Socket, event: string, handle: (...args: A) => void): void {
    listenGuarded(emitter, event, handle, (error) => this.fault(error));
  }

  /**
   * An exception on this connection's data path: its state is unknown, so it closes as a network
   * failure would (both sockets at once: what was half-written to the client may not be whole),
   * logged with the cause and counted (session_faults_total). Other connections go on.
   */
  fault(error: unknown): void {
    if (this.faulted) return;
    this.faulted = true;
    this.ctx.stats.sessionFaults++;
    this.log.error(
      { err: error, upstream: this.upstreamAddress },
      "fault on this connection's data path; closing it as a network failure would (other connections go on)",
    );
    this.closing = true;
    this.toUpstream.discard();
    this.stalled = [];
    try {
      this.requests.closingWithRepliesDue();
    } finally {
      this.destroy();
    }
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
  startSetup(): boolean {
    return this.start.sendSetup();
  }

  /** The client's bytes wait for the upstream URL's AUTH/SELECT to be answered. */
  awaitSetup(): void {
    this.awaiting = 'setup';
    this.updateFlow();
  }

  private onUpstreamError(err: Error): void {
    if (!this.start.connected) return this.start.failed(err);
    // A reset after Redis's last reply is how Redis closes when bytes it never read were arriving.
    this.log.debug({ upstream: this.upstreamAddress, err: err.message }, 'upstream connection closed with an error');
    this.onUpstreamEnd();
  }

  /**
   * Redis closed while bytes were on their way to it (upstream-socket.ts): nothing more goes
   * upstream, what the client sends is dropped, and reading goes on; the end of the reads closes
   * the client side (onUpstreamEnd) once what Redis sent first has been passed on.
   */
  private onUpstreamWriteRefused(error: Error): void {
    this.log.debug({ upstream: this.upstreamAddress, err: error.message }, 'upstream closed; reading what it sent before');
    this.closing = true;
    this.toUpstream.discard();
    this.stalled = [];
    this.updateFlow();
  }

  /** Redis closed its side: everything it sent is passed on, then the client side closes. */
  private onUpstreamEnd(): void {
    if (this.closed) {
      this.upstream.destroy(); // a lingering upstream (lingerUpstream): Redis has closed too
      return;
    }
    // Redis closed on its own (a restart, a failover, CLIENT KILL): the server behind the address may change.
    if (!this.clientEnded && this.awaiting !== 'close') {
      this.ctx.serverMethods.forget(this.upstreamAddress);
      askWayAhead(this.ctx, this.upstreamAddress);
    }
    this.toUpstream.discard();
    this.stalled = [];
    this.awaiting = null;
    this.replies.flush();
    this.endClient();
  }

  /** Closes the client side as Redis does after its last reply, but so that the client reads it (client-end.ts). */
  private endClient(last?: string): void {
    this.closing = true;
    this.updateFlow();
    this.clientEnd.end(last);
  }

  /** No bytes either way for --idle-timeout-ms: close, unless a reply is pending or the connection is subscribed. */
  private onIdle(): void {
    if (this.replies.pending || this.awaiting !== null || this.requests.pipe.active) return;
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
    const inFlight = this.replies.pending || this.awaiting !== null || this.requests.holding;
    if (this.replies.capturing || (!this.requests.pipe.active && inFlight)) return;
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
  refuseClient(message: string): void {
    const oneLine = message.replace(/[\r\n]+/g, ' ');
    this.endClient(`-ERR redis-lock-proxy: ${oneLine}\r\n`);
    this.upstream.destroy();
  }

  private onClientEnd(): void {
    this.clientEnded = true;
    if (this.awaiting === null) this.finishClientEnd();
  }

  /**
   * The client sends no more: what it sent goes on as it is (Redis drops an unfinished block
   * itself), then the end; Redis closes on it, and an upstream that does not is cut off.
   */
  private finishClientEnd(): void {
    this.requests.flushPending('client-closed');
    this.toUpstream.flush();
    this.upstream.end();
    clearTimeout(this.closeWait);
    this.closeWait = unrefTimer(() => this.destroy(), UPSTREAM_CLOSE_WAIT_MS);
  }

  private onClose(): void {
    if (this.closed) return;
    this.closed = true;
    this.requests.stop();
    this.replies.stop();
    this.watch?.stop();
    clearTimeout(this.closeWait);
    this.ctx.stats.connectionsOpen--;
    // A side being ended still has its last bytes on the way: it closes itself once they are out
    // (the client within its cut-off), and the upstream once Redis closes too, within a bound.
    if (!this.client.writableEnded) this.client.destroy();
    if (!this.upstream.writableEnded || this.upstream.readableEnded) this.upstream.destroy();
    else if (!this.upstream.destroyed) this.lingerUpstream();
    if (this.ctx.log.isLevelEnabled('debug')) this.log.debug('connection closed');
    this.onClosed(this);
  }

  /**
   * The session is closed with the client's end on its way to Redis, which closes once it has read
   * it: the client's last commands must not be cut off by a reset. What Redis still sends has
   * nowhere to go, so it is read and dropped (a paused socket would never see Redis's close);
   * Redis's close destroys the socket (onUpstreamEnd), and an upstream that does not close is cut
   * off after UPSTREAM_CLOSE_WAIT_MS.
   */
  private lingerUpstream(): void {
    this.flow.clientFull = false;
    this.flow.repliesHeld = false;
    this.updateFlow();
    this.closeWait = unrefTimer(() => this.upstream.destroy(), UPSTREAM_CLOSE_WAIT_MS);
  }

  // ------------------------------------------------------------ flow control

  writeUpstream(bytes: Buffer): void {
    // Once closing, Redis reads nothing more (it closed, or the proxy closes).
    if (bytes.length === 0 || this.closing) return;
    this.toUpstream.add(bytes);
    this.watch?.sent();
  }

  writeClient(bytes: Buffer): void {
    // Once the client side is ended (a refusal, an abandoned pipeline), nothing more is sent to it.
    if (bytes.length > 0 && !this.client.writableEnded) this.toClient.add(bytes);
  }

  /** A slow side pauses the other; a command of the proxy's in flight pauses the client. */
  private updateFlow(): void {
    this.flow.update(this.awaiting !== null, this.closing);
  }

  // ------------------------------- what RequestFlow and ReplyStream ask (their ports)

  stall(rest: Buffer): void {
    this.stalled.unshift(rest);
  }

  /**
   * QUIT went upstream: the client's next bytes wait for Redis's close. Redis closes once it has
   * written QUIT's reply, and reads nothing after it: bytes that reached it meanwhile would make
   * its close a reset, which discards what it had not sent yet. So the wait for the close is
   * bounded only once every reply is in, and while the proxy reads (a client slow to read keeps
   * Redis writing).
   */
  awaitClose(): void {
    this.awaiting = 'close';
    this.updateFlow();
    this.awaitCloseOnceAnswered();
  }

  /** After QUIT, once its reply is in and the proxy reads: Redis closes within CLOSE_WAIT_MS, or what waited goes on. */
  private awaitCloseOnceAnswered(): void {
    if (this.awaiting !== 'close' || this.closeWait !== undefined || this.replies.pending || this.flow.upstreamPaused) return;
    this.closeWait = unrefTimer(() => {
      // Redis did not close (a server that reads on): forward what waited, in order.
      if (this.awaiting === 'close' && !this.closing) this.resumeClient();
    }, CLOSE_WAIT_MS);
  }

  holdClient(): void {
    this.awaiting = 'block';
    this.updateFlow();
  }

  /** The proxy's own command is answered: forward what the client sent meanwhile. */
  resumeClient(): void {
    clearTimeout(this.closeWait);
    this.closeWait = undefined;
    this.awaiting = null;
    while (this.awaiting === null && this.stalled.length > 0) {
      const chunk = this.stalled.shift() as Buffer;
      this.requests.process(chunk);
    }
    if (this.awaiting === null && this.clientEnded) this.finishClientEnd();
    this.updateFlow();
    if (this.draining) this.closeIfDrained();
  }

  closeAfterReplies(): void {
    this.endClient();
    this.upstream.destroy();
  }

  get clientGone(): boolean {
    return this.client.destroyed;
  }

  untracked(reason: string, tooManyReplies: boolean): void {
    if (tooManyReplies) this.log.debug('more replies than requests; no longer interpreting this connection');
    else this.log.warn({ reason }, 'cannot follow the reply stream; no longer interpreting this connection');
    this.requests.flushPending(tooManyReplies ? 'unexpected-reply' : 'unreadable-reply');
    this.requests.enterPipe(false);
  }

  repliesWaiting(waiting: boolean): void {
    this.flow.repliesHeld = waiting;
    this.updateFlow();
    if (!waiting && this.draining) this.closeIfDrained();
  }

  /** Redis did not answer a command of the proxy's own in time: the connection's state is unknown, as after a network failure. */
  ownReplyLate(what: string, waitedMs: number): void {
    this.ctx.stats.ownRepliesTimedOut++;
    this.log.error(
      { waiting: what, waitedMs, upstream: this.upstreamAddress },
      "no reply from Redis to a command of the proxy's own in time; closing the connection",
    );
    this.requests.closingWithRepliesDue();
    this.closeAfterReplies();
  }

  blockingSent(): void {
    this.watch?.blockingSent();
  }

  /** A reply is due from Redis: one whose command is whole upstream (not the one the client is still sending). */
  get awaitingReply(): boolean {
    return !this.requests.pipe.active && !this.closing && this.replies.dueBeyond(this.requests.replyAwaitsRestOfFrame ? 1 : 0);
  }

  /** --upstream-timeout-ms passed with a reply due and nothing from Redis: closed as a network failure would. */
  upstreamSilent(ms: number): void {
    this.ctx.stats.upstreamTimeouts++;
    this.log.warn(
      { upstream: this.upstreamAddress, silentMs: ms },
      'no reply from Redis within --upstream-timeout-ms; closing the connection',
    );
    this.requests.closingWithRepliesDue();
    this.closeAfterReplies();
  }

  /** The proxy's own reply cannot be found: the connection's state is unknown. Never fake it. */
  lost(reason: string): void {
    this.log.error({ reason }, "cannot follow the reply stream while a reply of the proxy's own is due; closing the connection");
    this.requests.closingWithRepliesDue();
    this.closeAfterReplies();
  }

  // -------------------------------------------------------- client to server

  private onClientData(chunk: Buffer): void {
    this.ctx.stats.bytesFromClients += chunk.length;
    if (this.closing) return; // Redis would never read it either
    if (this.awaiting !== null) {
      this.stalled.push(chunk);
      return;
    }
    this.requests.process(chunk);
  }

  // -------------------------------------------------------- server to client

  /** A read into the connection's own buffer (read-buffer.ts): true when its bytes are still referenced after the call. */
  private onOwnRead(bytes: Buffer): boolean {
    try {
      this.onUpstreamData(bytes);
    } catch (error) {
      this.fault(error);
    }
    // A write to the client that did not reach the kernel whole goes on from that memory later.
    return this.client.writableLength > 0;
  }

  private onUpstreamData(chunk: Buffer): void {
    this.ctx.stats.bytesFromUpstream += chunk.length;
    if (this.closed) return; // the client is gone: read only to see Redis's close (lingerUpstream)
    if (!this.start.speaksResp(chunk)) return;
    if (this.replies.passingThrough) {
      this.writeClient(chunk);
    } else {
      this.toClient.begin();
      this.replies.process(chunk);
      this.toClient.end();
      if (this.draining) this.closeIfDrained();
    }
    // After the chunk's replies are counted: the watch asks what is still due.
    this.watch?.heard();
    this.awaitCloseOnceAnswered();
  }
}

/** A timer that does not keep the process alive. */
function unrefTimer(fire: () => void, ms: number): NodeJS.Timeout {
  const timer = setTimeout(fire, ms);
  timer.unref();
  return timer;
}
