/**
 * The lock pair fixed inside the client's own transaction, on servers that have `EXPIRE ... NX`
 * (Redis 7.0+, Valkey): every byte goes as the client sent it, except that the [P]EXPIRE frame
 * gains one argument, NX. Redis then applies the expiry only when the key has none, which is a
 * lock the increment just created or one that lost its expiry (healed); a held lock keeps the
 * expiry its owner set. Everything else stays Redis's own: ACL checks when the commands are
 * queued, all-or-nothing EXEC, cluster slot checks, each version's error texts.
 *
 * EXPIRE NX answers `:0` where it leaves an expiry in place; Redis alone, right after the
 * increment made sure the key exists, answers `:1`. That one element of EXEC's reply is given
 * back as `:1` as it streams (exec-reply.ts).
 */
/** `*4\r\n`: the [P]EXPIRE frame's count line, one argument more than the `*3` it had. */
const FOUR_ARGUMENTS = Buffer.from('*4\r\n');
const NX_ARGUMENT = Buffer.from('$2\r\nNX\r\n');

/**
 * A whole `*3` [P]EXPIRE frame with NX added. The frame was read as a RESP array, so its count
 * line is `*3` followed by the two bytes Redis skips unread; it becomes `*4\r\n`, and
 * `$2\r\nNX\r\n` follows the frame's last argument.
 */
export function expiryWithNx(frame: Buffer): Buffer {
  const countLineEnd = frame.indexOf(0x0d) + 2; // `*3\r?`
  return Buffer.concat([FOUR_ARGUMENTS, frame.subarray(countLineEnd), NX_ARGUMENT]);
}
