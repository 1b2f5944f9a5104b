/**
 * ReplyStream, without sockets: the replies of forwarded frames go to the client untouched and
 * in order, the proxy's own are taken aside exactly, however TCP splits them, and a stream the
 * count cannot follow is handed back to the session (as a pipe, or a close when its own reply
 * is due).
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { LineWatch, PendingLine } from '../src/session/error-lines.js';
import { ReplyStream, type ReplyStreamPort } from '../src/session/reply-stream.js';
import { ResetMarker, type ResetConditions, type ResetOutcome } from '../src/session/reset-marker.js';
import { splitAt } from './support/chunks.js';

class FakePort implements ReplyStreamPort {
  client = '';
  clientGone = false;
  events: string[] = [];
  writeClient(bytes: Buffer): void {
    this.client += bytes.toString('latin1');
  }
  untracked(reason: string, tooMany: boolean): void {
    this.events.push(`untracked ${tooMany ? 'too many' : reason}`);
  }
  lost(reason: string): void {
    this.events.push(`lost ${reason}`);
  }
  fault(error: unknown): void {
    throw error;
  }
  repliesWaiting(waiting: boolean): void {
    this.events.push(waiting ? 'waiting' : 'going on');
  }
  ownReplyLate(what: string): void {
    this.events.push(`late ${what}`);
  }
}

/** The bound on the proxy's own replies in these tests: never reached unless a test waits for it. */
const OWN_REPLY_TIMEOUT_MS = 60_000;

/** As --cluster watches error lines: -MOVED/-ASK lines, rewritten by `rewrite`. */
function redirectWatch(rewrite: LineWatch['replace']): LineWatch {
  const couldBe = (head: Buffer): boolean => {
    const text = head.toString('latin1');
    return ['-MOVED ', '-ASK '].some((word) => word.startsWith(text.slice(0, word.length)) || text.startsWith(word));
  };
  return { couldBe, replace: rewrite };
}

function judged(more: Partial<ResetConditions> = {}): ResetConditions {
  return { judged: true, skipPending: false, repliesMayBeOff: false, ...more };
}

/** Redis's refusal of the marker's `index`th command of its own (Redis 7's words, or Redis 6's with a backtick). */
function refusal(marker: ResetMarker, index = 0, quote = "'", sent: Buffer = marker.command): string {
  const names = [...sent.toString('latin1').matchAll(/\r\n(redis-lock-proxy-after-reset-[0-9a-f]+)\r\n/g)].map((m) => m[1]);
  return `-ERR unknown command ${quote}${names[index]}${quote}, with args beginning with: \r\n`;
}

function feed(stream: ReplyStream, text: string, cuts: number[] = []): void {
  for (const piece of splitAt(Buffer.from(text, 'latin1'), cuts)) stream.process(piece);
}

describe('ReplyStream', () => {
  it('a client’s reply taken aside (EXEC’s array): an error in its place is passed on as any reply, a redirect rewritten', () => {
    for (const cuts of [[], [1], [3, 9], [20]]) {
      const port = new FakePort();
      const stream = new ReplyStream(
        port,
        redirectWatch((line) => (line.toString('latin1').startsWith('-MOVED') ? Buffer.from('-MOVED 1 proxy:7001\r\n') : null)),
        OWN_REPLY_TIMEOUT_MS,
      );
      const own: string[] = [];
      stream.expect(1);
      stream.capture((reply) => own.push(reply.toString('latin1')), true);
      stream.expect(1);
      stream.capture((reply) => own.push(reply.toString('latin1')), true);
      feed(stream, '+OK\r\n-MOVED 1 10.0.0.9:6379\r\n+PONG\r\n*2\r\n:1\r\n:0\r\n', cuts);
      expect([own, port.client, stream.pending], String(cuts)).toEqual([
        ['*2\r\n:1\r\n:0\r\n'],
        '+OK\r\n-MOVED 1 proxy:7001\r\n+PONG\r\n',
        false,
      ]);
    }
  });

  it('a reply of the proxy’s own whose error may answer a client’s command: passed on (rewritten) when the mark says so when it comes, else taken aside', () => {
    for (const cuts of [[], [2], [12, 30], [40]]) {
      const port = new FakePort();
      const stream = new ReplyStream(
        port,
        redirectWatch((line) => (line.toString('latin1').startsWith('-ASK') ? Buffer.from('-ASK 1 proxy:7002\r\n') : null)),
        OWN_REPLY_TIMEOUT_MS,
      );
      const own: string[] = [];
      const asked: boolean[] = [];
      const verdicts = [true, false];
      const passes = (): boolean => {
        const verdict = verdicts[asked.length];
        asked.push(verdict);
        return verdict;
      };
      stream.capture((reply) => own.push(reply.toString('latin1')), false, undefined, passes);
      stream.capture((reply) => own.push(reply.toString('latin1')), false, undefined, passes);
      stream.capture((reply) => own.push(reply.toString('latin1')), false, undefined, passes);
      stream.expect(1);
      feed(stream, '-ASK 1 10.0.0.9:6379\r\n-ERR not an integer\r\n+QUEUED\r\n+PONG\r\n', cuts);
      expect([own, port.client, asked, stream.pending], String(cuts)).toEqual([
        ['-ERR not an integer\r\n', '+QUEUED\r\n'],
        '-ASK 1 proxy:7002\r\n+PONG\r\n',
        [true, false],
        false,
      ]);
    }
  });

  it('takes the proxy’s own reply aside after the replies expected before it, and counts those after it', () => {
    const port = new FakePort();
    const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
    const own: string[] = [];
    stream.expect(2);
    stream.capture((reply) => own.push(reply.toString('latin1')));
    stream.expect(1);
    feed(stream, '+PONG\r\n$3\r\nabc\r\n*2\r\n:1\r\n:0\r\n:7\r\n');
    expect(own).toEqual(['*2\r\n:1\r\n:0\r\n']);
    expect(port.client).toBe('+PONG\r\n$3\r\nabc\r\n:7\r\n');
    expect(stream.pending).toBe(false);
  });

  it('finds the same reply however the bytes are split, pushes left with the client', () => {
    const text = '+A\r\n>2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n*2\r\n$1\r\nx\r\n%1\r\n+a\r\n:1\r\n+B\r\n';
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 1, max: text.length - 1 }), { maxLength: 6 }), (cuts) => {
        const port = new FakePort();
        const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
        const own: string[] = [];
        stream.expect(1);
        stream.capture((reply) => own.push(reply.toString('latin1')));
        stream.expect(1);
        feed(stream, text, cuts);
        expect(own).toEqual(['*2\r\n$1\r\nx\r\n%1\r\n+a\r\n:1\r\n']);
        expect(port.client).toBe('+A\r\n>2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n+B\r\n');
      }),
    );
  });

  it('stops counting at once, or after its own replies still due', () => {
    const port = new FakePort();
    const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
    stream.capture(() => port.events.push('own'));
    stream.stopCounting(false);
    expect(stream.passingThrough).toBe(false);
    feed(stream, '+OK\r\n');
    expect([stream.passingThrough, port.events]).toEqual([true, ['own']]);
  });

  it('hands back a stream with more replies than requests, or one that is not RESP', () => {
    const port = new FakePort();
    const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
    stream.expect(1);
    feed(stream, '+OK\r\n+EXTRA\r\n');
    expect(port.events).toEqual(['untracked too many']);
    const broken = new FakePort();
    new ReplyStream(broken, null, OWN_REPLY_TIMEOUT_MS).process(Buffer.from('?what\r\n'));
    expect(broken.client).toBe('?what\r\n');
    expect(broken.events).toEqual([expect.stringMatching(/^untracked /)]);
  });

  it('closes rather than guess when its own reply is due and the stream cannot be followed', () => {
    const port = new FakePort();
    const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
    stream.capture(() => port.events.push('own'));
    feed(stream, '?broken\r\n');
    expect(port.events).toEqual([expect.stringMatching(/^lost /)]);
  });

  describe('the bound on a reply of the proxy’s own', () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    it('runs from when every reply before it has come, and says so once when it passes', () => {
      vi.useFakeTimers();
      const port = new FakePort();
      const stream = new ReplyStream(port, null, 1000);
      stream.expect(1); // a blocking command, say: it may take as long as it likes
      stream.capture(() => port.events.push('own'));
      vi.advanceTimersByTime(5000);
      expect(port.events).toEqual([]);
      feed(stream, '+late\r\n');
      vi.advanceTimersByTime(999);
      expect(port.events).toEqual([]);
      vi.advanceTimersByTime(1);
      expect(port.events).toEqual(['late a reply to a command of its own']);
    });

    it('restarts for each reply of its own in turn, and stops when they are in, or when the stream stops', () => {
      vi.useFakeTimers();
      const port = new FakePort();
      const stream = new ReplyStream(port, null, 1000);
      stream.capture(() => port.events.push('first'));
      stream.capture(() => port.events.push('second'));
      vi.advanceTimersByTime(900);
      feed(stream, '+OK\r\n');
      vi.advanceTimersByTime(900);
      feed(stream, '+OK\r\n');
      vi.advanceTimersByTime(5000);
      expect(port.events).toEqual(['first', 'second']);
      stream.capture(() => port.events.push('third'));
      stream.stop();
      vi.advanceTimersByTime(5000);
      expect(port.events).toEqual(['first', 'second']);
    });

    it('does not run while the proxy reads nothing from Redis (a client slow to read), and starts afresh after', () => {
      vi.useFakeTimers();
      const port = new FakePort();
      const stream = new ReplyStream(port, null, 1000);
      stream.capture(() => port.events.push('own'));
      vi.advanceTimersByTime(500);
      stream.readsPaused(true);
      vi.advanceTimersByTime(5000);
      expect(port.events).toEqual([]);
      stream.readsPaused(false);
      vi.advanceTimersByTime(999);
      expect(port.events).toEqual([]);
      vi.advanceTimersByTime(1);
      expect(port.events).toEqual(['late a reply to a command of its own']);
    });

    it('bounds the marker by Redis’s silence, not by the size of the backlog before it', () => {
      vi.useFakeTimers();
      const port = new FakePort();
      const stream = new ReplyStream(port, null, 1000);
      stream.stopCounting(true);
      stream.awaitMarker(new ResetMarker(), () => port.events.push('found'));
      for (let i = 0; i < 10; i++) {
        vi.advanceTimersByTime(900);
        feed(stream, '+message\r\n');
      }
      expect(port.events).toEqual([]);
      vi.advanceTimersByTime(1000);
      expect(port.events).toEqual(['late the RESET marker']);
    });

    it('names the lock blocks whose replies are still due', () => {
      const port = new FakePort();
      const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
      const lock = { rule: 'test-lock', key: Buffer.from('lock:a') };
      stream.expect(1);
      stream.capture(() => port.events.push('script'), false, lock);
      stream.capture(() => port.events.push('own'));
      expect(stream.lockBlocksDue()).toEqual([lock]);
      feed(stream, '+OK\r\n*1\r\n:1\r\n');
      expect(stream.lockBlocksDue()).toEqual([]);
      stream.stop();
    });

    it('runs for the marker after a RESET from the moment it is sent', () => {
      vi.useFakeTimers();
      const port = new FakePort();
      const stream = new ReplyStream(port, null, 1000);
      stream.stopCounting(true);
      stream.awaitMarker(new ResetMarker(), () => port.events.push('found'));
      feed(stream, '+message\r\n');
      vi.advanceTimersByTime(1000);
      expect(port.events).toEqual(['late the RESET marker']);
    });
  });

  describe('the marker after a RESET', () => {
    it('passes what comes before its refusal, drops the refusal wherever the stream seems to be, however split', () => {
      // A message, a script's +RESET, an EXEC array whose element never comes (a queued CLIENT REPLY
      // OFF), RESET's own reply filling it, then the refusal, and a reply counted after it.
      const before = "*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n+RESET\r\n-ERR unknown command 'x'\r\n*2\r\n+RESET\r\n";
      const length = `${before}${refusal(new ResetMarker())}+OK\r\n:5\r\n`.length;
      fc.assert(
        fc.property(fc.array(fc.integer({ min: 1, max: length - 1 }), { maxLength: 6 }), (cuts) => {
          const marker = new ResetMarker();
          const text = `${before}${refusal(marker)}+OK\r\n:5\r\n`;
          const port = new FakePort();
          const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
          const own: string[] = [];
          stream.stopCounting(true);
          stream.awaitMarker(marker, () => {
            port.events.push('found');
            stream.capture((reply) => own.push(reply.toString('latin1')));
            stream.expect(1);
          });
          feed(stream, text, cuts);
          expect(port.events).toEqual(['found']);
          expect(own).toEqual(['+OK\r\n']);
          expect(port.client).toBe(before + ':5\r\n');
          expect(stream.pending).toBe(false);
        }),
      );
    });

    it('finds the refusal when the RESET comes after a read that ended anywhere in a frame of the pipe', () => {
      // A subscriber's backlog: messages whose bodies hold bytes that start no frame (`m`), and
      // lines that look like errors inside bulk strings.
      const message = (i: number, body: string): string => `*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$${body.length}\r\n${body}\r\n`;
      const backlog = [message(0, 'm'.repeat(40)), message(1, '-ERR x\r\n'), ':7\r\n', message(2, 'mm')].join('');
      const length = `${backlog}${refusal(new ResetMarker())}+OK\r\n`.length;
      fc.assert(
        fc.property(
          fc.integer({ min: 1, max: backlog.length }),
          fc.array(fc.integer({ min: 1, max: length - 1 }), { maxLength: 4 }),
          (reset, cuts) => {
            const marker = new ResetMarker();
            const text = `${backlog}${refusal(marker)}+OK\r\n`;
            const port = new FakePort();
            const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
            stream.stopCounting(true); // a pipe (SUBSCRIBE) that a RESET may end
            expect(stream.passingThrough).toBe(false);
            const bytes = Buffer.from(text, 'latin1');
            // What Redis sent before the client's RESET came: read, in pieces, as a pipe.
            for (const piece of splitAt(
              bytes.subarray(0, reset),
              cuts.filter((cut) => cut < reset),
            ))
              stream.process(piece);
            const own: string[] = [];
            stream.awaitMarker(marker, () => {
              port.events.push('found');
              stream.capture((reply) => own.push(reply.toString('latin1')));
            });
            for (const piece of splitAt(
              bytes.subarray(reset),
              cuts.filter((cut) => cut > reset).map((cut) => cut - reset),
            )) {
              stream.process(piece);
            }
            expect(port.events).toEqual(['found']);
            expect(own).toEqual(['+OK\r\n']);
            expect(port.client).toBe(backlog);
            expect(stream.framesFollowed).toBe(true);
          },
        ),
      );
    });

    describe('where Redis may refuse the RESET (6.2), tells whether it ran from the line before the refusal', () => {
      const message = '*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$8\r\n+RESET\r\n\r\n';
      const push = '>3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n';
      const monitor = '+1733400000.123456 [0 127.0.0.1:5555] "PING"\r\n';
      const noperm = "-NOPERM this user has no permissions to run the 'reset' command or its subcommand\r\n";
      const long = `+${'x'.repeat(600)}\r\n`;
      const cases: Array<{
        name: string;
        conditions: ResetConditions;
        /** What Redis sends: the client's bytes and the proxy's (`A`, `B`: the markers' refusals; `ON`, `ON-REFUSED`: CLIENT REPLY ON's answer). */
        stream: string[];
        outcome: ResetOutcome;
      }> = [
        { name: 'ran', conditions: judged(), stream: [message, '+RESET\r\n', 'A'], outcome: 'ran' },
        {
          name: 'refused by ACL',
          conditions: judged(),
          stream: ['+RESET\r\n', message, noperm, push, message, monitor, 'A'],
          outcome: 'refused',
        },
        {
          name: 'refused, -BUSY',
          conditions: judged(),
          stream: ['+RESET\r\n', '-BUSY Redis is busy running a script.\r\n', 'A'],
          outcome: 'refused',
        },
        {
          name: 'refused, a long line last',
          conditions: judged(),
          stream: ['+RESET\r\n', `-${'y'.repeat(600)}\r\n`, long, 'A'],
          outcome: 'refused',
        },
        { name: 'after SKIP', conditions: judged({ skipPending: true }), stream: [message, '+RESET\r\n', 'A'], outcome: 'unknown' },
        {
          name: 'ran, replies may be off',
          conditions: judged({ repliesMayBeOff: true }),
          stream: ['+RESET\r\n', 'A', 'ON', 'B'],
          outcome: 'ran',
        },
        {
          name: 'refused, replies were on after all',
          conditions: judged({ repliesMayBeOff: true }),
          stream: ['+OK\r\n', noperm, 'A', monitor, push, 'ON', monitor, 'B'],
          outcome: 'refused',
        },
        {
          name: 'refused, CLIENT refused in subscribed mode',
          conditions: judged({ repliesMayBeOff: true }),
          stream: [noperm, message, 'A', message, 'ON-REFUSED', message, 'B'],
          outcome: 'refused',
        },
        {
          name: 'refused while replies were off',
          conditions: judged({ repliesMayBeOff: true }),
          stream: [push, 'ON', push, 'B'],
          outcome: 'refused-while-off',
        },
        {
          name: 'refused while replies were off, after a +OK of the client',
          conditions: judged({ repliesMayBeOff: true }),
          stream: ['+OK\r\n', message, 'ON', 'B'],
          outcome: 'refused-while-off',
        },
        {
          name: 'after an honoured SKIP, ran: the answer held, then dropped',
          conditions: judged({ skipPending: true, beforeReset: true }),
          stream: [message, '+RESET\r\n', message, 'RESET', 'A'],
          outcome: 'ran',
        },
        {
          name: 'after an honoured SKIP, refused, MONITOR lines behind',
          conditions: judged({ skipPending: true, beforeReset: true }),
          stream: ['+RESET\r\n', message, 'REFUSED', message, monitor, 'A'],
          outcome: 'refused',
        },
        {
          name: 'after a SKIP not honoured: ran',
          conditions: judged({ skipPending: true, beforeReset: true }),
          stream: ['-ERR x\r\n', 'P', '+RESET\r\n', 'A'],
          outcome: 'ran',
        },
        {
          name: 'after a SKIP not honoured: refused',
          conditions: judged({ skipPending: true, beforeReset: true }),
          stream: ['P', noperm, 'A'],
          outcome: 'refused',
        },
        {
          name: 'after a SKIP, replies maybe off',
          conditions: judged({ skipPending: true, beforeReset: true, repliesMayBeOff: true }),
          stream: ['+RESET\r\n', 'A', 'ON', 'B'],
          outcome: 'unknown',
        },
        {
          name: 'not judged (7.0+)',
          conditions: { judged: false, skipPending: true, repliesMayBeOff: true },
          stream: [message, 'A'],
          outcome: 'ran',
        },
      ];
      for (const { name, conditions, stream: parts, outcome } of cases) {
        it(name, () => {
          const proxys = (marker: ResetMarker, quote: string): Record<string, string> => ({
            A: refusal(marker, 0, quote),
            B: refusal(marker, 1, quote),
            P: marker.before === null ? 'no command before' : refusal(marker, 0, quote, marker.before),
            RESET: '+RESET\r\n',
            REFUSED: noperm,
            ON: '+OK\r\n',
            'ON-REFUSED':
              "-ERR Can't execute 'client': only (P)SUBSCRIBE / (P)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n",
          });
          const length = parts.map((part) => proxys(new ResetMarker(conditions), "'")[part] ?? part).join('').length;
          fc.assert(
            fc.property(fc.array(fc.integer({ min: 1, max: length + 9 }), { maxLength: 5 }), fc.boolean(), (cuts, backtick) => {
              const marker = new ResetMarker(conditions);
              const quote = backtick ? '`' : "'";
              const own = proxys(marker, quote);
              const bytes = parts.map((part) => own[part] ?? part);
              const port = new FakePort();
              const stream = new ReplyStream(port, null, OWN_REPLY_TIMEOUT_MS);
              stream.stopCounting(true);
              const outcomes: ResetOutcome[] = [];
              stream.awaitMarker(marker, (told) => {
                outcomes.push(told);
                stream.expect(1);
              });
              const text = `${bytes.join('')}:5\r\n`;
              feed(
                stream,
                text,
                cuts.filter((cut) => cut < text.length),
              );
              expect(outcomes).toEqual([outcome]);
              // The client gets its own bytes, in order, and none of the proxy's.
              expect(port.client).toBe([...parts.filter((part) => own[part] === undefined), ':5\r\n'].join(''));
              expect(stream.pending).toBe(false);
            }),
          );
        });
      }
    });

    it('takes the refusal in Redis 6’s words too, and no other unknown command’s', () => {
      const marker = new ResetMarker();
      const name = /\$\d+\r\n(.*)\r\n$/.exec(marker.command.toString('latin1'))?.[1] as string;
      const line = (text: string): Buffer => Buffer.from(`${text}\r\n`);
      expect(marker.matches(line(`-ERR unknown command '${name}', with args beginning with: `))).toBe(true);
      expect(marker.matches(line(`-ERR unknown command \`${name}\`, with args beginning with: `))).toBe(true);
      expect(marker.matches(line(`-ERR unknown command '${name}x', with args beginning with: `))).toBe(false);
      expect(marker.matches(line(`-ERR unknown command '${name}\``))).toBe(false);
      expect(marker.matches(line(`-ERR unknown command '${name.slice(0, -1)}'`))).toBe(false);
      expect(marker.matches(line(`+ERR unknown command '${name}'`))).toBe(false);
      expect(new ResetMarker().matches(line(`-ERR unknown command '${name}'`))).toBe(false);
    });
  });

  it('in cluster mode, rewrites -MOVED lines at any depth and across reads, even once it passes bytes through', () => {
    const rewrite = (line: Buffer) =>
      line.toString().startsWith('-MOVED') ? Buffer.from(line.toString().replace(/\S+:\d+/, 'proxy:7001')) : null;
    const text = '-MOVED 1 10.0.0.9:6379\r\n*2\r\n-MOVED 2 10.0.0.9:6380\r\n-ERR other\r\n';
    for (let cut = 1; cut < text.length; cut++) {
      const port = new FakePort();
      const stream = new ReplyStream(port, redirectWatch(rewrite), OWN_REPLY_TIMEOUT_MS);
      stream.expect(2);
      feed(stream, text, [cut]);
      expect(port.client, String(cut)).toBe('-MOVED 1 proxy:7001\r\n*2\r\n-MOVED 2 proxy:7001\r\n-ERR other\r\n');
    }
    const port = new FakePort();
    const stream = new ReplyStream(port, redirectWatch(rewrite), OWN_REPLY_TIMEOUT_MS);
    stream.stopCounting(false);
    expect(stream.passingThrough).toBe(false); // redirects still name nodes
    feed(stream, '-MOVED 3 10.0.0.9:6379\r\n');
    expect(port.client).toBe('-MOVED 3 proxy:7001\r\n');
  });

  describe('in cluster mode, a redirect to a node not known yet', () => {
    /**
     * A stream whose redirects to 10.0.0.9 wait until `settle()`; then they name the proxy, as a
     * refresh that learned the node would.
     */
    function waitingStream(): { port: FakePort; stream: ReplyStream; settle: () => Promise<void> } {
      let release!: () => void;
      const checked = new Promise<void>((resolve) => (release = resolve));
      const rewrite = (line: Buffer): Buffer | null | PendingLine => {
        const text = line.toString('latin1');
        if (!/^-(MOVED|ASK) /.test(text)) return null;
        return { checked, answer: () => Buffer.from(text.replace(/\S+:\d+/, 'proxy:7001'), 'latin1') };
      };
      const port = new FakePort();
      return {
        port,
        stream: new ReplyStream(port, redirectWatch(rewrite), OWN_REPLY_TIMEOUT_MS),
        settle: async () => {
          release();
          await new Promise((resolve) => setImmediate(resolve));
        },
      };
    }

    /** A bulk string reply of `size` bytes. */
    const bulk = (size: number): string => `$${size}\r\n${'v'.repeat(size)}\r\n`;

    const TEXT = '+A\r\n*3\r\n:1\r\n-ASK 2 10.0.0.9:6380\r\n$1\r\nx\r\n-MOVED 1 10.0.0.9:6379\r\n+B\r\n';
    const BEFORE = '+A\r\n*3\r\n:1\r\n';
    const AFTER = '+A\r\n*3\r\n:1\r\n-ASK 2 proxy:7001\r\n$1\r\nx\r\n-MOVED 1 proxy:7001\r\n+B\r\n';

    it('holds it and every byte after it, in order, however the bytes are split, until the check settles', async () => {
      await fc.assert(
        fc.asyncProperty(fc.array(fc.integer({ min: 1, max: TEXT.length - 1 }), { maxLength: 5 }), async (cuts) => {
          const { port, stream, settle } = waitingStream();
          stream.expect(3);
          feed(stream, TEXT, cuts);
          expect(port.client).toBe(BEFORE);
          expect([stream.pending, stream.passingThrough, port.events.at(-1)]).toEqual([true, false, 'waiting']);
          await settle();
          expect(port.client).toBe(AFTER);
          expect([stream.pending, port.events.at(-1)]).toEqual([false, 'going on']);
        }),
        { numRuns: 50 },
      );
    });

    it('also once replies are no longer counted', async () => {
      const { port, stream, settle } = waitingStream();
      stream.stopCounting(false);
      feed(stream, TEXT);
      expect(port.client).toBe(BEFORE);
      await settle();
      expect(port.client).toBe(AFTER);
    });

    it('goes out when Redis closes the connection, without waiting any longer', () => {
      const { port, stream } = waitingStream();
      stream.expect(3);
      feed(stream, TEXT);
      stream.flush();
      expect(port.client).toBe(AFTER);
      expect(stream.pending).toBe(false);
    });

    it('goes out once more than 1 MiB waits behind it', () => {
      const { port, stream } = waitingStream();
      const big = bulk(1024 * 1024);
      stream.expect(3);
      feed(stream, `-MOVED 1 10.0.0.9:6379\r\n+A\r\n`);
      expect(port.client).toBe('');
      feed(stream, big);
      expect(port.client).toBe(`-MOVED 1 proxy:7001\r\n+A\r\n${big}`);
    });

    it('lets a later redirect in what waited wait in turn, keeping the order when the size limit ends both waits', () => {
      const { port, stream } = waitingStream();
      const half = bulk(600 * 1024);
      stream.expect(5);
      feed(stream, '-MOVED 1 10.0.0.9:6379\r\n');
      feed(stream, `-MOVED 2 10.0.0.9:6379\r\n${half}`);
      expect(port.client).toBe('');
      feed(stream, half);
      feed(stream, '+END\r\n');
      expect(port.client).toBe(`-MOVED 1 proxy:7001\r\n-MOVED 2 proxy:7001\r\n${half}${half}+END\r\n`);
      expect(stream.pending).toBe(false);
    });

    it('sends nothing once the client is gone', async () => {
      const { port, stream, settle } = waitingStream();
      stream.expect(3);
      feed(stream, TEXT);
      port.clientGone = true;
      await settle();
      expect(port.client).toBe(BEFORE);
    });
  });
});
