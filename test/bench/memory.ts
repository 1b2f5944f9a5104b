/**
 * A hop's memory (the proxy, the baseline build, HAProxy), read from
 * /proc/<pid>/status (VmRSS: resident now; VmHWM: the most it has ever been
 * resident). Each test gets a freshly started process, so VmHWM belongs to
 * that test alone and not to the loads.
 *
 * (a) Idle connections: many Stalwart nodes each keep a pool open; every
 *     client connection also costs the proxy an upstream connection.
 * (b) Large values to slow readers (one of 256 MiB; twenty of 8 MiB at once):
 *     backpressure must hold the bytes in Redis's output buffer and the
 *     kernel's socket buffers, not in the proxy.
 * (c) Connection churn (churn.ts), and the V8 heap before and after it (a
 *     Node hop's admin /metrics): memory must follow the connections that are
 *     open, not the ones that closed a moment ago.
 * (d) All at once, as a sidecar under a memory limit meets it: churn, 5,000
 *     idle connections and twenty slow readers of 8 MiB.
 */
import { Buffer } from 'node:buffer';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { clearInterval, setInterval, setTimeout } from 'node:timers';
import { setTimeout as sleep } from 'node:timers/promises';
import { HOST, PING, roundTrip, type Managed } from './processes.js';

const MiB = 1024 * 1024;

/** MiB, from /proc/<pid>/status. */
export interface ProcMemory {
  rss: number;
  hwm: number;
}

export function readProcMemory(pid: number): ProcMemory {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string): number => {
    const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status);
    if (!match) throw new Error(`no ${field} in /proc/${pid}/status`);
    return Number(match[1]) / 1024;
  };
  return { rss: kib('VmRSS'), hwm: kib('VmHWM') };
}

// ---------------------------------------------------------------- (a) idle

export interface IdleResult {
  connections: number;
  /** Fresh proxy, before any connection. */
  before: ProcMemory;
  /** With every connection open and idle. */
  after: ProcMemory;
  /** Redis's connected_clients at that moment: proves the upstream side is open too. */
  redisClients: number;
  openSeconds: number;
}

/** Connections opened at once: enough to be quick, few enough for the listen backlog. */
const OPEN_CONCURRENCY = 100;
const SETTLE_MS = 1_000;

/** Connections held open and idle; `failure` is the first one that broke. */
export interface IdleSockets {
  readonly sockets: net.Socket[];
  readonly openSeconds: number;
  failure(): Error | null;
  close(): void;
}

/**
 * Opens `count` connections through `port`, each sending PING once and reading +PONG (so its
 * upstream connection exists), and leaves them open and idle.
 */
export async function openIdleConnections(port: number, count: number): Promise<IdleSockets> {
  const sockets: net.Socket[] = [];
  let failure: Error | null = null;
  const close = (): void => {
    for (const socket of sockets) {
      socket.removeAllListeners('close');
      socket.destroy();
    }
  };
  const t0 = Date.now();
  try {
    let next = 0;
    const opener = async (): Promise<void> => {
      while (next < count) {
        next++;
        sockets.push(await openIdle(port));
      }
    };
    await Promise.all(Array.from({ length: OPEN_CONCURRENCY }, opener));
  } catch (error) {
    close();
    throw error;
  }
  for (const socket of sockets) {
    socket.on('error', (error) => {
      failure ??= error;
    });
    socket.on('close', () => {
      failure ??= new Error('an idle connection was closed');
    });
  }
  return { sockets, openSeconds: (Date.now() - t0) / 1000, failure: () => failure, close };
}

/** Opens `count` idle connections through `hop` and reads its memory then. */
export async function idleConnections(hop: Managed, redisPort: number, count: number): Promise<IdleResult> {
  await sleep(SETTLE_MS);
  const before = readProcMemory(hop.pid);
  const idle = await openIdleConnections(hop.port, count);
  try {
    await sleep(SETTLE_MS);
    const after = readProcMemory(hop.pid);
    const info = await roundTrip(redisPort, '*2\r\n$4\r\nINFO\r\n$7\r\nclients\r\n');
    const redisClients = Number(/connected_clients:(\d+)/.exec(info)?.[1] ?? NaN);
    const failure = idle.failure();
    if (failure !== null) throw failure;
    return { connections: idle.sockets.length, before, after, redisClients, openSeconds: idle.openSeconds };
  } finally {
    idle.close();
  }
}

function openIdle(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, HOST);
    let got = '';
    const onData = (chunk: Buffer): void => {
      got += chunk.toString('latin1');
      if (got.length < 7) return;
      socket.off('data', onData);
      socket.off('error', reject);
      if (got === '+PONG\r\n') resolve(socket);
      else reject(new Error(`expected +PONG, got ${JSON.stringify(got)}`));
    };
    socket.once('connect', () => socket.write(PING));
    socket.on('data', onData);
    socket.on('error', reject);
  });
}

// ---------------------------------------------------------- (b) streaming

export interface StreamOptions {
  /** Readers at once, each GETting the value. */
  readers: number;
  valueBytes: number;
  /** The reader's pace. */
  bytesPerSecond: number;
  /** Besides the pacing, the reader stops reading for `stallMs` after each `stallEveryBytes`. */
  stallEveryBytes: number;
  stallMs: number;
}

export interface StreamResult {
  readers: number;
  valueMiB: number;
  readerMiBPerSecond: number;
  stallEveryMiB: number;
  stallMs: number;
  /** VmRSS just before the GET. */
  before: ProcMemory;
  /** Highest VmRSS seen while polling every 20 ms during the transfer. */
  peakRss: number;
  /** After the transfer. */
  after: ProcMemory;
  /**
   * Peak minus before. VmHWM is counted too when the transfer raised it, so
   * a spike between two polls is not missed.
   */
  growth: number;
  seconds: number;
  polls: number;
}

const POLL_MS = 20;
const BIG_KEY = 'bench:big';

/**
 * SETs the value directly on Redis, then GETs it through the hop at `port` `options.readers`
 * times at once, each at a reader's pace, polling the hop's `memory` meanwhile.
 */
export async function slowReaders(
  port: number,
  redisPort: number,
  options: StreamOptions,
  memory: () => ProcMemory,
): Promise<StreamResult> {
  await setBigValue(redisPort, options.valueBytes);
  try {
    await sleep(SETTLE_MS);
    const readers = await Promise.all(Array.from({ length: options.readers }, () => connected(port)));
    let peakRss = 0;
    let polls = 0;
    const poll = (): void => {
      peakRss = Math.max(peakRss, memory().rss);
      polls++;
    };
    const before = memory();
    const poller = setInterval(poll, POLL_MS);
    const t0 = Date.now();
    try {
      await Promise.all(readers.map((reader) => paceRead(reader, options)));
    } finally {
      clearInterval(poller);
      for (const reader of readers) reader.destroy();
    }
    const seconds = (Date.now() - t0) / 1000;
    poll();
    const after = memory();
    const peak = Math.max(peakRss, after.hwm > before.hwm ? after.hwm : 0);
    return {
      readers: options.readers,
      valueMiB: options.valueBytes / MiB,
      readerMiBPerSecond: options.bytesPerSecond / MiB,
      stallEveryMiB: options.stallEveryBytes / MiB,
      stallMs: options.stallMs,
      before,
      peakRss,
      after,
      growth: peak - before.rss,
      seconds,
      polls,
    };
  } finally {
    await roundTrip(redisPort, `*2\r\n$3\r\nDEL\r\n$${BIG_KEY.length}\r\n${BIG_KEY}\r\n`, 10_000);
  }
}

function connected(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, HOST, () => {
      socket.off('error', reject);
      resolve(socket);
    });
    socket.once('error', reject);
  });
}

/** One SET of `bytes` bytes, written 1 MiB at a time so the harness never holds the whole value. */
async function setBigValue(redisPort: number, bytes: number): Promise<void> {
  const socket = await connected(redisPort);
  try {
    const reply = new Promise<string>((resolve, reject) => {
      let got = '';
      socket.on('data', (chunk: Buffer) => {
        got += chunk.toString('latin1');
        if (got.endsWith('\r\n')) resolve(got);
      });
      socket.on('error', reject);
    });
    socket.write(`*3\r\n$3\r\nSET\r\n$${BIG_KEY.length}\r\n${BIG_KEY}\r\n$${bytes}\r\n`);
    const chunk = Buffer.alloc(MiB, 'b');
    for (let left = bytes; left > 0; left -= chunk.length) {
      if (!socket.write(left >= chunk.length ? chunk : chunk.subarray(0, left))) await once(socket, 'drain');
    }
    socket.write('\r\n');
    const answer = await reply;
    if (answer !== '+OK\r\n') throw new Error(`SET of the big value answered ${JSON.stringify(answer)}`);
  } finally {
    socket.destroy();
  }
}

/**
 * GETs the value and reads it at `bytesPerSecond`: whenever the reader is
 * ahead of that pace it stops reading (socket.pause() stops reading the file
 * descriptor, so the kernel buffers fill and TCP pushes back on the proxy)
 * until the pace catches up; plus a longer stall every `stallEveryBytes`.
 */
function paceRead(socket: net.Socket, options: StreamOptions): Promise<void> {
  const header = `$${options.valueBytes}\r\n`;
  const total = header.length + options.valueBytes + 2;
  return new Promise((resolve, reject) => {
    let received = 0;
    let stalled = 0;
    let stallTotalMs = 0;
    let first = '';
    const t0 = Date.now();
    const resumeIn = (ms: number): void => {
      socket.pause();
      setTimeout(() => socket.resume(), ms);
    };
    socket.on('data', (chunk: Buffer) => {
      if (first.length < header.length) {
        first += chunk.subarray(0, header.length).toString('latin1');
        if (first.length >= header.length && !first.startsWith(header)) {
          return reject(new Error(`GET answered ${JSON.stringify(first.slice(0, 40))}`));
        }
      }
      received += chunk.length;
      if (received > total) return reject(new Error(`more bytes than the value: ${received} > ${total}`));
      if (received === total) return resolve();
      if (received - stalled >= options.stallEveryBytes) {
        stalled += options.stallEveryBytes;
        stallTotalMs += options.stallMs;
        return resumeIn(options.stallMs);
      }
      const aheadMs = (received / options.bytesPerSecond) * 1000 + stallTotalMs - (Date.now() - t0);
      if (aheadMs >= 1) resumeIn(aheadMs);
    });
    socket.on('error', reject);
    socket.on('close', () => reject(new Error(`the proxy closed the connection after ${received} of ${total} bytes`)));
    socket.write(`*2\r\n$3\r\nGET\r\n$${BIG_KEY.length}\r\n${BIG_KEY}\r\n`);
  });
}

/** How many open files the idle test needs in the most demanding process (the proxy). */
export function filesNeeded(connections: number): number {
  return 2 * connections + 256;
}

/**
 * The V8 heap in use (MiB) of a Node hop with an admin server, from its /metrics
 * (`nodejs_heap_size_used_bytes`, prom-client's default metric); undefined where there is none.
 */
export async function heapUsedMiB(adminPort: number | undefined): Promise<number | undefined> {
  if (adminPort === undefined) return undefined;
  const text = await (await fetch(`http://${HOST}:${adminPort}/metrics`)).text();
  const match = /^\w*nodejs_heap_size_used_bytes (\S+)$/m.exec(text);
  return match === null ? undefined : Number(match[1]) / MiB;
}
