/**
 * Free TCP ports on the loopback address, for the servers and listeners tests
 * start. "Free" means free a moment ago: someone may take a port before the
 * test binds it, so whoever binds it must be ready to try another
 * (startServerProcess() in server-process.ts is).
 */
import net from 'node:net';

const HOST = '127.0.0.1';

/** A TCP port that was free a moment ago (the OS picks it, from the ephemeral range). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once('error', reject);
    server.listen(0, HOST, () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** Whether `port` could be bound on the loopback address a moment ago. */
export function isPortFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.unref();
    server.once('error', () => resolve(false));
    server.listen(port, HOST, () => server.close(() => resolve(true)));
  });
}

/**
 * The first of `count` consecutive TCP ports that were free a moment ago
 * (cluster listeners). They are taken below Linux's ephemeral range
 * (32768 and up), from which freePort(), and so the redis-servers of tests
 * running in parallel, and every outgoing connection take theirs.
 */
export async function freePortRange(count: number): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 16_000 + Math.floor(Math.random() * (32_000 - 16_000 - count));
    const ports = Array.from({ length: count }, (_, i) => base + i);
    if ((await Promise.all(ports.map(isPortFree))).every(Boolean)) return base;
  }
  throw new Error(`no ${count} consecutive free ports found`);
}

/**
 * A TCP port nothing listens on, for tests of an unreachable server. It is taken below the
 * ranges freePort() and freePortRange() give (and outgoing connections use): a server another
 * test starts meanwhile may take a port freePort() gave, and then answers where nothing should.
 */
export async function closedPort(): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 10_000 + Math.floor(Math.random() * 6_000);
    if (await isPortFree(port)) return port;
  }
  throw new Error('no closed port found');
}
