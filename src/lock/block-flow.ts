/**
 * The script way's lock blocks (servers before Redis 7.0, or --lock-method script), from the
 * MULTI that may start one to what Redis is sent: holding the frames while the block can still
 * match, releasing them verbatim when it cannot (or at the hold deadline, counted from the
 * client's last byte), and sending a complete block as the Lua script (script.ts), whose reply
 * becomes the client's four replies. While the call is in flight the client's later bytes wait
 * (the session holds them), so that a script that could not run is replaced by the original
 * block exactly where the client put it.
 *
 * The script must see the whole block before it runs, hence the hold. Servers with
 * `EXPIRE ... NX` hold nothing: their blocks are fixed as they stream (streamed-blocks.ts).
 * A block released unchanged is followed on from there, and counted at its EXEC like any other.
 *
 * The flow touches no socket: it works through a LockBlockPort, which the session implements,
 * and the connection's reply accounting.
 */
import { describeKey } from '../key-text.js';
import type { Logger } from '../log.js';
import { ASKING } from '../resp/encode.js';
import type { RequestScanner } from '../resp/request-scanner.js';
import { effectiveMode, type Rule, type RuleMode, type RuleSet } from '../rules/types.js';
import type { Stats } from '../stats.js';
import { BlockMatcher, BlockStep, framesTaken } from './block-matcher.js';
import { BLOCK_FRAMES, type LockCall } from './block-shape.js';
import { encodeLockCall, translateScriptReply } from './script.js';
import type { UnfixedReason } from './streamed-blocks.js';

/** What the block flow needs of its connection. */
export interface LockBlockPort {
  /** Bytes for Redis, in order. */
  writeUpstream(bytes: Buffer): void;
  /** Bytes for the client, in order. */
  writeClient(bytes: Buffer): void;
  /**
   * Held frames went upstream unchanged, as Redis runs them: `frames` of them (MULTI first),
   * `complete` with the EXEC; `key` the increment's once it got that far; `reason` why the
   * block was not fixed, should it turn out to be one.
   */
  blockSent(frames: number, complete: boolean, key: Buffer | null, reason: UnfixedReason): void;
  /** The client's next bytes wait until resumeClient(): a reply of the proxy's own decides what goes next. */
  holdClient(): void;
  resumeClient(): void;
  /**
   * Closes the connection as a network failure would (a block whose outcome cannot be told):
   * what the client has been sent still reaches it, nothing more goes either way.
   */
  closeAfterReplies(): void;
  /** An exception on the connection's data path, from a timer or a promise: it ends the session, never the process. */
  fault(error: unknown): void;
  readonly log: Logger;
}

/** A lock block whose replies are on their way: its rule's name and its key. */
export interface LockBlockRef {
  readonly rule: string;
  readonly key: Buffer;
}

/** The connection's reply accounting (session/reply-stream.ts). */
export interface ExpectedReplies {
  /** `count` replies come for what was just sent upstream. */
  expect(count: number): void;
  /**
   * The reply to what was just sent upstream is the flow's own: to `handle`, not to the client.
   * `lock`: it carries a lock block's replies (the rule and key), should the connection close first.
   */
  capture(handle: (reply: Buffer) => void, clients?: boolean, lock?: LockBlockRef): void;
}

export interface BlockSettings {
  /** 'observe': every rule only observes. */
  readonly mode: RuleMode;
  readonly holdMs: number;
  readonly stats: Stats;
}

/** A whole lock block, held until it is sent. */
interface CompleteBlock {
  readonly call: LockCall;
  readonly rule: Rule;
  /** The block as the client sent it. */
  readonly bytes: Buffer;
  /** ASKING came right before the block: a command of the proxy's own used it up, so it is sent again. */
  readonly asking: boolean;
}

/** Errors of Redis Cluster's key check, which Redis gives the original block's commands too. */
const CLUSTER_REDIRECT = /^-(MOVED|ASK|TRYAGAIN|CLUSTERDOWN)\b/;

export class LockBlocks {
  /** A MULTI and what followed it are held until the block matches or cannot. */
  holding = false;
  private readonly matcher = new BlockMatcher();
  /** Bytes of the block being held. */
  private held: Buffer[] = [];
  private holdTimer: NodeJS.Timeout | undefined;
  private readonly fallbackReasonsLogged = new Set<string>();

  constructor(
    private readonly port: LockBlockPort,
    private readonly replies: ExpectedReplies,
    private readonly settings: BlockSettings,
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
    this.holdTimer = setTimeout(() => {
      try {
        this.onHoldTimeout();
      } catch (error) {
        this.port.fault(error);
      }
    }, this.settings.holdMs);
    this.holdTimer.unref();
  }

  stopTimer(): void {
    if (this.holdTimer !== undefined) {
      clearTimeout(this.holdTimer);
      this.holdTimer = undefined;
    }
  }

  /** Sends the held bytes upstream unchanged and goes back to forwarding. */
  release(reason: string): void {
    this.stopTimer();
    this.holding = false;
    this.settings.stats.countRelease(reason);
    const held = this.held;
    this.held = [];
    this.port.writeUpstream(joined(held));
    const frames = framesTaken(this.matcher.step);
    const key = frames >= 2 ? this.matcher.call().key : null;
    this.port.blockSent(frames, this.isComplete, key, reason === 'hold-timeout' ? 'hold-timeout' : 'not-a-lock-block');
  }

  /**
   * A whole block is held. `asking`: ASKING came right before it. Returns true when the client's
   * next bytes must wait for the script's reply.
   */
  complete(asking: boolean): boolean {
    this.stopTimer();
    const rule = this.matcher.rule;
    if (rule === undefined) {
      this.release('no-rule');
      return false;
    }
    if (effectiveMode(rule, this.settings.mode) === 'observe') {
      this.release('observe');
      return false;
    }
    this.settings.stats.blockSeen(rule.name);
    this.holding = false;
    const block: CompleteBlock = { call: this.matcher.call(), rule, bytes: joined(this.held), asking };
    this.held = [];
    this.sendScript(block, false);
    return true;
  }

  private onHoldTimeout(): void {
    this.holdTimer = undefined;
    if (this.holding) this.release('hold-timeout');
  }

  private sendScript(block: CompleteBlock, withSource: boolean): void {
    this.port.holdClient();
    if (withSource) this.askAgain(block);
    this.port.writeUpstream(encodeLockCall(block.call, withSource));
    this.replies.capture((reply) => this.onScriptReply(reply, block, withSource), false, { rule: block.rule.name, key: block.call.key });
  }

  private onScriptReply(reply: Buffer, block: CompleteBlock, withSource: boolean): void {
    const outcome = translateScriptReply(reply);
    switch (outcome.kind) {
      case 'replies':
        this.settings.stats.blockRewritten(block.rule.name, 'script');
        this.port.writeClient(outcome.bytes);
        break;
      case 'error':
        if (!withSource && outcome.message.startsWith('-NOSCRIPT')) {
          // The script cache was flushed (SCRIPT FLUSH, restart, failover): send the source. Nothing
          // else was sent after the EVALSHA, so nothing is reordered.
          this.settings.stats.scriptReloads++;
          this.sendScript(block, true);
          return;
        }
        this.fallBack(outcome.message, block);
        break;
      case 'unknown':
        // The increment may have run: sending the block again could count twice, and faking
        // replies would lie. The client sees what a network failure looks like.
        this.settings.stats.blockClosed(block.rule.name);
        this.port.log.error(
          { reason: outcome.message, key: describeKey(block.call.key) },
          'lock script outcome unknown; closing the connection',
        );
        this.port.closeAfterReplies();
        return;
    }
    this.port.resumeClient();
  }

  /** The script wrote nothing: the original block goes upstream as the client sent it, for Redis to answer. */
  private fallBack(message: string, block: CompleteBlock): void {
    const { reason, command } = refusalCause(message);
    if (!this.fallbackReasonsLogged.has(reason)) {
      this.fallbackReasonsLogged.add(reason);
      // A cluster's key check (the key's slot is elsewhere) is routine: the client follows the redirect.
      const level = CLUSTER_REDIRECT.test(message) ? 'debug' : 'warn';
      this.port.log[level](
        { reason, command, error: message, rule: block.rule.name, key: describeKey(block.call.key) },
        'lock script could not run; sending the original block unchanged (logged once per connection and reason)',
      );
    }
    this.settings.stats.blockFallback(block.rule.name, reason);
    this.askAgain(block);
    this.port.writeUpstream(block.bytes);
    this.replies.expect(BLOCK_FRAMES);
  }

  /**
   * The block followed an ASKING, which a command of the proxy's own used up (ASKING lasts one
   * command): it is sent again before the block, and its +OK stays with the proxy.
   */
  private askAgain(block: CompleteBlock): void {
    if (!block.asking) return;
    this.port.writeUpstream(ASKING);
    this.replies.capture(() => {});
  }
}

/** One buffer for several (held bytes are small), so that they go out in one write. */
export function joined(parts: Buffer[]): Buffer {
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}

/**
 * The cause a refusal of the script names: its error code (NOPERM, OOM, READONLY, BUSY, NOSCRIPT,
 * MOVED, ...), and for NOPERM the command refused, where it says (the script names the one it was
 * refused; Redis names EVALSHA's own in quotes).
 */
export function refusalCause(message: string): { reason: string; command: string | undefined } {
  const reason = /^-([A-Z]+)\b/.exec(message)?.[1] ?? 'ERR';
  if (reason !== 'NOPERM') return { reason, command: undefined };
  const command = /^-NOPERM ([a-z]+):/.exec(message)?.[1] ?? /'([a-z|]+)' command/.exec(message)?.[1];
  return { reason, command };
}
