/**
 * The fast path over a chunk: frames that are whole in it and need nothing but their reply
 * counted go upstream with the rest of the chunk, without the scanner reading them head by head.
 */
import { Cmd } from '../resp/commands.js';
import { WholeFrameReader } from '../resp/whole-frame.js';

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

export class CountedFrames {
  private readonly whole = new WholeFrameReader();
  /** How many frames the last take() took. */
  taken = 0;

  /**
   * Takes the frames from `pos` (between frames) that are whole in the chunk and only counted;
   * `following`: inside a followed transaction, whose lock pairs' commands are read by their
   * heads. Returns where the next frame begins.
   */
  take(chunk: Buffer, pos: number, following: boolean): number {
    const whole = this.whole;
    let frames = 0;
    while (pos < chunk.length) {
      const after = whole.read(chunk, pos);
      if (after < 0 || !onlyCounted(whole.cmd, whole.argc) || (following && isPairCommand(whole.cmd))) break;
      frames++;
      pos = after;
    }
    this.taken = frames;
    return pos;
  }
}
