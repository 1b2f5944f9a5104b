/**
 * The stand-in upstream of the reply fuzzer: a TCP server the proxy takes for Redis. The first
 * command on a connection decides what it is:
 * - `CLIENT SETNAME bystander-...`: a bystander, relayed byte for byte to a real Redis, so that
 *   its replies are Redis's own and can be checked exactly;
 * - `HELLO` without arguments: the proxy's own question of the server's version, relayed too;
 * - anything else: a fuzz connection, whose requests are answered by a ReplyPlanner seeded from
 *   the case number in its `CLIENT SETNAME fuzz-<n>` (a run's seed repeats each case's replies;
 *   only timing differs), delivered whole or split at random bytes with small pauses.
 */
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { ReplyPlanner, Rng, streamSeed, type ReplyCounts, type Step } from './reply-fuzz-replies.js';

const HOST = '127.0.0.1';

export interface FuzzUpstreamCounts extends ReplyCounts {
  /** Connections answered by the fuzzer. */
  fuzzConnections: number;
  /** Connections relayed to the real Redis. */
  bystanderConnections: number;
}

export interface FuzzUpstream {
  readonly port: number;
  readonly counts: FuzzUpstreamCounts;
  /** Closes the server and every connection it holds. */
  close(): Promise<void>;
}

export interface FuzzUpstreamOptions {
  /** The real Redis bystanders are relayed to. */
  redisHost: string;
  redisPort: number;
  seed: number;
  /** The share of replies that go wrong. */
  misframeRate: number;
}

/** One request frame: an array of bulk strings (all the proxy forwards here), and where it ends. */
export interface Request {
  readonly args: Buffer[];
  readonly end: number;
}

/** The request frame at `pos`, undefined while it is not whole; throws on what is not one. */
export function parseRequest(buf: Buffer, pos: number): Request | undefined {
  const line = (at: number, type: number): { value: number; next: number } | undefined => {
    if (at >= buf.length) return undefined;
    if (buf[at] !== type) throw new Error(`expected ${String.fromCharCode(type)} at ${at}, found byte ${buf[at]}`);
    const cr = buf.indexOf('\r\n', at);
    if (cr < 0) return undefined;
    const value = Number(buf.toString('latin1', at + 1, cr));
    if (!Number.isSafeInteger(value) || value < 0) throw new Error(`bad length at ${at}`);
    return { value, next: cr + 2 };
  };
  const header = line(pos, 0x2a /* * */);
  if (header === undefined) return undefined;
  const args: Buffer[] = [];
  let at = header.next;
  for (let i = 0; i < header.value; i++) {
    const length = line(at, 0x24 /* $ */);
    if (length === undefined || length.next + length.value + 2 > buf.length) return undefined;
    args.push(buf.subarray(length.next, length.next + length.value));
    at = length.next + length.value + 2;
  }
  return { args, end: at };
}

const BYSTANDER = /^bystander-/;
const FUZZ_CASE = /^fuzz-(\d+)$/;

/** Starts the stand-in on a free loopback port. */
export async function startFuzzUpstream(opts: FuzzUpstreamOptions): Promise<FuzzUpstream> {
  const counts: FuzzUpstreamCounts = { replies: 0, misframed: 0, fuzzConnections: 0, bystanderConnections: 0 };
  const sockets = new Set<net.Socket>();
  const track = (socket: net.Socket): net.Socket => {
    sockets.add(socket);
    // Resets are part of the game here, on both sides.
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
    return socket;
  };
  /** Fuzz connections whose first command names no case: seeded in the order they come. */
  let unnamed = 0;

  const server = net.createServer((socket) => {
    track(socket);
    socket.setNoDelay(true);
    let head = Buffer.alloc(0);
    const onFirstBytes = (chunk: Buffer): void => {
      head = Buffer.concat([head, chunk]);
      let first: Request | undefined;
      try {
        first = parseRequest(head, 0);
      } catch {
        socket.destroy();
        return;
      }
      if (first === undefined) return;
      socket.off('data', onFirstBytes);
      const [command, sub, name] = first.args.map((a) => a.toString('latin1'));
      const isSetName = command?.toUpperCase() === 'CLIENT' && sub?.toUpperCase() === 'SETNAME';
      // HELLO without arguments is the proxy's own question of the server's version (at its start,
      // and ahead of connections): it gets the real server's answer, as a start refused on a
      // mis-framed answer would stop the run before it began.
      if (command?.toUpperCase() === 'HELLO' && first.args.length === 1) {
        relay(socket, head, opts, track);
        return;
      }
      if (isSetName && BYSTANDER.test(name ?? '')) {
        counts.bystanderConnections++;
        relay(socket, head, opts, track);
        return;
      }
      counts.fuzzConnections++;
      const caseNumber = isSetName ? FUZZ_CASE.exec(name ?? '')?.[1] : undefined;
      const index = caseNumber !== undefined ? Number(caseNumber) : 1_000_000 + unnamed++;
      const fuzz = new FuzzConnection(socket, opts, counts, index);
      socket.on('data', (more: Buffer) => fuzz.data(more));
      fuzz.data(head);
    };
    socket.on('data', onFirstBytes);
  });
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    counts,
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const socket of sockets) socket.destroy();
      await closed;
    },
  };
}

/** Relays a bystander's connection to the real Redis, the bytes read so far first. */
function relay(socket: net.Socket, head: Buffer, opts: FuzzUpstreamOptions, track: (s: net.Socket) => net.Socket): void {
  const redis = track(net.connect({ host: opts.redisHost, port: opts.redisPort }));
  redis.setNoDelay(true);
  redis.write(head);
  socket.pipe(redis);
  redis.pipe(socket);
  socket.on('close', () => redis.destroy());
  redis.on('close', () => socket.destroy());
}

/** One fuzz connection: requests parsed as they come, their answers written in order. */
class FuzzConnection {
  private buffered: Buffer = Buffer.alloc(0);
  private readonly steps: Step[] = [];
  private writing = false;
  private readonly planner: ReplyPlanner;
  /** Delivery draws from its own stream: how chunks arrive must not shift the replies' choices. */
  private readonly delivery: Rng;

  constructor(
    private readonly socket: net.Socket,
    opts: FuzzUpstreamOptions,
    counts: ReplyCounts,
    index: number,
  ) {
    this.planner = new ReplyPlanner(new Rng(streamSeed(opts.seed, index, 2)), opts.misframeRate, counts);
    this.delivery = new Rng(streamSeed(opts.seed, index, 3));
  }

  data(chunk: Buffer): void {
    this.buffered = this.buffered.length === 0 ? chunk : Buffer.concat([this.buffered, chunk]);
    let pos = 0;
    for (;;) {
      let request: Request | undefined;
      try {
        request = parseRequest(this.buffered, pos);
      } catch {
        // Not a request the proxy would forward from these clients: nothing sensible to answer.
        this.socket.destroy();
        return;
      }
      if (request === undefined) break;
      this.steps.push(...this.planner.answer(request.args));
      pos = request.end;
    }
    this.buffered = this.buffered.subarray(pos);
    void this.drain();
  }

  private async drain(): Promise<void> {
    if (this.writing) return;
    this.writing = true;
    try {
      while (this.steps.length > 0 && !this.socket.destroyed) {
        const step = this.steps.shift() as Step;
        if (step.kind === 'pause') await sleep(step.ms);
        else if (step.kind === 'close') {
          if (step.reset) this.socket.resetAndDestroy();
          else this.socket.end();
          this.steps.length = 0;
        } else await this.write(step.bytes);
      }
    } finally {
      this.writing = false;
    }
  }

  /** One reply: whole, or (one in four) cut at random bytes into writes with small pauses between. */
  private async write(bytes: Buffer): Promise<void> {
    if (bytes.length === 0 || this.socket.writableEnded) return;
    if (bytes.length < 2 || !this.delivery.chance(0.25)) {
      this.socket.write(bytes);
      return;
    }
    const cuts = Array.from({ length: 1 + this.delivery.int(4) }, () => 1 + this.delivery.int(bytes.length - 1)).sort((a, b) => a - b);
    let from = 0;
    for (const cut of [...cuts, bytes.length]) {
      if (cut <= from) continue;
      if (this.socket.destroyed || this.socket.writableEnded) return;
      this.socket.write(bytes.subarray(from, cut));
      from = cut;
      if (cut < bytes.length) await sleep(this.delivery.int(3));
    }
  }
}
