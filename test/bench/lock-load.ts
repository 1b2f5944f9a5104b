/**
 * Lock acquisition load, shaped like Stalwart's connection pool.
 *
 * N connections, each multiplexing requests: per 5 requests, one exact
 * Stalwart lock block (MULTI / INCRBY key 1 / EXPIRE key 3600 / EXEC, written
 * as ONE buffer as redis-rs writes an atomic pipeline) and 4 others rotating
 * over PING, GET and SETEX. Lock keys are 0x17 + a u64 big-endian id from a
 * pool of 1,000, so after the first thousand attempts every attempt loses
 * (counter > 1): the contended case the proxy exists for.
 *
 * Depth 1 sends a request, waits for all of its replies (4 for a lock block),
 * then sends the next; depth 16 keeps 16 requests in flight per connection.
 * A lock block counts as one request. Every request is encoded once up front
 * and replies are only counted (resp-counter.ts), so the generator itself
 * allocates next to nothing per request.
 *
 * `blocks: 'plain'` is the same load with nothing for the proxy to fix: each
 * block's four commands become PING / INCRBY k 1 / EXPIRE k 3600 / PING on a
 * key no rule names (same writes, same replies, same generator). What the
 * lock blocks cost the proxy beyond pass-through is the difference between
 * the two, free of the generator's own CPU on a small machine (redis-benchmark,
 * the pass-through table's generator, costs less).
 *
 * Each request's latency (its write to its last reply, at the depth's queueing)
 * goes into a histogram of 1 µs buckets: the latency under load beside the
 * throughput, read while the timed part runs.
 *
 * Against a Redis Cluster (directly or through the proxy's node listeners),
 * each connection goes to one master and sends only keys of its slots, as a
 * cluster client's connection to that node would.
 *
 * Runs as its own process (worker.ts): `runLockLoad()` spawns this file.
 */
import { Buffer } from 'node:buffer';
import type net from 'node:net';
import { performance } from 'node:perf_hooks';
import process from 'node:process';
import { setTimeout as sleep } from 'node:timers/promises';
import { keySlot, servesSlot, type Shard } from './cluster.js';
import { command, connect } from './processes.js';
import { ReplyCounter } from './resp-counter.js';
import { isMain, runWorker, workerMain } from './worker.js';

export interface LockLoadOptions {
  /** Where every connection goes, unless `shards` is given. */
  port: number;
  /**
   * Redis Cluster: connection i goes to shards[i mod n] instead, and sends
   * only the keys whose hash slot that shard serves (the 1,000 lock ids and
   * the other keys are split between the shards), so that no request is
   * answered with -MOVED.
   */
  shards?: Shard[];
  connections: number;
  /** Requests in flight per connection. */
  depth: number;
  warmupMs: number;
  durationMs: number;
  /** Lock blocks (the default), or the same commands in a shape nothing fixes (see above). */
  blocks?: 'lock' | 'plain';
}

export interface LockLoadResult {
  /** Requests per second, a lock block counting as one. */
  rps: number;
  /** Lock blocks per second (a fifth of rps). */
  locksPerSecond: number;
  requests: number;
  seconds: number;
  /** Error replies seen during the whole run (should be 0). */
  errors: number;
  /** Latency of the timed requests, µs: a request's write to its last reply. */
  latency: { p50: number; p99: number; p999: number };
}

const LOCK_IDS = 1_000;
const OTHER_KEYS = 1_000;
/** Lock blocks expire after an hour, as Stalwart's task locks do. */
const LOCK_EXPIRY_SECONDS = 3_600;
const DRAIN_TIMEOUT_MS = 5_000;

/** Harness side: one run in a child process. */
export function runLockLoad(options: LockLoadOptions): Promise<LockLoadResult> {
  return runWorker<LockLoadResult>(import.meta.url, options, options.warmupMs + options.durationMs + 30_000);
}

/** Stalwart's task lock key: KV_LOCK_TASK (0x17) then the id as u64 big-endian (the shipped rule stalwart-task-lock). */
export function taskLockKey(id: bigint): Buffer {
  const key = Buffer.alloc(9);
  key[0] = 0x17;
  key.writeBigUInt64BE(id, 1);
  return key;
}

/**
 * One attempt's four commands as one buffer: `MULTI / INCRBY k 1 / EXPIRE k 3600 / EXEC` for a
 * lock block; for a plain one the same writes and replies with nothing to fix, PING in place of
 * MULTI and EXEC (no transaction).
 */
function attempt(key: Buffer, blocks: 'lock' | 'plain'): Buffer {
  const [open, close] = blocks === 'lock' ? ['MULTI', 'EXEC'] : ['PING', 'PING'];
  return Buffer.concat([command(open), command('INCRBY', key, '1'), command('EXPIRE', key, String(LOCK_EXPIRY_SECONDS)), command(close)]);
}

/** The plain block's key for a lock id: a printable prefix no rule names, then the lock key's bytes. */
const plainKey = (lockKey: Buffer): Buffer => Buffer.concat([Buffer.from('bench:plain:'), lockKey]);

interface Requests {
  locks: Buffer[];
  /** Rotated through in order: PING, GET, SETEX, PING, ... */
  others: Buffer[];
}

/** Every request, or with `keep` those whose key it keeps. */
function encodeRequests(blocks: 'lock' | 'plain', keep: (key: Buffer) => boolean = () => true): Requests {
  const locks: Buffer[] = [];
  for (let i = 0; i < LOCK_IDS; i++) {
    // Spread the ids over the u64 range like real task ids, not 0..999.
    const lockKey = taskLockKey(0x0001_0000_0000_0000n + BigInt(i) * 7_919n);
    const key = blocks === 'lock' ? lockKey : plainKey(lockKey);
    if (keep(key)) locks.push(attempt(key, blocks));
  }
  const value = Buffer.alloc(64, 'v');
  const others: Buffer[] = [];
  for (let i = 0; i < OTHER_KEYS; i++) {
    const key = Buffer.from(`bench:lock-load:${i}`);
    if (keep(key)) others.push(command('PING'), command('GET', key), command('SETEX', key, '60', value));
  }
  if (locks.length === 0 || others.length === 0) throw new Error('a shard was left without keys');
  return { locks, others };
}

/** Where each connection goes and what it sends: one port and every key, or a shard of a cluster and its keys. */
function destinations(options: LockLoadOptions): Array<{ port: number; requests: Requests }> {
  const blocks = options.blocks ?? 'lock';
  if (options.shards === undefined) return [{ port: options.port, requests: encodeRequests(blocks) }];
  return options.shards.map((shard) => ({
    port: shard.port,
    requests: encodeRequests(blocks, (key) => servesSlot(shard, keySlot(key))),
  }));
}

/** Totals shared by all connections of this process. */
interface Totals {
  requests: number;
  locks: number;
  running: boolean;
  /** Latencies are recorded (the timed part). */
  timing: boolean;
  latency: Histogram;
}

/** Latencies in 1 µs buckets up to a second, the rest in the last: nothing allocated per request. */
class Histogram {
  private readonly counts = new Uint32Array(1_000_001);
  private total = 0;

  add(micros: number): void {
    const bucket = micros < 1_000_000 ? Math.floor(micros) : 1_000_000;
    this.counts[bucket]++;
    this.total++;
  }

  /** Nearest-rank percentile, as the upper bound of its bucket (µs). */
  percentile(p: number): number {
    const rank = Math.max(1, Math.ceil((p / 100) * this.total));
    let seen = 0;
    for (let bucket = 0; bucket < this.counts.length; bucket++) {
      seen += this.counts[bucket];
      if (seen >= rank) return bucket + 1;
    }
    return Number.NaN;
  }
}

/**
 * One pooled connection: a ring of the reply counts it is waiting for, a
 * position in the 1-in-5 schedule, and its own generator for lock ids.
 */
class Connection {
  private readonly counter = new ReplyCounter();
  /** Replies expected per request in flight, oldest first. */
  private readonly expected: Uint8Array;
  /** When each request in flight was written (performance.now(), ms), in the same ring. */
  private readonly sentAt: Float64Array;
  private head = 0;
  private inFlight = 0;
  /** Replies still missing for the oldest request. */
  private missing = 0;
  private slot: number;
  private other: number;
  private seed: number;

  constructor(
    private readonly socket: net.Socket,
    private readonly requests: Requests,
    private readonly depth: number,
    private readonly totals: Totals,
    index: number,
  ) {
    this.expected = new Uint8Array(depth);
    this.sentAt = new Float64Array(depth);
    // Offsets so the 50 connections do not all send their lock block at once.
    this.slot = index % 5;
    this.other = (index * 7) % requests.others.length;
    this.seed = (index + 1) * 2_654_435_761;
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
  }

  get errors(): number {
    return this.counter.errors;
  }

  get idle(): boolean {
    return this.inFlight === 0;
  }

  start(): void {
    this.socket.cork();
    while (this.inFlight < this.depth) this.send();
    this.socket.uncork();
  }

  private send(): void {
    let replies = 1;
    if (this.slot === 0) {
      // xorshift32: a cheap, allocation-free pick from the id pool.
      let x = this.seed;
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      this.seed = x >>> 0;
      this.socket.write(this.requests.locks[this.seed % this.requests.locks.length]);
      replies = 4;
    } else {
      this.socket.write(this.requests.others[this.other]);
      this.other = (this.other + 1) % this.requests.others.length;
    }
    this.slot = (this.slot + 1) % 5;
    const at = (this.head + this.inFlight) % this.depth;
    this.expected[at] = replies;
    this.sentAt[at] = performance.now();
    if (this.inFlight === 0) this.missing = replies;
    this.inFlight++;
  }

  private onData(chunk: Buffer): void {
    let replies = this.counter.feed(chunk);
    // Replies of several requests may arrive together: answer them all with one write.
    this.socket.cork();
    while (replies > 0) {
      const take = Math.min(replies, this.missing);
      replies -= take;
      this.missing -= take;
      if (this.missing > 0) break;
      const done = this.expected[this.head];
      const totals = this.totals;
      totals.requests++;
      if (done === 4) totals.locks++;
      if (totals.timing) totals.latency.add((performance.now() - this.sentAt[this.head]) * 1_000);
      this.head = (this.head + 1) % this.depth;
      this.inFlight--;
      if (this.totals.running) this.send();
      this.missing = this.inFlight > 0 ? this.expected[this.head] : 0;
    }
    this.socket.uncork();
    if (replies > 0) throw new Error(`${replies} replies nobody asked for`);
  }
}

/** Worker side: the load itself. */
async function lockLoad(options: LockLoadOptions): Promise<LockLoadResult> {
  const to = destinations(options);
  const destination = (i: number) => to[i % to.length];
  const totals: Totals = { requests: 0, locks: 0, running: true, timing: false, latency: new Histogram() };
  const sockets = await Promise.all(Array.from({ length: options.connections }, (_, i) => connect(destination(i).port)));
  let failure: Error | null = null;
  for (const socket of sockets) {
    socket.on('error', (error) => {
      failure ??= error;
    });
    socket.on('close', () => {
      if (totals.running) failure ??= new Error('a connection closed during the load');
    });
  }
  const connections = sockets.map((socket, i) => new Connection(socket, destination(i).requests, options.depth, totals, i));
  for (const connection of connections) connection.start();

  await sleep(options.warmupMs);
  const startRequests = totals.requests;
  const startLocks = totals.locks;
  const t0 = process.hrtime.bigint();
  totals.timing = true;
  await sleep(options.durationMs);
  totals.timing = false;
  const requests = totals.requests - startRequests;
  const locks = totals.locks - startLocks;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  totals.running = false;

  // Let what is in flight come back, so the target is quiet for the next run.
  const deadline = Date.now() + DRAIN_TIMEOUT_MS;
  while (connections.some((c) => !c.idle) && Date.now() < deadline && failure === null) await sleep(10);
  for (const socket of sockets) socket.destroy();
  if (failure !== null) throw failure;
  if (requests === 0) throw new Error('no request completed');

  return {
    rps: requests / seconds,
    locksPerSecond: locks / seconds,
    requests,
    seconds,
    errors: connections.reduce((sum, c) => sum + c.errors, 0),
    latency: { p50: totals.latency.percentile(50), p99: totals.latency.percentile(99), p999: totals.latency.percentile(99.9) },
  };
}

if (isMain(import.meta.url)) workerMain(lockLoad);
