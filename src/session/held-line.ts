/**
 * A line for the client kept back, with every byte after it, until the next line tells whose it
 * is: after a RESET that may have been refused while replies were off, a `+OK` may be the
 * answer to the proxy's own CLIENT REPLY ON (reset-marker.ts), known only once the marker's
 * refusal follows it. Redis sends the two together; anything else after the line shows that it
 * was the client's, and it goes on in order.
 */
export class HeldLine {
  /** The line, then what came after it; null while nothing is held. */
  private parts: Buffer[] | null = null;
  private size = 0;
  /** The line to hold once it is written (after the bytes that come before it). */
  private armed: Buffer | null = null;

  /** `write`: sends bytes on to the client, in order. `limit`: bytes held at most, past which the line is the client's. */
  constructor(
    private readonly write: (bytes: Buffer) => void,
    private readonly limit: number,
  ) {}

  /**
   * Returns a copy of `line` (it may be a view of a read) to write in its place: that write
   * holds it, once what comes before it has gone (error-lines.ts writes those after deciding).
   */
  hold(line: Buffer): Buffer {
    this.armed = Buffer.from(line);
    return this.armed;
  }

  /** Bytes for the client: sent, or kept behind the held line. */
  out(bytes: Buffer): void {
    const parts = this.parts;
    if (bytes === this.armed) {
      this.armed = null;
      this.release(true);
      this.parts = [bytes];
      this.size = bytes.length;
      return;
    }
    if (parts === null) {
      this.write(bytes);
      return;
    }
    if (bytes.length === 0) return;
    parts.push(Buffer.from(bytes));
    this.size += bytes.length;
    if (this.size > this.limit) this.release(true);
  }

  /** What is held goes on: with the line (it was the client's), or without it (it was the proxy's). */
  release(withLine: boolean): void {
    const parts = this.parts;
    if (parts === null) return;
    this.parts = null;
    for (let i = withLine ? 0 : 1; i < parts.length; i++) this.write(parts[i]);
  }
}
