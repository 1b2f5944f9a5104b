/**
 * Writes made while one chunk is processed leave together: in one write (the usual case, no
 * cork needed) or one writev, instead of one system call each.
 */
import type net from 'node:net';

/** Collects writes between begin() and the matching end(); outside them a write goes out at once. */
export class WriteBatch {
  private readonly parts: Buffer[] = [];
  private depth = 0;

  constructor(
    private readonly socket: net.Socket,
    private readonly send: (bytes: Buffer) => void,
  ) {}

  begin(): void {
    this.depth++;
  }

  add(bytes: Buffer): void {
    if (this.depth === 0) this.send(bytes);
    else this.parts.push(bytes);
  }

  end(): void {
    if (--this.depth === 0) this.flush();
  }

  /** Sends what is collected now (before the socket is ended, for example). */
  flush(): void {
    const parts = this.parts;
    if (parts.length === 0) return;
    if (parts.length === 1) {
      // The usual case: one write, and the array is reused rather than replaced.
      const only = parts[0];
      parts.length = 0;
      this.send(only);
      return;
    }
    const all = parts.splice(0);
    this.socket.cork();
    for (const part of all) this.send(part);
    this.socket.uncork();
  }
}
