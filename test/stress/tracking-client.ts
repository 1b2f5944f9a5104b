/**
 * A RESP3 client of the integrity stress: HELLO 3, then CLIENT TRACKING ON in its default mode
 * (Redis remembers the keys the client reads and tells it when they change), then its workload
 * (`resp3`: RESP3's nulls, and a mix that reads every kind of key it has before it writes them:
 * values, counters, its lock key). Invalidations come between replies and, from Redis 6.x, inside
 * EXEC's array, where a command of the transaction changed a key the client reads: all it
 * receives goes through a RESP3 frame walker (resp3-walker.ts) that takes every push out wherever
 * it is, the rest is checked byte for byte against the model as any client's, and each push must
 * invalidate only keys of the client's own (invalidations.ts).
 */
import { cmd } from '../support/resp.js';
import { StressClient, type ConnectionOptions, type Subscriber } from './client.js';
import { helloSegment } from './hello.js';
import { InvalidationCheck } from './invalidations.js';
import { PushWalker } from './resp3-walker.js';
import type { ClientWorkload } from './workload.js';

export class TrackingClient extends StressClient {
  /** The walker, with its figures: pushes taken out, how many nested, their bytes. */
  readonly pushes: PushWalker;

  constructor(
    workload: ClientWorkload,
    options: ConnectionOptions,
    subscriber: Subscriber | null,
    /** HELLO 3's reply on this server, its id apart (hello.ts). */
    private readonly helloTemplate: string,
  ) {
    super(workload, options, subscriber, `client ${workload.client} (RESP3, tracking)`);
    const check = new InvalidationCheck(workload.client, workload.ownKeys());
    this.pushes = new PushWalker({
      bytes: (bytes) => this.stream.take(bytes),
      push: (frame, offset) => {
        // The stream's offsets stay the connection's own, pushes counted.
        this.stream.skip(frame.length);
        const problem = check.problem(frame);
        return problem === null || this.stream.wrong(offset, problem);
      },
      malformed: (offset, why) => void this.stream.wrong(offset, why),
    });
  }

  override async run(deadline: number): Promise<void> {
    await this.write({
      kind: 'pipeline',
      bytes: Buffer.concat([cmd('HELLO', '3'), cmd('CLIENT', 'TRACKING', 'ON')]),
      segments: [
        helloSegment(this.helloTemplate),
        { kind: 'bytes', bytes: Buffer.from('+OK\r\n'), what: 'CLIENT TRACKING ON', endsReply: true },
      ],
    });
    await this.received();
    if (!this.stopped) await super.run(deadline);
  }

  protected override accept(chunk: Buffer): boolean {
    return this.pushes.take(chunk);
  }
}
