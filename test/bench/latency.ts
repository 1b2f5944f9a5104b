/**
 * Round-trip latency at pipeline 1: what a single request costs when nothing
 * else is queued, i.e. what the proxy adds per hop.
 *
 * One connection per target, and the round trips rotate over the targets
 * with only one request in flight at any time: a hiccup of the machine then
 * lands on every target alike instead of on whichever target happened to be
 * measured at the time, which matters for p99 on a small shared machine.
 * Each step visits the targets in a new shuffled order (a fixed seed, so
 * runs repeat), so that every target follows every other one equally often:
 * a round trip right after one to Redis itself, say, reads several µs slower
 * at p50 on a 2-core machine, and no target may always sit in that slot (a
 * fixed order, even one started at another target each step, puts the same
 * target after Redis nearly every time).
 *
 * Requests alternate PING and GET of a small value (stored by the warm-up
 * SET), each sent from the previous reply's handler as a client library
 * would. Times come from process.hrtime.bigint() into typed arrays;
 * percentiles are nearest-rank.
 *
 * Runs as its own process (worker.ts): `runLatency()` spawns this file.
 */
import { Buffer } from 'node:buffer';
import type { Socket } from 'node:net';
import process from 'node:process';
import { connect, type Target, type TargetName } from './processes.js';
import { mulberry32 } from './random.js';
import { ReplyCounter } from './resp-counter.js';
import { isMain, runWorker, workerMain } from './worker.js';

export interface LatencyOptions {
  targets: Target[];
  /** Untimed round trips per target first. */
  warmup: number;
  /** Timed round trips per target. */
  roundTrips: number;
}

/** Microseconds. */
export interface LatencyResult {
  p50: number;
  p99: number;
  p999: number;
  mean: number;
  min: number;
  max: number;
  roundTrips: number;
}

export type LatencyResults = Partial<Record<TargetName, LatencyResult>>;

export function runLatency(options: LatencyOptions): Promise<LatencyResults> {
  return runWorker<LatencyResults>(import.meta.url, options, 300_000);
}

const KEY = 'bench:latency';
const SET = Buffer.from(`*3\r\n$3\r\nSET\r\n$${KEY.length}\r\n${KEY}\r\n$32\r\n${'x'.repeat(32)}\r\n`);
export const PING = Buffer.from('*1\r\n$4\r\nPING\r\n');
const REQUESTS = [PING, Buffer.from(`*2\r\n$3\r\nGET\r\n$${KEY.length}\r\n${KEY}\r\n`)];

/** Fisher-Yates, in place. */
export function shuffle(order: Int32Array, random: () => number): void {
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    const t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

/** Nearest-rank percentile of sorted samples. */
export function percentile(sorted: Float64Array, p: number): number {
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

/** Ends a measurement: destroys its sockets; an error if any reply was one. */
export function closeAll(sockets: readonly Socket[], counters: readonly ReplyCounter[]): Error | null {
  for (const socket of sockets) socket.destroy();
  const errors = counters.reduce((sum, c) => sum + c.errors, 0);
  return errors > 0 ? new Error(`${errors} error replies`) : null;
}

/**
 * With one request in flight per socket (a chunk then holds at most the one reply awaited):
 * `reply(i, t1)` when socket i has a whole reply, timed at its arrival; a reply from a socket
 * other than `current()`'s, or a socket error, rejects.
 */
export function onReplies(
  sockets: readonly Socket[],
  counters: readonly ReplyCounter[],
  targets: readonly Target[],
  current: () => number,
  reject: (error: Error) => void,
  reply: (i: number, t1: bigint) => void,
): void {
  sockets.forEach((socket, i) => {
    socket.on('data', (chunk: Buffer) => {
      if (counters[i].feed(chunk) === 0) return;
      const t1 = process.hrtime.bigint();
      if (i !== current()) return reject(new Error(`a reply from ${targets[i].name} nobody asked for`));
      reply(i, t1);
    });
    socket.on('error', reject);
  });
}

/** Sorts `samples` in place. */
export function summarize(samples: Float64Array): LatencyResult {
  samples.sort();
  let sum = 0;
  for (const s of samples) sum += s;
  return {
    p50: percentile(samples, 50),
    p99: percentile(samples, 99),
    p999: percentile(samples, 99.9),
    mean: sum / samples.length,
    min: samples[0],
    max: samples[samples.length - 1],
    roundTrips: samples.length,
  };
}

async function measure(options: LatencyOptions): Promise<LatencyResults> {
  const { targets, warmup, roundTrips } = options;
  const sockets = await Promise.all(targets.map((t) => connect(t.port)));
  const samples = targets.map(() => new Float64Array(roundTrips));
  const counters = targets.map(() => new ReplyCounter());
  // Step -1 is the SET that stores the GET's value; steps 0..warmup-1 warm
  // up; the rest are timed. Within a step, every target in turn.
  const steps = warmup + roundTrips;

  return new Promise<LatencyResults>((resolve, reject) => {
    let step = -1;
    const random = mulberry32(0x5eed);
    /** The order the current step visits the targets in; the target is order[k]. */
    const order = Int32Array.from(sockets.keys());
    let k = 0;
    let current = order[0];
    let t0 = 0n;
    const send = (): void => {
      t0 = process.hrtime.bigint();
      sockets[current].write(step < 0 ? SET : REQUESTS[step & 1]);
    };
    const finish = (): void => {
      const failed = closeAll(sockets, counters);
      if (failed) return reject(failed);
      const results: LatencyResults = {};
      targets.forEach((t, i) => (results[t.name] = summarize(samples[i])));
      resolve(results);
    };
    onReplies(
      sockets,
      counters,
      targets,
      () => current,
      reject,
      (i, t1) => {
        if (step >= warmup) samples[i][step - warmup] = Number(t1 - t0) / 1_000;
        k++;
        if (k === sockets.length) {
          k = 0;
          step++;
          shuffle(order, random);
        }
        if (step === steps) return finish();
        current = order[k];
        send();
      },
    );
    send();
  });
}

if (isMain(import.meta.url)) workerMain(measure);
