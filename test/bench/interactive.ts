/**
 * The lock block sent one command at a time: MULTI, INCRBY k 1, EXPIRE k 600,
 * EXEC, each only after the reply to the one before, as redis-cli or
 * Lettuce's sync API send a transaction (Stalwart writes the block at once:
 * lock-load.ts). A hop that waited for the rest of the block before passing
 * MULTI on would stall such a client at the step it waits in, so each step's
 * round trip is timed on its own.
 *
 * It runs on a lock key a shipped rule names (0x17 + a task id u64 BE, rule
 * stalwart-task-lock) and on a plain key, the two in turn. Before each
 * transaction, a PING on the same connection: every step can then be set
 * against a plain round trip through the same target, measured in the same
 * moment.
 *
 * One connection per target and one request in flight at any time, as in
 * latency.ts, but the targets take turns of TURN visits (a PING and a
 * transaction each), in a new shuffled order at each step, and each turn is
 * led in by one untimed visit. A hop that holds MULTI leaves the machine idle
 * for its --hold-ms, and the next few round trips read slower whichever
 * target they go to (rotated round trip by round trip, a proxy with
 * --lock-method script, which holds it, made every other target's MULTI read
 * 1.5-1.7x its PING at p50): turns keep one target's pauses out of another's
 * figures, and the lead-in takes the round trips right after another
 * target's turn. Within a turn, the PING and every step alike follow a round
 * trip on the same connection. Nearest-rank percentiles of
 * process.hrtime.bigint() times.
 *
 * Runs as its own process (worker.ts): `runInteractive()` spawns this file.
 */
import { Buffer } from 'node:buffer';
import process from 'node:process';
import { closeAll, onReplies, PING, shuffle, summarize, type LatencyResult } from './latency.js';
import { taskLockKey } from './lock-load.js';
import { command, connect, type Target, type TargetName } from './processes.js';
import { mulberry32 } from './random.js';
import { ReplyCounter } from './resp-counter.js';
import { isMain, runWorker, workerMain } from './worker.js';

export const STEPS = ['MULTI', 'INCRBY', 'EXPIRE', 'EXEC'] as const;
export type Step = (typeof STEPS)[number];
export const KEY_KINDS = ['lock', 'plain'] as const;
export type KeyKind = (typeof KEY_KINDS)[number];

export interface InteractiveOptions {
  targets: Target[];
  /** Untimed transactions per key and target first. */
  warmup: number;
  /** Timed transactions per key and target. */
  transactions: number;
}

/** Microseconds. `ping`: the PINGs before the transactions of both keys. */
export type InteractiveResult = { ping: LatencyResult } & Record<KeyKind, Record<Step, LatencyResult>>;

export type InteractiveResults = Partial<Record<TargetName, InteractiveResult>>;

export function runInteractive(options: InteractiveOptions): Promise<InteractiveResults> {
  return runWorker<InteractiveResults>(import.meta.url, options, 600_000);
}

const transaction = (key: Buffer): Buffer[] => [
  command('MULTI'),
  command('INCRBY', key, '1'),
  command('EXPIRE', key, '600'),
  command('EXEC'),
];

/** What one visit of a target sends, one request at a time: a PING, then the transaction. */
const VISITS: Record<KeyKind, Buffer[]> = {
  lock: [PING, ...transaction(taskLockKey(0x0002_0000_0000_0000n))],
  plain: [PING, ...transaction(Buffer.from('bench:interactive'))],
};
const VISIT_LENGTH = 1 + STEPS.length;
/** Timed visits per turn: even, so that both keys get as many. */
const TURN = 20;

type Samples = { ping: Float64Array } & Record<KeyKind, Float64Array[]>;

async function measure(options: InteractiveOptions): Promise<InteractiveResults> {
  const { targets, warmup, transactions } = options;
  const sockets = await Promise.all(targets.map((t) => connect(t.port)));
  const perStep = (): Float64Array[] => STEPS.map(() => new Float64Array(transactions));
  const samples: Samples[] = targets.map(() => ({ ping: new Float64Array(2 * transactions), lock: perStep(), plain: perStep() }));
  const counters = targets.map(() => new ReplyCounter());
  // Visits counted per target, lead-ins aside: even ones on the lock key, odd
  // ones on the plain key; the first 2 * warmup of them untimed.
  const untimed = 2 * warmup;
  const total = untimed + 2 * transactions;
  const visits = new Int32Array(targets.length);

  return new Promise<InteractiveResults>((resolve, reject) => {
    const random = mulberry32(0x5eed);
    /** The order of the current step; the target whose turn it is is order[k]. */
    const order = Int32Array.from(sockets.keys());
    let k = 0;
    let current = order[0];
    /** Round trips into the current turn: its first VISIT_LENGTH are the lead-in visit. */
    let roundTrip = 0;
    let t0 = 0n;
    const send = (): void => {
      // The lead-in visit is on the lock key.
      const visit = roundTrip < VISIT_LENGTH ? 0 : visits[current];
      t0 = process.hrtime.bigint();
      sockets[current].write(VISITS[KEY_KINDS[visit & 1]][roundTrip % VISIT_LENGTH]);
    };
    const finish = (): void => {
      const failed = closeAll(sockets, counters);
      if (failed) return reject(failed);
      const results: InteractiveResults = {};
      const perKind = (s: Float64Array[]) =>
        Object.fromEntries(STEPS.map((name, i) => [name, summarize(s[i])])) as Record<Step, LatencyResult>;
      targets.forEach((t, i) => {
        const s = samples[i];
        results[t.name] = { ping: summarize(s.ping), lock: perKind(s.lock), plain: perKind(s.plain) };
      });
      resolve(results);
    };
    onReplies(
      sockets,
      counters,
      targets,
      () => current,
      reject,
      (i, t1) => {
        const request = roundTrip % VISIT_LENGTH; // 0 the PING, then the transaction's
        const timed = visits[i] - untimed;
        if (roundTrip >= VISIT_LENGTH && timed >= 0) {
          const us = Number(t1 - t0) / 1_000;
          if (request === 0) samples[i].ping[timed] = us;
          else samples[i][KEY_KINDS[timed & 1]][request - 1][timed >> 1] = us;
        }
        roundTrip++;
        if (roundTrip > VISIT_LENGTH && request === VISIT_LENGTH - 1) visits[i]++;
        if (roundTrip === (1 + TURN) * VISIT_LENGTH || visits[i] === total) {
          roundTrip = 0;
          k++;
          if (k === sockets.length) {
            // Every target has as many visits, so all finish in the same step.
            if (visits[i] === total) return finish();
            k = 0;
            shuffle(order, random);
          }
        }
        current = order[k];
        send();
      },
    );
    send();
  });
}

if (isMain(import.meta.url)) workerMain(measure);
