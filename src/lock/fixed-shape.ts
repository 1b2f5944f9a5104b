/**
 * Lock attempts in the fixed shape: Stalwart 0.16.16 and later take a lock with
 * `SET key <deadline> NX EX <seconds>`, whose expiry a failed attempt cannot push forward. The
 * proxy never changes these; it counts them per rule beside the old-shape blocks (a loaded rule,
 * or else the shipped rule of any release line that names the key: rules/census.ts), so that an
 * operator sees when no node sends the old shape any more and the proxy can go.
 */
import { Cmd, equalsIgnoreCase } from '../resp/commands.js';
import type { RequestScanner } from '../resp/request-scanner.js';
import { attemptRule } from '../rules/census.js';
import type { RuleSet } from '../rules/types.js';
import type { Stats } from '../stats.js';

const NX = Buffer.from('nx');
/** The expiry options of SET that take a number: relative (EX, PX) or absolute (EXAT, PXAT). */
const EXPIRY_UNITS = ['ex', 'px', 'exat', 'pxat'].map((unit) => Buffer.from(unit));

/**
 * Whether the frame whose head the scanner holds is `SET key value NX EX n`: NX and an expiry
 * (EX, PX, EXAT or PXAT and its number), in either order, as Redis takes its options.
 */
function isFixedShapeAttempt(scanner: RequestScanner): boolean {
  if (scanner.cmd !== Cmd.Set || scanner.argc !== 6 || scanner.inline || scanner.oversize) return false;
  if (isWord(scanner.arg3, scanner.arg3Length, NX)) return isExpiryUnit(scanner.arg4, scanner.arg4Length);
  return isExpiryUnit(scanner.arg3, scanner.arg3Length) && isWord(scanner.arg5, scanner.arg5Length, NX);
}

function isExpiryUnit(bytes: Buffer, length: number): boolean {
  return EXPIRY_UNITS.some((unit) => isWord(bytes, length, unit));
}

function isWord(bytes: Buffer, length: number, lower: Buffer): boolean {
  return length === lower.length && equalsIgnoreCase(bytes, 0, lower);
}

/** What the count needs of the connection's listener: the rules in force, the census, the counters. */
export interface AttemptCounting {
  rules(): RuleSet;
  readonly census: RuleSet;
  readonly stats: Stats;
}

/** Counts the frame whose head the scanner holds when it is a fixed-shape attempt on a lock key. */
export function countFixedShape(scanner: RequestScanner, counting: AttemptCounting): void {
  if (!isFixedShapeAttempt(scanner)) return;
  const rule = attemptRule(scanner.key.subarray(0, scanner.keyLength), counting.rules(), counting.census);
  if (rule !== undefined) counting.stats.attempt(rule).fixedShape++;
}
