/**
 * The replies that carry lock blocks' outcomes. An EXEC whose transaction had lock pairs fixed
 * reaches the client walked as it streams (lock/exec-reply.ts), each fixed expiry's element given
 * back as Redis alone answers it and the copies the transaction-script way queued cut out; or,
 * with --cluster, where a topology reply (one queued in the transaction too) is rewritten, taken
 * whole. A connection closed while such replies are due is said, block by block.
 */
import { ExpiryRestore, restoreExpiryReplies } from '../lock/exec-reply.js';
import type { FixedExec } from '../lock/streamed-blocks.js';
import { describeKey } from '../key-text.js';
import type { Logger } from '../log.js';
import type { Stats } from '../stats.js';
import type { ReplyStream } from './reply-stream.js';

export class LockReplies {
  /** `port`: the connection's writes to its client, and the log for lines about its lock blocks; `counting`: the settings they are counted with (verify's apart). */
  constructor(
    private readonly replies: ReplyStream,
    private readonly port: { writeClient(bytes: Buffer): void; readonly log: Logger },
    private readonly counting: { readonly stats: Stats },
  ) {}

  /**
   * The reply of the frame just forwarded: an EXEC whose pairs were `fixed` (null: none), or with
   * --cluster a reply to `rewrite`. EXEC is the client's own command: Redis answers it in its own
   * time, and an error in its place (EXEC refused as a whole) passes on as any reply.
   */
  announce(fixed: FixedExec | null, rewrite: ((reply: Buffer) => Buffer) | undefined): void {
    if (rewrite !== undefined) {
      const rearmed = this.rearmed(fixed);
      const whole = (reply: Buffer): Buffer => rewrite(fixed === null ? reply : restoreExpiryReplies(reply, fixed, rearmed));
      this.replies.capture((reply) => this.port.writeClient(whole(reply)), fixed !== null, fixed ?? undefined);
    } else if (fixed !== null) {
      this.replies.restoreExpiries(new ExpiryRestore(fixed, this.rearmed(fixed)), fixed);
    }
  }

  /**
   * What tells that the expiry script of `fixed`'s pair did what the client asked (the user may
   * not read the expiry): its lock was re-armed, counted and logged.
   */
  private rearmed(fixed: FixedExec | null): (() => void) | undefined {
    if (fixed === null || fixed.drop.length === 0) return undefined;
    return () => {
      this.counting.stats.blockUnfixed(fixed.rule, 'pttl-refused');
      this.port.log.warn(
        { rule: fixed.rule, key: describeKey(fixed.key) },
        "the expiry script may not read the lock key's expiry (the user needs +pttl): it re-armed the lock as the client asked",
      );
    };
  }

  /**
   * The connection is closed at a bound while replies are due: a lock block whose replies have
   * not come may have run in Redis (its counter moved), and its client will not learn it. Each
   * is logged with its rule and key, and counted (blocks_total{outcome="closed"}).
   */
  closingWithRepliesDue(): void {
    for (const lock of this.replies.lockBlocksDue()) {
      this.counting.stats.blockClosed(lock.rule);
      this.port.log.error(
        { rule: lock.rule, key: describeKey(lock.key) },
        "connection closed before a lock block's replies came: Redis may have run it, and its client is not told",
      );
    }
  }
}
