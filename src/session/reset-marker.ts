/**
 * Where Redis's answer to a RESET lies in a reply stream the proxy cannot count (a plain pipe:
 * subscribe mode, MONITOR, CLIENT REPLY, inline quoting). Looking for `+RESET` is not enough: a
 * RESP3 client may run any command while subscribed, and a script can answer `+RESET` too; a
 * `CLIENT REPLY SKIP` may or may not suppress the answer (Redis ignores SKIP while replies are
 * OFF, and a refused SKIP skips nothing); and a queued CLIENT REPLY OFF or SKIP leaves an EXEC
 * array header whose element never comes, so that later replies read as its elements.
 *
 * So right after the client's RESET the proxy sends one command of its own that no server
 * knows, named with a random nonce. Redis refuses an unknown command before any authentication
 * or ACL check (server.c processCommand: commandCheckExistence comes first), so whoever the
 * connection is logged in as, and RESET has turned replies back on: the refusal always comes.
 * Its line names the command: `-ERR unknown command 'NAME', with args beginning with: ` (Redis
 * 7, Valkey; Redis 6 quotes with backticks). Every reply before it answers the client's
 * commands up to the RESET, and the line itself is the proxy's, at any depth the stream seems
 * to be at. No reply of the client's can hold the nonce: it is drawn after the commands those
 * replies answer were sent, and it is never sent to the client. The refusal is counted in
 * Redis's error statistics (INFO errorstats, `ERR`) and nowhere else: an unknown command never
 * runs, so MONITOR, the slow log and the command statistics do not see it.
 *
 * Redis 6.2 may refuse the RESET itself: it checks ACLs on it (7.0 does not: RESET is no-auth
 * there) and answers -BUSY while a script runs. Where it may (`judged`), the outcome is read
 * from the last line before the marker's refusal: RESET answers `+RESET` right before it when
 * it ran, and its error when refused, after which only pushes, messages and MONITOR lines can
 * come (none of them a `+RESET` line). Two cases need more:
 * - a `CLIENT REPLY SKIP` before the RESET: Redis skips the RESET's answer whether it ran or
 *   not. A second unknown command goes right before the RESET and takes the SKIP (`before`);
 *   where Redis honoured it, that command's refusal does not come, and RESET's answer is held,
 *   then dropped. Where it cannot go there (the RESET's frame began in an earlier read), or
 *   replies may be off too, the outcome is not known (`unknown`): the connection stays a pipe;
 * - replies may be OFF: a refused RESET leaves them off, and the marker's refusal never comes.
 *   `CLIENT REPLY ON` and a second marker follow the first. Whatever the RESET did, the second
 *   refusal comes: alone, when replies were off (the RESET was refused, and the proxy then
 *   turns them off again, `refused-while-off`); after the first, when they were on. CLIENT
 *   REPLY ON's answer (`+OK`, or its error) between the two is the proxy's, and is dropped.
 */
import { randomBytes } from 'node:crypto';
import { encodeCommand } from '../resp/encode.js';

const REFUSAL_START = Buffer.from('-ERR unknown command ');
const QUOTE = 0x27; // '
const BACKTICK = 0x60; // `
const RESET_LINE = Buffer.from('+RESET\r\n');
const OK_LINE = Buffer.from('+OK\r\n');
const REPLY_ON = encodeCommand('CLIENT', 'REPLY', 'ON');
/** Sent after a RESET refused while replies were off: they are off again, as Redis left them (no answer comes). */
export const REPLY_OFF = encodeCommand('CLIENT', 'REPLY', 'OFF');

/** What became of the client's RESET, as far as its replies tell. */
export type ResetOutcome = 'ran' | 'refused' | 'refused-while-off' | 'unknown';

/** What is known of the connection when its RESET went upstream. */
export interface ResetConditions {
  /** The server may refuse RESET (Redis 6.2, or a server whose version is not known). */
  readonly judged: boolean;
  /** A CLIENT REPLY SKIP may be pending: RESET's answer may be skipped. */
  readonly skipPending: boolean;
  /** A CLIENT REPLY OFF may be in force. */
  readonly repliesMayBeOff: boolean;
  /** A command of the proxy's own can go right before the RESET (its frame is not yet forwarded). */
  readonly beforeReset?: boolean;
}

/**
 * What to do with a line the marker looked at: the client's (`pass`), the proxy's (`drop`), the
 * proxy's last (`end`), or not known until a later line (`hold`: held-line.ts).
 */
export type LineVerdict = 'pass' | 'drop' | 'end' | 'hold';

/** What becomes of a line held before: kept (not known yet), sent on (the client's), or dropped. */
export type HeldAction = 'keep' | 'send' | 'drop';

const NOT_JUDGED: ResetConditions = { judged: false, skipPending: false, repliesMayBeOff: false };

export class ResetMarker {
  /** What to send right after the client's RESET. */
  readonly command: Buffer;
  /**
   * What to send right before the client's RESET, or null: after a CLIENT REPLY SKIP where RESET
   * may be refused, a command no server knows takes the SKIP, so that RESET's own answer comes
   * and tells what it did. Where Redis honoured the SKIP, that refusal does not come, and RESET's
   * answer is held, then dropped, as the SKIP would have dropped it.
   */
  readonly before: Buffer | null;
  /** Simple lines (`+RESET`, `+OK`) are looked at too, not only error lines. */
  readonly watchesSimple: boolean;
  /** Known once line() returned 'end'. */
  outcome: ResetOutcome = 'unknown';
  /** What becomes of the held line, if any, told after each line() or skipped(). */
  heldAction: HeldAction = 'send';
  private readonly first: Nonce;
  private readonly second: Nonce | null;
  /** The command sent before the RESET, until its refusal came (null: none, or it came). */
  private absorber: Nonce | null;
  private firstFound = false;
  /** The last line looked at before the first refusal (the last that may be RESET's answer, while absorbing) was `+RESET`. */
  private lastWasReset = false;
  /** CLIENT REPLY ON's answer was dropped. */
  private replyOnAnswered = false;

  constructor(private readonly conditions: ResetConditions = NOT_JUDGED) {
    const { judged, skipPending, repliesMayBeOff, beforeReset = false } = conditions;
    this.first = new Nonce();
    this.second = judged && repliesMayBeOff ? new Nonce() : null;
    // With replies maybe off as well, whether Redis honoured the SKIP cannot be told either way.
    this.absorber = judged && skipPending && !repliesMayBeOff && beforeReset ? new Nonce() : null;
    this.before = this.absorber?.command ?? null;
    this.command = this.second === null ? this.first.command : Buffer.concat([this.first.command, REPLY_ON, this.second.command]);
    this.watchesSimple = judged;
  }

  /** Whether a whole error line (CRLF included) is Redis's refusal of the (first) marker command. */
  matches(line: Buffer): boolean {
    return this.first.matches(line);
  }

  /** Whether a line that begins with `head` (shorter than the line) is one to look at whole. */
  couldStart(head: Buffer): boolean {
    if (head[0] === 0x2b /* + */) return this.watchesSimple && (isPrefix(head, RESET_LINE) || isPrefix(head, OK_LINE));
    if (this.firstFound) return true; // CLIENT REPLY ON's refusal, or the second marker's
    return this.first.couldStart(head) || (this.second?.couldStart(head) ?? false) || this.watchesSimple;
  }

  /** A line went by that was not looked at whole (too long, or one that cannot be watched). */
  skipped(): void {
    // RESET's own answer is short: while absorbing, a held answer stays held.
    this.heldAction = this.absorber !== null ? 'keep' : 'send';
    if (this.absorber === null) this.lastWasReset = false;
  }

  /** A whole line (`+` or `-`, CRLF included) before the marker's end. */
  line(line: Buffer): LineVerdict {
    this.heldAction = 'send';
    if (!this.firstFound) {
      if (this.absorber?.matches(line)) {
        // Redis did not honour the SKIP (replies off, or SKIP refused): RESET's answer is the client's.
        this.absorber = null;
        return 'drop';
      }
      if (this.first.matches(line)) {
        this.firstFound = true;
        const { judged, skipPending } = this.conditions;
        // Where the command before the RESET took an honoured SKIP, the line held is RESET's answer.
        const absorbed = this.absorber !== null;
        if (absorbed) this.heldAction = 'drop';
        this.outcome = !judged ? 'ran' : skipPending && this.before === null ? 'unknown' : this.lastWasReset ? 'ran' : 'refused';
        return this.second === null ? 'end' : 'drop';
      }
      if (this.second?.matches(line)) {
        // The first refusal never came: replies were off after the RESET, so it did not run. The
        // `+OK` held right before it was CLIENT REPLY ON's.
        this.outcome = 'refused-while-off';
        this.heldAction = 'drop';
        return 'end';
      }
      const isReset = line.equals(RESET_LINE);
      if (this.absorber !== null) {
        // RESET's answer is the last `+RESET` or error line before the refusal: held until then.
        if (!isReset && line[0] !== 0x2d /* - */) {
          this.heldAction = 'keep';
          return 'pass';
        }
        this.lastWasReset = isReset;
        return 'hold';
      }
      this.lastWasReset = isReset;
      return this.second !== null && line.equals(OK_LINE) ? 'hold' : 'pass';
    }
    if (this.second?.matches(line)) return 'end';
    if (!this.replyOnAnswered && (line[0] === 0x2d /* - */ || line.equals(OK_LINE))) {
      this.replyOnAnswered = true;
      return 'drop';
    }
    return 'pass';
  }
}

/** One marker command and its refusal. */
class Nonce {
  readonly command: Buffer;
  private readonly name: Buffer;

  constructor() {
    this.name = Buffer.from(`redis-lock-proxy-after-reset-${randomBytes(12).toString('hex')}`);
    this.command = encodeCommand(this.name.toString('latin1'));
  }

  matches(line: Buffer): boolean {
    const quote = REFUSAL_START.length;
    const end = quote + 1 + this.name.length;
    return (
      line.length > end &&
      this.couldStart(line.subarray(0, quote + 1)) &&
      line.subarray(quote + 1, end).equals(this.name) &&
      line[end] === line[quote]
    );
  }

  couldStart(head: Buffer): boolean {
    const known = Math.min(head.length, REFUSAL_START.length);
    if (!head.subarray(0, known).equals(REFUSAL_START.subarray(0, known))) return false;
    if (head.length === known) return true;
    const quote = head[REFUSAL_START.length];
    if (quote !== QUOTE && quote !== BACKTICK) return false;
    const name = head.subarray(REFUSAL_START.length + 1, REFUSAL_START.length + 1 + this.name.length);
    return name.equals(this.name.subarray(0, name.length));
  }
}

function isPrefix(head: Buffer, whole: Buffer): boolean {
  return head.length <= whole.length && head.equals(whole.subarray(0, head.length));
}
