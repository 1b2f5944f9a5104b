/**
 * The client-to-server side of one connection: the loop over client chunks. Bytes go upstream as
 * they arrive, in order; frames are classified from their heads once those are complete
 * (TransactionState), but forwarding never waits to learn them. Lock blocks are found as they
 * stream (lock/streamed-blocks.ts): their expiry gains NX as it passes, or goes as the expiry
 * script (expiry-substitution.ts), and the only bytes kept back are those of a frame that may
 * still be that expiry, until its head is read (Redis waits for a whole frame too). Only the
 * script way holds a MULTI that may start a lock block (lock/block-flow.ts). The replies each
 * forwarded frame brings are announced to the reply side (ReplyStream).
 *
 * With --lock-method auto, the server's version is learnt once per upstream address (and again
 * after the server closed a connection on its own): HELLO goes right before the first MULTI, which
 * waits for the answer (server-way.ts). Every later MULTI to that address waits for nothing.
 *
 * When replies cannot be counted the connection becomes a plain pipe (plain-pipe.ts), which a
 * RESET may end.
 */
import type { NodeReplies } from '../cluster/node-replies.js';
import { joined, LockBlocks, type LockBlockPort } from '../lock/block-flow.js';
import { BLOCK_COMMANDS } from '../lock/block-shape.js';
import { ExpirySubstitution } from './expiry-substitution.js';
import { CountedFrames } from './counted-frames.js';
import { LockReplies } from './lock-replies.js';
import { PlainPipe } from './plain-pipe.js';
import { ServerWay } from './server-way.js';
import { expiryWithNx } from '../lock/expire-nx.js';
import { countFixedShape } from '../lock/fixed-shape.js';
import { StreamedBlocks, type FixedExec, type PairOutcome, type UnfixedReason } from '../lock/streamed-blocks.js';
import type { Logger } from '../log.js';
import { Cmd } from '../resp/commands.js';
import { END, HEAD, MALFORMED, RequestScanner } from '../resp/request-scanner.js';
import { VerifyConnection } from '../verify-connection.js';
import type { ProxyContext } from './context.js';
import type { ReplyStream } from './reply-stream.js';
import { FrameMeaning, TransactionState } from './transaction-state.js';

/** What the client-to-server side needs of its session. */
export interface RequestFlowPort {
  /** Bytes for Redis, in order. */
  writeUpstream(bytes: Buffer): void;
  /** Bytes for the client, in order. */
  writeClient(bytes: Buffer): void;
  /** The rest of a chunk waits for a reply of the proxy's own (the session feeds it back later). */
  stall(rest: Buffer): void;
  /** Sends the upstream URL's AUTH/SELECT (after RESET); true when sent, and the client's next bytes then wait. */
  startSetup(): boolean;
  /**
   * Redis reads nothing after what was just sent (QUIT) and closes: the client's next bytes wait
   * for that close, and go with it.
   */
  awaitClose(): void;
  /** The client's next bytes wait until resumeClient(). */
  holdClient(): void;
  resumeClient(): void;
  /** Closes the connection as a network failure would, after what the client has been sent. */
  closeAfterReplies(): void;
  /** A command went upstream whose reply may wait for other clients (BLPOP, XREAD, WAIT, ...). */
  blockingSent(): void;
  /** An exception on the connection's data path, from a timer: it ends the session, never the process. */
  fault(error: unknown): void;
  /** The upstream address this connection dialled: what the server's version is kept for. */
  readonly upstreamAddress: string;
  readonly log: Logger;
}

const { EXPIRE, PEXPIRE } = BLOCK_COMMANDS;

export class RequestFlow {
  private readonly scanner = new RequestScanner();
  /** The fast path over whole frames. */
  private readonly counted: CountedFrames;
  private readonly tx = new TransactionState();
  private readonly blocks: LockBlocks;
  private readonly streamed: StreamedBlocks;
  /** The transaction-script way's pairs (servers without EXPIRE ... NX). */
  private readonly substitution: ExpirySubstitution;
  /** The replies that carry lock blocks' outcomes. */
  private readonly lockReplies: LockReplies;
  /** The server's way for lock blocks, and whether it has RESET. */
  private readonly server: ServerWay;
  /** The connection as a plain pipe, once replies cannot be counted (`active`: bytes go uninterpreted). */
  readonly pipe: PlainPipe;
  /**
   * Bytes of the current frame, from earlier chunks, kept back because they may still be a MULTI
   * that the script way holds or HELLO must go before (at most the 11 bytes before its last), or
   * the expiry of a lock pair, which gains NX (at most its head); any other frame is forwarded.
   */
  private partial: Buffer[] = [];
  /** The frame being read is a QUIT: once it has gone upstream, Redis closes. */
  private quitting = false;
  /** Whether the client named its connection as verify's: its lock blocks are then counted apart, and logged as verify's. */
  private readonly verify: VerifyConnection<ProxyContext>;
  /** The frame whose head was read last had its reply counted when it went upstream. */
  private headCounted = false;
  /**
   * A command queued in a transaction with lock pairs makes the connection a plain pipe once the
   * EXEC has run it (resettable: a RESET can end that pipe); until then the replies are followed,
   * so that the pairs' elements of EXEC's reply are restored and counted.
   */
  private pipeAfterExec: { resettable: boolean } | null = null;

  constructor(
    private readonly port: RequestFlowPort,
    private readonly replies: ReplyStream,
    private readonly ctx: ProxyContext,
    private readonly nodes: NodeReplies | null,
  ) {
    this.verify = new VerifyConnection(ctx, port.log);
    const counting = this.verify.counting;
    // What the lock blocks' parts need of the connection: its own, and the log for their lines (verify's say so).
    const blockLog = (): Logger => this.log;
    const lockPort: LockBlockPort = {
      get log(): Logger {
        return blockLog();
      },
      writeUpstream: (bytes) => port.writeUpstream(bytes),
      writeClient: (bytes) => port.writeClient(bytes),
      blockSent: (frames, complete, key, reason) => this.blockSent(frames, complete, key, reason),
      holdClient: () => port.holdClient(),
      resumeClient: () => port.resumeClient(),
      closeAfterReplies: () => port.closeAfterReplies(),
      fault: (error) => port.fault(error),
    };
    this.blocks = new LockBlocks(lockPort, replies, counting);
    this.streamed = new StreamedBlocks(counting, () => this.log);
    this.substitution = new ExpirySubstitution(lockPort, replies, this.tx, this.streamed);
    this.lockReplies = new LockReplies(replies, lockPort, counting);
    this.server = new ServerWay(port, replies, this.tx, ctx);
    this.pipe = new PlainPipe(port, replies, this.scanner, this.tx, this.server, ctx);
    const server = this.server;
    this.counted = new CountedFrames({
      tx: this.tx,
      streamed: this.streamed,
      replies,
      stats: ctx.stats,
      rules: () => ctx.rules(),
      method: () => server.method(),
      writeUpstream: (bytes) => port.writeUpstream(bytes),
    });
    if (this.pipe.withoutRules) this.enterPipe(true);
  }

  /** Whether client bytes are held or kept back (a lock block, or the start of a MULTI). */
  get holding(): boolean {
    return this.blocks.holding || this.partial.length > 0;
  }

  /**
   * Whether the last reply counted is for a frame the client has not finished sending: it went
   * upstream at its head, so that Redis reads its bytes as they come, but Redis owes no reply to
   * it before its last byte.
   */
  get replyAwaitsRestOfFrame(): boolean {
    const scanner = this.scanner;
    return this.headCounted && !scanner.atFrameBoundary && !scanner.awaitingHead && !this.blocks.holding;
  }

  /** The connection is closed at a bound while replies are due: the lock blocks among them are said (lock-replies.ts). */
  closingWithRepliesDue(): void {
    this.lockReplies.closingWithRepliesDue();
  }

  /** The connection closes: no hold deadline fires any more. */
  stop(): void {
    this.blocks.stopTimer();
  }

  /** The log for lines about this connection's lock blocks: verify's say so. */
  get log(): Logger {
    return this.verify.log;
  }

  /** A held block of the script way went upstream as the client sent it: its first `frames` frames. */
  private blockSent(frames: number, complete: boolean, key: Buffer | null, reason: UnfixedReason): void {
    this.replies.expect(frames);
    this.headCounted = frames > 0;
    this.tx.blockSent(frames, complete);
    this.streamed.released(frames, complete, key, this.ctx.rules(), reason);
  }

  /** One chunk from the client (in order; while the session is not holding the client back). */
  process(chunk: Buffer): void {
    const scanner = this.scanner;
    // Offsets the scanner gives are in this chunk from here on: in a pipe too (plain-pipe.ts).
    scanner.newChunk();
    if (this.pipe.active) {
      this.pipe.chunk(chunk, 0, 0);
      return;
    }
    const blocks = this.blocks;
    if (blocks.holding) blocks.touched();
    let pos = 0;
    /** Start of the bytes of this chunk not yet forwarded or held. */
    let from = 0;
    while (pos < chunk.length) {
      if (scanner.atFrameBoundary && !blocks.holding) {
        pos = this.counted.take(chunk, pos, from);
        from = this.counted.unsentFrom;
        if (pos === chunk.length) break;
      }
      pos = scanner.next(chunk, pos);
      const event = scanner.event;
      if (event === 0) break;
      if (event & MALFORMED) {
        this.port.log.debug({ reason: scanner.malformedReason }, 'malformed request: passing it to Redis unread');
        this.flushPending('malformed');
        this.enterPipe(false);
        // Redis answers with a protocol error and closes, but only once it has read what it needs
        // to tell (the rest of the line, say): what the client sends goes on as it comes. Should
        // it meet Redis's close, the reply is still read first (upstream/upstream-socket.ts).
        this.port.writeUpstream(chunk.subarray(from));
        return;
      }
      if (event & HEAD) {
        this.headCounted = false;
        if (blocks.holding) {
          if (!blocks.accept(scanner, this.ctx.rules())) {
            blocks.release('not-a-lock-block');
            this.forwardFrame(null);
          }
        } else if (this.tx.canStartBlock && LockBlocks.isStart(scanner)) {
          from = this.atMulti(chunk, from);
          if (from < 0) return; // the MULTI waits for the server's version
        } else if (this.streamed.active && this.streamed.isEnforcedExpiry(scanner)) {
          from = this.atExpiry(chunk, from, pos);
          if (from < 0) return; // what follows the expiry waits for Redis's answers to its script
        } else {
          this.flushPartial();
          this.forwardFrame(null);
        }
        this.quitting = scanner.cmd === Cmd.Quit && !blocks.holding && !this.pipe.active;
        if ((event & END) !== 0 && !blocks.holding && !this.pipe.active && this.pipe.resetBeforeSetup(scanner)) {
          // RESET logs the connection out and selects db 0: the URL's AUTH/SELECT go again once it has
          // run (afterReset), and the client's next bytes wait for them.
          this.port.writeUpstream(chunk.subarray(from, pos));
          this.port.holdClient();
          if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
          return;
        }
        // forwardFrame() may have made the connection a plain pipe.
        if (this.pipe.active) {
          this.pipe.chunk(chunk, from, pos);
          return;
        }
      }
      if (event & END && this.quitting) {
        this.quitting = false;
        this.port.writeUpstream(chunk.subarray(from, pos));
        this.port.awaitClose();
        if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
        return;
      }
      if (event & END && blocks.holding && blocks.isComplete) {
        blocks.hold(chunk.subarray(from, pos));
        from = pos;
        const asking = this.tx.afterAsking;
        this.tx.blockRewritten();
        if (blocks.complete(asking)) {
          // The script is in flight: the rest of this chunk waits for its reply.
          if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
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
    if (scanner.awaitingHead && this.mayStillBeActedOn(scanner) && this.frameKeptBack(scanner)) {
      const start = scanner.frameStart >= from ? scanner.frameStart : from;
      this.port.writeUpstream(chunk.subarray(from, start));
      this.partial.push(chunk.subarray(start));
      return;
    }
    this.flushPartial();
    this.port.writeUpstream(from === 0 ? chunk : chunk.subarray(from));
  }

  /**
   * Whether the frame whose head is still being read may yet be one whose bytes cannot go as they
   * are: a MULTI that the script way holds or that HELLO must go before, or the expiry of a lock
   * pair to fix.
   */
  private mayStillBeActedOn(scanner: RequestScanner): boolean {
    const method = this.server.method();
    if (this.tx.canStartBlock) return (method === 'script' || method === null) && LockBlocks.couldStillStart(scanner);
    return (
      this.streamed.active &&
      this.streamed.expiryMayFollow &&
      method !== 'script' &&
      (scanner.couldStillBe(EXPIRE, 3) || scanner.couldStillBe(PEXPIRE, 3))
    );
  }

  /**
   * A MULTI that may start a lock block: held on the script way, forwarded on the transaction
   * ways. Where the server's version is not known yet (the first MULTI to an upstream address, or
   * after it closed a connection), HELLO goes right before it and the MULTI waits for the answer
   * (the script way must hold the block from its MULTI on). Returns the new `from`, or -1 when
   * the MULTI and the rest of the chunk wait for the answer.
   */
  private atMulti(chunk: Buffer, from: number): number {
    const scanner = this.scanner;
    const method = this.server.method();
    const keptBack = this.frameKeptBack(scanner);
    if (method === 'script' && keptBack) return this.startHolding(chunk, from);
    if (method === null && keptBack && !this.server.refused) {
      this.waitForVersion(chunk, from);
      return -1;
    }
    this.server.refused = false;
    this.flushPartial();
    this.forwardFrame(null);
    return from;
  }

  /**
   * Sends what precedes the MULTI whose head the scanner holds, then HELLO; the MULTI and the
   * rest of the chunk wait for HELLO's answer, to be read again from the MULTI's first byte.
   */
  private waitForVersion(chunk: Buffer, from: number): void {
    const start = this.scanner.frameStart;
    let rest = chunk.subarray(from);
    if (start >= 0) {
      this.port.writeUpstream(chunk.subarray(from, start));
      rest = chunk.subarray(start);
    }
    if (this.partial.length > 0) rest = Buffer.concat([...this.partial, rest]);
    this.partial = [];
    this.server.ask(rest);
  }

  /**
   * The expiry of a lock pair whose rule enforces (its head, which is the whole frame, is read):
   * with NX on servers that have it, unchanged where it cannot be fixed. Returns the new `from`.
   */
  private atExpiry(chunk: Buffer, from: number, pos: number): number {
    const scanner = this.scanner;
    const method = this.server.method();
    const keptBack = this.frameKeptBack(scanner);
    const increment = method === 'transaction-script' ? this.streamed.pendingIncrement() : null;
    const refusal = increment === null ? null : this.substitution.refusal(increment.first && this.tx.queued === 1);
    if (keptBack && method === 'transaction') {
      this.port.writeUpstream(expiryWithNx(this.takeFrame(chunk, from, pos)));
      this.forwardFrame('nx');
      return pos;
    }
    if (keptBack && increment !== null && refusal === null) {
      this.substitution.send(this.takeFrame(chunk, from, pos), scanner, increment.command);
      this.forwardFrame('queued-script');
      if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
      this.port.holdClient();
      return -1;
    }
    // The script way fixes only a block it held whole: this one was released (at the hold
    // deadline, or by a frame that broke its shape) or came in another shape.
    const script = method === 'script' ? (this.streamed.releaseReason ?? 'not-a-lock-block') : null;
    this.flushPartial();
    this.forwardFrame({ unfixed: refusal ?? script ?? (method === null ? 'version-unknown' : 'split-frame') });
    return from;
  }

  /** The expiry frame whose head was just read, whole (from `from` or kept back), once what came before it has gone upstream. */
  private takeFrame(chunk: Buffer, from: number, pos: number): Buffer {
    const start = this.scanner.frameStart;
    if (start >= 0) {
      this.port.writeUpstream(chunk.subarray(from, start));
      return chunk.subarray(start, pos);
    }
    this.partial.push(chunk.subarray(from, pos));
    const frame = joined(this.partial);
    this.partial = [];
    return frame;
  }

  /** Whether none of the current frame has gone upstream yet: it starts in this chunk, or was kept back. */
  private frameKeptBack(scanner: RequestScanner): boolean {
    return scanner.frameStart >= 0 || this.partial.length > 0;
  }

  /** Starts holding at the MULTI whose head the scanner just read; returns the new `from`. */
  private startHolding(chunk: Buffer, from: number): number {
    const start = this.scanner.frameStart;
    if (start >= 0) {
      this.port.writeUpstream(chunk.subarray(from, start));
      this.blocks.start([]);
      return start;
    }
    this.blocks.start(this.partial); // the MULTI began in an earlier chunk
    this.partial = [];
    return from;
  }

  private flushPartial(): void {
    if (this.partial.length === 0) return;
    this.port.writeUpstream(joined(this.partial));
    this.partial = [];
  }

  /** Forwards everything held or kept back as it is (before the connection becomes a plain pipe, or closes). */
  flushPending(reason: string): void {
    if (this.blocks.holding) this.blocks.release(reason);
    this.flushPartial();
  }

  /**
   * The frame whose head the scanner holds goes upstream: the replies it brings and the state it
   * changes. `outcome`: what became of it, when it is the expiry of a lock pair whose rule enforces.
   */
  private forwardFrame(outcome: PairOutcome | null): void {
    const tx = this.tx;
    if (this.scanner.cmd === Cmd.Reset) tx.resetKnown = this.server.hasReset();
    const afterAsking = tx.afterAsking;
    const meaning = tx.frame(this.scanner);
    if (meaning === FrameMeaning.NoReply) return;
    if (meaning === FrameMeaning.Untrackable || meaning === FrameMeaning.Replication) {
      const resettable = meaning === FrameMeaning.Untrackable;
      if (!this.streamed.holdsPairs) {
        this.enterPipe(resettable);
        return;
      }
      if (this.scanner.nameOpaque) {
        // It may be the EXEC whose reply carries NX's answers, or queued: the state is unknown.
        this.port.log.error(
          'an inline command whose name the proxy cannot read, in a transaction with a lock pair: closing the connection',
        );
        this.port.closeAfterReplies();
        return;
      }
      // Queued (one reply) in a transaction whose pairs must be followed to its EXEC's reply.
      this.pipeAfterExec = { resettable: resettable && (this.pipeAfterExec?.resettable ?? true) };
      this.pipe.queued(this.scanner);
      this.streamed.seal();
    }
    this.headCounted = true;
    let fixed: FixedExec | null = null;
    if (tx.opened) {
      if (!tx.watching) this.streamed.begin();
    } else if (this.streamed.active) {
      if (tx.queuedIndex >= 0) this.streamed.queued(this.scanner, tx.queuedIndex, this.ctx.rules(), outcome);
      else if (tx.closed && this.scanner.cmd === Cmd.Exec) fixed = this.streamed.executed(tx.queued);
      else if (tx.closed) this.streamed.end();
    }
    if (this.scanner.cmd === Cmd.Client) this.verify.client(this.scanner);
    else if (this.scanner.cmd === Cmd.Blocking) this.port.blockingSent();
    if (this.scanner.cmd === Cmd.Set && this.scanner.argc === 6) countFixedShape(this.scanner, this.ctx);
    this.ctx.stats.commandsForwarded++;
    const rewrite = this.nodes?.replyRewrite(this.scanner, this.tx);
    if (rewrite !== undefined || fixed !== null) this.lockReplies.announce(fixed, rewrite);
    else if (tx.opened) this.substitution.multiSent(afterAsking, this.server.method() === 'transaction-script');
    else if (this.pipe.resetBeforeSetup(this.scanner)) this.replies.peek((first) => this.pipe.afterReset(first));
    else if (outcome !== 'queued-script') this.replies.expect(1); // the substitution's replies are its own
    if (tx.closed && this.pipeAfterExec !== null) {
      // What was queued runs only at EXEC (DISCARD and RESET ran none of it).
      const { resettable } = this.pipeAfterExec;
      this.pipeAfterExec = null;
      if (this.scanner.cmd === Cmd.Exec) this.enterPipe(resettable);
    }
  }

  /**
   * Stops interpreting this connection: from here on bytes pass untouched both ways, until a
   * RESET if `resettable` (it is not after replication, or input or replies the proxy cannot read).
   */
  enterPipe(resettable: boolean): void {
    this.streamed.end();
    this.blocks.stopTimer();
    this.pipe.enter(resettable);
  }
}
