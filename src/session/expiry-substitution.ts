/**
 * The transaction-script way on one connection (servers without `EXPIRE ... NX`): a lock pair's
 * expiry goes as the copy Redis checks and the conditional-expiry script (lock/expiry-script.ts),
 * and the client's bytes after it wait until Redis has answered both. Redis owes those answers at
 * once (queueing runs nothing), and the wait lets Redis's own outcome stand whatever they are:
 *
 * - both queued: the copy's `+QUEUED` is the client's answer for its expiry, and the client's
 *   next bytes (its EXEC) go on;
 * - the copy refused (a -MOVED/-ASK while a slot moves, -OOM, -NOPERM on the key): the copy is
 *   the client's own command on the client's own key, so its refusal is what Redis answers the
 *   client's expiry at that moment, and Redis has already marked the transaction to abort. The
 *   refusal goes to the client as Redis wrote it (a redirect rewritten like any other), and
 *   nothing is sent again: a transaction sent again could get another answer (the slot moved on)
 *   beside the increment's first one;
 * - the script refused (a user without EVAL): the transaction now holds a refusal the client did
 *   not cause, so it is discarded and sent again as the client sent it (MULTI, the increment, the
 *   expiry), and the client gets that expiry's answer. A transaction the proxy follows has no
 *   WATCH (lock/streamed-blocks.ts), so DISCARD loses nothing; the pair is counted as re-armed
 *   (`eval-refused`), and the connection's later pairs go unchanged;
 * - the MULTI refused (a user without MULTI): there was no transaction, the increment ran, and
 *   so did the copy (failing on its value) and the script; the expiry goes now as the client sent
 *   it, as Redis alone would have run it, and the client gets its answer.
 *
 * Only a transaction's first pair (its first two queued commands) is sent so: that is what can be
 * sent again as it was. MULTI's answer is peeked at (ReplyStream.peek) for every transaction on
 * this way, so that a refused MULTI is known before anything is decided on it.
 */
import { BLOCK_COMMANDS } from '../lock/block-shape.js';
import { conditionalExpiry, expiryProbe } from '../lock/expiry-script.js';
import type { StreamedBlocks, UnfixedReason } from '../lock/streamed-blocks.js';
import type { Logger } from '../log.js';
import { Cmd } from '../resp/commands.js';
import { ASKING, encodeCommand } from '../resp/encode.js';
import type { RequestScanner } from '../resp/request-scanner.js';
import type { ReplyStream } from './reply-stream.js';
import type { TransactionState } from './transaction-state.js';

const DISCARD = encodeCommand('DISCARD');
const MULTI = encodeCommand('MULTI');
const QUEUED = Buffer.from('+QUEUED\r\n');
const PLUS = 0x2b;
const NOPERM = Buffer.from('-NOPERM');

function isNoPerm(reply: Buffer): boolean {
  return reply.subarray(0, NOPERM.length).equals(NOPERM);
}

/** What the substitution needs of its connection. */
export interface SubstitutionPort {
  writeUpstream(bytes: Buffer): void;
  writeClient(bytes: Buffer): void;
  /** The client's bytes, held since the substitution, go on. */
  resumeClient(): void;
  readonly log: Logger;
}

/** Where the transaction opened by the last MULTI stands: its answer not in yet, opened, or refused. */
type MultiVerdict = 'none' | 'pending' | 'opened' | 'refused';

/** A pair's expiry sent as the copy and the script, waiting for Redis's answers. */
interface InFlight {
  /** The client's expiry frame, as it sent it. */
  readonly expiry: Buffer;
  /** The increment, to be sent again. */
  readonly increment: Buffer;
  /** ASKING came before the MULTI (it must come again before a MULTI sent again). */
  readonly afterAsking: boolean;
  /** Redis's answer to the copy, once in. */
  probe: Buffer | null;
  /** The copy was refused inside the transaction, and that refusal went to the client. */
  copyRefused: boolean;
}

export class ExpirySubstitution {
  private multi: MultiVerdict = 'none';
  /** ASKING came right before that MULTI. */
  private multiAfterAsking = false;
  /** Which MULTI the verdict is of: a later transaction's state is never changed by an earlier MULTI's answer. */
  private generation = 0;
  /** Redis refused to queue the script on this connection: its later pairs go unchanged. */
  private evalRefused = false;
  private inFlight: InFlight | null = null;

  constructor(
    private readonly port: SubstitutionPort,
    private readonly replies: ReplyStream,
    private readonly tx: TransactionState,
    private readonly streamed: StreamedBlocks,
  ) {}

  /**
   * A MULTI that opened a transaction went upstream; its reply is counted here (the caller expects
   * none for it). On this way (`peeked`) its answer is looked at: a refusal means no transaction,
   * and the state says so. Elsewhere it is not, and no pair of its transaction goes as the script
   * (the server's way was learnt between the MULTI and the pair).
   */
  multiSent(afterAsking: boolean, peeked: boolean): void {
    const generation = ++this.generation;
    if (!peeked) {
      this.multi = 'none';
      this.replies.expect(1);
      return;
    }
    this.multi = 'pending';
    this.multiAfterAsking = afterAsking;
    this.replies.peek((first) => {
      if (generation !== this.generation) return;
      this.multi = first === PLUS ? 'opened' : 'refused';
      if (this.multi === 'refused' && this.tx.inMulti) {
        this.tx.multiRefused();
        this.streamed.end();
      }
    });
  }

  /** Why the pair whose expiry's head is read now cannot go as the script (null: it can). */
  refusal(first: boolean): UnfixedReason | null {
    if (!first) return 'not-first';
    if (this.evalRefused) return 'eval-refused';
    if (this.multi !== 'pending' && this.multi !== 'opened') return 'version-unknown';
    return null;
  }

  /**
   * Sends the copy of the expiry and the script in place of `expiry` (the client's whole frame,
   * whose head `scanner` holds: [P]EXPIRE key ttl); the caller holds the client's next bytes until
   * resumeClient(). `increment`: the pair's increment, to be sent again.
   */
  send(expiry: Buffer, scanner: RequestScanner, increment: Buffer): void {
    const command = scanner.cmd === Cmd.Pexpire ? BLOCK_COMMANDS.PEXPIRE : BLOCK_COMMANDS.EXPIRE;
    const key = scanner.key.subarray(0, scanner.keyLength);
    const ttl = scanner.value.subarray(0, scanner.valueLength);
    const inFlight: InFlight = {
      expiry: Buffer.from(expiry),
      increment,
      afterAsking: this.multiAfterAsking,
      probe: null,
      copyRefused: false,
    };
    this.inFlight = inFlight;
    this.port.writeUpstream(expiryProbe(command, key));
    this.replies.capture(
      (reply) => {
        inFlight.probe = Buffer.from(reply);
      },
      false,
      undefined,
      () => this.copyRefused(inFlight),
    );
    this.port.writeUpstream(conditionalExpiry(command, key, ttl));
    this.replies.capture((reply) => this.scriptAnswered(inFlight, reply));
  }

  /**
   * Redis answered the copy with an error. Inside the transaction (the MULTI's answer, read
   * before this one, opened it) that is the client's answer for its expiry, passed on as it
   * came; with no transaction it is the copy's own failure on its value, taken aside.
   */
  private copyRefused(inFlight: InFlight): boolean {
    if (this.multi !== 'opened') return false;
    inFlight.copyRefused = true;
    return true;
  }

  /** Redis answered the script (its queueing, or, with no transaction, its run). */
  private scriptAnswered(inFlight: InFlight, reply: Buffer): void {
    if (this.inFlight === inFlight) this.inFlight = null;
    if (this.multi === 'refused') {
      // No transaction: the copy failed and the script ran on their own. The expiry runs now as
      // the client sent it, as it would have right after its increment.
      this.sendAsClientDid(inFlight.expiry);
    } else if (inFlight.copyRefused) {
      // The client has its answer, and the transaction aborts at its EXEC whatever the script got.
      if (isNoPerm(reply)) this.learnEvalRefused(reply, 'the transaction aborts as Redis marked it, for its own refusal');
    } else if (reply.equals(QUEUED)) {
      this.port.writeClient(inFlight.probe ?? QUEUED);
    } else {
      this.replayed(inFlight, reply);
    }
    this.port.resumeClient();
  }

  /**
   * The script was refused: the transaction goes again as the client sent it. Refused by the
   * ACLs, the connection's later pairs go unchanged; any other refusal (a -MOVED, -LOADING) is
   * the transaction's, which Redis answers again.
   */
  private replayed(inFlight: InFlight, reply: Buffer): void {
    this.streamed.scriptRefused();
    if (isNoPerm(reply)) this.learnEvalRefused(reply, 'the transaction went again as the client sent it, its lock re-armed');
    const ignore = (): void => {};
    this.port.writeUpstream(DISCARD);
    this.replies.capture(ignore);
    if (inFlight.afterAsking) {
      this.port.writeUpstream(ASKING);
      this.replies.capture(ignore);
    }
    this.port.writeUpstream(MULTI);
    this.replies.capture(ignore);
    this.port.writeUpstream(inFlight.increment);
    this.replies.capture(ignore);
    this.sendAsClientDid(inFlight.expiry);
  }

  /** The script is refused to this user: the connection's later pairs go unchanged. */
  private learnEvalRefused(reply: Buffer, outcome: string): void {
    this.evalRefused = true;
    this.port.log.warn(
      { refusal: reply.toString('latin1', 0, Math.min(reply.length, 200)).replace(/\r\n$/, '') },
      `Redis refused the expiry script to this user (it needs +eval): ${outcome}; this connection's later lock blocks go unchanged`,
    );
  }

  private sendAsClientDid(expiry: Buffer): void {
    this.port.writeUpstream(expiry);
    this.replies.expect(1);
  }
}
