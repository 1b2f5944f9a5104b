/**
 * A request frame read at once, for the frames the proxy only counts (most of them): when a
 * whole multibulk frame is in the chunk, its command and arity are all the proxy needs of it,
 * and reading them in one tight pass costs a fraction of RequestScanner's resumable,
 * event-by-event reading. Anything out of the ordinary is left to the scanner, which reads it
 * with Redis's every rule: a line cut by the end of the chunk, an empty argument, a count or
 * length of more than 9 digits or with a sign or a leading zero, an inline command.
 */
import { classifyCommand, Cmd } from './commands.js';

export class WholeFrameReader {
  /** The command of the frame read last. */
  cmd: Cmd = Cmd.Other;
  /** Its number of arguments, the name included. */
  argc = 0;

  /**
   * Reads the frame that starts at `pos` when it is whole in `buf`, and returns the offset after
   * it (cmd and argc then describe it); otherwise returns -1.
   */
  read(buf: Buffer, pos: number): number {
    const end = buf.length;
    if (buf[pos] !== 0x2a /* * */) return -1;
    // The lines are read inline, not by a helper: this runs for most frames.
    let i = pos + 1;
    let argc = 0;
    let digit = i < end ? buf[i] - 0x30 : -1;
    if (digit < 1 || digit > 9) return -1;
    const countEnd = Math.min(end, i + 9);
    do {
      argc = argc * 10 + digit;
      i++;
      digit = i < countEnd ? buf[i] - 0x30 : -1;
    } while (digit >= 0 && digit <= 9);
    // CR, and the byte after it, which Redis skips unchecked.
    if (i + 1 >= end || buf[i] !== 0x0d) return -1;
    pos = i + 2;
    let cmd: Cmd = Cmd.Other;
    for (let arg = 0; arg < argc; arg++) {
      if (pos >= end || buf[pos] !== 0x24 /* $ */) return -1;
      i = pos + 1;
      let length = 0;
      digit = i < end ? buf[i] - 0x30 : -1;
      if (digit < 1 || digit > 9) return -1;
      const lengthEnd = Math.min(end, i + 9);
      do {
        length = length * 10 + digit;
        i++;
        digit = i < lengthEnd ? buf[i] - 0x30 : -1;
      } while (digit >= 0 && digit <= 9);
      if (i + 1 >= end || buf[i] !== 0x0d) return -1;
      const body = i + 2;
      pos = body + length + 2; // the two bytes after a body are skipped unchecked, as Redis does
      if (pos > end) return -1;
      if (arg === 0) cmd = classifyCommand(buf, body, length);
    }
    this.cmd = cmd;
    this.argc = argc;
    return pos;
  }
}
