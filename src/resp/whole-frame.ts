/**
 * A request frame read at once, for the frames the proxy only counts (most of them): when a
 * whole multibulk frame is in the chunk, its command and arity are all the proxy needs of it,
 * and reading them in one tight pass costs a fraction of RequestScanner's resumable,
 * event-by-event reading. Anything out of the ordinary is left to the scanner, which reads it
 * with Redis's every rule: a line cut by the end of the chunk, an empty argument, a count or
 * length of more than 9 digits or with a sign or a leading zero, an inline command.
 */
import { classifyCommand, Cmd } from './commands.js';
import { ShortNumberLine } from './number-line.js';

const EMPTY = Buffer.alloc(0);

export class WholeFrameReader {
  /** The command of the frame read last. */
  cmd: Cmd = Cmd.Other;
  /** Its number of arguments, the name included. */
  argc = 0;
  /**
   * Where its argument 1 (the key, for the commands of a lock pair) lies, when argc > 1, and its
   * argument 2 (a delta or an expiry), when argc > 2: in the buffer read (`key`, `value`), valid
   * only as long as that buffer is.
   */
  key: Buffer = EMPTY;
  keyStart = 0;
  keyLength = 0;
  value: Buffer = EMPTY;
  valueStart = 0;
  valueLength = 0;
  private readonly line = new ShortNumberLine();

  /**
   * Reads the frame that starts at `pos` when it is whole in `buf`, and returns the offset after
   * it (cmd and argc then describe it); otherwise returns -1.
   */
  read(buf: Buffer, pos: number): number {
    if (buf[pos] !== 0x2a /* * */) return -1;
    const line = this.line;
    pos = line.read(buf, pos + 1);
    if (pos < 0) return -1;
    const argc = line.value;
    const end = buf.length;
    let cmd: Cmd = Cmd.Other;
    for (let arg = 0; arg < argc; arg++) {
      if (pos >= end || buf[pos] !== 0x24 /* $ */) return -1;
      const body = line.read(buf, pos + 1);
      if (body < 0) return -1;
      const length = line.value;
      pos = body + length + 2; // the two bytes after a body are skipped unchecked, as Redis does
      if (pos > end) return -1;
      if (arg === 0) cmd = classifyCommand(buf, body, length);
      else if (arg === 1) {
        this.keyStart = body;
        this.keyLength = length;
      } else if (arg === 2) {
        this.valueStart = body;
        this.valueLength = length;
      }
    }
    this.cmd = cmd;
    this.argc = argc;
    this.key = buf;
    this.value = buf;
    return pos;
  }
}
