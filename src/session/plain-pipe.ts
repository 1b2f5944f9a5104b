/**
 * A connection that has become a plain pipe: when replies cannot be counted (subscribe mode,
 * MONITOR, CLIENT REPLY, REPLCONF, replication, malformed input), bytes pass untouched both ways.
 * A RESET ends such a pipe, as it ends all of that in Redis, except after replication or
 * malformed input; frames are therefore still found in the pipe, to count replies again after a
 * RESET and apply the upstream URL's AUTH/SELECT again. Outside a pipe, the URL's AUTH/SELECT
 * follow a RESET once it has run too (afterReset).
 */
import type { Logger } from '../log.js';
import { Cmd, equalsIgnoreCase } from '../resp/commands.js';
import { END, HEAD, MALFORMED, type RequestScanner } from '../resp/request-scanner.js';
import type { ProxyContext } from './context.js';
import type { ReplyStream } from './reply-stream.js';
import { REPLY_OFF, ResetMarker, type ResetOutcome } from './reset-marker.js';
import type { ServerWay } from './server-way.js';
import { isClientReply, type TransactionState } from './transaction-state.js';

/** What the pipe needs of its connection. */
export interface PlainPipePort {
  writeUpstream(bytes: Buffer): void;
  /** The rest of a chunk waits for a reply of the proxy's own (the session feeds it back later). */
  stall(rest: Buffer): void;
  /** Sends the upstream URL's AUTH/SELECT (after RESET); true when sent, and the client's next bytes then wait. */
  startSetup(): boolean;
  holdClient(): void;
  resumeClient(): void;
  readonly log: Logger;
}

const OFF = Buffer.from('off');
const SKIP = Buffer.from('skip');

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
  /** A CLIENT REPLY OFF may be in force (reset-marker.ts: a refused RESET leaves it). */
  private repliesMayBeOff = false;
  /**
   * A CLIENT REPLY SKIP went in this pipe (or may have): the answer to the RESET may be skipped.
   * It stays once seen: a SKIP queued in a transaction skips the answer after its EXEC, and
   * inside the pipe transactions are not followed. Where none is pending, the command that goes
   * before a RESET for it is answered, and that is all (reset-marker.ts).
   */
  private skipPending = false;
  /** What the CLIENT REPLY frames queued in the transaction do at its EXEC (REPLY_MAY_SKIP, REPLY_MAY_BE_OFF). */
  private queuedReplies = 0;

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
    // What made it a pipe may silence replies: the frame itself, or at EXEC what was queued.
    if (this.scanner.cmd === Cmd.Exec) this.noteReplies(this.queuedReplies);
    else this.noteReplies(replyChange(this.scanner));
    this.queuedReplies = 0;
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
      if ((event & HEAD) === 0) continue;
      // A one-argument frame reports its head and end at once.
      if ((event & END) === 0 || scanner.cmd !== Cmd.Reset || scanner.argc !== 1 || !this.server.hasReset()) {
        this.noteReplies(replyChange(scanner));
        continue;
      }
      this.reset(chunk, from, pos);
      if (pos < chunk.length) this.port.stall(chunk.subarray(pos));
      return;
    }
    this.port.writeUpstream(from === 0 ? chunk : chunk.subarray(from));
  }

  /**
   * A CLIENT REPLY frame (or one that may be) queued in a transaction: it takes effect at EXEC,
   * a SKIP anywhere in it skipping the answer to the frame after EXEC.
   */
  queued(scanner: RequestScanner): void {
    this.queuedReplies |= replyChange(scanner);
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
   * The client's RESET (the frame that ends at `end` in `chunk`, from `from` on not yet
   * forwarded) goes upstream while the connection is a plain pipe. Where its answer lies cannot
   * be told (the replies before it are not counted), so the marker's commands follow it (and,
   * after a CLIENT REPLY SKIP where RESET may be refused, one goes before it: reset-marker.ts),
   * and the client waits. Once they are answered, a RESET that ran has left Redis's initial
   * state: the upstream URL's AUTH/SELECT go again, and replies are counted again (unless the
   * pipe stays: no rule was loaded). A refused one left the connection as it was: a pipe.
   */
  private reset(chunk: Buffer, from: number, end: number): void {
    this.tx.frame(this.scanner); // out of any transaction, nothing watched
    const start = this.scanner.frameStart; // -1: the RESET began in a chunk already forwarded
    const marker = new ResetMarker({
      judged: this.server.resetMayBeRefused(),
      skipPending: this.skipPending,
      repliesMayBeOff: this.repliesMayBeOff,
      beforeReset: start >= from,
    });
    if (marker.before !== null) {
      this.port.writeUpstream(chunk.subarray(from, start));
      this.port.writeUpstream(marker.before);
      this.port.writeUpstream(chunk.subarray(start, end));
    } else {
      this.port.writeUpstream(chunk.subarray(from, end));
    }
    this.port.writeUpstream(marker.command);
    this.port.holdClient();
    this.replies.awaitMarker(marker, (outcome) => this.resetAnswered(outcome));
  }

  private resetAnswered(outcome: ResetOutcome): void {
    if (outcome !== 'ran') {
      // Refused (or not known to have run): the connection is as it was, a pipe, with its user and database.
      if (outcome === 'refused-while-off') this.port.writeUpstream(REPLY_OFF); // as Redis left them: off
      if (outcome === 'unknown') {
        this.port.log.warn(
          "a RESET after CLIENT REPLY OFF and SKIP, on a server that may refuse RESET (Redis 6.2): whether it ran is not known, so the connection stays a plain pipe, without the upstream URL's AUTH/SELECT",
        );
      }
      this.replies.stopCounting(this.resetEnds);
      this.port.resumeClient();
      return;
    }
    this.repliesMayBeOff = this.skipPending = false;
    if (!this.withoutRules) this.active = false;
    const setupSent = this.port.startSetup();
    if (this.withoutRules) this.replies.stopCounting(this.resetEnds); // still a pipe, once the setup's replies are in
    if (!setupSent) this.port.resumeClient();
  }

  /** A frame that went upstream, and what it does to Redis's answers (replyChange). */
  private noteReplies(change: number): void {
    if ((change & REPLY_MAY_SKIP) !== 0) this.skipPending = true;
    if ((change & REPLY_MAY_BE_OFF) !== 0) this.repliesMayBeOff = true;
  }
}

const REPLY_MAY_SKIP = 1;
const REPLY_MAY_BE_OFF = 2;

/**
 * What a frame does to Redis's answers: CLIENT REPLY OFF silences them (REPLY_MAY_BE_OFF), SKIP
 * the next frame's (REPLY_MAY_SKIP). An inline CLIENT, or a command whose name cannot be read,
 * may do either.
 */
function replyChange(scanner: RequestScanner): number {
  if (scanner.nameOpaque || (scanner.cmd === Cmd.Client && scanner.inline)) return REPLY_MAY_SKIP | REPLY_MAY_BE_OFF;
  if (scanner.argc !== 3 || !isClientReply(scanner)) return 0;
  const is = (word: Buffer): boolean => scanner.valueLength === word.length && equalsIgnoreCase(scanner.value, 0, word);
  return is(SKIP) ? REPLY_MAY_SKIP : is(OFF) ? REPLY_MAY_BE_OFF : 0;
}
