/**
 * A sentinel that lies, for tests of what the proxy believes: a small TCP server speaking RESP
 * that answers `SENTINEL get-master-addr-by-name` with an address of its choosing, claims a
 * configuration epoch far above the real sentinels' (`SENTINEL MASTER`), and can publish
 * `+switch-master` to its subscribers over and over. It stands for a misbehaving peer (a
 * sentinel of another environment, a compromised host), so it is not a real sentinel; the
 * masters and replicas it names are real redis-server processes.
 *
 * Requests are read with redis-parser (a client's commands are RESP arrays of bulk strings,
 * which it reads as it reads replies).
 */
import net from 'node:net';
import Parser from 'redis-parser';
import { cmd } from './resp.js';

export interface LyingSentinelOptions {
  masterName: string;
  /** The master it names. */
  names: { host: string; port: number };
  /** The configuration epoch it claims in SENTINEL MASTER (default 999). */
  epoch?: number;
}

export interface LyingSentinel {
  readonly host: string;
  readonly port: number;
  /** Publishes `+switch-master <name> <from> <to: the address it names>` to its subscribers every `everyMs`. */
  spam(from: { host: string; port: number }, everyMs: number): void;
  /** How many +switch-master messages it has published, and queries it has answered. */
  readonly published: number;
  readonly queries: number;
  close(): Promise<void>;
}

const HOST = '127.0.0.1';

export async function startLyingSentinel(opts: LyingSentinelOptions): Promise<LyingSentinel> {
  const sockets = new Set<net.Socket>();
  const subscribers = new Set<net.Socket>();
  let published = 0;
  let queries = 0;
  let spammer: NodeJS.Timeout | undefined;

  const answer = (socket: net.Socket, args: string[]): void => {
    const [name = '', sub = ''] = args.map((arg) => arg.toLowerCase());
    if (name === 'sentinel' && sub === 'get-master-addr-by-name') {
      queries++;
      socket.write(args[2] === opts.masterName ? cmd(opts.names.host, String(opts.names.port)) : '*-1\r\n');
    } else if (name === 'sentinel' && sub === 'master' && args[2] === opts.masterName) {
      const fields = ['name', opts.masterName, 'ip', opts.names.host, 'port', String(opts.names.port), 'flags', 'master'];
      socket.write(cmd(...fields, 'config-epoch', String(opts.epoch ?? 999)));
    } else if (name === 'subscribe') {
      subscribers.add(socket);
      args
        .slice(1)
        .forEach((channel, i) => socket.write(`*3\r\n$9\r\nsubscribe\r\n$${Buffer.byteLength(channel)}\r\n${channel}\r\n:${i + 1}\r\n`));
    } else if (name === 'ping') {
      socket.write('+PONG\r\n');
    } else if (name === 'client' || name === 'auth') {
      socket.write('+OK\r\n');
    } else {
      socket.write(`-ERR unknown command '${args[0]}'\r\n`);
    }
  };

  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => {
      sockets.delete(socket);
      subscribers.delete(socket);
    });
    const parser = new Parser({
      returnReply: (reply) => answer(socket, (reply as unknown[]).map(String)),
      returnError: () => socket.destroy(),
      returnFatalError: () => socket.destroy(),
    });
    socket.on('data', (chunk: Buffer) => parser.execute(chunk));
  });
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));

  return {
    host: HOST,
    port: (server.address() as net.AddressInfo).port,
    get published() {
      return published;
    },
    get queries() {
      return queries;
    },
    spam(from, everyMs) {
      clearInterval(spammer);
      const text = `${opts.masterName} ${from.host} ${from.port} ${opts.names.host} ${opts.names.port}`;
      spammer = setInterval(() => {
        for (const socket of subscribers) socket.write(cmd('message', '+switch-master', text));
        published++;
      }, everyMs);
    },
    async close() {
      clearInterval(spammer);
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
