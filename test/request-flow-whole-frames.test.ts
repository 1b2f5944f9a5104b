/**
 * RequestFlow takes the frames that are whole in a chunk and that it only has to count (any
 * command it does not classify, a lone INCR/INCRBY/EXPIRE/PEXPIRE, a SET of other than six
 * arguments), and a lock pair's increment and expiry in a followed transaction (NX added), at
 * once, with WholeFrameReader and TransactionState.forwarded (counted-frames.ts), instead of
 * event by event. Fed one byte at a time no frame is ever whole in a chunk, so every frame goes
 * the event way: both must send Redis the same bytes, expect the same replies and count the same.
 */
import type { LockBlockRef } from '../src/lock/block-flow.js';
import type { ExpiryRestore } from '../src/lock/exec-reply.js';
import { ServerMethods } from '../src/lock/lock-method.js';
import fc from 'fast-check';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { Cmd } from '../src/resp/commands.js';
import { MAX_CAPTURED_KEY, MAX_CAPTURED_VALUE, type RequestScanner } from '../src/resp/request-scanner.js';
import { WholeFrameReader } from '../src/resp/whole-frame.js';
import { createRuleSet, parseRuleFile } from '../src/rules/loader.js';
import type { ProxyContext } from '../src/session/context.js';
import { ReplyStream, type ReplyStreamPort } from '../src/session/reply-stream.js';
import { RequestFlow, type RequestFlowPort } from '../src/session/request-flow.js';
import { TransactionState } from '../src/session/transaction-state.js';
import { Stats } from '../src/stats.js';
import { RefusalLog } from '../src/upstream/refusal-log.js';
import { VerifyRuns } from '../src/verify-connection.js';
import type { UpstreamConnector } from '../src/upstream/connect.js';
import { parseUpstreamUrl } from '../src/upstream/target.js';
import { splitAt } from './support/chunks.js';
import { cmd } from './support/resp.js';
import { lockAttempt } from './support/stalwart.js';
import { frameHeads } from './support/scan.js';

const RULES = createRuleSet(
  parseRuleFile('rules:\n  - name: locks\n    prefix: "lock:"\n  - name: watched\n    prefix: "seen:"\n    mode: observe\n', 'x.yaml')
    .rules,
  ['x.yaml'],
);
const LONG_KEY = 'lock:' + 'k'.repeat(1100);

/** Replies expected, counted as the flow announces them, and the EXEC replies whose expiries are restored. */
class CountedReplies extends ReplyStream {
  expected = 0;
  restores: unknown[] = [];
  override expect(count: number): void {
    this.expected += count;
    super.expect(count);
  }
  override restoreExpiries(restore: ExpiryRestore, lock: LockBlockRef): void {
    this.restores.push({ ...lock, key: Buffer.from(lock.key).toString('latin1') });
    super.restoreExpiries(restore, lock);
  }
}

/** The server's version, known as a start asks it: a MULTI waits for nothing. */
function learnt(methods: ServerMethods): ServerMethods {
  methods.learnt('127.0.0.1:6379', 'transaction');
  return methods;
}

/** A flow (transaction method: nothing waits for a reply of the proxy's own) and what it sent. */
function flow() {
  const log = pino({ level: 'silent' });
  const stats = new Stats();
  const ctx: ProxyContext = {
    upstream: { target: parseUpstreamUrl('redis://127.0.0.1:6379') } as unknown as UpstreamConnector,
    rules: () => RULES,
    census: createRuleSet([], []),
    mode: 'enforce',
    holdMs: 50,
    connectTimeoutMs: 1000,
    idleTimeoutMs: 0,
    ownReplyTimeoutMs: 60_000,
    upstreamTimeoutMs: 0,
    lockMethod: 'transaction',
    serverMethods: learnt(new ServerMethods()),
    cluster: null,
    log,
    stats,
    refusals: new RefusalLog(log),
    verifyRuns: new VerifyRuns(),
  };
  const sent: Buffer[] = [];
  const port: RequestFlowPort & ReplyStreamPort = {
    writeUpstream: (bytes) => sent.push(Buffer.from(bytes)),
    writeClient: () => {},
    stall: () => {
      throw new Error('nothing here waits for a reply');
    },
    startSetup: () => false,
    awaitClose: () => {},
    holdClient: () => {},
    resumeClient: () => {},
    closeAfterReplies: () => {},
    fault: (error) => {
      throw error;
    },
    upstreamAddress: '127.0.0.1:6379',
    log,
    clientGone: false,
    untracked: () => {},
    lost: () => {},
    repliesWaiting: () => {},
    ownReplyLate: () => {},
    blockingSent: () => {},
  };
  const replies = new CountedReplies(port, null, 60_000);
  const requests = new RequestFlow(port, replies, ctx, null);
  const outcome = () => ({
    sent: Buffer.concat(sent).toString('latin1'),
    expected: replies.expected,
    restores: replies.restores,
    holding: requests.holding,
    piping: requests.pipe.active,
    commandsForwarded: stats.commandsForwarded,
    blocksSeen: stats.blocksSeen,
    blocksRewritten: stats.blocksRewritten,
    releases: [...stats.releases],
    byRule: [...stats.byRule].map(([name, counters]) => [name, { ...counters }]),
  });
  return { requests, outcome };
}

/** The frames the streams are made of: only counted, classified, a lock block, inline, empty arguments, a pipe. */
const FRAMES: Buffer[] = [
  cmd('GET', 'k'),
  cmd('SET', 'k', 'v'),
  cmd('SET', 'lock:a', '1796000000', 'NX', 'EX', '3600'),
  cmd('INCR', 'lock:a'),
  cmd('INCRBY', 'lock:a', '1'),
  cmd('EXPIRE', 'lock:a', '60'),
  cmd('PEXPIRE', 'k', '60000'),
  cmd('PING'),
  cmd('MULTI'),
  cmd('EXEC'),
  cmd('DISCARD'),
  cmd('WATCH', 'k'),
  cmd('UNWATCH'),
  cmd('ASKING'),
  cmd('CLIENT', 'SETNAME', 'x'),
  cmd('GET', ''),
  cmd('MGET', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k'),
  cmd('SET', 'big', Buffer.alloc(1000, 'x')),
  Buffer.from('PING\r\n'),
  lockAttempt('lock:a', 60),
  lockAttempt('lock:b', 60),
  // The pair's frames in every shape the scanner tells apart: other keys, an observing rule, no rule,
  // expiries that are not a lease, a delta Redis refuses, arguments longer than the scanner captures.
  cmd('INCR', 'lock:b'),
  cmd('EXPIRE', 'lock:b', '60'),
  cmd('PEXPIRE', 'lock:a', '60000'),
  cmd('EXPIRE', 'lock:a', '0'),
  cmd('EXPIRE', 'lock:a', '-5'),
  cmd('EXPIRE', 'lock:a', '60', 'NX'),
  cmd('INCRBY', 'lock:a', '01'),
  cmd('INCRBY', 'lock:a', '1'.repeat(40)),
  cmd('PEXPIRE', 'lock:a', '1'.repeat(40)),
  cmd('INCR', 'seen:a'),
  cmd('EXPIRE', 'seen:a', '60'),
  cmd('INCR', 'free'),
  cmd('EXPIRE', 'free', '60'),
  cmd('INCR', LONG_KEY),
  cmd('EXPIRE', LONG_KEY, '60'),
  lockAttempt('seen:a', 60),
  lockAttempt(LONG_KEY, 60),
  Buffer.from('EXPIRE lock:a 60\r\n'),
];
const PIPE = cmd('SUBSCRIBE', 'ch');

describe('RequestFlow: whole frames taken at once', () => {
  it('sends, expects and counts exactly as frame by frame, however the stream is cut', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: FRAMES.length - 1 }), { maxLength: 40 }),
        fc.boolean(),
        fc.array(fc.nat(), { maxLength: 8 }),
        (picks, pipe, cuts) => {
          const frames = picks.map((i) => FRAMES[i]);
          if (pipe) frames.splice(frames.length >> 1, 0, PIPE);
          const stream = Buffer.concat(frames);
          const byByte = flow();
          for (let i = 0; i < stream.length; i++) byByte.requests.process(Buffer.from(stream.subarray(i, i + 1)));
          const inChunks = flow();
          for (const chunk of splitAt(stream, cuts)) inChunks.requests.process(chunk);
          byByte.requests.stop(); // no hold deadline fires after the run
          inChunks.requests.stop();
          expect(inChunks.outcome()).toEqual(byByte.outcome());
        },
      ),
      { numRuns: 600 },
    );
  });

  it('reads whole frames, and leaves every other frame to the scanner', () => {
    const whole = new WholeFrameReader();
    const frames = Buffer.concat([cmd('GET', 'k'), cmd('MULTI'), cmd('SET', 'k', 'v')]);
    const afterGet = cmd('GET', 'k').length;
    expect(whole.read(frames, 0)).toBe(afterGet);
    expect([whole.cmd, whole.argc]).toEqual([Cmd.Other, 2]);
    // MULTI is whole too; the flow hands it to the scanner's events because it is classified.
    expect(whole.read(frames, afterGet)).toBe(afterGet + cmd('MULTI').length);
    expect(whole.cmd).toBe(Cmd.Multi);
    // Not whole in the chunk, an empty argument, an inline command: left to the scanner.
    expect(whole.read(frames.subarray(0, afterGet - 1), 0)).toBe(-1);
    expect(whole.read(cmd('GET', ''), 0)).toBe(-1);
    expect(whole.read(Buffer.from('GET k\r\n'), 0)).toBe(-1);
    // Lines Redis would refuse, or that need its every rule, are left to the scanner, which reports them.
    expect(whole.read(Buffer.from('*01\r\n$3\r\nGET\r\n'), 0)).toBe(-1);
    expect(whole.read(Buffer.from('*1\r\n$+3\r\nGET\r\n'), 0)).toBe(-1);
    expect(whole.read(Buffer.from('*1\r\n$-1\r\n'), 0)).toBe(-1);
    expect(whole.read(Buffer.from('*1234567890\r\n'), 0)).toBe(-1);
  });

  it('reads the same command, arity and end as the scanner, on random frames', () => {
    const names = [
      'GET',
      'set',
      'MULTI',
      'exec',
      'INCRBY',
      'incr',
      'Expire',
      'PEXPIRE',
      'CLIENT',
      'SUBSCRIBE',
      'QUIT',
      'RESET',
      'ASKING',
      'X',
    ];
    fc.assert(
      fc.property(fc.constantFrom(...names), fc.array(fc.uint8Array({ maxLength: 30 }), { maxLength: 12 }), fc.nat(), (name, args, cut) => {
        const frame = cmd(name, ...args.map((arg) => Buffer.from(arg)));
        const chunk = frame.subarray(0, cut % (frame.length + 1));
        const whole = new WholeFrameReader();
        const after = whole.read(chunk, 0);
        if (chunk.length < frame.length || args.some((arg) => arg.length === 0)) expect(after).toBe(-1);
        if (after < 0) return;
        const { scanner } = frameHeads(frame).next().value as { scanner: RequestScanner };
        expect([whole.cmd, whole.argc, after]).toEqual([scanner.cmd, scanner.argc, frame.length]);
        // A pair command's key and value where the reader says they lie, as the scanner captured them.
        if (!([Cmd.Incr, Cmd.Incrby, Cmd.Expire, Cmd.Pexpire] as Cmd[]).includes(whole.cmd)) return;
        const arg = (buf: Buffer, start: number, length: number): string => buf.toString('latin1', start, start + length);
        if (whole.argc > 1 && whole.keyLength <= MAX_CAPTURED_KEY) {
          expect(arg(whole.key, whole.keyStart, whole.keyLength)).toBe(arg(scanner.key, scanner.keyStart, scanner.keyLength));
        }
        if (whole.cmd !== Cmd.Incr && whole.argc > 2 && whole.valueLength <= MAX_CAPTURED_VALUE && !scanner.oversize) {
          expect(arg(whole.value, whole.valueStart, whole.valueLength)).toBe(arg(scanner.value, scanner.valueStart, scanner.valueLength));
        }
      }),
      { numRuns: 3000 },
    );
  });

  it('reads the same command and arity as the scanner does', () => {
    for (const frame of FRAMES) {
      const whole = new WholeFrameReader();
      if (whole.read(frame, 0) < 0) continue;
      const head = frameHeads(frame).next().value as { scanner: RequestScanner };
      expect([whole.cmd, whole.argc]).toEqual([head.scanner.cmd, head.scanner.argc]);
    }
  });
});

describe('TransactionState.forwarded', () => {
  it('is what frame() does for each of the frames, inside and outside a transaction, after ASKING', () => {
    const frame = (bytes: Buffer): RequestScanner => (frameHeads(bytes).next().value as { scanner: RequestScanner }).scanner;
    for (const before of [[], [cmd('MULTI')], [cmd('MULTI'), cmd('GET', 'a')], [cmd('ASKING')], [cmd('WATCH', 'k')]]) {
      for (const count of [1, 3]) {
        const oneByOne = new TransactionState();
        const atOnce = new TransactionState();
        for (const bytes of before) {
          oneByOne.frame(frame(bytes));
          atOnce.frame(frame(bytes));
        }
        for (let i = 0; i < count; i++) oneByOne.frame(frame(cmd('GET', 'k')));
        atOnce.forwarded(count);
        expect({ ...atOnce }).toEqual({ ...oneByOne });
      }
    }
  });
});
