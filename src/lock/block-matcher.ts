/**
 * Recognises the one transaction shape the proxy rewrites (block-shape.ts), and the rule that
 * names its key (none: the block is only counted). It is fed the head of each frame after MULTI
 * and answers, as early as possible, whether the block can still match.
 */
import { Cmd } from '../resp/commands.js';
import type { RequestScanner } from '../resp/request-scanner.js';
import type { Rule, RuleSet } from '../rules/types.js';
import { isRedisInteger, isRewritableExpiry } from './integers.js';
import { BLOCK_COMMANDS, type LockCall } from './block-shape.js';

const ONE = Buffer.from('1');
const { MULTI, INCR, INCRBY, EXPIRE, PEXPIRE, EXEC } = BLOCK_COMMANDS;

export const enum BlockStep {
  /** MULTI seen; waiting for the increment. */
  Increment,
  /** Waiting for the expiry. */
  Expire,
  /** Waiting for EXEC. */
  Exec,
  /** The whole block matched. */
  Complete,
}

/** How many of the block's frames a matcher at `step` has taken, the MULTI included. */
export function framesTaken(step: BlockStep): number {
  return 1 + (step >= BlockStep.Expire ? 1 : 0) + (step >= BlockStep.Exec ? 1 : 0) + (step >= BlockStep.Complete ? 1 : 0);
}

export class BlockMatcher {
  step = BlockStep.Increment;
  /** The rule that names the block's key; undefined before the increment, or when no rule does. */
  rule: Rule | undefined;
  private key: Buffer = ONE;
  private increment: LockCall['increment'] = 'INCR';
  private delta: Buffer = ONE;
  private expire: LockCall['expire'] = 'EXPIRE';
  private ttl: Buffer = ONE;

  /** True when the frame whose head the scanner holds is MULTI as the block must start. */
  static isBlockStart(scanner: RequestScanner): boolean {
    return scanner.cmd === Cmd.Multi && scanner.argc === 1 && !scanner.inline;
  }

  /** Whether the frame whose head the scanner is still reading can turn out to be that MULTI. */
  static couldStillStart(scanner: RequestScanner): boolean {
    return scanner.couldStillBe(MULTI, 1);
  }

  /** Starts matching a new block (after its MULTI). */
  reset(): void {
    this.step = BlockStep.Increment;
    this.rule = undefined;
  }

  /**
   * Offers the next frame's head. Returns false when the block cannot match
   * any more; the matcher is then done with this block.
   */
  accept(scanner: RequestScanner, rules: RuleSet): boolean {
    if (scanner.inline || scanner.oversize) return false;
    switch (this.step) {
      case BlockStep.Increment:
        return this.acceptIncrement(scanner, rules);
      case BlockStep.Expire:
        return this.acceptExpire(scanner);
      case BlockStep.Exec:
        if (scanner.cmd !== Cmd.Exec || scanner.argc !== 1) return false;
        this.step = BlockStep.Complete;
        return true;
      case BlockStep.Complete:
        return false;
    }
  }

  /**
   * Whether the frame whose head the scanner is still reading can be the block's next one:
   * false as soon as its argument count or its name rules it out, so that a held block is
   * released at once rather than at the hold deadline.
   */
  couldStillAccept(scanner: RequestScanner): boolean {
    switch (this.step) {
      case BlockStep.Increment:
        return scanner.couldStillBe(INCR, 2) || scanner.couldStillBe(INCRBY, 3);
      case BlockStep.Expire:
        return scanner.couldStillBe(EXPIRE, 3) || scanner.couldStillBe(PEXPIRE, 3);
      case BlockStep.Exec:
        return scanner.couldStillBe(EXEC, 1);
      case BlockStep.Complete:
        return false;
    }
  }

  /** What a complete block asks for. */
  call(): LockCall {
    return { key: this.key, increment: this.increment, delta: this.delta, expire: this.expire, ttl: this.ttl };
  }

  private acceptIncrement(scanner: RequestScanner, rules: RuleSet): boolean {
    const key = scanner.key.subarray(0, scanner.keyLength);
    if (scanner.cmd === Cmd.Incr && scanner.argc === 2) {
      this.increment = 'INCR';
      this.delta = ONE;
    } else if (scanner.cmd === Cmd.Incrby && scanner.argc === 3) {
      const delta = scanner.value.subarray(0, scanner.valueLength);
      if (!isRedisInteger(delta)) return false;
      this.increment = 'INCRBY';
      this.delta = Buffer.from(delta);
    } else {
      return false;
    }
    // Followed to its EXEC whether a rule names the key or not: a whole lock-shaped block that no
    // rule covers is counted (block-flow.ts), so that lock kinds the loaded rules miss show.
    this.rule = rules.match(key);
    this.key = Buffer.from(key);
    this.step = BlockStep.Expire;
    return true;
  }

  private acceptExpire(scanner: RequestScanner): boolean {
    const milliseconds = scanner.cmd === Cmd.Pexpire;
    if ((scanner.cmd !== Cmd.Expire && !milliseconds) || scanner.argc !== 3) return false;
    if (!this.key.equals(scanner.key.subarray(0, scanner.keyLength))) return false;
    const ttl = scanner.value.subarray(0, scanner.valueLength);
    if (!isRewritableExpiry(ttl, milliseconds)) return false;
    this.expire = milliseconds ? 'PEXPIRE' : 'EXPIRE';
    this.ttl = Buffer.from(ttl);
    this.step = BlockStep.Exec;
    return true;
  }
}
