/**
 * Opens the upstream connection for one client connection: TCP, a unix
 * socket, or TLS (rediss://), to the configured host or to the master that
 * the sentinels currently name.
 */
import net from 'node:net';
import tls from 'node:tls';
import { formatAddress } from '../address.js';
import type { UpstreamTls } from '../config.js';
import { readBuffer } from './read-buffer.js';
import { setupCommands, type UpstreamTarget } from './target.js';

export interface UpstreamSocket {
  readonly socket: net.Socket;
  /** The event that means the connection is usable: 'connect', or 'secureConnect' for TLS. */
  readonly readyEvent: 'connect' | 'secureConnect';
  /** host:port or socket path actually dialled (with sentinel: the master of the moment). */
  readonly address: string;
  /** The host of that address (the socket path for a unix socket). */
  readonly host: string;
  /**
   * True when what Redis sends goes to the `receive` given to connect(), read into the shared
   * buffer (read-buffer.ts: valid only during the call); otherwise it comes as 'data' events.
   */
  readonly readsShared: boolean;
}

/** Takes each read's bytes, valid only during the call (read-buffer.ts). */
export type Receive = (bytes: Buffer) => void;

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
   * Dials the upstream. With `receive`, a plain connection (TCP, unix socket) reads into the
   * shared buffer and hands each read to it (`readsShared`); TLS, and a call without `receive`,
   * give 'data' events.
   */
  connect(receive?: Receive): UpstreamSocket {
    const onread = receive === undefined ? undefined : sharedReads(receive);
    const readsShared = onread !== undefined;
    if (this.target.path !== undefined) {
      return {
        socket: net.connect({ path: this.target.path, allowHalfOpen: true, onread }),
        readyEvent: 'connect',
        address: this.target.path,
        host: this.target.path,
        readsShared,
      };
    }
    const { host, port } =
      this.locator !== null ? this.locator.locate() : { host: this.target.host as string, port: this.target.port ?? DEFAULT_PORT };
    const address = formatAddress(host, port);
    if (this.tlsOptions === null) {
      const socket = net.connect({ host, port, allowHalfOpen: true, noDelay: true, keepAlive: true, onread });
      return { socket, readyEvent: 'connect', address, host, readsShared };
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
    return { socket, readyEvent: 'secureConnect', address, host, readsShared: false }; // a TLSSocket takes no onread
  }
}

/**
 * net.connect's `onread`: `buffer` is asked for the memory of each next read, the callback gets
 * what was read. Flow control goes through the socket's pause() and resume(), so the callback
 * never stops the reading itself (by returning false).
 */
function sharedReads(receive: Receive): net.OnReadOpts {
  return {
    buffer: readBuffer,
    callback: (bytes: number, buffer: Uint8Array): boolean => {
      receive((buffer as Buffer).subarray(0, bytes));
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
