/**
 * The listener: accepts client connections (plain TCP or TLS) and gives each
 * its own Session, and so its own upstream connection. It also owns what
 * concerns all sessions at once: the connection limit, closing the sessions
 * of a master that is no longer one, and a graceful shutdown.
 */
import net from 'node:net';
import tls from 'node:tls';
import type { Address } from './address.js';
import type { ListenerTls } from './config.js';
import { describeInherited, type InheritedSocket } from './listen-fds.js';
import type { ProxyContext } from './session/context.js';
import { Session } from './session/session.js';

export interface ProxyServerOptions {
  /** Where to bind, or a listening socket systemd passed (socket activation). */
  readonly listen: Address | InheritedSocket;
  /** Serve clients over TLS. */
  readonly tls?: ListenerTls | null;
  /** Client connections at once; more are refused with Redis's own error. */
  readonly maxConnections?: number;
}

export interface ProxyServer {
  /** The address actually bound (useful with port 0). */
  readonly address: Address;
  /** Open sessions. */
  readonly sessionCount: number;
  /** Closes every session whose upstream is `address` (a master that was failed over). Returns how many. */
  closeSessionsTo(address: string): number;
  /**
   * Stops accepting, lets every session finish what is in flight, and closes
   * them; sessions still busy after `timeoutMs` are closed anyway. Resolves
   * when all are closed, with how many were open and how many were cut.
   */
  shutdown(timeoutMs: number): Promise<ShutdownCount>;
  /** Stops accepting and closes every connection at once. */
  close(): Promise<void>;
}

/** What a graceful shutdown did: connections open when it began, and those still busy at its deadline, closed then. */
export interface ShutdownCount {
  readonly open: number;
  readonly cutAtDeadline: number;
}

/** Adds up the counts of several listeners' shutdowns. */
export function addShutdownCounts(counts: ReadonlyArray<ShutdownCount | undefined>): ShutdownCount {
  let open = 0;
  let cutAtDeadline = 0;
  for (const count of counts) {
    open += count?.open ?? 0;
    cutAtDeadline += count?.cutAtDeadline ?? 0;
  }
  return { open, cutAtDeadline };
}

/** What Redis answers a connection over its maxclients limit. */
const MAX_CLIENTS_ERROR = '-ERR max number of clients reached\r\n';

export function startProxy(options: ProxyServerOptions, ctx: ProxyContext): Promise<ProxyServer> {
  const sessions = new Set<Session>();
  const maxConnections = options.maxConnections ?? Number.MAX_SAFE_INTEGER;
  let allClosed: (() => void) | null = null;

  const accept = (client: net.Socket): void => {
    if (sessions.size >= maxConnections) {
      ctx.stats.connectionsRejected++;
      client.on('error', () => {});
      client.end(MAX_CLIENTS_ERROR);
      return;
    }
    const session = new Session(client, ctx, (closed) => {
      sessions.delete(closed);
      if (sessions.size === 0) allClosed?.();
    });
    sessions.add(session);
  };

  const server = options.tls
    ? tls.createServer(
        {
          cert: options.tls.cert,
          key: options.tls.key,
          ca: options.tls.clientCa,
          requestCert: options.tls.clientCa !== undefined,
          rejectUnauthorized: options.tls.clientCa !== undefined,
          allowHalfOpen: true,
        },
        accept,
      )
    : net.createServer({ allowHalfOpen: true, noDelay: true, keepAlive: true }, accept);
  if (options.tls) {
    server.on('tlsClientError', (err: Error, socket: net.Socket) => {
      ctx.log.warn({ err: err.message, client: socket.remoteAddress }, 'client TLS handshake failed');
    });
  }

  // On a socket systemd passed, close() closes this process's descriptor only: systemd keeps the
  // socket listening, and connections made meanwhile wait for the next process to accept them.
  const stopAccepting = (): Promise<void> => new Promise((resolve) => server.close(() => resolve()));

  return new Promise((resolve, reject) => {
    server.once('error', reject);
    const listening = (): void => {
      server.off('error', reject);
      server.on('error', (err) => ctx.log.error({ err: err.message }, 'listener error'));
      const bound = server.address();
      if (bound === null || typeof bound === 'string') {
        server.close();
        reject(new Error(`${describeInherited(options.listen as InheritedSocket)} is not a TCP socket (the proxy listens on TCP only)`));
        return;
      }
      resolve({
        address: { host: bound.address, port: bound.port },
        get sessionCount() {
          return sessions.size;
        },
        closeSessionsTo(address: string): number {
          let closed = 0;
          for (const session of sessions) {
            if (session.upstreamAddress === address) {
              session.destroy();
              closed++;
            }
          }
          return closed;
        },
        async shutdown(timeoutMs: number): Promise<ShutdownCount> {
          const stopped = stopAccepting();
          const open = sessions.size;
          let cutAtDeadline = 0;
          if (sessions.size > 0) {
            const drained = new Promise<void>((done) => (allClosed = done));
            for (const session of sessions) session.beginShutdown();
            let timer: NodeJS.Timeout | undefined;
            const deadline = new Promise<void>((done) => (timer = setTimeout(done, timeoutMs)));
            await Promise.race([drained, deadline]);
            clearTimeout(timer);
            cutAtDeadline = sessions.size;
            for (const session of sessions) session.destroy();
          }
          await stopped;
          return { open, cutAtDeadline };
        },
        async close(): Promise<void> {
          const stopped = stopAccepting();
          for (const session of sessions) session.destroy();
          await stopped;
        },
      });
    };
    if ('fd' in options.listen) server.listen({ fd: options.listen.fd }, listening);
    else server.listen(options.listen.port, options.listen.host, listening);
  });
}
