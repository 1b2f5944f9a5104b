/**
 * One connection's lock blocks, from the MULTI that may start one to the client's four replies:
 * holding the frames while the block can still match, releasing them verbatim when it cannot
 * (or at the hold deadline), and for a complete block the script call, with a retry by EVAL on
 * NOSCRIPT and the original block as the fallback when the script cannot run.
 *
 * Ordering is kept exactly: while the script call is in flight the client's later bytes wait
 * (the session holds them), so a fallback sends the block where the client put it. With
 * --lock-pipelining, once the script has worked on the connection, what follows a block is not
 * held back; a later script failure then cannot send the block in its place, so the connection
 * is closed instead (after the replies that precede the block), as a network failure would.
 *
 * The flow touches no socket: it works through a LockBlockPort, which the session implements,
 * and the connection's reply accounting.
 */
import type { Logger } from '../log.js';
import { describeKey } from '../key-text.js';
import { encodeCommand } from '../resp/encode.js';
import type { RequestScanner } from '../resp/request-scanner.js';
import { effectiveMode, type Rule, type RuleMode, type RuleSet } from '../rules/types.js';
import type { Stats } from '../stats.js';
import { BlockMatcher, BlockStep } from './block-matcher.js';
import { BLOCK_FRAMES, framesTaken } from './block-replies.js';
import { encodeLockCall, translateScriptReply, type LockCall } from './script.js';

/** What the block flow needs of its connection. */
export interface LockBlockPort {
  /** Bytes for Redis, in order. */
  writeUpstream(bytes: Buffer): void;
  /** Bytes for the client, in order. */
  writeClient(bytes: Buffer): void;
  /** Held frames went upstream as the client sent them: `frames` of them, `complete` with the EXEC. */
  blockSent(frames: number, complete: boolean): void;
  /** The client's next bytes wait until resumeClient(): the script's reply decides what goes next. */
  holdClient(): void;
  resumeClient(): void;
  /** Ends the connection after what the client has been sent (a pipelined script failed). */
  abandon(): void;
  /** Closes the connection at once (a script reply the proxy cannot read). */
  destroy(): void;
  readonly log: Logger;
}

/** The connection's reply accounting (session/reply-stream.ts). */
export interface ExpectedReplies {
  /** `count` replies come for what was just sent upstream. */
  expect(count: number): void;
  /** The reply to what was just sent upstream is the flow's own: to `handle`, not to the client. */
  capture(handle: (reply: Buffer) => void): void;
}

/** In front of a cluster: how a redirected script call is answered (cluster/node-replies.ts). */
export interface BlockRedirects {
  /** Whether a script error is the cluster's key check (-MOVED, -ASK, -TRYAGAIN, -CLUSTERDOWN). */
  isRedirect(message: string): boolean;
  /** The four replies Redis gives a block whose key another node serves, addresses rewritten. */
  redirectedBlock(reply: Buffer): Buffer;
}

export interface BlockSettings {
  /** 'observe': every rule only observes. */
  readonly mode: RuleMode;
  readonly holdMs: number;
  readonly lockPipelining: boolean;
  readonly stats: Stats;
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

const ASKING = encodeCommand('ASKING');

export class LockBlocks {
  /** A MULTI and what followed it are held until the block matches or cannot. */
  holding = false;
  private readonly matcher = new BlockMatcher();
  /** Bytes of the block being held. */
  private held: Buffer[] = [];
  private holdTimer: NodeJS.Timeout | undefined;
  /** The script has worked on this connection for its current user (see --lock-pipelining). */
  private scriptProven = false;
  private readonly fallbackReasonsLogged = new Set<string>();

  constructor(
    private readonly port: LockBlockPort,
    private readonly replies: ExpectedReplies,
    private readonly settings: BlockSettings,
    private readonly redirects: BlockRedirects | null,
  ) {}

  /** True when the frame whose head the scanner holds is a MULTI that may start a block. */
  static isStart(scanner: RequestScanner): boolean {
    return BlockMatcher.isBlockStart(scanner);
  }

  /** True when the frame whose head the scanner is still reading may yet be such a MULTI (its bytes are kept back). */
  static couldStillStart(scanner: RequestScanner): boolean {
    return BlockMatcher.couldStillStart(scanner);
  }

  /** Starts holding at a MULTI; `held` are its bytes read so far. */
  start(held: Buffer[]): void {
    this.held = held;
    this.holding = true;
    this.matcher.reset();
  }

  /** Bytes of the held block (the MULTI and what follows it). */
  hold(bytes: Buffer): void {
    this.held.push(bytes);
  }

  /** Offers the next frame's head; false when the block cannot match any more. */
  accept(scanner: RequestScanner, rules: RuleSet): boolean {
    return this.matcher.accept(scanner, rules);
  }

  /** Whether the frame whose head is still being read can be the block's next one. */
  couldStillAccept(scanner: RequestScanner): boolean {
    return this.matcher.couldStillAccept(scanner);
  }

  get isComplete(): boolean {
    return this.matcher.step === BlockStep.Complete;
  }

  /** More bytes from the client: the hold deadline counts from the last one. */
  touched(): void {
    this.holdTimer?.refresh();
  }

  /** The chunk ended inside a held block: the deadline starts if it has not. */
  awaitMore(): void {
    if (this.holdTimer !== undefined) return;
    this.holdTimer = setTimeout(() => this.onHoldTimeout(), this.settings.holdMs);
    this.holdTimer.unref();
  }

  stopTimer(): void {
    if (this.holdTimer !== undefined) {
      clearTimeout(this.holdTimer);
      this.holdTimer = undefined;
    }
  }

  /** Another user may not be allowed to run scripts (AUTH, HELLO, RESET): prove it again. */
  forgetProof(): void {
    this.scriptProven = false;
  }

  /** Sends the held bytes upstream unchanged and goes back to forwarding. */
  release(reason: string): void {
    this.stopTimer();
    this.holding = false;
    this.settings.stats.countRelease(reason, this.matcher.rule?.name);
    const held = this.held;
    this.held = [];
    this.port.writeUpstream(joined(held));
    this.port.blockSent(framesTaken(this.matcher.step), this.isComplete);
  }

  /**
   * A whole block is held. `asking`: ASKING came right before it. Returns true when its script
   * was sent and the client's next bytes must wait for the reply.
   */
  complete(asking: boolean): boolean {
    this.stopTimer();
    const rule = this.matcher.rule as Rule; // set whenever a block completes
    const call = this.matcher.call();
    const stats = this.settings.stats;
    stats.blockSeen(rule.name);
    if (effectiveMode(rule, this.settings.mode) === 'observe') {
      stats.blockObserved(rule.name);
      this.port.log.info({ rule: rule.name, key: describeKey(call.key) }, 'observe: lock block would be rewritten');
      this.release('observe');
      return false;
    }
    this.holding = false;
    const block: PendingBlock = { call, rule, held: this.held, asking };
    this.held = [];
    // Once the script has worked on this connection, what follows the block may go at once.
    const pipelined = this.settings.lockPipelining && this.scriptProven;
    if (pipelined) stats.blocksPipelined++;
    this.sendScript(block, false, pipelined);
    return !pipelined;
  }

  private onHoldTimeout(): void {
    this.holdTimer = undefined;
    if (this.holding) this.release('hold-timeout');
  }

  private sendScript(block: PendingBlock, withSource: boolean, pipelined: boolean): void {
    if (!pipelined) this.port.holdClient();
    if (withSource) this.askAgain(block);
    this.port.writeUpstream(encodeLockCall(block.call, withSource));
    this.replies.capture((reply) => this.onScriptReply(reply, block, withSource, pipelined));
  }

  private onScriptReply(reply: Buffer, block: PendingBlock, withSource: boolean, pipelined: boolean): void {
    const outcome = translateScriptReply(reply);
    switch (outcome.kind) {
      case 'replies':
        this.settings.stats.blockRewritten(block.rule.name);
        this.scriptProven = true;
        this.port.writeClient(outcome.bytes);
        break;
      case 'error':
        if (pipelined) {
          if (this.redirects?.isRedirect(outcome.message)) this.answerRedirected(reply, outcome.message, block);
          else this.abandonPipelining(outcome.message, block);
          return;
        }
        if (!withSource && outcome.message.startsWith('-NOSCRIPT')) {
          // The script cache was flushed (SCRIPT FLUSH, restart, failover): send the source. Nothing
          // else was sent after the EVALSHA, so nothing is reordered.
          this.settings.stats.scriptReloads++;
          this.sendScript(block, true, false);
          return;
        }
        this.fallBack(outcome.message, block);
        break;
      case 'unexpected':
        this.port.log.error(
          { reply: outcome.message, key: describeKey(block.call.key) },
          'cannot interpret the script reply; closing the connection',
        );
        this.port.destroy();
        return;
    }
    if (!pipelined) this.port.resumeClient();
  }

  /** The script could not run: the original block goes upstream as the client sent it. */
  private fallBack(message: string, block: PendingBlock): void {
    const reason = this.noteFallback(
      message,
      block,
      'lock script could not run; sending the original block unchanged (logged once per connection and reason)',
    );
    this.settings.stats.blockFallback(block.rule.name, reason);
    this.askAgain(block);
    this.port.writeUpstream(joined(block.held));
    this.replies.expect(BLOCK_FRAMES);
  }

  /**
   * The block followed an ASKING, which the first script call used up: a retry or the fallback
   * sends ASKING again, and its +OK stays with the proxy.
   */
  private askAgain(block: PendingBlock): void {
    if (!block.asking) return;
    this.port.writeUpstream(ASKING);
    this.replies.capture(() => {});
  }

  /**
   * A pipelined script call was refused by the cluster's key check. Redis refuses the block's
   * INCR[BY] and [P]EXPIRE on the same key with the same error and then aborts the EXEC, having
   * run nothing: the client gets exactly those replies.
   */
  private answerRedirected(reply: Buffer, message: string, block: PendingBlock): void {
    const reason = this.noteFallback(
      message,
      block,
      'pipelined lock script redirected by the cluster; answering as Redis answers the block',
    );
    this.settings.stats.blockFallback(block.rule.name, reason);
    this.port.writeClient((this.redirects as BlockRedirects).redirectedBlock(reply));
  }

  /**
   * A pipelined script call failed where the script had worked before (an ACL change, SCRIPT
   * FLUSH, a busy or out-of-memory server). What the client sent after the block has already
   * run, so sending the block now would reorder it: the connection is closed instead. The
   * client's reconnection starts unproven, so its first block takes the ordered path.
   */
  private abandonPipelining(message: string, block: PendingBlock): void {
    const reason = this.noteFallback(message, block, 'pipelined lock script failed; closing the connection to keep the order of commands');
    this.settings.stats.blockFallback(block.rule.name, `${reason} (connection closed)`);
    this.port.abandon();
  }

  /** Logs a script failure once per connection and reason; returns the reason (the error's first word). */
  private noteFallback(message: string, block: PendingBlock, text: string): string {
    const reason = /^-(\S+)/.exec(message)?.[1] ?? 'ERR';
    if (!this.fallbackReasonsLogged.has(reason)) {
      this.fallbackReasonsLogged.add(reason);
      // A redirect is routine in a cluster (the client follows it), not a problem to report.
      const level = this.redirects?.isRedirect(message) ? 'debug' : 'warn';
      this.port.log[level]({ reason, error: message, rule: block.rule.name, key: describeKey(block.call.key) }, text);
    }
    return reason;
  }
}

/** One buffer for several (held bytes are small), so that they go out in one write. */
export function joined(parts: Buffer[]): Buffer {
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}
