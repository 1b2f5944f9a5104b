/**
 * The listener: accepts client connections and gives each its own Session
 * (and so its own upstream connection).
 */
import net from 'node:net';
import type { ListenAddress } from './config.js';
import { Session, type ProxyContext } from './session.js';

export interface ProxyServer {
  /** The address actually bound (useful with port 0). */
  readonly address: ListenAddress;
  /** Stops accepting and closes every open connection. */
  close(): Promise<void>;
}

export function startProxy(listen: ListenAddress, ctx: ProxyContext): Promise<ProxyServer> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer({ allowHalfOpen: true, noDelay: true, keepAlive: true }, (client) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    new Session(client, ctx);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(listen.port, listen.host, () => {
      server.off('error', reject);
      server.on('error', (err) => ctx.log.error({ err: err.message }, 'listener error'));
      const bound = server.address() as net.AddressInfo;
      resolve({
        address: { host: bound.address, port: bound.port },
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            for (const socket of sockets) socket.destroy();
          }),
      });
    });
  });
}
