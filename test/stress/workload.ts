/**
 * What one client of the integrity stress sends, and the exact model of what Redis answers: its
 * own keys only (named with a hash tag of its own, so that in a cluster they share one node),
 * values of heavy-tailed sizes made of pattern records (pattern.ts), counters, transactions,
 * Stalwart lock blocks on a task key of its own, blocks of the same shape on counters no rule
 * names (held to their EXEC, then sent unchanged), and messages to the subscriber paired with it.
 * Each batch is a pipeline of commands and the segments its replies must be, byte for byte.
 */
import type { Rng } from '../bench/random.js';
import { slotOf } from '../support/cluster.js';
import { cmd } from '../support/resp.js';
import { lockAttempt, taskLockKey } from '../support/stalwart.js';
import type { ExpectedStream, Segment } from './expected.js';
import type { ValueId } from './pattern.js';
import { valueBytes } from './pattern.js';

export interface WorkloadOptions {
  /** Largest value, in bytes. */
  readonly maxValueBytes: number;
  /** Lock blocks are fixed (through the proxy, enforce): a contender's EXPIRE answers 0. */
  readonly lockFixed: boolean;
  /** The subscriber paired with this client, and its channel: PUBLISH goes there. */
  readonly subscriber: { readonly channel: string; readonly stream: ExpectedStream } | null;
}

export interface Batch {
  readonly bytes: Buffer;
  readonly commands: number;
  readonly segments: Segment[];
}

/** Keys of values and of counters per client. */
const KEYS = 8;
/** The lock's lease: long enough never to run out during a run. */
const LOCK_SECONDS = 3600;
/** A windowed counter's expiry, set again by every block: long enough never to run out during a run. */
const WINDOW_SECONDS = 86_400;

type Op = 'set' | 'get' | 'getrange' | 'incrby' | 'del' | 'ping' | 'multi' | 'lock' | 'release' | 'window' | 'publish';
const OPS: ReadonlyArray<readonly [number, Op]> = [
  [22, 'set'],
  [28, 'get'],
  [5, 'getrange'],
  [9, 'incrby'],
  [4, 'del'],
  [4, 'ping'],
  [8, 'multi'],
  [10, 'lock'],
  [2, 'release'],
  [4, 'window'],
  [8, 'publish'],
];

/** The client's hash tag: its keys, its lock key and its channel share the tag's slot. */
export function clientTag(client: number): string {
  return `{c${String(client).padStart(4, '0')}}`;
}

/** A Stalwart task lock key (0x17 + u64) whose slot is the tag's, found by trying ids from the client's number on. */
export function lockKeyFor(client: number): Buffer {
  const slot = slotOf(clientTag(client));
  for (let id = BigInt(client) << 32n; ; id++) {
    const key = taskLockKey(id);
    if (slotOf(key) === slot) return key;
  }
}

export class ClientWorkload {
  private readonly tag: string;
  private readonly lockKey: Buffer;
  /** Each value key's value now (null: no such key), and the versions used so far. */
  private readonly values: Array<ValueId & { length: number }> = [];
  private readonly present: boolean[] = new Array<boolean>(KEYS).fill(false);
  private nextVersion = 1;
  private readonly counters: bigint[] = new Array<bigint>(KEYS).fill(0n);
  private lockCounter = 0;
  /** Each windowed counter's value now. */
  private readonly windows: number[] = new Array<number>(KEYS).fill(0);
  private messages = 0;
  /** What was sent, by kind (for the report). */
  readonly sent = new Map<Op, number>();

  constructor(
    readonly client: number,
    private readonly rng: Rng,
    private readonly options: WorkloadOptions,
  ) {
    this.tag = clientTag(client);
    this.lockKey = lockKeyFor(client);
    for (let key = 0; key < KEYS; key++) this.values.push({ client, key, version: 0, length: 0 });
  }

  /** A pipeline of 1 to about 100 commands (most are short). */
  nextBatch(): Batch {
    const rng = this.rng;
    const count = rng.weighted<number>([
      [40, 1],
      [30, rng.int(2, 8)],
      [20, rng.int(9, 32)],
      [10, rng.int(33, 100)],
    ]);
    const frames: Buffer[] = [];
    const segments: Segment[] = [];
    for (let i = 0; i < count; i++) {
      let op = rng.weighted(OPS);
      if (op === 'publish' && this.options.subscriber === null) op = 'get';
      this.sent.set(op, (this.sent.get(op) ?? 0) + 1);
      this.add(op, frames, segments);
    }
    return { bytes: Buffer.concat(frames), commands: count, segments };
  }

  private add(op: Op, frames: Buffer[], segments: Segment[]): void {
    const rng = this.rng;
    const k = rng.int(0, KEYS - 1);
    switch (op) {
      case 'set': {
        const value = this.newValue(k);
        frames.push(cmd('SET', this.valueKey(k), valueBytes(value, 0, value.length)));
        segments.push(...line('+OK\r\n', `SET ${this.valueKey(k)} (${value.length} bytes)`));
        return;
      }
      case 'get':
        frames.push(cmd('GET', this.valueKey(k)));
        segments.push(...this.bulkOf(k, 0, this.present[k] ? this.values[k].length : -1, `GET ${this.valueKey(k)}`));
        return;
      case 'getrange': {
        const length = this.present[k] ? this.values[k].length : 0;
        const start = length === 0 ? 0 : rng.int(0, length - 1);
        const end = length === 0 ? rng.int(0, 100) : rng.int(start, length - 1);
        frames.push(cmd('GETRANGE', this.valueKey(k), String(start), String(end)));
        segments.push(...this.bulkOf(k, start, length === 0 ? 0 : end - start + 1, `GETRANGE ${this.valueKey(k)} ${start} ${end}`));
        return;
      }
      case 'incrby': {
        const by = BigInt(rng.int(-1000, 1000));
        this.counters[k] += by;
        frames.push(cmd('INCRBY', this.counterKey(k), String(by)));
        segments.push(...line(`:${this.counters[k]}\r\n`, `INCRBY ${this.counterKey(k)} ${by}`));
        return;
      }
      case 'del':
        frames.push(cmd('DEL', this.valueKey(k)));
        segments.push(...line(`:${this.present[k] ? 1 : 0}\r\n`, `DEL ${this.valueKey(k)}`));
        this.present[k] = false;
        return;
      case 'ping': {
        const payload = `ping-${this.client}-${rng.int(0, 1e9)}`;
        frames.push(cmd('PING', payload));
        segments.push(...line(`$${payload.length}\r\n${payload}\r\n`, `PING ${payload}`));
        return;
      }
      case 'multi':
        return this.transaction(frames, segments);
      case 'lock': {
        this.lockCounter++;
        const applied = !this.options.lockFixed || this.lockCounter === 1 ? 1 : 0;
        frames.push(lockAttempt(this.lockKey, LOCK_SECONDS));
        const what = `lock block #${this.lockCounter} on ${this.lockKey.toString('hex')}`;
        segments.push(...line(`+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:${this.lockCounter}\r\n:${applied}\r\n`, what));
        return;
      }
      case 'release':
        frames.push(cmd('DEL', this.lockKey));
        segments.push(...line(`:${this.lockCounter > 0 ? 1 : 0}\r\n`, `DEL lock ${this.lockKey.toString('hex')}`));
        this.lockCounter = 0;
        return;
      case 'window': {
        // A rate limit's shape: no rule names the key, so the block runs as sent and its expiry is set every time.
        const key = `${this.tag}:window:${k}`;
        this.windows[k]++;
        frames.push(lockAttempt(key, WINDOW_SECONDS));
        segments.push(
          ...line(`+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:${this.windows[k]}\r\n:1\r\n`, `counter block #${this.windows[k]} on ${key}`),
        );
        return;
      }
      case 'publish':
        return this.publish(frames, segments);
    }
  }

  /** MULTI, 1 to 4 commands, EXEC: each queued, then EXEC's array of their replies. */
  private transaction(frames: Buffer[], segments: Segment[]): void {
    const rng = this.rng;
    const n = rng.int(1, 4);
    frames.push(cmd('MULTI'));
    const inside: Segment[] = [];
    let queued = '+OK\r\n';
    for (let i = 0; i < n; i++) {
      const k = rng.int(0, KEYS - 1);
      queued += '+QUEUED\r\n';
      const kind = rng.pick(['set', 'incrby', 'get'] as const);
      if (kind === 'set') {
        const value = this.newValue(k, 4096);
        frames.push(cmd('SET', this.valueKey(k), valueBytes(value, 0, value.length)));
        inside.push(...line('+OK\r\n', `SET ${this.valueKey(k)} in MULTI`));
      } else if (kind === 'incrby') {
        this.counters[k] += 1n;
        frames.push(cmd('INCRBY', this.counterKey(k), '1'));
        inside.push(...line(`:${this.counters[k]}\r\n`, `INCRBY ${this.counterKey(k)} in MULTI`));
      } else {
        frames.push(cmd('GET', this.valueKey(k)));
        inside.push(...this.bulkOf(k, 0, this.present[k] ? this.values[k].length : -1, `GET ${this.valueKey(k)} in MULTI`));
      }
    }
    frames.push(cmd('EXEC'));
    segments.push(...line(queued, 'MULTI and its queued commands'), ...notEnding(line(`*${n}\r\n`, 'EXEC')), ...inside);
  }

  private publish(frames: Buffer[], segments: Segment[]): void {
    const subscriber = this.options.subscriber as NonNullable<WorkloadOptions['subscriber']>;
    const length = Math.min(this.valueSize(), 16 * 1024);
    const id: ValueId = { client: this.client, key: 9000 + (this.messages % 1000), version: ++this.messages };
    frames.push(cmd('PUBLISH', subscriber.channel, valueBytes(id, 0, length)));
    segments.push(...line(':1\r\n', `PUBLISH ${subscriber.channel} #${this.messages}`));
    // The message is expected before the PUBLISH is even written: it cannot arrive earlier.
    const what = `message #${this.messages} on ${subscriber.channel}`;
    subscriber.stream.expect(
      ...notEnding(line(`*3\r\n$7\r\nmessage\r\n$${subscriber.channel.length}\r\n${subscriber.channel}\r\n$${length}\r\n`, what)),
      { kind: 'value', id, from: 0, length, what, endsReply: false },
      ...line('\r\n', what),
    );
  }

  /** A new version of key `k`'s value (at most `max` bytes). */
  private newValue(k: number, max = this.options.maxValueBytes): ValueId & { length: number } {
    const value = { client: this.client, key: k, version: this.nextVersion++, length: Math.min(this.valueSize(), max) };
    this.values[k] = value;
    this.present[k] = true;
    return value;
  }

  /** A heavy-tailed size: mostly tens of bytes, now and then megabytes. */
  private valueSize(): number {
    const rng = this.rng;
    const [low, high] = rng.weighted<readonly [number, number]>([
      [60, [0, 64]],
      [25, [64, 4096]],
      [10, [4096, 65_536]],
      [4, [65_536, 1024 * 1024]],
      [1, [1024 * 1024, this.options.maxValueBytes]],
    ]);
    const top = Math.max(low, Math.min(high, this.options.maxValueBytes));
    // Log-uniform within the band.
    return Math.round(Math.exp(Math.log(low + 1) + (rng.int(0, 1_000_000) / 1_000_000) * (Math.log(top + 1) - Math.log(low + 1))) - 1);
  }

  /** A bulk reply of `length` bytes of key `k`'s value from `from` (-1: a nil). */
  private bulkOf(k: number, from: number, length: number, what: string): Segment[] {
    if (length < 0) return line('$-1\r\n', what);
    if (length === 0) return line('$0\r\n\r\n', what);
    return [
      ...notEnding(line(`$${length}\r\n`, what)),
      { kind: 'value', id: this.values[k], from, length, what, endsReply: false },
      ...line('\r\n', what),
    ];
  }

  private valueKey(k: number): string {
    return `s:${this.tag}:v${k}`;
  }

  private counterKey(k: number): string {
    return `s:${this.tag}:n${k}`;
  }
}

/** A whole reply of fixed bytes. */
function line(text: string, what: string): Segment[] {
  return [{ kind: 'bytes', bytes: Buffer.from(text, 'latin1'), what, endsReply: true }];
}

/** Segments that are part of a larger reply. */
function notEnding(segments: Segment[]): Segment[] {
  return segments.map((segment) => ({ ...segment, endsReply: false }));
}
