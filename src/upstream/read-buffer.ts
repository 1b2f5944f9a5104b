/**
 * The memory one plain (TCP or unix socket) upstream connection reads into, through
 * net.connect's `onread` option: Node then allocates no buffer per read and skips its stream
 * layer (no `push`, no 'data' event, no read-ahead scheduling), which is most of what a read
 * costs a Node process beyond the system call.
 *
 * Why one buffer per connection, and never one shared by several: Node does not ask for the
 * memory at each read. It asks once when the socket starts reading, and again right after each
 * read's callback has returned, and registers the answer with that socket as the memory of its
 * NEXT read (lib/net.js initSocketHandle, lib/internal/stream_base_commons.js onStreamRead;
 * src/stream_base.cc CustomBufferJSListener). Once given to a socket, a buffer stays that
 * socket's until its next read has landed in it; nothing done afterwards can take it back. A
 * buffer given to several sockets can therefore be written by any of them at any time, and bytes
 * still waiting in it to be sent to one client are overwritten by another connection's read.
 *
 * With a buffer of its own, only this connection's next read can land in it, and that read
 * comes after the callback that handled the previous one. The callback decides: when the bytes
 * read are still referenced after it (a write to the client that did not reach the kernel whole
 * goes on from this memory later), `retained()` gives the connection new memory before its next
 * read, and the old buffer belongs to that write until the write is done and the GC takes it.
 * Anything else kept past a read (a reply of the proxy's own that spans reads, bytes waiting
 * behind a cluster redirect) is copied by whoever keeps it.
 *
 * Size follows the work: a connection starts with a small buffer (most exchange small replies,
 * and 5,000 idle ones must not each pin kilobytes), takes the next size up whenever a read fills
 * its buffer (it carries larger replies: bigger reads, fewer system calls), up to libuv's usual
 * 64 KiB, and the next size down after a run of reads that each used little of it (a pooled
 * connection that once carried a large value does not keep 64 KiB while it idles).
 */

/** The buffer sizes a connection moves between. */
const SIZES = [256, 4 * 1024, 64 * 1024] as const;
/** Reads in a row that used at most 1/16 of the buffer before it gets smaller. */
const SMALL_READS_TO_SHRINK = 16;

export class ReadBuffer {
  private step = 0;
  private memory = Buffer.allocUnsafe(SIZES[0]);
  private smallReads = 0;

  /** Where this connection's next read lands (net.Socket's `onread.buffer`). */
  readonly next = (): Buffer => this.memory;

  /**
   * A read of `bytes` landed in the buffer just given. `retained`: they are still referenced
   * after the read's callback (a write in progress), so the next read must go elsewhere.
   */
  afterRead(bytes: number, retained: boolean): void {
    const size = this.memory.length;
    let step = this.step;
    if (bytes === size) {
      this.smallReads = 0;
      if (step < SIZES.length - 1) step++;
    } else if (bytes <= size / 16 && step > 0) {
      if (++this.smallReads >= SMALL_READS_TO_SHRINK) {
        this.smallReads = 0;
        step--;
      }
    } else {
      this.smallReads = 0;
    }
    if (step === this.step && !retained) return;
    this.step = step;
    this.memory = Buffer.allocUnsafe(SIZES[step]);
  }
}
