/**
 * The clients of the reply fuzzer (test/e2e/reply-fuzz.test.ts), both through the proxy:
 * - fuzz cases: one connection each, lock blocks on the shipped rules' keys (whole, pipelined,
 *   with other commands queued in between, split at random bytes), HELLO 3 and plain commands.
 *   Whatever comes back (errors, garbage, a close) is fine: they only need the proxy to read them.
 * - bystanders: connections kept open for the whole run, relayed by the stand-in upstream to a
 *   real Redis, whose every reply is known in advance from keys of their own and checked byte for
 *   byte. One wrong byte, or a close, is the failure the fuzzer looks for.
 */
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { cmd } from './resp.js';
import { Rng } from './reply-fuzz-replies.js';
import { attemptReplies, lockAttempt, queueLockKey, taskLockKey } from './stalwart.js';

const HOST = '127.0.0.1';

/** A lock block on a key some rule names: few keys, so that blocks meet on the same ones. */
function ruleKey(r: Rng): { key: Buffer; seconds: number } {
  return r.chance(0.7)
    ? { key: taskLockKey(BigInt(r.int(8))), seconds: 3600 }
    : { key: queueLockKey(BigInt(r.int(4)), 'default'), seconds: 600 };
}

/** One batch of a fuzz case: 1-4 items, a lock block most often. */
function fuzzBatch(r: Rng, first: Buffer | null): Buffer {
  const parts: Buffer[] = first === null ? [] : [first];
  for (let items = 1 + r.int(4); items > 0; items--) {
    const { key, seconds } = ruleKey(r);
    const x = r.next();
    if (x < 0.45) parts.push(lockAttempt(key, seconds));
    else if (x < 0.55) {
      // Other commands queued in the same transaction: before the pair, or between its two.
      const other = r.pick([cmd('GET', 'big'), cmd('SET', 'k', 'v'), cmd('PING')]);
      const pair = [cmd('INCRBY', key, '1'), cmd('EXPIRE', key, String(seconds))];
      pair.splice(r.int(3), 0, other);
      parts.push(cmd('MULTI'), ...pair, cmd('EXEC'));
    } else if (x < 0.62) {
      // Two lock pairs in one transaction: EXEC's array has two expiries to restore.
      const second = ruleKey(r);
      parts.push(cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, String(seconds)));
      parts.push(cmd('INCRBY', second.key, '1'), cmd('EXPIRE', second.key, String(second.seconds)), cmd('EXEC'));
    } else if (x < 0.72) parts.push(cmd('HELLO', r.chance(0.8) ? '3' : '2'));
    else if (x < 0.75) parts.push(cmd('RESET'));
    else
      parts.push(
        r.pick([
          cmd('PING'),
          cmd('GET', 'big'),
          cmd('SET', 'k', 'v'),
          cmd('INCRBY', 'n', '5'),
          cmd('EXPIRE', key, '3600'),
          cmd('ECHO', 'x'),
        ]),
      );
  }
  return Buffer.concat(parts);
}

/** Writes `bytes` whole, or (a third of the time) cut at random bytes with small pauses between. */
async function sendMaybeSplit(socket: net.Socket, bytes: Buffer, r: Rng): Promise<void> {
  if (!r.chance(0.33) || bytes.length < 2) {
    socket.write(bytes);
    return;
  }
  const cuts = Array.from({ length: 1 + r.int(5) }, () => 1 + r.int(bytes.length - 1)).sort((a, b) => a - b);
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    if (cut <= from) continue;
    if (socket.destroyed) return;
    socket.write(bytes.subarray(from, cut));
    from = cut;
    // Longer than --hold-ms now and then: a held lock block waits and then goes on as it is.
    if (cut < bytes.length) await sleep(r.chance(0.1) ? 15 : r.int(3));
  }
}

/**
 * One fuzz case: a connection through the proxy, 1-3 batches, each followed by a short wait for
 * the replies (until the close, a quiet moment after some bytes, or a bound), then a close.
 * Nothing it gets back is checked.
 */
export async function fuzzCase(port: number, n: number, r: Rng): Promise<void> {
  const socket = net.connect({ host: HOST, port });
  socket.setNoDelay(true);
  socket.on('error', () => {});
  let closed = false;
  let lastBytes = 0;
  let wake: (() => void) | undefined;
  socket.on('data', () => {
    lastBytes = performance.now();
    wake?.();
  });
  socket.on('close', () => {
    closed = true;
    wake?.();
  });
  const change = (ms: number) =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, ms);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  await new Promise<void>((resolve) => {
    socket.once('connect', resolve);
    socket.once('close', resolve);
  });
  try {
    for (let round = 0, rounds = 1 + r.int(3); round < rounds && !closed; round++) {
      // The first command names the case: the stand-in seeds its replies from it.
      await sendMaybeSplit(socket, fuzzBatch(r, round === 0 ? cmd('CLIENT', 'SETNAME', `fuzz-${n}`) : null), r);
      const sent = performance.now();
      const bound = sent + 300 + r.int(300);
      while (!closed && performance.now() < bound) {
        if (lastBytes > sent && performance.now() - lastBytes > 25) break;
        await change(10);
      }
    }
    if (!closed && r.chance(0.3)) {
      // Now and then a polite end, so that the proxy's closing path with replies due runs too.
      socket.end();
      await change(100);
    }
  } finally {
    socket.destroy();
  }
}

/** Exactly what the bystander sends in one round, and exactly what Redis answers to it. */
interface Round {
  request: Buffer;
  expected: Buffer;
}

const OK = Buffer.from('+OK\r\n');
const QUEUED = Buffer.from('+QUEUED\r\n');
const integer = (n: number): Buffer => Buffer.from(`:${n}\r\n`);
const bulk = (value: Buffer | undefined): Buffer =>
  value === undefined ? Buffer.from('$-1\r\n') : Buffer.concat([Buffer.from(`$${value.length}\r\n`), value, Buffer.from('\r\n')]);

/**
 * A bystander: one connection through the proxy for the whole run, running a workload on keys of
 * its own whose replies it knows exactly (a model of its keys), pipelined, sometimes split.
 */
export class Bystander {
  /** What its keys hold: GET's exact reply. */
  private readonly values = new Map<string, Buffer>();
  private counter = 0;
  private lockCounter = 0;
  private readonly lockKey: Buffer;
  private received: Buffer[] = [];
  private receivedBytes = 0;
  private closed = false;
  private wake: (() => void) | undefined;
  rounds = 0;
  bytesChecked = 0;

  private constructor(
    readonly name: string,
    private readonly socket: net.Socket,
    private readonly r: Rng,
    id: number,
    private readonly lockBlocks: boolean,
  ) {
    this.lockKey = taskLockKey(0xb0000000n + BigInt(id));
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => {
      this.received.push(chunk);
      this.receivedBytes += chunk.length;
      this.wake?.();
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      this.closed = true;
      this.wake?.();
    });
  }

  /**
   * Connects through the proxy and names itself (the stand-in relays it to Redis from then on).
   * `lockBlocks`: its workload has lock blocks of its own (the server has EXPIRE ... NX).
   */
  static async open(port: number, id: number, r: Rng, timeoutMs: number, lockBlocks: boolean): Promise<Bystander> {
    const socket = net.connect({ host: HOST, port });
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    const bystander = new Bystander(`bystander-${id}`, socket, r, id, lockBlocks);
    socket.write(cmd('CLIENT', 'SETNAME', bystander.name));
    await bystander.expect(OK, timeoutMs);
    return bystander;
  }

  /** One pipelined round, its replies checked byte for byte; throws on any difference or a close. */
  async round(timeoutMs: number): Promise<void> {
    const round = this.plan();
    await sendMaybeSplit(this.socket, round.request, this.r);
    await this.expect(round.expected, timeoutMs);
    this.rounds++;
  }

  /** Nothing more came than was expected (a reply that is not its own would be). */
  async expectNothingMore(waitMs: number): Promise<void> {
    await sleep(waitMs);
    if (this.receivedBytes > 0)
      throw new Error(`${this.name}: ${this.receivedBytes} bytes nobody asked for: ${preview(Buffer.concat(this.received), 0)}`);
  }

  close(): void {
    this.socket.destroy();
  }

  private plan(): Round {
    const r = this.r;
    const request: Buffer[] = [];
    const expected: Buffer[] = [];
    const key = () => `${this.name}:${r.int(12)}`;
    for (let ops = 1 + r.int(6); ops > 0; ops--) {
      const x = r.next();
      if (x < 0.3) {
        const k = key();
        const value = this.value();
        request.push(cmd('SET', k, value));
        expected.push(OK);
        this.values.set(k, value);
      } else if (x < 0.55) {
        const k = key();
        request.push(cmd('GET', k));
        expected.push(bulk(this.values.get(k)));
      } else if (x < 0.7) {
        const delta = r.int(2001) - 1000;
        this.counter += delta;
        request.push(cmd('INCRBY', `${this.name}:counter`, String(delta)));
        expected.push(integer(this.counter));
      } else if (x < 0.85 || !this.lockBlocks) {
        const k = key();
        const value = this.value();
        const delta = 1 + r.int(9);
        this.counter += delta;
        request.push(cmd('MULTI'), cmd('SET', k, value), cmd('INCRBY', `${this.name}:counter`, String(delta)), cmd('GET', k), cmd('EXEC'));
        expected.push(OK, QUEUED, QUEUED, QUEUED, Buffer.from('*3\r\n'), OK, integer(this.counter), bulk(value));
        this.values.set(k, value);
      } else {
        // A lock block of its own: fixed by the proxy on the way (NX), its expiry answered as Redis
        // alone answers it. The path a fault on another connection must not disturb.
        this.lockCounter++;
        request.push(lockAttempt(this.lockKey, 3600));
        expected.push(Buffer.from(attemptReplies(this.lockCounter, 1)));
      }
    }
    return { request: Buffer.concat(request), expected: Buffer.concat(expected) };
  }

  /** A value of random size: mostly small, now and then up to 16 KiB, rarely up to 1 MiB. */
  private value(): Buffer {
    const r = this.r;
    const size = r.chance(0.03) ? r.int(1 << 20) : r.chance(0.2) ? r.int(16 << 10) : r.int(64);
    return r.bytes(size);
  }

  /** The next `expected.length` bytes are exactly `expected`. */
  private async expect(expected: Buffer, timeoutMs: number): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (this.receivedBytes < expected.length) {
      if (this.closed) throw new Error(`${this.name}: connection closed after ${this.receivedBytes} of ${expected.length} bytes expected`);
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`${this.name}: ${this.receivedBytes} of ${expected.length} bytes within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    const all = Buffer.concat(this.received);
    const got = all.subarray(0, expected.length);
    this.received = all.length > expected.length ? [all.subarray(expected.length)] : [];
    this.receivedBytes = all.length - expected.length;
    if (!got.equals(expected)) {
      let at = 0;
      while (got[at] === expected[at]) at++;
      throw new Error(`${this.name}: byte ${at} of ${expected.length} differs: expected ${preview(expected, at)}, got ${preview(got, at)}`);
    }
    this.bytesChecked += expected.length;
  }
}

/** The bytes around `at`, quoted, for failure messages. */
function preview(bytes: Buffer, at: number): string {
  const from = Math.max(0, at - 40);
  return `…${JSON.stringify(bytes.toString('latin1', from, Math.min(bytes.length, at + 80)))}… (offset ${from})`;
}
