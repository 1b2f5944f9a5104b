/**
 * What one client of the integrity stress sends, and the exact model of what Redis answers: its
 * own keys only (named with a hash tag of its own, so that in a cluster they share one node),
 * values of heavy-tailed sizes made of pattern records (pattern.ts), counters, transactions,
 * Stalwart lock blocks on a task key of its own, blocks of the same shape on counters no rule
 * names (held to their EXEC, then sent unchanged), and messages to the subscriber paired with it.
 *
 * A lock block arrives three ways: whole, within a pipeline (`lock`); cut at random bytes (inside
 * a count line, a command name, the key, the ttl, ...) into pieces written with pauses of up to
 * 20 ms between them, no reply awaited (`lock-split`, lock-pieces.ts); and one command at a time,
 * each written only once its reply came, as redis-cli or a synchronous client sends it
 * (`lock-interactive`). Each way, the four replies are Redis's own.
 *
 * Each batch is a run of writes (a pipeline of commands, a piece of a split block, a step of an
 * interactive one) and the segments their replies must be, byte for byte.
 *
 * A RESP3 client (`resp3`: HELLO 3 and CLIENT TRACKING ON on its connection, tracking-client.ts)
 * gets its nulls as `_`, and its mix also reads its counters, windowed counters and lock key, so
 * that Redis tracks every kind of key it has and the writes that follow, lock blocks and
 * transactions among them, send it invalidations (checked apart from the model: invalidations.ts).
 */
import type { Rng } from '../bench/random.js';
import { slotOf } from '../support/cluster.js';
import { cmd } from '../support/resp.js';
import { lockAttempt, taskLockKey } from '../support/stalwart.js';
import type { ExpectedStream, Segment } from './expected.js';
import { cutBlock } from './lock-pieces.js';
import type { ValueId } from './pattern.js';
import { valueBytes } from './pattern.js';

export interface WorkloadOptions {
  /** Largest value, in bytes. */
  readonly maxValueBytes: number;
  /** The subscriber paired with this client, and its channel: PUBLISH goes there. */
  readonly subscriber: { readonly channel: string; readonly stream: ExpectedStream } | null;
  /** The client speaks RESP3, with CLIENT TRACKING on. */
  readonly resp3?: boolean;
}

/**
 * One write of a batch, and the segments its bytes bring (expected before it is written: a reply
 * may come before the last byte is out, as Redis answers MULTI as soon as it has it).
 */
export type Write =
  /** Pipelined commands, written in the client's random split; their replies are awaited at the batch's end. */
  | { readonly kind: 'pipeline'; readonly bytes: Buffer; readonly segments: Segment[] }
  /** A piece of a split lock block, written as it is: `pauseMs` after the write before it (0: the next turn; null: at once). */
  | { readonly kind: 'piece'; readonly bytes: Buffer; readonly segments: Segment[]; readonly pauseMs: number | null }
  /** A command of an interactive lock block: written whole, then every reply expected so far awaited. */
  | { readonly kind: 'step'; readonly bytes: Buffer; readonly segments: Segment[] };

export interface Batch {
  readonly writes: Write[];
  readonly commands: number;
}

/** Keys of values and of counters per client. */
const KEYS = 8;
/** The lock's lease: long enough never to run out during a run. */
const LOCK_SECONDS = 3600;
/** A windowed counter's expiry, set again by every block: long enough never to run out during a run. */
const WINDOW_SECONDS = 86_400;

type Op =
  | 'set'
  | 'get'
  | 'getrange'
  | 'incrby'
  | 'del'
  | 'ping'
  | 'multi'
  | 'lock'
  | 'lock-split'
  | 'lock-interactive'
  | 'release'
  | 'window'
  | 'publish'
  | 'publish-burst'
  | 'get-lock'
  | 'get-counter';
type PipelinedOp = Exclude<Op, 'lock-split' | 'lock-interactive'>;
const OPS: ReadonlyArray<readonly [number, Op]> = [
  [22, 'set'],
  [28, 'get'],
  [5, 'getrange'],
  [9, 'incrby'],
  [4, 'del'],
  [4, 'ping'],
  [8, 'multi'],
  [10, 'lock'],
  // A split block takes its pauses (about 20 ms in all), an interactive one four round trips.
  [2, 'lock-split'],
  [3, 'lock-interactive'],
  [2, 'release'],
  [4, 'window'],
  [8, 'publish'],
];
/** A RESP3 client's mix: reads of its lock key and counters too, so that Redis tracks them. */
const RESP3_OPS: ReadonlyArray<readonly [number, Op]> = [...OPS, [4, 'get-lock'], [4, 'get-counter']];

/** The pause before each piece of a split lock block after the first, in ms (0: the next turn). */
function piecePause(rng: Rng): number {
  return rng.weighted<number>([
    [20, 0],
    [50, rng.int(1, 10)],
    [30, rng.int(11, 20)],
  ]);
}

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
  /** Each counter key exists (it was incremented once). */
  private readonly counted: boolean[] = new Array<boolean>(KEYS).fill(false);
  private lockCounter = 0;
  /** Each windowed counter's value now. */
  private readonly windows: number[] = new Array<number>(KEYS).fill(0);
  private messages = 0;
  /** What was sent, by kind (for the report). */
  readonly sent = new Map<Op, number>();
  /** A null reply: RESP3's, or RESP2's null bulk string. */
  private readonly nil: string;
  private readonly ops: ReadonlyArray<readonly [number, Op]>;

  constructor(
    readonly client: number,
    private readonly rng: Rng,
    private readonly options: WorkloadOptions,
  ) {
    this.tag = clientTag(client);
    this.lockKey = lockKeyFor(client);
    this.nil = options.resp3 === true ? '_\r\n' : '$-1\r\n';
    this.ops = options.resp3 === true ? RESP3_OPS : OPS;
    for (let key = 0; key < KEYS; key++) this.values.push({ client, key, version: 0, length: 0 });
  }

  /**
   * Messages to the paired subscriber, 8 to 48 of up to 256 KiB (12 MiB at most, within Redis's
   * output buffer limit for a subscriber), pipelined: published while the subscriber reads
   * nothing, they make a backlog larger than the sockets hold, longer than any read (client.ts).
   */
  publishBurst(): Batch {
    const frames: Buffer[] = [];
    const segments: Segment[] = [];
    const count = this.rng.int(8, 48);
    for (let i = 0; i < count; i++) this.publish(frames, segments, this.rng.int(1, 256 * 1024));
    this.sent.set('publish-burst', (this.sent.get('publish-burst') ?? 0) + 1);
    return { writes: [{ kind: 'pipeline', bytes: Buffer.concat(frames), segments }], commands: count };
  }

  /**
   * 1 to about 100 commands (most batches are short): pipelined, except that a split or an
   * interactive lock block ends the pipeline before it, and what follows it starts another.
   */
  nextBatch(): Batch {
    const rng = this.rng;
    const count = rng.weighted<number>([
      [40, 1],
      [30, rng.int(2, 8)],
      [20, rng.int(9, 32)],
      [10, rng.int(33, 100)],
    ]);
    const writes: Write[] = [];
    let frames: Buffer[] = [];
    let segments: Segment[] = [];
    const endPipeline = (): void => {
      if (frames.length > 0) writes.push({ kind: 'pipeline', bytes: Buffer.concat(frames), segments });
      frames = [];
      segments = [];
    };
    for (let i = 0; i < count; i++) {
      let op = rng.weighted(this.ops);
      if (op === 'publish' && this.options.subscriber === null) op = 'get';
      this.sent.set(op, (this.sent.get(op) ?? 0) + 1);
      if (op === 'lock-split' || op === 'lock-interactive') {
        endPipeline();
        writes.push(...(op === 'lock-split' ? this.splitLock() : this.interactiveLock()));
      } else this.add(op, frames, segments);
    }
    endPipeline();
    return { writes, commands: count };
  }

  private add(op: PipelinedOp, frames: Buffer[], segments: Segment[]): void {
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
        this.counted[k] = true;
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
        const attempt = this.lockAttempt('lock block');
        frames.push(attempt.bytes);
        segments.push(...line(attempt.replies.join(''), attempt.what));
        return;
      }
      case 'release':
        frames.push(cmd('DEL', this.lockKey));
        segments.push(...line(`:${this.lockCounter > 0 ? 1 : 0}\r\n`, `DEL lock ${this.lockKey.toString('hex')}`));
        this.lockCounter = 0;
        return;
      case 'window': {
        // A rate limit's shape: no rule names the key, so the block runs as sent and its expiry is set every time.
        const key = this.windowKey(k);
        this.windows[k]++;
        frames.push(lockAttempt(key, WINDOW_SECONDS));
        segments.push(
          ...line(`+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:${this.windows[k]}\r\n:1\r\n`, `counter block #${this.windows[k]} on ${key}`),
        );
        return;
      }
      case 'publish':
        return this.publish(frames, segments);
      case 'get-lock':
        frames.push(cmd('GET', this.lockKey));
        segments.push(...this.textBulk(this.lockCounter > 0 ? String(this.lockCounter) : null, `GET lock ${this.lockKey.toString('hex')}`));
        return;
      case 'get-counter': {
        const windowed = rng.chance(0.5);
        const key = windowed ? this.windowKey(k) : this.counterKey(k);
        const value = windowed ? (this.windows[k] > 0 ? String(this.windows[k]) : null) : this.counted[k] ? String(this.counters[k]) : null;
        frames.push(cmd('GET', key));
        segments.push(...this.textBulk(value, `GET ${key}`));
        return;
      }
    }
  }

  /** Every key the client may touch: its values, counters, windowed counters and lock key. */
  ownKeys(): Buffer[] {
    const keys = [this.lockKey];
    for (let k = 0; k < KEYS; k++) keys.push(...[this.valueKey(k), this.counterKey(k), this.windowKey(k)].map((key) => Buffer.from(key)));
    return keys;
  }

  /**
   * The next attempt on the client's lock key: its bytes, and its four replies. They are Redis's
   * own, whichever way the block arrives and whether or not the proxy fixed it: the increment's
   * counter (the key's attempts since it was last deleted), and `:1` from the expiry, which Redis
   * alone applies to the key the increment just made sure exists. (Through the proxy, NX leaves a
   * held lock's expiry alone, and EXEC's reply is given back as Redis alone gives it.)
   */
  private lockAttempt(form: string): { bytes: Buffer; replies: string[]; what: string } {
    this.lockCounter++;
    return {
      bytes: lockAttempt(this.lockKey, LOCK_SECONDS),
      replies: ['+OK\r\n', '+QUEUED\r\n', '+QUEUED\r\n', `*2\r\n:${this.lockCounter}\r\n:1\r\n`],
      what: `${form} #${this.lockCounter} on ${this.lockKey.toString('hex')}`,
    };
  }

  /**
   * A lock block cut at random bytes (lock-pieces.ts) into pieces written with pauses of up to
   * 20 ms between them, no reply awaited: every reply is expected before the first piece goes.
   */
  private splitLock(): Write[] {
    const attempt = this.lockAttempt('split lock block');
    const { pieces, places } = cutBlock(attempt.bytes, this.rng);
    const what = `${attempt.what}, cut ${places.join(', ')}`;
    const segments = STEPS.flatMap((step, i) => line(attempt.replies[i], `${step} of ${what}`));
    return pieces.map((bytes, i) =>
      i === 0 ? { kind: 'piece', bytes, segments, pauseMs: null } : { kind: 'piece', bytes, segments: [], pauseMs: piecePause(this.rng) },
    );
  }

  /** A lock block sent one command at a time, each once the reply to the one before came. */
  private interactiveLock(): Write[] {
    const attempt = this.lockAttempt('interactive lock block');
    const frames = [cmd('MULTI'), cmd('INCRBY', this.lockKey, '1'), cmd('EXPIRE', this.lockKey, String(LOCK_SECONDS)), cmd('EXEC')];
    if (!Buffer.concat(frames).equals(attempt.bytes)) throw new Error('the interactive block differs from the lock block');
    return frames.map((bytes, i) => ({ kind: 'step', bytes, segments: line(attempt.replies[i], `${STEPS[i]} of ${attempt.what}`) }));
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
        this.counted[k] = true;
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

  private publish(frames: Buffer[], segments: Segment[], length = Math.min(this.valueSize(), 16 * 1024)): void {
    const subscriber = this.options.subscriber as NonNullable<WorkloadOptions['subscriber']>;
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
    if (length < 0) return line(this.nil, what);
    if (length === 0) return line('$0\r\n\r\n', what);
    return [
      ...notEnding(line(`$${length}\r\n`, what)),
      { kind: 'value', id: this.values[k], from, length, what, endsReply: false },
      ...line('\r\n', what),
    ];
  }

  /** A bulk reply of `text` (null: a nil). */
  private textBulk(text: string | null, what: string): Segment[] {
    return line(text === null ? this.nil : `$${text.length}\r\n${text}\r\n`, what);
  }

  private valueKey(k: number): string {
    return `s:${this.tag}:v${k}`;
  }

  private counterKey(k: number): string {
    return `s:${this.tag}:n${k}`;
  }

  private windowKey(k: number): string {
    return `${this.tag}:window:${k}`;
  }
}

/** The commands of a lock block, in order. */
const STEPS = ['MULTI', 'INCRBY', 'EXPIRE', 'EXEC'] as const;

/** A whole reply of fixed bytes. */
function line(text: string, what: string): Segment[] {
  return [{ kind: 'bytes', bytes: Buffer.from(text, 'latin1'), what, endsReply: true }];
}

/** Segments that are part of a larger reply. */
function notEnding(segments: Segment[]): Segment[] {
  return segments.map((segment) => ({ ...segment, endsReply: false }));
}
