/**
 * A TCP relay to a server (a sentinel), for tests that need to cut it off from a client and
 * bring it back, or to drop what it pushes to subscribers.
 */
import net from 'node:net';

const HOST = '127.0.0.1';

export interface Relay {
  port: number;
  /** While down, the relay cuts every connection at once: the sentinel behind it is unreachable. */
  setDown(down: boolean): void;
  close(): Promise<void>;
}

/**
 * A TCP relay to a sentinel. With `dropEvents`, it forwards everything except
 * what the sentinel sends to a connection that subscribed: a monitor behind it
 * gets no +switch-master events and can only learn of a failover by polling.
 */
export async function startRelay(target: number, opts: { dropEvents?: boolean } = {}): Promise<Relay> {
  const sockets = new Set<net.Socket>();
  let down = false;
  const server = net.createServer((client) => {
    if (down) {
      client.destroy();
      return;
    }
    const upstream = net.connect({ host: HOST, port: target });
    sockets.add(client).add(upstream);
    let subscribed = false;
    client.on('data', (chunk) => {
      if (/subscribe/i.test(chunk.toString('latin1'))) subscribed = true;
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      if (!subscribed || !opts.dropEvents) client.write(chunk);
    });
    for (const [a, b] of [
      [client, upstream],
      [upstream, client],
    ]) {
      a.on('error', () => {});
      a.on('close', () => {
        sockets.delete(a);
        b.destroy();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    setDown(value) {
      down = value;
      if (down) for (const socket of sockets) socket.destroy();
    },
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
