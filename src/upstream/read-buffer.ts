/**
 * The memory every plain (TCP or unix socket) upstream connection reads into, through
 * net.connect's `onread` option: Node then allocates no buffer per read and skips its stream
 * layer (no `push`, no 'data' event, no read-ahead scheduling), which is most of what a read
 * costs a Node process beyond the system call.
 *
 * One buffer serves every connection, because a read's bytes are handled before the event loop
 * reads anything else. So they are valid only during the callback that receives them: what is
 * kept longer is copied, and when a write that carries them did not reach the kernel whole (it
 * goes on from this memory later), `retained()` makes the reads that follow use a new buffer.
 */

/** What one read may bring: libuv's usual read size. */
const READ_BUFFER_BYTES = 64 * 1024;

let current = Buffer.allocUnsafe(READ_BUFFER_BYTES);

/** Where the next upstream read lands. */
export function readBuffer(): Buffer {
  return current;
}

/** The bytes of the last read are still referenced (a write in progress): the next reads go elsewhere. */
export function retained(): void {
  current = Buffer.allocUnsafe(READ_BUFFER_BYTES);
}
