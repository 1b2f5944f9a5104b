/**
 * The fast path over a chunk: frames that are whole in it go upstream with the rest of the chunk,
 * without the scanner reading them head by head, when all they need is their reply counted, or,
 * inside a followed transaction, when they are a lock pair's increment or expiry (the expiry that
 * completes a pair whose rule enforces gains NX on the transaction way). Anything else is left to
 * the scanner, from the first such frame on: RequestFlow reads it event by event.
 */
import { expiryWithNx } from '../lock/expire-nx.js';
import type { LockMethod } from '../lock/lock-method.js';
import type { PairOutcome, StreamedBlocks } from '../lock/streamed-blocks.js';
import { Cmd } from '../resp/commands.js';
import { MAX_CAPTURED_KEY, MAX_CAPTURED_VALUE } from '../resp/request-scanner.js';
import { WholeFrameReader } from '../resp/whole-frame.js';
import type { RuleSet } from '../rules/types.js';
import type { Stats } from '../stats.js';
import type { ReplyStream } from './reply-stream.js';
import type { TransactionState } from './transaction-state.js';

/** The commands of a lock pair: inside a followed transaction, each is looked at. */
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

/** What the fast path needs of its connection: the state a forwarded frame changes, and the way bytes go upstream. */
export interface CountedFramesPort {
  readonly tx: TransactionState;
  readonly streamed: StreamedBlocks;
  readonly replies: Pick<ReplyStream, 'expect'>;
  readonly stats: Stats;
  rules(): RuleSet;
  /** The server's way for lock blocks, once known. */
  method(): LockMethod | null;
  writeUpstream(bytes: Buffer): void;
}

export class CountedFrames {
  private readonly whole = new WholeFrameReader();
  /** After take(): where the bytes of the chunk not yet forwarded begin. */
  unsentFrom = 0;

  constructor(private readonly port: CountedFramesPort) {}

  /**
   * Takes the frames from `pos` (between frames) that are whole in the chunk and need no more
   * than the fast path gives them: their replies are expected, and their bytes go upstream with
   * the rest of the chunk (`from`: where the bytes not yet forwarded begin). Returns where the
   * next frame begins, which the scanner reads, and leaves in `unsentFrom` where the bytes not
   * yet forwarded begin then (`from`, unless an expiry gained NX).
   */
  take(chunk: Buffer, pos: number, from: number): number {
    const { whole, port } = this;
    const following = port.streamed.active;
    this.unsentFrom = from;
    let frames = 0;
    while (pos < chunk.length) {
      const after = whole.read(chunk, pos);
      if (after < 0 || !onlyCounted(whole.cmd, whole.argc)) break;
      if (following && isPairCommand(whole.cmd)) {
        this.counted(frames, true);
        frames = 0;
        if (!this.pairFrame(chunk, pos, after)) return pos;
      } else {
        frames++;
      }
      pos = after;
    }
    this.counted(frames, following);
    return pos;
  }

  /** `frames` frames that are none of a pair's went upstream (`following`: inside a followed transaction). */
  private counted(frames: number, following: boolean): void {
    if (frames === 0) return;
    const port = this.port;
    if (following) port.streamed.others();
    port.tx.forwarded(frames);
    port.stats.commandsForwarded += frames;
    port.replies.expect(frames);
  }

  /**
   * A lock pair's command, whole in the chunk from `start` to `end`, queued in a followed
   * transaction: taken as RequestFlow.forwardFrame takes it. The increment is noted; the expiry
   * that completes a pair whose rule enforces gains NX on the transaction way. Returns false to
   * leave the frame to the scanner: arguments longer than it captures, or an expiry to fix on
   * the other ways (they send the script, or hold the block).
   */
  private pairFrame(chunk: Buffer, start: number, end: number): boolean {
    const { whole: frame, port } = this;
    if (!port.tx.inMulti || frame.keyLength > MAX_CAPTURED_KEY || (frame.argc > 2 && frame.valueLength > MAX_CAPTURED_VALUE)) {
      return false;
    }
    let outcome: PairOutcome | null = null;
    if (frame.cmd !== Cmd.Incr && frame.cmd !== Cmd.Incrby && port.streamed.isEnforcedExpiryFrame(frame)) {
      if (port.method() !== 'transaction') return false;
      port.writeUpstream(chunk.subarray(this.unsentFrom, start));
      port.writeUpstream(expiryWithNx(chunk.subarray(start, end)));
      this.unsentFrom = end;
      outcome = 'nx';
    }
    port.tx.forwarded(1);
    port.streamed.queuedFrame(frame, port.tx.queuedIndex, port.rules(), outcome);
    port.stats.commandsForwarded++;
    port.replies.expect(1);
    return true;
  }
}
