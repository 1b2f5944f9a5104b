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
 */
import { randomBytes } from 'node:crypto';
import { encodeCommand } from '../resp/encode.js';

const REFUSAL_START = Buffer.from('-ERR unknown command ');
const QUOTE = 0x27; // '
const BACKTICK = 0x60; // `

export class ResetMarker {
  /** The command to send right after the client's RESET. */
  readonly command: Buffer;
  private readonly name: Buffer;

  constructor() {
    this.name = Buffer.from(`redis-lock-proxy-after-reset-${randomBytes(12).toString('hex')}`);
    this.command = encodeCommand(this.name.toString('latin1'));
  }

  /** Whether a whole error line (CRLF included) is Redis's refusal of the marker command. */
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

  /** Whether an error line that begins with `head` may still be the refusal (`head` shorter than the line). */
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
