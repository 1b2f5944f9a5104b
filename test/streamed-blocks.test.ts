/**
 * StreamedBlocks on its own: which queued frames make a lock pair, which expiry may be fixed, the
 * EXEC elements to give back, and what each attempt counts, for transactions fed frame by frame
 * as the session feeds them (TransactionState says what is queued).
 */
import { describe, expect, it } from 'vitest';
import { StreamedBlocks, type PairOutcome } from '../src/lock/streamed-blocks.js';
import type { Logger } from '../src/log.js';
import { Cmd } from '../src/resp/commands.js';
import { createRuleSet, parseRuleFile } from '../src/rules/loader.js';
import { TransactionState } from '../src/session/transaction-state.js';
import { Stats } from '../src/stats.js';
import { cmd } from './support/resp.js';
import { frameHeads } from './support/scan.js';

const RULES = createRuleSet(
  parseRuleFile('rules:\n  - name: locks\n    prefix: "lock:"\n  - name: watch\n    prefix: "watch:"\n    mode: observe\n', 'x.yaml').rules,
  ['x.yaml'],
);
/** Stands for the shipped rules of every release line. */
const CENSUS = createRuleSet(parseRuleFile('rules:\n  - name: shipped-lock\n    prefix: "shipped:"\n', 'census.yaml').rules, [
  'census.yaml',
]);

function setup() {
  const stats = new Stats();
  const logged: string[] = [];
  const log = {
    info: (_: unknown, msg: string) => logged.push(msg),
    warn: (_: unknown, msg: string) => logged.push(msg),
  } as unknown as Logger;
  const streamed = new StreamedBlocks({ mode: 'enforce', census: CENSUS, stats }, () => log);
  const tx = new TransactionState();
  /** What each EXEC gave back: the indexes of its reply to restore. */
  const execs: number[][] = [];
  /** The keys of the expiries the flow was told it may fix. */
  const fixable: string[] = [];
  /** Feeds frames as the session does; an expiry it may fix goes with `outcome`. */
  const feed = (bytes: Buffer, outcome: PairOutcome = 'nx'): void => {
    for (const { scanner } of frameHeads(bytes)) {
      const enforced = streamed.active && streamed.isEnforcedExpiry(scanner);
      if (enforced) fixable.push(scanner.key.toString('latin1', 0, scanner.keyLength));
      tx.frame(scanner);
      if (tx.opened) {
        if (!tx.watching) streamed.begin();
      } else if (streamed.active) {
        if (tx.queuedIndex >= 0) streamed.queued(scanner, tx.queuedIndex, RULES, enforced ? outcome : null);
        else if (tx.closed && scanner.cmd === Cmd.Exec) execs.push([...(streamed.executed(tx.queued)?.restore ?? [])]);
        else if (tx.closed) streamed.end();
      }
    }
  };
  /** The script way released held frames, as the session tells both. */
  const released = (frames: number, complete: boolean, key: string, reason: 'hold-timeout' | 'not-a-lock-block'): void => {
    tx.blockSent(frames, complete);
    streamed.released(frames, complete, Buffer.from(key), RULES, reason);
  };
  return { stats, logged, streamed, feed, execs, fixable, released };
}

const block = (key: string, ...more: Buffer[]): Buffer =>
  Buffer.concat([cmd('MULTI'), cmd('INCRBY', key, '1'), cmd('EXPIRE', key, '60'), ...more, cmd('EXEC')]);

describe('StreamedBlocks', () => {
  it('fixes the expiry right after an increment of its key, and gives its element of EXEC back', () => {
    const { stats, feed, execs, fixable } = setup();
    feed(block('lock:a'));
    feed(
      Buffer.concat([
        cmd('MULTI'),
        cmd('GET', 'x'),
        cmd('INCR', 'lock:b'),
        cmd('PEXPIRE', 'lock:b', '5000'),
        cmd('SET', 'y', '1'),
        cmd('EXEC'),
      ]),
    );
    expect(fixable).toEqual(['lock:a', 'lock:b']);
    expect(execs).toEqual([[1], [2]]);
    expect([stats.blocksSeen, stats.blocksRewritten, stats.rewrittenBy.transaction, stats.attempts.get('locks')?.oldShape]).toEqual([
      2, 2, 2, 2,
    ]);
  });

  it('leaves alone an expiry not right after the increment, of another key, with an option, or after a bad integer', () => {
    const { stats, feed, execs, fixable } = setup();
    for (const frames of [
      [cmd('INCR', 'lock:a'), cmd('GET', 'lock:a'), cmd('EXPIRE', 'lock:a', '60')],
      [cmd('INCR', 'lock:a'), cmd('EXPIRE', 'lock:b', '60')],
      [cmd('INCR', 'lock:a'), cmd('EXPIRE', 'lock:a', '60', 'NX')],
      [cmd('INCRBY', 'lock:a', '01'), cmd('EXPIRE', 'lock:a', '60')],
      [cmd('INCR', 'lock:a'), cmd('EXPIRE', 'lock:a', '0')],
    ]) {
      feed(Buffer.concat([cmd('MULTI'), ...frames, cmd('EXEC')]));
    }
    expect([fixable, execs.flat(), stats.blocksSeen]).toEqual([[], [], 0]);
  });

  it('follows no transaction opened under WATCH, and counts nothing for one discarded', () => {
    const { stats, feed, execs, fixable } = setup();
    feed(Buffer.concat([cmd('WATCH', 'lock:a'), block('lock:a')]));
    feed(Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:a'), cmd('EXPIRE', 'lock:a', '60'), cmd('DISCARD')]));
    expect(fixable).toEqual(['lock:a']); // the second, which is then discarded
    expect([execs.flat(), stats.blocksSeen, stats.attempts.size]).toEqual([[], 0, 0]);
  });

  it('counts an observed pair, and one no loaded rule names (by prefix when it is the exact block, as an attempt when a shipped rule names it)', () => {
    const { stats, logged, feed, execs, fixable } = setup();
    feed(block('watch:a'));
    feed(block('other:1'));
    feed(block('shipped:1'));
    feed(block('shipped:2', cmd('PING'))); // not the exact block: an attempt, but no lock-shaped block
    expect([fixable, execs.flat()]).toEqual([[], []]);
    expect([stats.blocksObserved, stats.rule('watch').seen, stats.attempts.get('watch')?.oldShape]).toEqual([1, 1, 1]);
    expect(logged).toEqual(['observe: lock block would be rewritten']);
    expect(Object.fromEntries(stats.uncovered)).toEqual({ 'other:': 1, 'shipped:': 1 });
    expect(stats.attempts.get('shipped-lock')?.oldShape).toBe(2);
  });

  it('counts a pair sent unchanged by its reason, and logs it once per reason', () => {
    const { stats, logged, feed, execs } = setup();
    feed(block('lock:a'), { unfixed: 'version-unknown' });
    feed(block('lock:a'), { unfixed: 'version-unknown' });
    feed(block('lock:a'), { unfixed: 'split-frame' });
    expect(execs.flat()).toEqual([]);
    expect(Object.fromEntries(stats.rule('locks').unfixed)).toEqual({ 'version-unknown': 2, 'split-frame': 1 });
    expect([stats.attempts.get('locks')?.oldShape, stats.blocksRewritten]).toEqual([3, 0]);
    expect(logged.filter((line) => line.startsWith('lock block sent unchanged'))).toHaveLength(2);
  });

  it('takes over a block the script way released, wherever it got to, and counts it at its EXEC', () => {
    const { stats, streamed, feed, released } = setup();
    released(4, true, 'lock:a', 'not-a-lock-block'); // whole: counted now
    expect(stats.rule('locks').unfixed.get('not-a-lock-block')).toBe(1);
    released(2, false, 'lock:a', 'hold-timeout'); // MULTI and INCRBY went at the deadline
    expect(streamed.releaseReason).toBe('hold-timeout');
    feed(Buffer.concat([cmd('EXPIRE', 'lock:a', '60'), cmd('EXEC')]), { unfixed: 'hold-timeout' });
    expect(Object.fromEntries(stats.rule('locks').unfixed)).toEqual({ 'not-a-lock-block': 1, 'hold-timeout': 1 });
    released(4, true, 'watch:a', 'not-a-lock-block'); // observed, not unfixed
    expect([stats.blocksObserved, stats.attempts.get('locks')?.oldShape]).toEqual([1, 2]);
  });
});
