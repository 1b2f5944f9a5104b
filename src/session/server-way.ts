/**
 * What one connection knows of its server: the way its lock blocks go (lock/lock-method.ts), and
 * whether the server has RESET; and the question asked ahead for a new address (askWayAhead). With --lock-method auto, the server's version is learnt once per
 * upstream address (ServerMethods, and again after the server closed a connection on its own);
 * where nothing is known yet, HELLO goes on the connection itself, right before the MULTI that
 * needs the answer, which waits for it.
 */
import { HELLO, methodFromHello, type LockMethod } from '../lock/lock-method.js';
import type { Logger } from '../log.js';
import { ASKING } from '../resp/encode.js';
import { askHello } from '../upstream/probe.js';
import type { ProxyContext } from './context.js';
import type { ReplyStream } from './reply-stream.js';
import type { TransactionState } from './transaction-state.js';

/** What HELLO answers: a RESP3 map, a RESP2 array of pairs, or an error. */
const HELLO_REPLY_TYPES = new Set([0x25 /* % */, 0x2a /* * */, 0x2d /* - */]);

/** What the question needs of its connection. */
export interface ServerWayPort {
  writeUpstream(bytes: Buffer): void;
  /** The rest of a chunk waits for a reply of the proxy's own (the session feeds it back later). */
  stall(rest: Buffer): void;
  /** The client's next bytes wait until resumeClient(). */
  holdClient(): void;
  /** The client's bytes, held while HELLO was answered, go on. */
  resumeClient(): void;
  closeAfterReplies(): void;
  /** The upstream address this connection dialled: what the server's version is kept for. */
  readonly upstreamAddress: string;
  readonly log: Logger;
}

export class ServerWay {
  /** What this connection's HELLO said the server needs (auto); null until it has answered. */
  private learnt: LockMethod | null = null;
  /** HELLO was refused (not authenticated yet): the MULTI it went before goes on without asking again. */
  refused = false;

  constructor(
    private readonly port: ServerWayPort,
    private readonly replies: ReplyStream,
    private readonly tx: TransactionState,
    private readonly ctx: ProxyContext,
  ) {}

  /**
   * How this connection's lock blocks go: the script where set, else what the server was found to
   * need (null: not known yet). --lock-method transaction was refused at start in front of a server
   * without EXPIRE ... NX; one found later (a failover to an older replica) gets the
   * transaction-script way, with an error line, rather than EXECABORT for every lock
   * (lock/method-choice.ts).
   */
  method(): LockMethod | null {
    const setting = this.ctx.lockMethod;
    if (setting === 'script') return setting;
    // What the address is known to need holds for this connection's whole life: it stays on that server.
    this.learnt ??= this.ctx.serverMethods.get(this.port.upstreamAddress);
    if (setting === 'transaction' && this.learnt === 'transaction-script' && this.ctx.serverMethods.mismatch(this.port.upstreamAddress)) {
      this.port.log.error(
        { upstream: this.port.upstreamAddress },
        '--lock-method transaction: this server has no EXPIRE ... NX (before Redis 7.0); its lock blocks take the transaction-script way',
      );
    }
    return this.learnt;
  }

  /**
   * Whether RESET is a command of this connection's server: not before Redis 6.2, where it is an
   * unknown command that changes nothing (no transaction ended, no pipe, no AUTH/SELECT after it).
   * Unknown servers are taken to have it.
   */
  hasReset(): boolean {
    return !this.ctx.serverMethods.lacksReset(this.port.upstreamAddress);
  }

  /**
   * Whether the server may refuse a RESET: Redis 6.2 checks ACLs on it and answers -BUSY while a
   * script runs; from 7.0 on (the servers with EXPIRE ... NX) RESET is never refused. A server
   * whose version is not known may.
   */
  resetMayBeRefused(): boolean {
    return this.ctx.serverMethods.get(this.port.upstreamAddress) !== 'transaction';
  }

  /** Asks the server's version on the connection, right before a MULTI: it and `rest` (from its first byte on) wait for the answer. */
  ask(rest: Buffer): void {
    this.port.writeUpstream(HELLO);
    this.replies.capture((reply) => this.answered(reply));
    if (this.tx.afterAsking) {
      // HELLO used up the ASKING the client sent before its MULTI: it goes again, its +OK the proxy's.
      this.port.writeUpstream(ASKING);
      this.replies.capture(() => {});
    }
    this.port.stall(rest);
    this.port.holdClient();
  }

  private answered(reply: Buffer): void {
    if (!HELLO_REPLY_TYPES.has(reply[0])) {
      // HELLO answers a map (an array in RESP2) or an error: anything else is another command's reply.
      this.port.log.error({ type: String.fromCharCode(reply[0]) }, 'the server version reply is not one; closing the connection');
      this.port.closeAfterReplies();
      return;
    }
    // Not authenticated yet (method null): Redis refuses the MULTI itself; the next one asks again.
    const version = methodFromHello(reply);
    if (version.method !== null) {
      this.learnt = version.method;
      // Logged by whoever learns it first: this connection, or the question asked ahead.
      if (this.ctx.serverMethods.learnt(this.port.upstreamAddress, version.method, version.detail, version.hasReset)) {
        this.port.log.debug({ server: version.detail, method: version.method }, 'lock method chosen from the server version');
      }
    } else {
      this.refused = true;
    }
    this.port.resumeClient();
  }
}

/**
 * With --lock-method auto, the server's version is asked ahead on a connection of the proxy's own
 * where the address's is not known (lock-method.ts), so that a MULTI seldom waits for it.
 */
export function askWayAhead(ctx: ProxyContext, address: string): void {
  if (ctx.lockMethod === 'script' || ctx.rules().rules.length === 0) return;
  const { upstream, ownReplyTimeoutMs, log } = ctx;
  ctx.serverMethods.askAhead(
    address,
    async () => {
      const answer = await askHello(upstream, HELLO, ownReplyTimeoutMs);
      return answer !== null && answer.address === address ? methodFromHello(answer.reply) : null;
    },
    (version) =>
      log.debug(
        { upstream: address, server: version.detail, method: version.method, asked: 'ahead' },
        'lock method chosen from the server version',
      ),
  );
}
