/**
 * The marks in a connection's reply stream (reply-stream.ts): the points where a reply is not
 * simply counted and passed on, each followed by the replies of frames forwarded after it.
 */
import type { LockBlockRef } from '../lock/block-flow.js';
import type { ExpiryRestore } from '../lock/exec-reply.js';
import type { ResetMarker, ResetOutcome } from './reset-marker.js';

/** A point in the reply stream, and how many forwarded replies follow it. */
export type Mark =
  /**
   * A reply taken aside: to a command the proxy sent itself (`timed`: bounded by
   * --own-reply-timeout-ms), or a client's reply the proxy must change (EXEC's, after a lock
   * pair was fixed; not bounded: Redis answers its client's command in its own time).
   */
  | {
      readonly kind: 'capture';
      readonly handle: (reply: Buffer) => void;
      readonly timed: boolean;
      /**
       * Whether a simple error in its place is passed on as a counted reply (rewritten like any
       * other), not captured: always, or as the function decides when the error comes.
       */
      readonly errorsPass: boolean | (() => boolean);
      /** The reply carries a lock block's replies (its rule and key). */
      readonly lock: LockBlockRef | undefined;
      after: number;
    }
  /**
   * EXEC's reply after lock pairs were fixed: walked as it streams to the client, each expiry's
   * element restored in place and each copy's cut out (lock/exec-reply.ts); nothing of it is kept. Not bounded: it is
   * the client's own command. A reply that is not an array (EXEC refused as a whole, a null) is
   * Redis's own, passed on as any counted reply.
   */
  | { readonly kind: 'restore'; readonly restore: ExpiryRestore; readonly lock: LockBlockRef; after: number }
  /**
   * A client's reply passed on as any counted reply, its first byte told to `seen` (whether
   * Redis opened the transaction a MULTI asked for: `+`).
   */
  | { readonly kind: 'peek'; readonly seen: (first: number) => void; after: number }
  /**
   * The refusal of the marker command sent right after a client's RESET in a plain pipe:
   * replies pass uncounted until it, it is dropped, and `found` is told what became of the RESET.
   */
  | { readonly kind: 'marker'; readonly marker: ResetMarker; readonly found: (outcome: ResetOutcome) => void; after: number };
