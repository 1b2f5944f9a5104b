/**
 * The client-to-server side of one connection: the loop over client chunks. Bytes go upstream as
 * they arrive, in order; frames are classified from their heads once those are complete
 * (TransactionState), but forwarding never waits to learn them. Lock blocks are found as they
 * stream (lock/streamed-blocks.ts): on servers with `EXPIRE ... NX` their expiry gains NX as it
 * passes, and the only bytes kept back are those of a frame that may still be that expiry, until
 * its head is read (Redis waits for a whole frame too). Only the script way (servers before 7.0)
 * holds a MULTI that may start a lock block, in LockBlocks (lock/block-flow.ts). The replies each
 * forwarded frame brings are announced to the reply side (ReplyStream).
 *
 * With --lock-method auto, the server's version is learnt once per upstream address (and again
 * after the server closed a connection on its own): HELLO goes right before the first MULTI, which
 * waits for the answer (lock/lock-method.ts). Every later MULTI to that address waits for nothing.
 *
 * When replies cannot be counted (subscribe mode, MONITOR, CLIENT REPLY, REPLCONF, replication,
 * malformed input) the connection becomes a plain pipe. A RESET ends such a pipe, as it ends all
 * of that in Redis, except after replication or malformed input; frames are therefore still found
 * in the pipe, to count replies again after a RESET and apply the upstream URL's AUTH/SELECT again.
 */
import type { NodeReplies } from '../cluster/node-replies.js';
import { joined, LockBlocks, type LockBlockPort } from '../lock/block-flow.js';
import { BLOCK_COMMANDS } from '../lock/block-shape.js';
import { ExpiryRestore, restoreExpiryReplies } from '../lock/exec-reply.js';
import { ExpirySubstitution } from './expiry-substitution.js';
import { expiryWithNx } from '../lock/expire-nx.js';
import { countFixedShape } from '../lock/fixed-shape.js';
import { HELLO, methodFromHello, type LockMethod } from '../lock/lock-method.js';
import { StreamedBlocks, type FixedExec, type PairOutcome, type UnfixedReason } from '../lock/streamed-blocks.js';
import { describeKey } from '../key-text.js';
import type { Logger } from '../log.js';
import { Cmd } from '../resp/commands.js';
import { encodeCommand } from '../resp/encode.js';
import { END, HEAD, MALFORMED, RequestScanner } from '../resp/request-scanner.js';
import { WholeFrameReader } from '../resp/whole-frame.js';
import { countedApart, verifyLogger } from '../verify-connection.js';
import type { ProxyContext } from './context.js';
import type { ReplyStream } from './reply-stream.js';
import { ResetMarker } from './reset-marker.js';
import type { Stats } from '../stats.js';
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

const ASKING = encodeCommand('ASKING');
/** What HELLO answers: a RESP3 map, a RESP2 array of pairs, or an error. */
const HELLO_REPLY_TYPES = new Set([0x25 /* % */, 0x2a /* * */, 0x2d /* - */]);
const { EXPIRE, PEXPIRE } = BLOCK_COMMANDS;

/** The commands of a lock pair: inside a followed transaction, each is read by its head. */
function isPairCommand(cmd: Cmd): boolean {
  return cmd === Cmd.Incr || cmd === Cmd.Incrby || cmd === Cmd.Expire || cmd === Cmd.Pexpire;
}

/**
 * Frames that, outside a held block, need nothing but their reply counted: any command the
 * proxy does not classify, and the lock block's increment and expiry outside a followed
 * transaction. `SET` too, except the six-argument one whose shape is counted (countFixedShape).
 */
function onlyCounted(cmd: Cmd, argc: number): boolean {
  switch (cmd) {
    case Cmd.Other:
    case Cmd.Incr:
    case Cmd.Incrby:
    case Cmd.Expire:
    case Cmd.Pexpire:
      return true;
    case Cmd.Set:
      return argc !== 6;
    default:
      return false;
  }
}

export class RequestFlow implements LockBlockPort {
  private readonly scanner = new RequestScanner();
  private readonly whole = new WholeFrameReader();
  private readonly tx = new TransactionState();
  private readonly blocks: LockBlocks;
  private readonly streamed: StreamedBlocks;
  /** The transaction-script way's pairs (servers without EXPIRE ... NX). */
  private readonly substitution: ExpirySubstitution;
  /** What this connection's HELLO said the server needs (auto); null until it has answered. */
  private learnt: LockMethod | null = null;
  /** A HELLO of the proxy's own is on its way; the client's bytes wait for its answer. */
  private versionAsked = false;
  /** HELLO was refused (not authenticated yet): the MULTI it went before goes on without asking again. */
  private versionRefused = false;
  /** Bytes are forwarded without being interpreted (a plain pipe). */
  piping = false;
  /**
   * In the pipe, frames are still found to see a RESET: lock blocks are fixed again after it, and
   * the upstream URL's AUTH/SELECT follow it. Not in a pipe a RESET cannot end, nor in a pipe
   * without rules whose URL has no AUTH/SELECT (a RESET changes nothing the proxy does there).
   */
  private resetEndsPipe = false;
  /** The pipe stays after a RESET: the connection was opened while no rule was loaded. */
  private readonly pipeWithoutRules: boolean;
  /**
   * Bytes of the current frame, from earlier chunks, kept back because they may still be a MULTI
   * that the script way holds or HELLO must go before (at most the 11 bytes before its last), or
   * the expiry of a lock pair, which gains NX (at most its head); any other frame is forwarded.
   */
  private partial: Buffer[] = [];
  /** The frame being read is a QUIT: once it has gone upstream, Redis closes. */
  private quitting = false;
  /** The client named its connection as verify's: its lock blocks are counted apart, and logged as verify's. */
  private verifyConnection = false;
  /** The logger for a verify connection's blocks, made when first needed. */
  private verifyLog: Logger | undefined;
  /** The settings lock blocks are counted with (verify's apart). */
  private readonly counting: { readonly stats: Stats };
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
    const counting = countedApart(ctx, () => this.verifyConnection);
    this.counting = counting;
    this.blocks = new LockBlocks(this, replies, counting);
    this.streamed = new StreamedBlocks(counting, () => this.log);
    this.substitution = new ExpirySubstitution(this, replies, this.tx, this.streamed);
    // Without rules there is nothing to rewrite, unless cluster replies need their addresses rewritten.
    this.pipeWithoutRules = ctx.rules().rules.length === 0 && !ctx.cluster;
    if (this.pipeWithoutRules) this.enterPipe(true);
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

  /**
   * The connection is closed at a bound while replies are due: a lock block whose replies have
   * not come may have run in Redis (its counter moved), and its client will not learn it. Each
   * is logged with its rule and key, and counted (blocks_total{outcome="closed"}).
   */
  closingWithRepliesDue(): void {
    for (const lock of this.replies.lockBlocksDue()) {
      this.counting.stats.blockClosed(lock.rule);
      this.log.error(
        { rule: lock.rule, key: describeKey(lock.key) },
        "connection closed before a lock block's replies came: Redis may have run it, and its client is not told",
      );
    }
  }

  /** The connection closes: no hold deadline fires any more. */
  stop(): void {
    this.blocks.stopTimer();
  }

  // ------------------------------------------------------- LockBlocks' port

  /** The log for lines about this connection's lock blocks: verify's say so. */
  get log(): Logger {
    if (!this.verifyConnection) return this.port.log;
    this.verifyLog ??= verifyLogger(this.port.log);
    return this.verifyLog;
  }

  writeUpstream(bytes: Buffer): void {
    this.port.writeUpstream(bytes);
  }

  writeClient(bytes: Buffer): void {
    this.port.writeClient(bytes);
  }

  blockSent(frames: number, complete: boolean, key: Buffer | null, reason: UnfixedReason): void {
    this.replies.expect(frames);
    this.headCounted = frames > 0;
    this.tx.blockSent(frames, complete);
    this.streamed.released(frames, complete, key, this.ctx.rules(), reason);
  }

  holdClient(): void {
    this.port.holdClient();
  }

  resumeClient(): void {
    this.port.resumeClient();
  }

  closeAfterReplies(): void {
    this.port.closeAfterReplies();
  }

  fault(error: unknown): void {
    this.port.fault(error);
  }

  // ------------------------------------------------------------- the loop

  /** One chunk from the client (in order; while the session is not holding the client back). */
  process(chunk: Buffer): void {
    if (this.piping) {
      this.pipeChunk(chunk, 0, 0);
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
      if (scanner.atFrameBoundary && !blocks.holding) {
        pos = this.countWholeFrames(chunk, pos);
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
        this.quitting = scanner.cmd === Cmd.Quit && !blocks.holding && !this.piping;
        if (scanner.cmd === Cmd.Reset && scanner.argc === 1 && (event & END) !== 0 && !blocks.holding && !this.piping && this.hasReset()) {
          // RESET logs the connection out and selects db 0: apply the URL's AUTH/SELECT again, after it.
          this.port.writeUpstream(chunk.subarray(from, pos));
          from = pos;
          if (this.port.startSetup()) {
            if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
            return;
          }
        }
        // forwardFrame() may have made the connection a plain pipe.
        if (this.piping) {
          this.pipeChunk(chunk, from, pos);
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
   * The frames from `pos` (the scanner between frames) that are whole in the chunk and only
   * counted (onlyCounted) are taken at once: their replies are expected, and their bytes go
   * upstream with the rest of the chunk. Returns where the next frame begins; the scanner reads
   * that one.
   */
  private countWholeFrames(chunk: Buffer, pos: number): number {
    const whole = this.whole;
    let frames = 0;
    // Inside a followed transaction, a lock pair's commands are read by their heads.
    const following = this.streamed.active;
    while (pos < chunk.length) {
      const after = whole.read(chunk, pos);
      if (after < 0 || !onlyCounted(whole.cmd, whole.argc) || (following && isPairCommand(whole.cmd))) break;
      frames++;
      pos = after;
    }
    if (frames > 0) {
      if (following) this.streamed.others();
      this.tx.forwarded(frames);
      this.ctx.stats.commandsForwarded += frames;
      this.replies.expect(frames);
    }
    return pos;
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
    const method = this.lockMethod();
    if (this.tx.canStartBlock) return (method === 'script' || method === null) && LockBlocks.couldStillStart(scanner);
    return (
      this.streamed.active &&
      this.streamed.expiryMayFollow &&
      method !== 'script' &&
      (scanner.couldStillBe(EXPIRE, 3) || scanner.couldStillBe(PEXPIRE, 3))
    );
  }

  /**
   * How this connection's lock blocks go: the script where set, else what the server was found to
   * need (null: not known yet). --lock-method transaction was refused at start in front of a server
   * without EXPIRE ... NX; one found later (a failover to an older replica) gets the
   * transaction-script way, with an error line, rather than EXECABORT for every lock
   * (lock/method-choice.ts).
   */
  private lockMethod(): LockMethod | null {
    const setting = this.ctx.lockMethod;
    if (setting === 'script') return setting;
    // What the address is known to need holds for this connection's whole life: it stays on that server.
    this.learnt ??= this.ctx.serverMethods.get(this.port.upstreamAddress);
    if (setting === 'transaction' && this.learnt === 'transaction-script' && this.ctx.serverMethods.mismatch(this.port.upstreamAddress)) {
      this.port.log.error(
        { upstream: this.port.upstreamAddress },
        '--lock-method transaction: this server has no EXPIRE ... NX (before Redis 7.0); its lock blocks take the transaction-script way',
      );
    }
    return this.learnt;
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
    const method = this.lockMethod();
    const keptBack = this.frameKeptBack(scanner);
    if (method === 'script' && keptBack) return this.startHolding(chunk, from);
    if (method === null && keptBack && !this.versionRefused) {
      this.waitForVersion(chunk, from);
      return -1;
    }
    this.versionRefused = false;
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
    this.askVersion();
    this.port.stall(rest);
    this.port.holdClient();
  }

  /**
   * The expiry of a lock pair whose rule enforces (its head, which is the whole frame, is read):
   * with NX on servers that have it, unchanged where it cannot be fixed. Returns the new `from`.
   */
  private atExpiry(chunk: Buffer, from: number, pos: number): number {
    const scanner = this.scanner;
    const method = this.lockMethod();
    let outcome: PairOutcome;
    let refusal: UnfixedReason | null = null;
    const increment = method === 'transaction-script' ? this.streamed.pendingIncrement : null;
    if (increment !== null) refusal = this.substitution.refusal(increment.first && this.tx.queued === 1);
    if (method === 'transaction' && this.frameKeptBack(scanner)) {
      this.port.writeUpstream(expiryWithNx(this.takeFrame(chunk, from, pos)));
      from = pos;
      outcome = 'nx';
    } else if (increment !== null && refusal === null && this.frameKeptBack(scanner)) {
      const frame = this.takeFrame(chunk, from, pos);
      const key = scanner.key.subarray(0, scanner.keyLength);
      const ttl = scanner.value.subarray(0, scanner.valueLength);
      this.substitution.send(frame, scanner.cmd === Cmd.Pexpire, key, ttl, increment.command);
      this.forwardFrame('queued-script');
      if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
      this.port.holdClient();
      return -1;
    } else if (refusal !== null) {
      outcome = { unfixed: refusal };
      this.flushPartial();
    } else {
      // The script way fixes only a block it held whole: this one was released (at the hold
      // deadline, or by a frame that broke its shape) or came in another shape.
      const reason =
        method === 'transaction'
          ? 'split-frame'
          : method === 'script'
            ? (this.streamed.releaseReason ?? 'not-a-lock-block')
            : 'version-unknown';
      outcome = { unfixed: reason };
      this.flushPartial();
    }
    this.forwardFrame(outcome);
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

  /**
   * Whether RESET is a command of this connection's server: not before Redis 6.2, where it is an
   * unknown command that changes nothing (no transaction ended, no pipe, no AUTH/SELECT after it).
   * Unknown servers are taken to have it.
   */
  private hasReset(): boolean {
    return !this.ctx.serverMethods.lacksReset(this.port.upstreamAddress);
  }

  /** Asks the server's version on the connection, right before a MULTI. */
  private askVersion(): void {
    this.versionAsked = true;
    this.port.writeUpstream(HELLO);
    this.replies.capture((reply) => this.onVersion(reply));
    if (this.tx.afterAsking) {
      // HELLO used up the ASKING the client sent before its MULTI: it goes again, its +OK the proxy's.
      this.port.writeUpstream(ASKING);
      this.replies.capture(() => {});
    }
  }

  private onVersion(reply: Buffer): void {
    this.versionAsked = false;
    if (!HELLO_REPLY_TYPES.has(reply[0])) {
      // HELLO answers a map (an array in RESP2) or an error: anything else is another command's reply.
      this.port.log.error({ type: String.fromCharCode(reply[0]) }, 'the server version reply is not one; closing the connection');
      this.port.closeAfterReplies();
      return;
    }
    // Not authenticated yet (method null): Redis refuses the MULTI itself; the next one asks again.
    const version = methodFromHello(reply);
    if (version.method !== null) {
      this.learnt = version.method;
      // Logged by whoever learns it first: this connection, or the question asked ahead.
      if (this.ctx.serverMethods.learnt(this.port.upstreamAddress, version.method, version.detail, version.hasReset)) {
        this.port.log.debug({ server: version.detail, method: version.method }, 'lock method chosen from the server version');
      }
    } else {
      this.versionRefused = true;
    }
    this.port.resumeClient();
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
    if (this.scanner.cmd === Cmd.Reset) tx.resetKnown = this.hasReset();
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
    if (this.scanner.cmd === Cmd.Client) this.verifyConnection = this.ctx.verifyRuns.named(this.scanner) ?? this.verifyConnection;
    else if (this.scanner.cmd === Cmd.Blocking) this.port.blockingSent();
    if (this.scanner.cmd === Cmd.Set && this.scanner.argc === 6) countFixedShape(this.scanner, this.ctx);
    this.ctx.stats.commandsForwarded++;
    const rewrite = this.nodes?.replyRewrite(this.scanner, this.tx);
    if (rewrite !== undefined) {
      // With --cluster, a topology reply (one queued in the transaction too) is rewritten: the
      // reply is taken whole, and EXEC's expiries restored in it. EXEC is the client's own
      // command: Redis answers it in its own time, and an error in its place (EXEC refused as a
      // whole) passes on as any reply.
      const edits = fixed;
      const rearmed = this.rearmed(fixed);
      const whole = (reply: Buffer): Buffer => rewrite(edits === null ? reply : restoreExpiryReplies(reply, edits, rearmed));
      this.replies.capture((reply) => this.port.writeClient(whole(reply)), fixed !== null, fixed ?? undefined);
    } else if (fixed !== null) {
      // EXEC's array gives each fixed expiry back as Redis alone answers it, as it streams.
      this.replies.restoreExpiries(new ExpiryRestore(fixed, this.rearmed(fixed)), fixed);
    } else if (tx.opened && this.lockMethod() === 'transaction-script') {
      this.substitution.multiSent(afterAsking);
    } else if (outcome !== 'queued-script') this.replies.expect(1); // the substitution's replies are its own
    if (tx.closed && this.pipeAfterExec !== null) {
      // What was queued runs only at EXEC (DISCARD and RESET ran none of it).
      const { resettable } = this.pipeAfterExec;
      this.pipeAfterExec = null;
      if (this.scanner.cmd === Cmd.Exec) this.enterPipe(resettable);
    }
  }

  /**
   * What tells that the expiry script of `fixed`'s pair did what the client asked (the user may
   * not read the expiry): its lock was re-armed, counted and logged.
   */
  private rearmed(fixed: FixedExec | null): (() => void) | undefined {
    if (fixed === null || fixed.drop.length === 0) return undefined;
    return () => {
      this.counting.stats.blockUnfixed(fixed.rule, 'pttl-refused');
      this.log.warn(
        { rule: fixed.rule, key: describeKey(fixed.key) },
        "the expiry script may not read the lock key's expiry (the user needs +pttl): it re-armed the lock as the client asked",
      );
    };
  }

  /**
   * Stops interpreting this connection: from here on bytes pass untouched both ways, until a
   * RESET if `resettable` (it is not after replication, or input or replies the proxy cannot read).
   */
  enterPipe(resettable: boolean): void {
    this.piping = true;
    this.streamed.end();
    // A RESET matters where lock blocks may follow it, or the URL's AUTH/SELECT must.
    this.resetEndsPipe = resettable && (!this.pipeWithoutRules || this.ctx.upstream.setup.length > 0);
    this.blocks.stopTimer();
    // Replies stop being counted, unless a reply of the proxy's own is still due: then after it.
    this.replies.stopCounting(this.resetEndsPipe);
  }

  /**
   * A chunk (from `from`) of a plain pipe goes upstream as it is. Where a RESET ends the pipe, the
   * scanner goes on finding frames from `pos`; after a RESET, the proxy's marker command follows
   * it (reset-marker.ts), and the client's next bytes wait until its refusal has come back.
   */
  private pipeChunk(chunk: Buffer, from: number, pos: number): void {
    const scanner = this.scanner;
    // A RESET ends the pipe only where its marker's refusal can be found among the replies.
    while (this.resetEndsPipe && this.replies.framesFollowed && pos < chunk.length) {
      pos = scanner.next(chunk, pos);
      const event = scanner.event;
      if (event === 0) break;
      if (event & MALFORMED) {
        this.resetEndsPipe = false; // Redis answers with a protocol error and closes
        break;
      }
      // A one-argument frame reports its head and end at once.
      if ((event & END) === 0 || (event & HEAD) === 0 || scanner.cmd !== Cmd.Reset || scanner.argc !== 1 || !this.hasReset()) continue;
      this.port.writeUpstream(chunk.subarray(from, pos));
      this.resetFromPipe();
      if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
      return;
    }
    this.port.writeUpstream(from === 0 ? chunk : chunk.subarray(from));
  }

  /**
   * A RESET went upstream while the connection was a plain pipe. Whether Redis answers it cannot
   * be told from here (CLIENT REPLY SKIP), nor where its answer lies (the replies before it are
   * not counted), but Redis runs it: the marker command follows, and the client waits. Once the
   * marker's refusal is back, the state is Redis's initial one: the upstream URL's AUTH/SELECT go
   * again, and the replies are counted again (unless the pipe stays: no rule was loaded).
   */
  private resetFromPipe(): void {
    this.tx.frame(this.scanner); // out of any transaction, nothing watched
    const marker = new ResetMarker();
    this.port.writeUpstream(marker.command);
    this.port.holdClient();
    this.replies.awaitMarker(marker, () => {
      if (!this.pipeWithoutRules) this.piping = false;
      const setupSent = this.port.startSetup();
      if (this.pipeWithoutRules) this.replies.stopCounting(this.resetEndsPipe); // still a pipe, once the setup's replies are in
      if (!setupSent) this.port.resumeClient();
    });
  }
}
