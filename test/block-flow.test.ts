/**
 * LockBlocks, the script way's lock-block flow, without sockets: a whole block sent as the script
 * call (its reply turned into the client's four replies, the retry with the source on NOSCRIPT,
 * the fallback to the original bytes, the close when the outcome is unknown), observe mode, and
 * the hold deadline. A fake port records what the flow asks of its connection. What a released
 * block counts is streamed-blocks.test.ts's.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { LockBlocks, refusalCause, type LockBlockPort } from '../src/lock/block-flow.js';
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
  fault(error: unknown): void {
    throw error;
  }
  /** The reply accounting the flow is given alongside the port. */
  readonly replies = {
    expect: (count: number) => (this.expected += count),
    capture: (handle: (reply: Buffer) => void) => this.captures.push(handle),
  };
  blockSent(frames: number, complete: boolean, key: Buffer | null, reason: string): void {
    this.events.push(`sent ${frames}${complete ? ' complete' : ''}${key === null ? '' : ` ${key.toString('latin1')}`} ${reason}`);
  }
  holdClient(): void {
    this.events.push('hold');
  }
  resumeClient(): void {
    this.events.push('resume');
  }
  closeAfterReplies(): void {
    this.events.push('close');
  }
  /** Redis answers the oldest capture. */
  reply(text: string): void {
    const handle = this.captures.shift();
    if (handle === undefined) throw new Error('no reply expected');
    handle(Buffer.from(text, 'latin1'));
  }
}

function setup(options: { mode?: 'enforce' | 'observe'; asking?: boolean } = {}) {
  const port = new FakePort();
  const stats = new Stats();
  const blocks = new LockBlocks(port, port.replies, { mode: options.mode ?? 'enforce', holdMs: 10, stats });
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
        return blocks.complete(options.asking ?? false);
      }
    }
    blocks.hold(bytes.subarray(from));
    return 'released';
  };
  return { port, stats, blocks, offer };
}

describe('LockBlocks', () => {
  describe('as the script', () => {
    it('sends one EVALSHA for a whole block, holds the client, and answers with the four replies', () => {
      const { port, stats, offer } = setup();
      expect(offer(lockAttempt('lock:a', 60))).toBe(true);
      expect(port.events).toEqual(['hold']);
      expect(port.upstream).toEqual([cmd('EVALSHA', LOCK_SCRIPT_SHA, '1', 'lock:a', 'INCRBY', '1', 'EXPIRE', '60').toString('latin1')]);
      port.reply('*2\r\n:1\r\n:1\r\n');
      expect(port.client).toBe('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n:1\r\n');
      expect(port.events).toEqual(['hold', 'resume']);
      expect([stats.blocksSeen, stats.blocksRewritten, stats.rewrittenBy.script]).toEqual([1, 1, 1]);
    });

    it('passes an error of the expiry on inside the array, where EXEC puts it', () => {
      const { port, offer } = setup();
      offer(lockAttempt('lock:a', 60));
      port.reply('*2\r\n:3\r\n-ERR something after the increment\r\n');
      expect(port.client).toBe('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:3\r\n-ERR something after the increment\r\n');
    });

    it('after ASKING: the EVAL retry and the original block each get ASKING again (the call before used it up)', () => {
      const { port, offer } = setup({ asking: true });
      const block = lockAttempt('lock:a', 60);
      offer(block);
      expect(port.upstream[0]).toMatch(/^\*8\r\n\$7\r\nEVALSHA/);
      port.reply('-NOSCRIPT No matching script.\r\n');
      expect(port.upstream[1]).toBe(cmd('ASKING').toString('latin1'));
      expect(port.upstream[2]).toMatch(/^\*8\r\n\$4\r\nEVAL\r\n/);
      port.reply('+OK\r\n');
      port.reply('-BUSY Redis is busy running a script.\r\n');
      expect(port.upstream.slice(3)).toEqual([cmd('ASKING').toString('latin1'), block.toString('latin1')]);
      port.reply('+OK\r\n');
      expect(port.client).toBe('');
    });

    it('sends the source once the script cache has lost it, and only then lets the client go on', () => {
      const { port, stats, offer } = setup();
      offer(lockAttempt('lock:a', 60));
      port.reply('-NOSCRIPT No matching script. Please use EVAL.\r\n');
      expect(port.upstream[1]).toMatch(/^\*8\r\n\$4\r\nEVAL\r\n/);
      expect(port.events).toEqual(['hold', 'hold']);
      port.reply('*2\r\n:2\r\n:0\r\n'); // a held lock: the script left its expiry alone
      expect(port.client).toBe('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:2\r\n:1\r\n'); // as Redis alone answers
      expect(stats.scriptReloads).toBe(1);
    });

    it('falls back to the original bytes when the script wrote nothing, expecting their four replies', () => {
      const { port, stats, offer } = setup();
      const block = lockAttempt('lock:a', 60);
      offer(block);
      port.reply("-NOPERM this user has no permissions to run the 'evalsha' command\r\n");
      expect(port.upstream[1]).toBe(block.toString('latin1'));
      expect([port.expected, port.client]).toEqual([4, '']);
      expect(port.events).toEqual(['hold', 'resume']);
      expect(stats.fallbacks.get('NOPERM')).toBe(1);
    });

    it('names the cause of a refusal: the error code, and for NOPERM the command refused', () => {
      expect(refusalCause("-NOPERM this user has no permissions to run the 'evalsha' command or its subcommand")).toEqual({
        reason: 'NOPERM',
        command: 'evalsha',
      });
      // The script's own words, before 7.0 ("@user_script: 1: The user executing ...") and after.
      expect(refusalCause("-NOPERM pttl: The user executing the script can't run this command or subcommand")).toEqual({
        reason: 'NOPERM',
        command: 'pttl',
      });
      expect(refusalCause('-NOPERM exec: the lock block is not allowed for this user')).toEqual({ reason: 'NOPERM', command: 'exec' });
      for (const [message, reason] of [
        ["-OOM command not allowed when used memory > 'maxmemory'.", 'OOM'],
        ["-READONLY You can't write against a read only replica.", 'READONLY'],
        ['-BUSY Redis is busy running a script.', 'BUSY'],
        ['-NOSCRIPT No matching script.', 'NOSCRIPT'],
        ['-@user_script: 1: something else', 'ERR'],
      ]) {
        expect(refusalCause(message)).toEqual({ reason, command: undefined });
      }
    });

    it('closes the connection, never resending the block, when the increment ran but the reply cannot say how', () => {
      for (const reply of ['+QUEUED\r\n', '*2\r\n$-1\r\n:1\r\n', '*2\r\n_\r\n:0\r\n', '*3\r\n:1\r\n:1\r\n:1\r\n', '*2\r\n:1\r\n:7\r\n']) {
        const { port, stats, offer } = setup();
        offer(lockAttempt('lock:a', 60));
        port.reply(reply);
        expect([port.events, port.upstream.length, port.client], reply).toEqual([['hold', 'close'], 1, '']);
        expect(stats.blocksClosed).toBe(1);
      }
    });
  });

  it('in observe mode, and on a key no loaded rule names: sends the block unchanged, for the stream to count', () => {
    const { port, stats, offer } = setup();
    for (const key of ['watch:a', 'other:1']) {
      expect(offer(lockAttempt(key, 60))).toBe(false);
      expect(port.upstream.at(-1)).toBe(lockAttempt(key, 60).toString('latin1'));
    }
    expect(port.events).toEqual(['sent 4 complete watch:a not-a-lock-block', 'sent 4 complete other:1 not-a-lock-block']);
    expect([stats.releases.get('observe'), stats.releases.get('no-rule'), stats.blocksSeen]).toEqual([1, 1, 0]);
  });

  it('releases what it held as soon as a frame cannot be the block’s', () => {
    const { port, offer } = setup();
    const bytes = Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:a', '1'), cmd('GET', 'lock:a')]);
    expect(offer(bytes)).toBe('released');
    expect(port.upstream.join('')).toBe(bytes.toString('latin1'));
    expect(port.events).toEqual(['sent 2 lock:a not-a-lock-block']);
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
      expect([port.events, stats.releases.get('hold-timeout')]).toEqual([['sent 1 hold-timeout'], 1]);
    });

    it('stops the deadline once the block is complete', () => {
      const { port, stats, blocks, offer } = setup();
      blocks.awaitMore();
      offer(lockAttempt('lock:a', 60));
      vi.advanceTimersByTime(100);
      expect([port.events, stats.releases.get('hold-timeout')]).toEqual([['hold'], undefined]);
    });
  });
});
