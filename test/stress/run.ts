/**
 * The integrity stress: many connections at once, each with keys of its own and an exact model
 * of every reply (workload.ts), checked byte for byte as they arrive (expected.ts); heavy-tailed
 * values up to several MiB made of records that name their owner (pattern.ts); pipelines in
 * random splits; slow readers; transactions; Stalwart lock blocks, pipelined, cut into pieces
 * written with pauses, and sent one command at a time; pub/sub pairs; RESP3 clients with CLIENT
 * TRACKING on, whose invalidation pushes come between and inside replies (tracking-client.ts).
 * Whatever goes wrong is reported with the seed that repeats the run.
 */
import { Rng } from '../bench/random.js';
import { StressClient, Subscriber, type Endpoint } from './client.js';
import type { Mismatch } from './expected.js';
import { probeHello, type HelloProbe } from './hello.js';
import { TrackingClient } from './tracking-client.js';
import { clientTag, ClientWorkload } from './workload.js';

export interface StressOptions {
  readonly seed: number;
  readonly seconds: number;
  readonly clients: number;
  /** Clients that publish to a subscriber of their own (the first ones). */
  readonly pairs: number;
  /** Share of connections (clients and subscribers) that read slowly. */
  readonly slowShare: number;
  readonly maxValueBytes: number;
  /**
   * Lock blocks are fixed on the way (through the proxy in enforce mode). The model does not
   * depend on it: a lock block's replies are Redis's own either way (workload.ts).
   */
  readonly lockFixed: boolean;
  /** Subscribers send RESET and SUBSCRIBE again now and then: the server has RESET (Redis 6.2 on). */
  readonly resubscribe: boolean;
  /** Where the connection for `tag` (a client's hash tag) goes: the node that owns the tag's slot, in a cluster. */
  readonly endpointFor: (tag: string) => Endpoint;
  /** No byte for this long while bytes are expected: a failure. */
  readonly stallMs?: number;
}

export interface StressReport {
  readonly seed: number;
  readonly seconds: number;
  readonly connections: number;
  /** Of the clients, how many spoke RESP3 with tracking on. */
  readonly resp3Clients: number;
  /** Why there were none: the server's answer to HELLO 3 (before Redis 6.0); '' otherwise. */
  readonly resp3Refused: string;
  readonly replies: number;
  readonly bytes: number;
  readonly batches: number;
  readonly commands: ReadonlyMap<string, number>;
  readonly failures: readonly Mismatch[];
}

/** Seeds the generator of connection `n` of the run seeded `seed`. */
function connectionSeed(seed: number, n: number): number {
  return (Math.imul(seed ^ 0x9e3779b9, 0x85ebca6b) + Math.imul(n + 1, 0xc2b2ae35)) >>> 0;
}

/**
 * Whether client `c` of `clients` speaks RESP3 with tracking on: one in 8 (the 8th, the 16th,
 * ...; the 8th of 32 has a subscriber, the others not), and of 2 to 7 clients the last one.
 */
export function speaksResp3(c: number, clients: number): boolean {
  return clients >= 2 && (c % 8 === 7 || (clients < 8 && c === clients - 1));
}

export async function runStress(options: StressOptions): Promise<StressReport> {
  const stallMs = options.stallMs ?? 30_000;
  // HELLO 3's reply, the same on every connection but for its id, is asked on a connection of
  // the probe's own; a server without HELLO 3 (before Redis 6.0) has only RESP2 clients.
  const first = [...Array(options.clients).keys()].find((c) => speaksResp3(c, options.clients));
  const hello: HelloProbe = first === undefined ? { refused: '' } : await probeHello(options.endpointFor(clientTag(first)));
  const layout = new Rng(options.seed);
  const subscribers: Subscriber[] = [];
  const clients: StressClient[] = [];
  for (let i = 0; i < options.pairs; i++) {
    const tag = clientTag(i);
    const rng = new Rng(connectionSeed(options.seed, options.clients + i));
    subscribers.push(
      new Subscriber(`s:${tag}:channel`, i, { endpoint: options.endpointFor(tag), rng, slow: layout.chance(options.slowShare), stallMs }),
    );
  }
  for (let c = 0; c < options.clients; c++) {
    const rng = new Rng(connectionSeed(options.seed, c));
    const subscriber = subscribers[c] ?? null;
    const template = 'template' in hello && speaksResp3(c, options.clients) ? hello.template : null;
    const workload = new ClientWorkload(c, rng, {
      maxValueBytes: options.maxValueBytes,
      subscriber: subscriber === null ? null : { channel: subscriber.channel, stream: subscriber.stream },
      resp3: template !== null,
    });
    const connection = { endpoint: options.endpointFor(clientTag(c)), rng, slow: layout.chance(options.slowShare), stallMs };
    const paired = options.resubscribe ? subscriber : null;
    clients.push(
      template !== null ? new TrackingClient(workload, connection, paired, template) : new StressClient(workload, connection, paired),
    );
  }
  const connections = [...subscribers, ...clients];
  try {
    await Promise.all(connections.map((connection) => connection.open()));
    await Promise.all(subscribers.map((subscriber) => subscriber.subscribe()));
    const deadline = Date.now() + options.seconds * 1000;
    await Promise.all(clients.map((client) => client.run(deadline)));
    await Promise.all(subscribers.map((subscriber) => subscriber.drained()));
  } finally {
    for (const connection of connections) connection.close();
  }
  const commands = new Map<string, number>();
  for (const client of clients) for (const [op, n] of client.workload.sent) commands.set(op, (commands.get(op) ?? 0) + n);
  commands.set(
    'resubscribe',
    clients.reduce((sum, client) => sum + client.resubscribes, 0),
  );
  const tracking = clients.filter((client) => client instanceof TrackingClient);
  if (tracking.length > 0) {
    commands.set(
      'invalidate',
      tracking.reduce((sum, client) => sum + client.pushes.pushCount, 0),
    );
    commands.set(
      'invalidate-nested',
      tracking.reduce((sum, client) => sum + client.pushes.nestedPushes, 0),
    );
  }
  return {
    seed: options.seed,
    seconds: options.seconds,
    connections: connections.length,
    resp3Clients: tracking.length,
    resp3Refused: 'refused' in hello ? hello.refused : '',
    replies: connections.reduce((sum, c) => sum + c.stream.replies, 0),
    bytes: connections.reduce((sum, c) => sum + c.stream.received, 0) + tracking.reduce((sum, client) => sum + client.pushes.pushBytes, 0),
    batches: clients.reduce((sum, c) => sum + c.batches, 0),
    commands,
    failures: connections.flatMap((c) => (c.failure === null ? [] : [c.failure])),
  };
}

/** The report in a few lines: figures, then each failure. */
export function describeReport(report: StressReport, label: string): string {
  const mib = (report.bytes / (1024 * 1024)).toFixed(1);
  const ops = [...report.commands].map(([op, n]) => `${op} ${n}`).join(', ');
  const resp3 = report.resp3Refused === '' ? `${report.resp3Clients} RESP3` : `no RESP3: HELLO 3 answered ${report.resp3Refused}`;
  const head =
    `${label}: seed ${report.seed}, ${report.seconds} s, ${report.connections} connections (${resp3}): ` +
    `${report.replies} replies, ${mib} MiB checked, ${report.batches} batches (${ops}); ${report.failures.length} wrong`;
  const failures = report.failures.map(
    (f) => `  ${f.connection}, at byte ${f.streamOffset} of its stream, in the reply to ${f.expected}: ${f.detail}`,
  );
  return [head, ...failures].join('\n');
}
