/**
 * Lock blocks found as a transaction streams past, frame by frame, with nothing held: which
 * expiry gets NX, which element of EXEC's reply to give back as Redis alone would have answered,
 * and how each old-shape attempt is counted, however its frames arrived (in one write, split at
 * any byte, typed one at a time, or released by a hold of the script way).
 *
 * A lock pair: in a transaction opened by MULTI with no WATCH active, `INCR k` or `INCRBY k <int>`
 * queued, and the very next queued command `EXPIRE k <secs>` or `PEXPIRE k <ms>` (no option,
 * a positive expiry) on the same key. Right after the increment the key exists, so Redis alone
 * answers the expiry `:1`; with NX Redis answers `:0` exactly where it left an expiry in place,
 * and that element becomes `:1` again (exec-reply.ts). The transaction-script way queues two
 * commands in the expiry's place (expiry-script.ts): the first one's element is cut out of EXEC's
 * reply, the second one's restored as NX's. Whatever else the transaction holds is Redis's own.
 * The pair is fixed where the key's rule enforces; it is counted when its EXEC goes upstream (a
 * DISCARD, a RESET or a closed connection ran nothing).
 */
import { describeKey, keyPrefixLabel } from '../key-text.js';
import type { Logger } from '../log.js';
import { Cmd } from '../resp/commands.js';
import type { RequestScanner } from '../resp/request-scanner.js';
import { effectiveMode, type Rule, type RuleMode, type RuleSet } from '../rules/types.js';
import type { Stats } from '../stats.js';
import { encodeCommand } from '../resp/encode.js';
import type { ExecEdits } from './exec-reply.js';
import { isRedisInteger, isRewritableExpiry } from './integers.js';

/** What became of a lock pair's expiry. */
export type PairOutcome =
  /** Sent with NX (the transaction way). */
  | 'nx'
  /** Sent as the conditional-expiry script, beside the copy Redis checks (the transaction-script way). */
  | 'queued-script'
  /** Sent unchanged because its rule observes. */
  | 'observe'
  /** Sent unchanged although its rule enforces: the lock was re-armed. The reason says why. */
  | { readonly unfixed: UnfixedReason };

/**
 * Why an enforced pair went unchanged: its frames came further apart than --hold-ms on the script
 * way (`hold-timeout`), another command broke the held block's shape (`not-a-lock-block`), the
 * server's version was not known when the expiry went (`version-unknown`), the expiry's first
 * bytes had gone upstream before it could be told apart (`split-frame`), the transaction-script
 * way found the pair after other queued commands (`not-first`: only a transaction's first two
 * can be sent again as they were), or Redis refused to queue the expiry script (`eval-refused`:
 * the user may not run EVAL; the transaction went again as the client sent it).
 */
export type UnfixedReason = 'hold-timeout' | 'not-a-lock-block' | 'version-unknown' | 'split-frame' | 'not-first' | 'eval-refused';

export interface CountingSettings {
  /** 'observe': every rule only observes. */
  readonly mode: RuleMode;
  /** Every shipped release line's lock keys (rules/census.ts). */
  readonly census: RuleSet;
  readonly stats: Stats;
}

/** An increment just queued, waiting to see whether an expiry of its key comes next. */
interface Increment {
  readonly key: Buffer;
  /** INCRBY's delta; null for INCR. */
  readonly delta: Buffer | null;
  /** The loaded rule that names the key, if any. */
  readonly rule: Rule | undefined;
  /** The increment was the transaction's first queued command. */
  readonly first: boolean;
}

/** An EXEC whose transaction had pairs fixed: its reply's elements to restore and cut, and the first fixed pair's rule and key. */
export interface FixedExec extends ExecEdits {
  readonly rule: string;
  readonly key: Buffer;
}

interface Pair {
  readonly key: Buffer;
  readonly rule: Rule | undefined;
  /** The expiry's place among the queued commands: its element of EXEC's reply. */
  readonly index: number;
  outcome: PairOutcome;
  /** The transaction's first two queued commands, so far. */
  readonly first: boolean;
}

export class StreamedBlocks {
  /** Inside a transaction whose frames are followed (opened by MULTI with no WATCH active). */
  active = false;
  private increment: Increment | null = null;
  private pairs: Pair[] = [];
  /**
   * No more pairs are looked for in this transaction: a command queued in it makes the replies
   * after its EXEC uncountable, so EXEC's elements past it may not be where their count says.
   */
  private sealed = false;
  /** Why the script way released this transaction's held block, if it did. */
  releaseReason: UnfixedReason | null = null;
  private readonly unfixedLogged = new Set<string>();

  constructor(
    private readonly settings: CountingSettings,
    private readonly log: () => Logger,
  ) {}

  /** A MULTI opened a transaction with no WATCH active. */
  begin(): void {
    this.active = true;
    this.increment = null;
    this.pairs = [];
    this.sealed = false;
    this.releaseReason = null;
  }

  /** Whether a pair of this transaction is recorded: its EXEC's reply must be followed to count it, or restore it. */
  get holdsPairs(): boolean {
    return this.active && this.pairs.length > 0;
  }

  /**
   * A command was queued after which EXEC's replies cannot be counted (the connection becomes a
   * plain pipe after the EXEC): the pairs recorded so far stand, no later one is looked for.
   */
  seal(): void {
    this.sealed = true;
    this.increment = null;
  }

  /** The transaction ended without EXEC (DISCARD, RESET), or its frames are no longer followed. */
  end(): void {
    this.active = false;
    this.increment = null;
    this.pairs = [];
  }

  /** Frames were queued that are none of the pair's (counted without being looked at). */
  others(): void {
    this.increment = null;
  }

  /**
   * The increment the expiry whose head the scanner holds completes, as a command to send again
   * (INCR k, INCRBY k delta: Redis reads the same arguments), and whether it was the transaction's
   * first queued command; null when there is none.
   */
  pendingIncrement(): { readonly command: Buffer; readonly first: boolean } | null {
    const increment = this.increment;
    if (increment === null) return null;
    const command =
      increment.delta === null ? encodeCommand('INCR', increment.key) : encodeCommand('INCRBY', increment.key, increment.delta);
    return { command, first: increment.first };
  }

  /**
   * The transaction-script way's last pair did not go as its script: Redis refused to queue the
   * script (the transaction went again as the client sent it), or the MULTI before it was refused
   * (no transaction: nothing to count as one).
   */
  scriptRefused(): void {
    const pair = this.pairs[this.pairs.length - 1];
    if (pair !== undefined && pair.outcome === 'queued-script') pair.outcome = { unfixed: 'eval-refused' };
  }

  /**
   * The rule whose key an expiry may be fixed for, if the frame being read right now can still
   * complete a pair under an enforcing rule: its bytes are then kept back until its head is read.
   */
  get expiryMayFollow(): boolean {
    const rule = this.increment?.rule;
    return rule !== undefined && effectiveMode(rule, this.settings.mode) === 'enforce';
  }

  /**
   * Whether the queued frame whose head the scanner holds is the expiry that completes a pair
   * whose rule enforces (to be fixed); changes nothing.
   */
  isEnforcedExpiry(scanner: RequestScanner): boolean {
    return this.isEnforcedExpiryFrame(scannedArgs(scanner));
  }

  /** isEnforcedExpiry(), for a frame however it was read (a whole one, say). */
  isEnforcedExpiryFrame(frame: PairArgs): boolean {
    return this.expiryMayFollow && completesPair(this.increment as Increment, frame);
  }

  /**
   * A frame queued in the transaction, as number `index` (0-based), `outcome` what became of it
   * when it completes a pair under an enforcing rule ('nx', or why not).
   */
  queued(scanner: RequestScanner, index: number, rules: RuleSet, outcome: PairOutcome | null): void {
    this.queuedFrame(scannedArgs(scanner), index, rules, outcome);
  }

  /** queued(), for a frame however it was read (a whole one, say). */
  queuedFrame(frame: PairArgs, index: number, rules: RuleSet, outcome: PairOutcome | null): void {
    const increment = this.increment;
    this.increment = null;
    if (increment !== null && completesPair(increment, frame)) {
      const observes = increment.rule !== undefined && effectiveMode(increment.rule, this.settings.mode) === 'observe';
      this.pairs.push({
        key: increment.key,
        rule: increment.rule,
        index,
        outcome:
          increment.rule === undefined ? { unfixed: 'not-a-lock-block' } : observes ? 'observe' : (outcome ?? { unfixed: 'split-frame' }),
        first: increment.first && index === 1,
      });
      return;
    }
    if (this.sealed) return;
    const isIncrement =
      (frame.cmd === Cmd.Incr && frame.argc === 2) || (frame.cmd === Cmd.Incrby && frame.argc === 3 && isRedisInteger(valueOf(frame)));
    if (!isIncrement) return;
    const key = Buffer.from(frame.key.subarray(frame.keyStart, frame.keyStart + frame.keyLength));
    const delta = frame.cmd === Cmd.Incrby ? Buffer.from(valueOf(frame)) : null;
    this.increment = { key, delta, rule: rules.match(key), first: index === 0 };
  }

  /**
   * A held block of the script way went upstream unchanged (lock/block-flow.ts): its first
   * `frames` frames, MULTI first, `key` its increment's key once it got that far, the EXEC among
   * them when `complete`. What streams after it is followed from there.
   */
  released(frames: number, complete: boolean, key: Buffer | null, rules: RuleSet, reason: UnfixedReason): void {
    this.begin();
    this.releaseReason = reason;
    if (frames < 2 || key === null) return;
    const rule = rules.match(key);
    if (frames === 2) {
      this.increment = { key, delta: null, rule, first: true };
      return;
    }
    const observes = rule !== undefined && effectiveMode(rule, this.settings.mode) === 'observe';
    this.pairs.push({ key, rule, index: 1, outcome: observes ? 'observe' : { unfixed: reason }, first: true });
    if (complete) this.executed(2);
  }

  /**
   * The transaction's EXEC went upstream, after `queued` queued commands (the client's): its pairs
   * are counted, and what of EXEC's reply is to be changed is returned, as places in the reply
   * Redis sends (where the transaction-script way queued two commands for one): the elements
   * whose `:0` is NX's or the script's answer, and those of the copies Redis only checked (null:
   * none, the reply is Redis's own as it is).
   */
  executed(queued: number): FixedExec | null {
    const pairs = this.pairs;
    this.end();
    let fixed: { restore: number[]; drop: number[]; rule: string; key: Buffer } | null = null;
    /** Commands the proxy queued beyond the client's, before the pair. */
    let added = 0;
    for (const pair of pairs) {
      this.count(pair, pair.first && queued === 2);
      if (pair.outcome !== 'nx' && pair.outcome !== 'queued-script') continue;
      fixed ??= { restore: [], drop: [], rule: (pair.rule as Rule).name, key: pair.key };
      const index = pair.index + added;
      if (pair.outcome === 'nx') {
        fixed.restore.push(index);
      } else {
        fixed.drop.push(index);
        fixed.restore.push(index + 1);
        added++;
      }
    }
    return fixed;
  }

  /** One old-shape attempt went to Redis; `whole`: exactly MULTI, the pair, EXEC. */
  private count(pair: Pair, whole: boolean): void {
    const stats = this.settings.stats;
    const rule = pair.rule;
    if (rule === undefined) {
      // A lock-shaped transaction no loaded rule names: counted by its key's prefix, so that lock
      // kinds the rules miss show; an attempt when a shipped release line's rule names the key.
      if (whole) stats.blockUncovered(keyPrefixLabel(pair.key));
      const shipped = this.settings.census.match(pair.key);
      if (shipped !== undefined) stats.attempt(shipped.name).oldShape++;
      return;
    }
    stats.blockSeen(rule.name);
    const outcome = pair.outcome;
    if (outcome === 'nx' || outcome === 'queued-script') {
      stats.blockRewritten(rule.name, outcome === 'nx' ? 'transaction' : 'transaction-script');
    } else if (outcome === 'observe') {
      stats.blockObserved(rule.name);
      this.log().info({ rule: rule.name, key: describeKey(pair.key) }, 'observe: lock block would be rewritten');
    } else {
      stats.blockUnfixed(rule.name, outcome.unfixed);
      if (!this.unfixedLogged.has(outcome.unfixed)) {
        this.unfixedLogged.add(outcome.unfixed);
        this.log().warn(
          { rule: rule.name, key: describeKey(pair.key), reason: outcome.unfixed },
          'lock block sent unchanged: its lock was re-armed (logged once per connection and reason)',
        );
      }
    }
  }
}

/**
 * What a pair's frames are told by, however they were read (RequestScanner, WholeFrameReader): the
 * command, the arity, and arguments 1 and 2 where they lie, valid only while the frame is looked
 * at. `argc` is 0 where the arguments were not read (an inline command, or one longer than the
 * scanner captures): no pair then.
 */
export interface PairArgs {
  readonly cmd: Cmd;
  readonly argc: number;
  readonly key: Buffer;
  readonly keyStart: number;
  readonly keyLength: number;
  readonly value: Buffer;
  readonly valueStart: number;
  readonly valueLength: number;
}

const NONE = Buffer.alloc(0);
/** An inline frame's arguments, and any longer than the scanner captures, are not read. */
const UNREAD: PairArgs = { cmd: Cmd.Other, argc: 0, key: NONE, keyStart: 0, keyLength: 0, value: NONE, valueStart: 0, valueLength: 0 };

function scannedArgs(scanner: RequestScanner): PairArgs {
  return scanner.inline || scanner.oversize ? UNREAD : scanner;
}

function valueOf(frame: PairArgs): Buffer {
  return frame.value.subarray(frame.valueStart, frame.valueStart + frame.valueLength);
}

/** Whether a frame is an expiry of `increment`'s key that completes a pair. */
function completesPair(increment: Increment, frame: PairArgs): boolean {
  if (frame.argc !== 3) return false;
  const milliseconds = frame.cmd === Cmd.Pexpire;
  if (frame.cmd !== Cmd.Expire && !milliseconds) return false;
  const keyStart = frame.keyStart;
  if (frame.keyLength !== increment.key.length || increment.key.compare(frame.key, keyStart, keyStart + frame.keyLength) !== 0)
    return false;
  return isRewritableExpiry(valueOf(frame), milliseconds);
}
