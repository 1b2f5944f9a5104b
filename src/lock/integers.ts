/**
 * Integer arguments are accepted for a rewrite only when Redis would accept
 * them the same way, so that the script and the original block can never
 * disagree about what an argument means.
 */

const INT64_MAX = '9223372036854775807';
const INT64_MIN_ABS = '9223372036854775808';

/** True when `bytes` is an integer Redis's string2ll accepts (no `+`, no leading zeros, no spaces, int64 range). */
export function isRedisInteger(bytes: Uint8Array): boolean {
  const len = bytes.length;
  if (len === 0 || len > 20) return false;
  let i = 0;
  const negative = bytes[0] === 0x2d;
  if (negative) i = 1;
  const digits = len - i;
  if (digits === 0) return false;
  if (bytes[i] === 0x30) return digits === 1 && !negative; // "0" only; never "-0" or "01"
  for (let j = i; j < len; j++) {
    if (bytes[j] < 0x30 || bytes[j] > 0x39) return false;
  }
  if (digits < 19) return true;
  if (digits > 19) return false;
  const limit = negative ? INT64_MIN_ABS : INT64_MAX;
  for (let j = 0; j < 19; j++) {
    const d = bytes[i + j];
    const l = limit.charCodeAt(j);
    if (d !== l) return d < l;
  }
  return true;
}

/**
 * Largest expiry the proxy rewrites: far beyond any lock lease, and small
 * enough that Redis's own overflow checks (`when * 1000 + now`) can never
 * trigger, so the script never meets an "invalid expire time" that the
 * original block would have met at a different point.
 */
export const MAX_EXPIRE_SECONDS = 1_000_000_000_000; // ~31,700 years
export const MAX_EXPIRE_MILLISECONDS = MAX_EXPIRE_SECONDS * 1000;

/**
 * True when `bytes` is a positive expiry Redis accepts and the proxy rewrites.
 * Zero and negative expiries delete the key in Redis; those blocks are left alone.
 */
export function isRewritableExpiry(bytes: Uint8Array, milliseconds: boolean): boolean {
  if (!isRedisInteger(bytes) || bytes[0] === 0x2d || bytes.length > 16) return false;
  let value = 0;
  for (let i = 0; i < bytes.length; i++) value = value * 10 + (bytes[i] - 0x30);
  return value > 0 && value <= (milliseconds ? MAX_EXPIRE_MILLISECONDS : MAX_EXPIRE_SECONDS);
}
