/**
 * A connection's transaction state as Redis holds it (MULTI, WATCH, the ASKING flag), followed
 * from the frames the client sends: a scanned frame in, what it means out. No sockets, so every
 * rule here is tested on its own (test/transaction-state.test.ts).
 *
 * Redis refuses a command with the wrong number of arguments before running it, so the state
 * changes only on the exact arities: `MULTI x` opens no transaction, `WATCH` without a key
 * watches nothing, `UNWATCH x`, `DISCARD x` and `RESET x` change nothing (server.c
 * processCommand checks arity before MULTI queueing and before the command runs). EXEC is the
 * exception: refused for any reason, it aborts the transaction and unwatches, even outside MULTI.
 */
import { Cmd, equalsIgnoreCase } from '../resp/commands.js';
import type { RequestScanner } from '../resp/request-scanner.js';

/** What a forwarded frame means for the replies that come back. */
export const enum FrameMeaning {
  /** No reply comes: an empty frame (a blank line, `*0`). */
  NoReply,
  /** One reply comes. */
  Reply,
  /**
   * Replies can no longer be counted (SUBSCRIBE and the rest of its family, MONITOR, CLIENT REPLY,
   * REPLCONF, an inline command with quoting the proxy does not interpret): the connection is a
   * plain pipe until a RESET puts it back in a known state.
   */
  Untrackable,
  /** SYNC or PSYNC: the connection carries a replication stream; it stays a plain pipe. */
  Replication,
}

const REPLY = Buffer.from('reply');

export class TransactionState {
  /** Inside MULTI: commands are queued until EXEC or DISCARD. */
  inMulti = false;
  /** Commands queued in the open transaction. */
  queued = 0;
  /** A WATCH is active: a block now may be aborted by EXEC, so it is never rewritten. */
  watching = false;
  /** The last command forwarded was ASKING, which lasts one command. */
  afterAsking = false;
  /** The server has RESET (false before Redis 6.2, where RESET is an unknown command and changes nothing). */
  resetKnown = true;

  // What the last frame did (valid until the next frame).
  /** It opened a transaction. */
  opened = false;
  /** It ended the transaction: EXEC, DISCARD or RESET. */
  closed = false;
  /** It was queued in the transaction, as number `queuedIndex` (0-based); -1 when it ran at once. */
  queuedIndex = -1;
  /** Whether a MULTI sent now could start a lock block: not inside a transaction, no WATCH. */
  get canStartBlock(): boolean {
    return !this.inMulti && !this.watching;
  }

  /** The frame whose head `scanner` holds goes upstream as the client sent it. */
  frame(scanner: RequestScanner): FrameMeaning {
    this.opened = false;
    this.closed = false;
    this.queuedIndex = -1;
    const cmd = scanner.cmd;
    if (cmd === Cmd.Empty) return FrameMeaning.NoReply;
    // Which command it is is unknown: so is what it does to the state.
    if (scanner.nameOpaque) return FrameMeaning.Untrackable;
    // Inside MULTI these are queued as any command (one reply each): the state goes on as usual.
    const meaning =
      cmd === Cmd.Replication
        ? FrameMeaning.Replication
        : scanner.inlineOpaque || cmd === Cmd.Uncountable || isClientReply(scanner)
          ? FrameMeaning.Untrackable
          : FrameMeaning.Reply;
    const argc = scanner.argc;
    const queued = this.inMulti && queuedInMulti(cmd);
    switch (cmd) {
      case Cmd.Multi:
        if (argc === 1 && !this.inMulti) this.open();
        break;
      case Cmd.Exec:
        // Refused (wrong arity, ACL, -BUSY, ...), EXEC still ends the transaction and unwatches,
        // outside MULTI too: server.c rejectCommand calls execCommandAbort for it (6.0.16 as 7.x).
        // `EXEC` alone outside MULTI runs, answers "EXEC without MULTI" and leaves WATCH as it is.
        if (this.inMulti) this.close();
        else if (argc !== 1) this.watching = false;
        break;
      case Cmd.Discard:
        if (argc === 1 && this.inMulti) this.close();
        break;
      case Cmd.Watch:
        if (argc >= 2 && !this.inMulti) this.watching = true;
        break;
      case Cmd.Unwatch:
        if (argc === 1 && !this.inMulti) this.watching = false;
        break;
      case Cmd.Reset:
        if (argc === 1 && this.resetKnown) this.close();
        break;
    }
    if (queued) this.queuedIndex = this.queued++;
    this.afterAsking = cmd === Cmd.Asking;
    return meaning;
  }

  /**
   * `count` frames went upstream that Redis runs (or queues) as any command, none of MULTI, EXEC,
   * DISCARD, WATCH, UNWATCH, RESET, ASKING or the kinds that stop the counting: what frame() does
   * for each of them, at once.
   */
  forwarded(count: number): void {
    this.opened = false;
    this.closed = false;
    this.queuedIndex = -1;
    if (this.inMulti) {
      this.queued += count;
      this.queuedIndex = this.queued - 1;
    }
    this.afterAsking = false;
  }

  /**
   * A held lock block went upstream as the client sent it, its first `frames` frames (MULTI
   * first); `complete` when its EXEC was among them. Redis is then inside the transaction with
   * all but the MULTI queued, or, after the EXEC, out of it with nothing watched.
   */
  blockSent(frames: number, complete: boolean): void {
    this.inMulti = !complete;
    this.queued = complete ? 0 : frames - 1;
    if (complete) this.watching = false;
    this.afterAsking = false;
  }

  /**
   * Redis refused the MULTI that opened the transaction (its answer came later, ACLs say no):
   * there is none, and what was taken as queued ran at once.
   */
  multiRefused(): void {
    this.inMulti = false;
    this.queued = 0;
  }

  /** A lock block was answered by its script: Redis ran one command, no transaction. */
  blockRewritten(): void {
    this.afterAsking = false;
  }

  private open(): void {
    this.inMulti = true;
    this.queued = 0;
    this.opened = true;
  }

  private close(): void {
    this.inMulti = false;
    this.watching = false; // EXEC, DISCARD and RESET unwatch everything
    this.closed = true;
  }
}

/** CLIENT REPLY changes how many replies come; an inline CLIENT's subcommand is not captured, so any could be it. */
export function isClientReply(scanner: RequestScanner): boolean {
  if (scanner.cmd !== Cmd.Client) return false;
  return scanner.inline || (scanner.argc >= 2 && scanner.keyLength === REPLY.length && equalsIgnoreCase(scanner.key, 0, REPLY));
}

/** Whether Redis queues `cmd` inside MULTI: the transaction's own commands, QUIT and RESET run at once (server.c processCommand). */
function queuedInMulti(cmd: Cmd): boolean {
  return (
    cmd !== Cmd.Multi &&
    cmd !== Cmd.Exec &&
    cmd !== Cmd.Discard &&
    cmd !== Cmd.Watch &&
    cmd !== Cmd.Quit &&
    cmd !== Cmd.Reset &&
    cmd !== Cmd.Empty
  );
}
