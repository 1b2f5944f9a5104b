/**
 * LockBlocks, the lock-block flow, without sockets: a held block's script call, its reply
 * turned into the client's four replies, the retry with the source on NOSCRIPT, the fallback to
 * the original bytes, observe mode, the hold deadline, and --lock-pipelining's close on a late
 * failure. A fake port records what the flow asks of its connection.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { LockBlocks, type LockBlockPort } from '../src/lock/block-flow.js';
import { LOCK_SCRIPT_SHA } from '../src/lock/script.js';
import type { Logger } from '../src/log.js';
import { createRuleSet, parseRuleFile } from '../src/rules/loader.js';
import { Stats } from '../src/stats.js';
import { cmd } from './support/resp.js';
import { lockAttempt } from './support/stalwart.js';
import { frameHeads } from './support/scan.js';

const RULES = createRuleSet(
  parseRuleFile('rules:\n  - name: locks\n    prefix: "lock:"\n  - name: watch\n    prefix: "watch:"\n    mode: observe\n', 'x.yaml').rules,
  ['x.yaml'],
);

class FakePort implements LockBlockPort {
  upstream: string[] = [];
  client = '';
  expected = 0;
  captures: Array<(reply: Buffer) => void> = [];
  events: string[] = [];
  readonly log = { info: () => {}, warn: () => {}, debug: () => {}, error: () => {} } as unknown as Logger;
  writeUpstream(bytes: Buffer): void {
    this.upstream.push(bytes.toString('latin1'));
  }
  writeClient(bytes: Buffer): void {
    this.client += bytes.toString('latin1');
  }
  /** The reply accounting the flow is given alongside the port. */
  readonly replies = {
    expect: (count: number) => (this.expected += count),
    capture: (handle: (reply: Buffer) => void) => this.captures.push(handle),
  };
  blockSent(frames: number, complete: boolean): void {
    this.events.push(`sent ${frames}${complete ? ' complete' : ''}`);
  }
  holdClient(): void {
    this.events.push('hold');
  }
  resumeClient(): void {
    this.events.push('resume');
  }
  abandon(): void {
    this.events.push('abandon');
  }
  destroy(): void {
    this.events.push('destroy');
  }
  /** Redis answers the oldest capture. */
  reply(text: string): void {
    const handle = this.captures.shift();
    if (handle === undefined) throw new Error('no reply expected');
    handle(Buffer.from(text, 'latin1'));
  }
}

function setup(options: { mode?: 'enforce' | 'observe'; lockPipelining?: boolean } = {}) {
  const port = new FakePort();
  const stats = new Stats();
  const blocks = new LockBlocks(
    port,
    port.replies,
    { mode: options.mode ?? 'enforce', holdMs: 10, lockPipelining: options.lockPipelining ?? false, stats },
    null,
  );
  /** Feeds a whole block, as the session would: MULTI starts holding, each head is offered. Returns whether the client waits. */
  const offer = (bytes: Buffer): boolean | 'released' => {
    let from = 0;
    for (const { scanner, pos } of frameHeads(bytes)) {
      if (!blocks.holding) {
        expect(LockBlocks.isStart(scanner)).toBe(true);
        blocks.start([]);
      } else if (!blocks.accept(scanner, RULES)) {
        blocks.hold(bytes.subarray(from)); // the session would forward the rest of this frame itself
        blocks.release('not-a-lock-block');
        return 'released';
      }
      if (blocks.isComplete) {
        blocks.hold(bytes.subarray(from, pos));
        from = pos;
        return blocks.complete(false);
      }
    }
    blocks.hold(bytes.subarray(from));
    return 'released';
  };
  return { port, stats, blocks, offer };
}

describe('LockBlocks', () => {
  it('sends one EVALSHA for a whole block, holds the client, and answers with the four replies', () => {
    const { port, stats, offer } = setup();
    expect(offer(lockAttempt('lock:a', 60))).toBe(true);
    expect(port.events).toEqual(['hold']);
    expect(port.upstream).toEqual([cmd('EVALSHA', LOCK_SCRIPT_SHA, '1', 'lock:a', 'INCRBY', '1', 'EXPIRE', '60').toString('latin1')]);
    port.reply('*2\r\n:1\r\n:1\r\n');
    expect(port.client).toBe('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n:1\r\n');
    expect(port.events).toEqual(['hold', 'resume']);
    expect([stats.blocksSeen, stats.blocksRewritten]).toEqual([1, 1]);
  });

  it('sends the source once the script cache has lost it, and only then lets the client go on', () => {
    const { port, stats, offer } = setup();
    offer(lockAttempt('lock:a', 60));
    port.reply('-NOSCRIPT No matching script. Please use EVAL.\r\n');
    expect(port.upstream[1]).toMatch(/^\*8\r\n\$4\r\nEVAL\r\n/);
    expect(port.events).toEqual(['hold', 'hold']);
    port.reply('*2\r\n:2\r\n:0\r\n');
    expect(port.client).toBe('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:2\r\n:0\r\n');
    expect(stats.scriptReloads).toBe(1);
  });

  it('falls back to the original bytes when the script cannot run, expecting their four replies', () => {
    const { port, stats, offer } = setup();
    const block = lockAttempt('lock:a', 60);
    offer(block);
    port.reply("-NOPERM this user has no permissions to run the 'evalsha' command\r\n");
    expect(port.upstream[1]).toBe(block.toString('latin1'));
    expect([port.expected, port.client]).toEqual([4, '']);
    expect(port.events).toEqual(['hold', 'resume']);
    expect(stats.fallbacks.get('NOPERM')).toBe(1);
  });

  it('in observe mode, counts the block and sends it unchanged', () => {
    const { port, stats, offer } = setup();
    expect(offer(lockAttempt('watch:a', 60))).toBe(false);
    expect(port.upstream).toEqual([lockAttempt('watch:a', 60).toString('latin1')]);
    expect(port.events).toEqual(['sent 4 complete']);
    expect(stats.blocksObserved).toBe(1);
  });

  it('releases what it held as soon as a frame cannot be the block’s', () => {
    const { port, offer } = setup();
    const bytes = Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:a', '1'), cmd('GET', 'lock:a')]);
    expect(offer(bytes)).toBe('released');
    expect(port.upstream.join('')).toBe(bytes.toString('latin1'));
    expect(port.events).toEqual(['sent 2']);
  });

  describe('the hold deadline', () => {
    beforeEach(() => vi.useFakeTimers());
    afterEach(() => vi.useRealTimers());

    it('releases an unfinished block after --hold-ms without new bytes, counted from the last byte', () => {
      const { port, stats, blocks } = setup();
      blocks.start([cmd('MULTI')]);
      blocks.awaitMore();
      vi.advanceTimersByTime(8);
      blocks.touched();
      vi.advanceTimersByTime(8);
      expect(port.upstream).toEqual([]);
      vi.advanceTimersByTime(3);
      expect(port.upstream).toEqual([cmd('MULTI').toString('latin1')]);
      expect([port.events, stats.releases.get('hold-timeout')]).toEqual([['sent 1'], 1]);
    });
  });

  it('with --lock-pipelining, does not hold the client once the script has worked, and closes on a later failure', () => {
    const { port, stats, offer } = setup({ lockPipelining: true });
    expect(offer(lockAttempt('lock:a', 60))).toBe(true); // the first block proves the script
    port.reply('*2\r\n:1\r\n:1\r\n');
    expect(offer(lockAttempt('lock:b', 60))).toBe(false);
    expect(stats.blocksPipelined).toBe(1);
    port.reply('-BUSY Redis is busy running a script.\r\n');
    expect(port.events).toEqual(['hold', 'resume', 'abandon']);
    expect(stats.fallbacks.get('BUSY (connection closed)')).toBe(1);
  });

  it('closes the connection on a script reply it cannot read', () => {
    const { port, offer } = setup();
    offer(lockAttempt('lock:a', 60));
    port.reply('+what\r\n');
    expect(port.events).toEqual(['hold', 'destroy']);
  });
});
