/**
 * The lock block sent inside the client's own transaction, on servers that have `EXPIRE ... NX`
 * (Redis 7.0+, Valkey): every byte goes as the client sent it, except that the [P]EXPIRE frame
 * gains one argument, NX. Redis then applies the expiry only when the key has none, which is a
 * lock the increment just created or one that lost its expiry (healed); a held lock keeps the
 * expiry its owner set. Everything else stays Redis's own: ACL checks when the commands are
 * queued, all-or-nothing EXEC, cluster slot checks, each version's error texts, and the replies,
 * `*2 :<counter> :1|0` (EXPIRE NX answers 0 where it leaves the expiry alone).
 */
import { END, MALFORMED, RequestScanner } from '../resp/request-scanner.js';
import { BLOCK_FRAMES } from './block-shape.js';

/** The [P]EXPIRE frame is the block's third. */
const EXPIRE_FRAME = 2;
/** `*4\r\n`: the [P]EXPIRE frame's count line, one argument more than the `*3` it had. */
const FOUR_ARGUMENTS = Buffer.from('*4\r\n');
const NX_ARGUMENT = Buffer.from('$2\r\nNX\r\n');

/** Frame bounds of a block, found by the same scanner the session reads requests with. */
let scanner = new RequestScanner();
const frameEnds = new Array<number>(BLOCK_FRAMES).fill(0);

/**
 * `block` (a whole matched block, the four frames exactly) with NX added to its [P]EXPIRE frame.
 * The block was matched as RESP arrays, so the frame's count line is `*3` followed by the two
 * bytes Redis skips unread; it becomes `*4\r\n`, and `$2\r\nNX\r\n` follows the frame's last argument.
 * Null if the bytes are not four whole frames (never, for a matched block): then nothing is changed.
 */
export function withExpireNx(block: Buffer): Buffer | null {
  scanner.newChunk();
  let pos = 0;
  let frames = 0;
  while (pos < block.length && frames < BLOCK_FRAMES) {
    pos = scanner.next(block, pos);
    if (scanner.event & END) frameEnds[frames++] = pos;
    else if (scanner.event === 0 || scanner.event & MALFORMED) break;
  }
  if (frames !== BLOCK_FRAMES || pos !== block.length || !scanner.atFrameBoundary) {
    resetScanner();
    return null;
  }
  const start = frameEnds[EXPIRE_FRAME - 1];
  const end = frameEnds[EXPIRE_FRAME];
  const countLineEnd = block.indexOf(0x0d, start) + 2; // `*3\r?`
  return Buffer.concat([block.subarray(0, start), FOUR_ARGUMENTS, block.subarray(countLineEnd, end), NX_ARGUMENT, block.subarray(end)]);
}

/** After bytes that were not a whole block, the scanner starts over (never for a matched block). */
function resetScanner(): void {
  scanner = new RequestScanner();
}
