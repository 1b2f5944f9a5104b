/** Feeding a RequestScanner a whole byte stream in one chunk, as the session does, for tests of what acts on frame heads. */
import { HEAD, RequestScanner } from '../../src/resp/request-scanner.js';

/** Each frame head in `bytes`: the scanner holding it, and the position after the bytes read so far. */
export function* frameHeads(bytes: Buffer, scanner = new RequestScanner()): Generator<{ scanner: RequestScanner; pos: number }> {
  scanner.newChunk();
  let pos = 0;
  while (pos < bytes.length) {
    pos = scanner.next(bytes, pos);
    if (scanner.event & HEAD) yield { scanner, pos };
  }
}
