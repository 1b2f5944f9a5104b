/** The part of unix-dgram (unix datagram sockets for Node) the proxy uses. */
declare module 'unix-dgram' {
  import type { EventEmitter } from 'node:events';

  export interface UnixDgramSocket extends EventEmitter {
    bind(path: string): void;
    send(buf: Buffer, offset: number, length: number, path: string, callback?: (err?: Error) => void): void;
    close(): void;
  }

  export function createSocket(type: 'unix_dgram', listener?: (msg: Buffer) => void): UnixDgramSocket;
}
