/**
 * Opens the upstream connection for one client connection: TCP, a unix
 * socket, or TLS (rediss://), to the configured host or to the master that
 * the sentinels currently name.
 */
import net from 'node:net';
import tls from 'node:tls';
import { formatAddress } from '../address.js';
import type { UpstreamTls } from '../config.js';
import { ReadBuffer } from './read-buffer.js';
import { UpstreamSocket } from './upstream-socket.js';
import { setupCommands, type UpstreamTarget } from './target.js';

export interface UpstreamConnection {
  readonly socket: net.Socket;
  /** The event that means the connection is usable: 'connect', or 'secureConnect' for TLS. */
  readonly readyEvent: 'connect' | 'secureConnect';
  /** host:port or socket path actually dialled (with sentinel: the master of the moment). */
  readonly address: string;
  /** The host of that address (the socket path for a unix socket). */
  readonly host: string;
  /**
   * True when what Redis sends goes to `reads.receive`, read into the connection's own buffer
   * (read-buffer.ts), and a refused write goes to `reads.writeRefused`; otherwise (TLS, or no
   * `reads` given) Redis's bytes come as 'data' events and a refused write is an 'error'.
   */
  readonly ownReads: boolean;
}

/** What a connection does with its reads, when it reads into memory of its own (read-buffer.ts). */
export interface UpstreamReads {
  /**
   * Takes one read's bytes, valid until the call returns. Returns true when they are still
   * referenced after it (a write to the client that goes on from this memory later).
   */
  receive(bytes: Buffer): boolean;
  /** Redis closed while bytes were on their way to it: nothing more is written, what it sent is still read (upstream-socket.ts). */
  writeRefused(error: Error): void;
}

const DEFAULT_PORT = 6379;

/** Where connections go when that changes over time: the master the sentinels name, a live cluster node. */
export interface UpstreamLocator {
  locate(): { host: string; port: number };
  describe(): string;
}

export class UpstreamConnector {
  /** The URL's AUTH and SELECT, sent first on every connection (and again after a RESET). */
  readonly setup: readonly Buffer[];

  constructor(
    readonly target: UpstreamTarget,
    private readonly tlsOptions: UpstreamTls | null,
    private readonly locator: UpstreamLocator | null = null,
  ) {
    this.setup = setupCommands(target);
  }

  /** For logs and error replies: the URL (password masked), or the sentinel or cluster setup. */
  describe(): string {
    return this.locator !== null ? this.locator.describe() : this.target.display;
  }

  /**
   * Dials the upstream. With `reads`, a plain connection (TCP, unix socket) reads into memory of
   * its own and hands each read to it (`ownReads`); TLS, and a call without `reads`, give 'data'
   * events.
   */
  connect(reads?: UpstreamReads): UpstreamConnection {
    const ownReads = reads !== undefined;
    const plain = (): net.Socket =>
      reads === undefined
        ? new net.Socket({ allowHalfOpen: true })
        : new UpstreamSocket({ allowHalfOpen: true, onread: readsOwnBuffer(reads) }, (error) => reads.writeRefused(error));
    if (this.target.path !== undefined) {
      const socket = plain().connect({ path: this.target.path });
      return { socket, readyEvent: 'connect', address: this.target.path, host: this.target.path, ownReads };
    }
    const { host, port } =
      this.locator !== null ? this.locator.locate() : { host: this.target.host as string, port: this.target.port ?? DEFAULT_PORT };
    const address = formatAddress(host, port);
    if (this.tlsOptions === null) {
      const socket = plain().connect({ host, port, noDelay: true, keepAlive: true });
      return { socket, readyEvent: 'connect', address, host, ownReads };
    }
    const tlsOptions: tls.ConnectionOptions & { allowHalfOpen: boolean } = {
      host,
      port,
      ...upstreamTlsOptions(this.tlsOptions, host),
      allowHalfOpen: true, // passed on to the TLSSocket: Redis's FIN must not close our side early
    };
    const socket = tls.connect(tlsOptions);
    socket.setNoDelay(true);
    socket.setKeepAlive(true);
    return { socket, readyEvent: 'secureConnect', address, host, ownReads: false }; // a TLSSocket takes no onread
  }
}

/**
 * net.Socket's `onread`: `buffer` is asked for the memory of the socket's next read (after each
 * read's callback, read-buffer.ts), the callback gets what was read. Flow control goes through
 * the socket's pause() and resume(), so the callback never stops the reading itself (by
 * returning false).
 */
function readsOwnBuffer(reads: UpstreamReads): net.OnReadOpts {
  const memory = new ReadBuffer();
  return {
    buffer: memory.next,
    callback: (bytes: number, buffer: Uint8Array): boolean => {
      memory.afterRead(bytes, reads.receive((buffer as Buffer).subarray(0, bytes)));
      return true;
    },
  };
}

/** rediss://: the CA, client certificate and server name given, else the system's CAs and the host. */
export function upstreamTlsOptions(settings: UpstreamTls | null, host: string | undefined): tls.ConnectionOptions {
  // SNI carries host names only; an IP address is verified against the certificate's IP entries.
  const servername = settings?.servername ?? (host !== undefined && net.isIP(host) === 0 ? host : undefined);
  return { ca: settings?.ca, cert: settings?.cert, key: settings?.key, servername, rejectUnauthorized: !(settings?.insecure ?? false) };
}
