/**
 * One connection of the integrity stress: it writes its workload's batches, pipelines in random
 * splits (whole, in pieces, down to one byte a write), the pieces of a split lock block each as
 * it is after its pause, the commands of an interactive lock block each once the replies before
 * it came; checks every byte it receives against what the batch must bring (expected.ts); and,
 * if it is a slow reader, stops reading now and then. A subscriber connection mostly reads: the
 * messages its paired client publishes. Now and then, between two of that client's batches, it
 * stops reading while the client publishes a burst of large messages, then sends RESET and
 * SUBSCRIBE again and reads on: a RESET in a plain pipe behind a backlog that the proxy's reads
 * from Redis, paused for the subscriber, leave at any byte of a message.
 */
import net from 'node:net';
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises';
import type { Rng } from '../bench/random.js';
import { cmd } from '../support/resp.js';
import { ExpectedStream, type Mismatch } from './expected.js';
import type { ClientWorkload, Write } from './workload.js';

export interface Endpoint {
  readonly host: string;
  readonly port: number;
}

export interface ConnectionOptions {
  readonly endpoint: Endpoint;
  readonly rng: Rng;
  /** Stops reading now and then, for a few to a hundred milliseconds. */
  readonly slow: boolean;
  /** No byte for this long while bytes are expected: the connection is reported stalled. */
  readonly stallMs: number;
}

/** How often, after one of its client's batches, a subscriber sends RESET and subscribes again. */
const RESUBSCRIBE_CHANCE = 0.02;

/** The bytes of a batch up to this size may be written one byte a write (larger ones start so). */
const BYTEWISE_LIMIT = 2048;

/** A connection that checks what it receives. */
class CheckedConnection {
  readonly stream: ExpectedStream;
  private socket: net.Socket | null = null;
  private wake: (() => void) | null = null;
  /** Not reading until told (a subscriber's backlog): the slow reader's pauses do not end it. */
  protected held = false;
  private ended = '';
  private lastProgress = Date.now();

  constructor(
    name: string,
    protected readonly options: ConnectionOptions,
  ) {
    this.stream = new ExpectedStream(name);
  }

  get failure(): Mismatch | null {
    return this.stream.failure;
  }

  async open(): Promise<void> {
    const socket = net.connect(this.options.endpoint.port, this.options.endpoint.host);
    socket.setNoDelay(true);
    this.socket = socket;
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', (error) => this.end(`connection error: ${error.message}`));
    socket.on('close', () => this.end('connection closed'));
  }

  protected get writer(): net.Socket {
    return this.socket as net.Socket;
  }

  /** Writes `bytes` as the rng decides: whole, in pieces, or (the start of) one byte a write. */
  protected async writeSplit(bytes: Buffer): Promise<void> {
    const rng = this.options.rng;
    const style = rng.weighted<'whole' | 'pieces' | 'small' | 'bytewise'>([
      [50, 'whole'],
      [30, 'pieces'],
      [15, 'small'],
      [5, 'bytewise'],
    ]);
    let pos = 0;
    while (pos < bytes.length && this.failure === null && this.ended === '') {
      let size: number;
      if (style === 'whole') size = bytes.length;
      else if (style === 'pieces') size = rng.int(1, Math.max(1, Math.ceil(bytes.length / 4)));
      else if (pos >= BYTEWISE_LIMIT)
        size = bytes.length - pos; // only the start goes slowly
      else size = style === 'small' ? rng.int(1, 16) : 1;
      const piece = bytes.subarray(pos, Math.min(bytes.length, pos + size));
      pos += piece.length;
      if (!this.writer.write(piece)) await new Promise((resolve) => this.writer.once('drain', resolve));
      if (pos < bytes.length) {
        if (rng.chance(0.05)) await sleep(rng.int(0, 3));
        else await nextTurn();
      }
    }
  }

  /** Writes `bytes` in one write, after `pauseMs` (0: the next turn; null: at once). */
  protected async writeWhole(bytes: Buffer, pauseMs: number | null = null): Promise<void> {
    if (pauseMs !== null) await (pauseMs > 0 ? sleep(pauseMs) : nextTurn());
    if (this.failure !== null || this.ended !== '') return;
    if (!this.writer.write(bytes)) await new Promise((resolve) => this.writer.once('drain', resolve));
  }

  /** Whether the check failed or the connection ended. */
  protected get stopped(): boolean {
    return this.failure !== null || this.ended !== '';
  }

  /** Resolves once nothing more is expected, the check failed, or the connection stalled or ended. */
  protected async received(): Promise<void> {
    this.lastProgress = Date.now();
    while (this.stream.pending && this.failure === null) {
      if (this.ended !== '') {
        this.stream.incomplete(this.ended);
        return;
      }
      if (Date.now() - this.lastProgress > this.options.stallMs) {
        this.stream.incomplete(`nothing received for ${this.options.stallMs} ms`);
        return;
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 1000);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wake = null;
    }
  }

  close(): void {
    this.socket?.removeAllListeners('close');
    this.socket?.destroy();
  }

  /** Checks bytes the connection received; false once they are wrong. (A RESP3 client takes its pushes out first.) */
  protected accept(chunk: Buffer): boolean {
    return this.stream.take(chunk);
  }

  private onData(chunk: Buffer): void {
    this.lastProgress = Date.now();
    if (!this.accept(chunk)) this.socket?.destroy();
    if (this.options.slow && this.options.rng.chance(0.2)) {
      const socket = this.socket as net.Socket;
      socket.pause();
      setTimeout(() => this.held || socket.resume(), this.options.rng.int(5, 100));
    }
    if (!this.stream.pending || this.failure !== null) this.wake?.();
  }

  private end(why: string): void {
    if (this.ended === '') this.ended = why;
    this.wake?.();
  }
}

/** A client running its workload until `deadline` (ms since the epoch). */
export class StressClient extends CheckedConnection {
  batches = 0;
  /** How often the paired subscriber sent RESET and subscribed again. */
  resubscribes = 0;

  constructor(
    readonly workload: ClientWorkload,
    options: ConnectionOptions,
    /** The paired subscriber, if any. */
    private readonly subscriber: Subscriber | null = null,
    name = `client ${workload.client}`,
  ) {
    super(name, options);
  }

  async run(deadline: number): Promise<void> {
    while (Date.now() < deadline && this.failure === null) {
      const batch = this.workload.nextBatch();
      for (const write of batch.writes) {
        if (this.stopped) break;
        await this.write(write);
      }
      await this.received();
      this.batches++;
      // Every message published so far is Redis's to deliver (each PUBLISH was answered), and
      // none is published until the subscriber is back: none is lost to the RESET.
      if (this.subscriber !== null && !this.stopped && this.options.rng.chance(RESUBSCRIBE_CHANCE)) {
        this.subscriber.hold();
        for (const write of this.workload.publishBurst().writes) if (!this.stopped) await this.write(write);
        await this.received();
        await this.subscriber.resubscribe();
        this.resubscribes++;
      }
    }
  }

  /** One write of a batch, its replies expected first (they may come before its last byte is out). */
  protected async write(write: Write): Promise<void> {
    this.stream.expect(...write.segments);
    switch (write.kind) {
      case 'pipeline':
        return this.writeSplit(write.bytes);
      case 'piece':
        return this.writeWhole(write.bytes, write.pauseMs);
      case 'step':
        await this.writeWhole(write.bytes);
        return this.received();
    }
  }
}

/** The subscriber paired with a client: it checks every message that client publishes. */
export class Subscriber extends CheckedConnection {
  constructor(
    readonly channel: string,
    index: number,
    options: ConnectionOptions,
  ) {
    super(`subscriber ${index} (${channel})`, options);
  }

  /** Subscribes, and resolves once Redis confirmed it. */
  async subscribe(): Promise<void> {
    this.stream.expect({ kind: 'bytes', bytes: this.confirmation(), what: `SUBSCRIBE ${this.channel}`, endsReply: true });
    await this.writeSplit(cmd('SUBSCRIBE', this.channel));
    await this.received();
  }

  /**
   * RESET, then SUBSCRIBE again (written as the rng splits them), with any backlog still to come
   * before RESET's reply; resolves once Redis confirmed the new subscription.
   */
  async resubscribe(): Promise<void> {
    if (!this.stopped) {
      this.stream.expect(
        { kind: 'bytes', bytes: Buffer.from('+RESET\r\n'), what: `RESET on ${this.channel}`, endsReply: true },
        { kind: 'bytes', bytes: this.confirmation(), what: `SUBSCRIBE ${this.channel} after RESET`, endsReply: true },
      );
      await this.writeSplit(Buffer.concat([cmd('RESET'), cmd('SUBSCRIBE', this.channel)]));
    }
    this.held = false;
    this.writer.resume();
    await this.received();
  }

  /** Stops reading until resubscribe(). */
  hold(): void {
    this.held = true;
    this.writer.pause();
  }

  private confirmation(): Buffer {
    return Buffer.from(`*3\r\n$9\r\nsubscribe\r\n$${this.channel.length}\r\n${this.channel}\r\n:1\r\n`);
  }

  /** Resolves once every message published so far has arrived (or the check failed). */
  async drained(): Promise<void> {
    await this.received();
  }
}
