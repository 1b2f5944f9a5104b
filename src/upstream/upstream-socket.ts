/**
 * A plain (TCP or unix socket) upstream socket on which a write refused because Redis closed
 * does not end the connection before everything Redis sent first has been read.
 *
 * Redis closes a connection right after its last reply: a protocol error, QUIT, the client
 * limit (which it answers before reading anything), CLIENT KILL, an output buffer limit. Bytes
 * still on their way to it then meet a closed socket, and its kernel answers them with a reset.
 * A write after that reset fails (EPIPE or ECONNRESET), and Node destroys a net.Socket whose
 * write failed at once (Writable's onwrite → errorOrDestroy; net.Socket always sets
 * autoDestroy), which closes the descriptor with Redis's last reply still unread in the kernel:
 * the client would get nothing where Redis sent an error. Whether the reply was read before the
 * write went out is a race the proxy cannot win by ordering alone (the reset may arrive between
 * the event loop's poll, which reads, and the write), least of all on a busy machine.
 *
 * Linux keeps the bytes received before a reset readable (tcp_reset purges only the write
 * queue; tcp_recvmsg hands out the receive queue before it reports the error). So here such a
 * write's error is held back: the write never completes, nothing more is written (later writes
 * queue behind it and are dropped with the socket), `onWriteRefused` says so once, and reading
 * goes on. The connection then ends the way its reads end it: a reset as a read error destroys
 * it, and at EOF (Redis's close had come before the reset) it is destroyed here, after every
 * byte Redis sent has been handed on. Node would not close it at EOF: its writable side waits for
 * the held-back write for ever, and even end() never finishes it, so the descriptor would stay
 * open until the process ends. Any other write error is Node's usual one.
 */
import net from 'node:net';

/** Write errors that mean the peer closed: what was received before is still readable. */
const PEER_CLOSED = new Set(['EPIPE', 'ECONNRESET']);

type WriteCallback = (error?: Error | null) => void;

/** net.Socket's constructor takes `onread` too (lib/net.js; net.connect passes it on), which its typings give connect() only. */
export type UpstreamSocketOptions = net.SocketConstructorOpts & { onread?: net.OnReadOpts };

export class UpstreamSocket extends net.Socket {
  private refused = false;

  constructor(
    options: UpstreamSocketOptions,
    private readonly onWriteRefused: (error: Error) => void,
  ) {
    super(options);
    // After the 'end' listeners (the reads are handed on first): nothing more can come or go.
    this.once('end', () => {
      if (this.refused) process.nextTick(() => this.destroy());
    });
  }

  override _write(chunk: Buffer, encoding: BufferEncoding, callback: WriteCallback): void {
    super._write(chunk, encoding, this.unlessRefused(callback));
  }

  override _writev(chunks: Array<{ chunk: Buffer; encoding: BufferEncoding }>, callback: WriteCallback): void {
    // net.Socket has its own _writev (one writev for a corked batch); the typings call it optional.
    super._writev?.(chunks, this.unlessRefused(callback));
  }

  /** The write's callback, except for an error that means Redis closed: that one is held back. */
  private unlessRefused(callback: WriteCallback): WriteCallback {
    return (error) => {
      if (error && PEER_CLOSED.has((error as NodeJS.ErrnoException).code ?? '')) {
        if (this.refused) return;
        this.refused = true;
        this.onWriteRefused(error);
        if (this.readableEnded) this.destroy(); // Redis's close was read already
        return;
      }
      callback(error);
    };
  }
}
