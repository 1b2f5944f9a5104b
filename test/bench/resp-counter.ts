/**
 * Counts complete top-level RESP2 replies in a byte stream that arrives in
 * chunks cut anywhere. The load generators only need to know when a request
 * has all its replies (a lock block has 4: +OK, +QUEUED, +QUEUED and the EXEC
 * array), not what they say, so nothing is decoded or allocated per reply:
 * bulk bodies are skipped by length, nested arrays are a stack of counts.
 */
import { Buffer } from 'node:buffer';

const CR = 0x0d;
const LF = 0x0a;
const MAX_DEPTH = 32;
/** Longest header line carried over a chunk boundary (`$536870912\r` is 11). */
const MAX_LINE = 64;

export class ReplyCounter {
  /** Error replies (`-...`) seen at any depth: the loads expect none. */
  errors = 0;
  /** Bulk body bytes plus its CRLF still to skip. */
  private skip = 0;
  /** Elements still missing in each open array, innermost last. */
  private readonly pending = new Int32Array(MAX_DEPTH);
  private depth = 0;
  /** A header line cut by the end of a chunk, kept until its LF arrives. */
  private readonly carry = Buffer.alloc(MAX_LINE);
  private carried = 0;

  /** Consumes a chunk and returns how many top-level replies it completed. */
  feed(chunk: Buffer): number {
    let done = 0;
    let i = 0;
    const end = chunk.length;
    while (i < end) {
      if (this.skip > 0) {
        const take = Math.min(this.skip, end - i);
        this.skip -= take;
        i += take;
        if (this.skip === 0) done += this.completeValue();
        continue;
      }
      const lf = chunk.indexOf(LF, i);
      if (lf === -1) {
        this.keep(chunk, i, end);
        break;
      }
      if (this.carried > 0) {
        // Rare: the header started in the previous chunk.
        this.keep(chunk, i, lf);
        done += this.header(this.carry, 0, this.carried);
        this.carried = 0;
      } else {
        done += this.header(chunk, i, lf);
      }
      i = lf + 1;
    }
    return done;
  }

  private keep(chunk: Buffer, from: number, to: number): void {
    if (this.carried + (to - from) > MAX_LINE) throw new Error('RESP header line too long');
    chunk.copy(this.carry, this.carried, from, to);
    this.carried += to - from;
  }

  /** One header line, `start` at its type byte, `lf` at its LF (CR just before). */
  private header(buf: Buffer, start: number, lf: number): number {
    const type = buf[start];
    switch (type) {
      case 0x2b: // +simple string
      case 0x3a: // :integer
        return this.completeValue();
      case 0x2d: // -error
        this.errors++;
        return this.completeValue();
      case 0x24: {
        // $bulk: skip the body and its CRLF; $-1 is nil.
        const length = parseLength(buf, start + 1, lf);
        if (length < 0) return this.completeValue();
        this.skip = length + 2;
        return 0;
      }
      case 0x2a: {
        // *array: its elements complete it; *0 and *-1 are complete at once.
        const count = parseLength(buf, start + 1, lf);
        if (count <= 0) return this.completeValue();
        if (this.depth === MAX_DEPTH) throw new Error('RESP arrays nested too deep');
        this.pending[this.depth++] = count;
        return 0;
      }
      default:
        throw new Error(`unexpected RESP type byte 0x${(type ?? 0).toString(16)}`);
    }
  }

  /** A value ended: it either fills a slot of the innermost array or is a whole reply. */
  private completeValue(): number {
    while (this.depth > 0) {
      if (--this.pending[this.depth - 1] > 0) return 0;
      this.depth--; // that array is now a complete value of its parent
    }
    return 1;
  }
}

/** The signed decimal between `from` and the CR before `lf`. */
function parseLength(buf: Buffer, from: number, lf: number): number {
  const to = buf[lf - 1] === CR ? lf - 1 : lf;
  let i = from;
  let sign = 1;
  if (buf[i] === 0x2d) {
    sign = -1;
    i++;
  }
  let value = 0;
  for (; i < to; i++) value = value * 10 + (buf[i] - 0x30);
  return sign * value;
}
