/**
 * The decimal number on a request's `*` or `$` line, read a byte at a time (a line may be cut
 * anywhere by TCP), with the rules of Redis's string2ll (util.c): an optional `-`, digits, no
 * `+`, no leading zero but for "0" itself, within the int64 range.
 */

/** Incremental parser for the decimal number on a `*` or `$` line, with string2ll's rules. */
export class NumberLine {
  value = 0;
  digits = 0;
  negative = false;
  valid = true;
  length = 0;
  /** The digits as text once the number grows past 15 digits, for the exact int64 range check. */
  private long = '';

  reset(): void {
    this.value = 0;
    this.digits = 0;
    this.negative = false;
    this.valid = true;
    this.length = 0;
    this.long = '';
  }

  push(byte: number): void {
    this.length++;
    if (byte === 0x2d /* - */ && this.length === 1) {
      this.negative = true;
      return;
    }
    const d = byte - 0x30;
    if (d < 0 || d > 9) {
      this.valid = false;
      return;
    }
    // string2ll refuses leading zeros, except for "0" itself.
    if (this.digits === 1 && this.value === 0) this.valid = false;
    if (this.digits === 0 && d === 0 && this.negative) this.valid = false;
    this.digits++;
    this.value = this.value * 10 + d;
    if (this.digits > 15) this.long = this.digits === 16 ? String(Math.floor(this.value / 10)) + String(d) : this.long + String(d);
  }

  /**
   * The parsed value, or undefined when Redis would refuse the line. Values
   * beyond 2^53 in magnitude are approximate (only their sign and size matter).
   */
  result(): number | undefined {
    if (!this.valid || this.digits === 0 || this.digits > 19) return undefined;
    if (this.digits === 19 && BigInt(this.long) > (this.negative ? 2n ** 63n : 2n ** 63n - 1n)) return undefined;
    return this.negative ? -this.value : this.value;
  }
}

/** Whether the digits read so far on a count line can still spell `n` (a positive integer). */
export function isPrefixOfNumber(line: NumberLine, n: number): boolean {
  if (line.length === 0) return true;
  if (line.negative || !line.valid) return false;
  // A valid line has no leading zero, so its value has exactly `digits` digits: compare it with
  // n's first `digits` digits (arithmetic, not strings: this runs at the end of chunks).
  const limit = 10 ** line.digits;
  let prefix = n;
  while (prefix >= limit) prefix = Math.floor(prefix / 10);
  return prefix === line.value;
}

/**
 * The usual `*` or `$` line, read at once when it is whole in the chunk: 1 to 9 digits, the
 * first not 0, then CR and the byte after it (which Redis skips unchecked). Anything else (a line
 * cut by the end of the chunk, a sign, a leading zero, a longer number) is NumberLine's to read,
 * with all of string2ll's rules. A plain loop: this runs for most request lines.
 */
export class ShortNumberLine {
  /** The number on the line read last. */
  value = 0;

  /** Reads the line whose digits start at `pos`; returns the offset after it, or -1. */
  read(buf: Buffer, pos: number): number {
    const end = buf.length;
    const last = Math.min(end, pos + 9);
    let i = pos;
    let value = 0;
    for (; i < last; i++) {
      const d = buf[i] - 0x30;
      if (d < 0 || d > 9) break;
      value = value * 10 + d;
    }
    if (i === pos || i + 1 >= end || buf[i] !== 0x0d || buf[pos] === 0x30) return -1;
    this.value = value;
    return i + 2;
  }
}
