/**
 * The reply side of the reply fuzzer (test/e2e/reply-fuzz.test.ts): a seeded random source, and
 * what a stand-in upstream answers to each request on a fuzz connection. Mostly replies a server
 * could send for the command (so that the proxy gets deep into its own paths: lock blocks fixed,
 * EXEC's array taken aside and restored), and now and then one that is mis-framed, not RESP at all,
 * or the end of the connection. Nothing here is checked: only the proxy's survival, and what its
 * other connections see, are (the test).
 */

/** A small seeded generator (mulberry32): every case draws from its own, so a seed repeats a run's choices. */
export class Rng {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** A number in [0, 1). */
  next(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** An integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  chance(p: number): boolean {
    return this.next() < p;
  }

  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)];
  }

  /** `n` random bytes, four at a time: a 1 MiB value must stay cheap. */
  bytes(n: number): Buffer {
    const out = Buffer.alloc(n);
    let i = 0;
    for (; i + 4 <= n; i += 4) out.writeUInt32LE(Math.floor(this.next() * 4294967296), i);
    for (; i < n; i++) out[i] = this.int(256);
    return out;
  }
}

/** A seed for one stream of choices (`salt` tells the streams of the same case apart). */
export function streamSeed(seed: number, index: number, salt: number): number {
  let h = Math.imul(seed ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(index + 1, 0xc2b2ae35) ^ Math.imul(salt + 1, 0x27d4eb2f);
  h = Math.imul(h ^ (h >>> 16), 0x7feb352d);
  return (h ^ (h >>> 15)) >>> 0;
}

/** What the stand-in does next on a fuzz connection. */
export type Step =
  | { readonly kind: 'send'; readonly bytes: Buffer }
  | { readonly kind: 'pause'; readonly ms: number }
  | { readonly kind: 'close'; readonly reset: boolean };

/** Counts the test prints (shared by every fuzz connection of a run). */
export interface ReplyCounts {
  /** Replies planned, well-framed or not. */
  replies: number;
  /** Of them, the ones mis-framed (or a close in their place). */
  misframed: number;
}

const text = (s: string): Buffer => Buffer.from(s, 'latin1');
const WORDS = ['OK', 'QUEUED', 'PONG', 'hello', 'x', 'invalidate', 'message', 'redis', ''];

/**
 * The ways a reply goes wrong. `push-in-exec` is the one Redis 6 really sends (a tracking
 * invalidation in the middle of EXEC's array); the others no server sends, and each must cost at
 * most the connection it came on.
 */
const MISFRAMES = [
  'short-array',
  'extra-elements',
  'push-in-exec',
  'bulk-too-long',
  'bulk-too-short',
  'negative-count',
  'huge-count',
  'cut-then-close',
  'not-resp',
  'unknown-type',
  'bad-number',
  'lone-lf',
  'too-many',
  'too-few-then-close',
] as const;
export type Misframe = (typeof MISFRAMES)[number];

/**
 * Answers the requests of one fuzz connection, in order. It follows MULTI/EXEC so that EXEC gets an
 * array with an element for each queued command: the shape the proxy takes aside and restores
 * after a lock block, where a bad element or count does the most harm.
 */
export class ReplyPlanner {
  private inMulti = false;
  private queued: string[] = [];
  /** A close is planned: nothing more is answered. */
  private ended = false;

  constructor(
    private readonly r: Rng,
    private readonly misframeRate: number,
    private readonly counts: ReplyCounts,
  ) {}

  /** The steps answering one request (none once the connection is to end). */
  answer(args: readonly Buffer[]): Step[] {
    if (this.ended) return [];
    const name = (args[0]?.toString('latin1') ?? '').toUpperCase();
    const good = this.plausible(name, args);
    this.counts.replies++;
    const steps: Step[] = [];
    // An out-of-band push before a reply now and then (RESP3 allows one between any two replies).
    if (this.r.chance(0.05)) steps.push(this.send(this.push()));
    if (this.r.chance(0.03)) steps.push({ kind: 'pause', ms: 1 + this.r.int(20) });
    if (!this.r.chance(this.misframeRate)) return [...steps, this.send(good)];
    this.counts.misframed++;
    return [...steps, ...this.misframe(this.r.pick(MISFRAMES), name, good)];
  }

  private send(bytes: Buffer): Step {
    return { kind: 'send', bytes };
  }

  /** What a server could answer to `name` (tracking MULTI/EXEC). */
  private plausible(name: string, args: readonly Buffer[]): Buffer {
    if (this.inMulti && name !== 'EXEC' && name !== 'DISCARD' && name !== 'MULTI') {
      this.queued.push(name);
      return text('+QUEUED\r\n');
    }
    switch (name) {
      case 'MULTI':
        this.inMulti = true;
        this.queued = [];
        return text('+OK\r\n');
      case 'EXEC':
        this.inMulti = false;
        return this.execReply();
      case 'DISCARD':
        this.inMulti = false;
        return text('+OK\r\n');
      case 'HELLO':
        return this.hello(args[1]?.toString('latin1') === '3');
      default:
        if (name.startsWith('REDIS-LOCK-PROXY-AFTER-RESET-') && this.r.chance(0.7)) {
          // The refusal the proxy waits for after a RESET (reset-marker.ts): often found, so that
          // the connection goes on being interpreted.
          return text(`-ERR unknown command '${args[0].toString('latin1')}', with args beginning with: \r\n`);
        }
        return this.single(name);
    }
  }

  /** The reply to one command outside a transaction (or its element in EXEC's array). */
  private single(name: string): Buffer {
    if (this.r.chance(0.1)) return this.value(1);
    switch (name) {
      case 'INCRBY':
      case 'INCR':
        return text(`:${1 + this.r.int(5)}\r\n`);
      case 'EXPIRE':
      case 'PEXPIRE':
        return text(`:${this.r.int(2)}\r\n`);
      case 'GET':
        return this.r.chance(0.2) ? text('$-1\r\n') : this.bulk(this.r.chance(0.1) ? 20_000 + this.r.int(100_000) : this.r.int(64));
      case 'PING':
        return text('+PONG\r\n');
      case 'RESET':
        return text('+RESET\r\n');
      case 'SET':
      case 'CLIENT':
        return text('+OK\r\n');
      default:
        return this.value(0);
    }
  }

  private execReply(): Buffer {
    const queued = this.queued;
    this.queued = [];
    if (this.r.chance(0.03)) return text('*-1\r\n'); // a WATCH failed
    if (this.r.chance(0.03)) return text('-EXECABORT Transaction discarded because of previous errors.\r\n');
    // The RESP3 null (`_`, three bytes) stands in for an element now and then: as short as a reply gets.
    const elements = queued.map((name) => (this.r.chance(0.05) ? text('_\r\n') : this.single(name)));
    return Buffer.concat([text(`*${elements.length}\r\n`), ...elements]);
  }

  private hello(resp3: boolean): Buffer {
    const pairs = [
      ['server', 'redis'],
      ['version', '7.0.15'],
      ['proto', resp3 ? 3 : 2],
      ['id', 1 + this.r.int(1000)],
      ['mode', 'standalone'],
      ['role', 'master'],
    ] as const;
    const body = pairs.map(([k, v]) =>
      Buffer.concat([this.bulkOf(text(k)), typeof v === 'number' ? text(`:${v}\r\n`) : this.bulkOf(text(v))]),
    );
    return Buffer.concat([
      text(resp3 ? `%${pairs.length + 1}\r\n` : `*${2 * (pairs.length + 1)}\r\n`),
      ...body,
      this.bulkOf(text('modules')),
      text('*0\r\n'),
    ]);
  }

  /** A random well-framed value: RESP2 and RESP3 types, aggregates to depth 3, pushes nested now and then. */
  private value(depth: number): Buffer {
    switch (this.r.int(depth >= 3 ? 10 : 16)) {
      case 0:
        return text(`+${this.r.pick(WORDS)}\r\n`);
      case 1:
        return text(`-ERR ${this.r.pick(WORDS)}\r\n`);
      case 2:
        return text(`:${this.r.int(2000) - 1000}\r\n`);
      case 3:
        return this.bulk(this.r.int(40));
      case 4:
        return text('$-1\r\n');
      case 5:
        return text('_\r\n');
      case 6:
        return text(this.r.pick([',3.14\r\n', ',inf\r\n', ',-0.5\r\n', '#t\r\n', '#f\r\n']));
      case 7:
        return text(`(${this.r.int(1e9)}${this.r.int(1e9)}\r\n`);
      case 8:
        return Buffer.concat([text(`=${4 + 3}\r\ntxt:`), this.r.bytes(3), text('\r\n')]);
      case 9:
        return text('!9\r\nERR bulky\r\n');
      case 10:
      case 11:
        return this.aggregate('*', depth);
      case 12:
        return this.aggregate('~', depth);
      case 13: {
        const n = this.r.int(3);
        const pairs = Array.from({ length: 2 * n }, () => this.value(depth + 1));
        return Buffer.concat([text(`%${n}\r\n`), ...pairs]);
      }
      case 14:
        // An attribute in front of the value it annotates.
        return Buffer.concat([text('|1\r\n'), this.bulkOf(text('key-popularity')), text(':1\r\n'), this.value(depth + 1)]);
      default:
        return this.push();
    }
  }

  /** `*`/`~` with 0-4 elements, and now and then a push among them (out of band: not counted). */
  private aggregate(type: string, depth: number): Buffer {
    const elements = Array.from({ length: this.r.int(5) }, () => this.value(depth + 1));
    if (this.r.chance(0.15)) elements.splice(this.r.int(elements.length + 1), 0, this.push());
    const count = elements.length - elements.filter((e) => e[0] === 0x3e).length;
    return Buffer.concat([text(`${type}${count}\r\n`), ...elements]);
  }

  private push(): Buffer {
    return this.r.chance(0.5)
      ? Buffer.concat([text('>2\r\n$10\r\ninvalidate\r\n*1\r\n'), this.bulk(this.r.int(12))])
      : Buffer.concat([text('>3\r\n$7\r\nmessage\r\n$2\r\nch\r\n'), this.bulk(this.r.int(30))]);
  }

  private bulk(length: number): Buffer {
    return this.bulkOf(this.r.bytes(length));
  }

  private bulkOf(body: Buffer): Buffer {
    return Buffer.concat([text(`$${body.length}\r\n`), body, text('\r\n')]);
  }

  /** `good`, the reply due, spoilt in the way `how` names. */
  private misframe(how: Misframe, name: string, good: Buffer): Step[] {
    const r = this.r;
    const values = (n: number) => Array.from({ length: n }, () => this.value(1));
    switch (how) {
      case 'short-array': {
        const n = 2 + r.int(4);
        return [this.send(Buffer.concat([text(`*${n}\r\n`), ...values(n - 1 - r.int(2))]))];
      }
      case 'extra-elements': {
        const n = r.int(3);
        return [this.send(Buffer.concat([text(`*${n}\r\n`), ...values(n + 1 + r.int(3))]))];
      }
      case 'push-in-exec': {
        if (name !== 'EXEC') return [this.send(Buffer.concat([text('*2\r\n'), this.push(), ...values(2)]))];
        // Pushes anywhere in EXEC's array (often before the first element), the count left as it is.
        let reply = good;
        for (let i = 1 + r.int(2); i > 0; i--) reply = this.intoArray(reply, this.push());
        return [this.send(reply)];
      }
      case 'bulk-too-long': {
        const length = 5 + r.int(200);
        return [this.send(Buffer.concat([text(`$${length}\r\n`), r.bytes(r.int(length)), text('\r\n')]))];
      }
      case 'bulk-too-short': {
        const length = r.int(20);
        return [this.send(Buffer.concat([text(`$${length}\r\n`), r.bytes(length + 1 + r.int(50)), text('\r\n')]))];
      }
      case 'negative-count':
        return [
          this.send(
            Buffer.concat([
              text(r.pick(['*-2', '%-1', '~-3', '>-1', '$-2', '|-1', '*-99999999999', '$-0', '*-']) + '\r\n'),
              ...values(r.int(3)),
            ]),
          ),
        ];
      case 'huge-count': {
        const count = r.pick(['2147483648', '4294967296', '9007199254740993', '99999999999999999999', '1e9']);
        return [this.send(Buffer.concat([text(`${r.pick(['*', '$', '%', '~', '>', '|'])}${count}\r\n`), ...values(1 + r.int(3))]))];
      }
      case 'cut-then-close':
        return [this.send(good.subarray(0, r.int(good.length))), { kind: 'pause', ms: r.int(20) }, this.close()];
      case 'not-resp':
        return [
          this.send(
            r.chance(0.5)
              ? r.bytes(1 + r.int(64))
              : text(r.pick(['HTTP/1.1 400 Bad Request\r\n\r\n', 'hello world\n', '\r\n\r\n', 'OK\r\n'])),
          ),
        ];
      case 'unknown-type':
        return [
          this.send(
            text(r.pick(['@1\r\n', '?\r\n', '\0\r\n', ';3\r\nabc\r\n', '$?\r\n;3\r\nabc\r\n;0\r\n', '*?\r\n:1\r\n.\r\n', 'X\r\n'])),
          ),
        ];
      case 'bad-number':
        return [
          this.send(
            text(
              r.pick([':12x3\r\n', '*2a\r\n:1\r\n:2\r\n', '$3x\r\nabc\r\n', '*\r\n', '$\r\n\r\n', ':\r\n', '*1\r\r\n:1\r\n', '+OK\rX\r\n']),
            ),
          ),
        ];
      case 'lone-lf':
        return [this.send(text(r.pick(['+OK\n', '*2\n:1\n:0\n', ':1\n', '$2\nab\n'])))];
      case 'too-many':
        return [this.send(Buffer.concat([good, ...values(1 + r.int(3))]))];
      case 'too-few-then-close':
        // This reply never comes: silence, then the close.
        return [{ kind: 'pause', ms: 50 + r.int(250) }, this.close()];
    }
  }

  /** `element` put among an array reply's elements (before the first one too), its count left as it is. */
  private intoArray(reply: Buffer, element: Buffer): Buffer {
    if (reply[0] !== 0x2a /* * */) return Buffer.concat([element, reply]);
    const header = reply.indexOf('\r\n') + 2;
    // Elements are split by where a frame could start: good enough to land between or inside them.
    const cuts = [header];
    for (let i = header; i < reply.length - 1; i++)
      if (reply[i] === 0x0d && reply[i + 1] === 0x0a && i + 2 < reply.length) cuts.push(i + 2);
    const at = this.r.chance(0.5) ? header : this.r.pick(cuts);
    return Buffer.concat([reply.subarray(0, at), element, reply.subarray(at)]);
  }

  private close(): Step {
    this.ended = true;
    return { kind: 'close', reset: this.r.chance(0.3) };
  }
}
