/**
 * LockBlocks, the lock-block flow, without sockets: a whole block sent inside the client's own
 * transaction with NX, or as the script call (its reply turned into the client's four replies,
 * the retry with the source on NOSCRIPT, the fallback to the original bytes, the close when the
 * outcome is unknown), the server's version asked before the first block (auto), observe mode,
 * and the hold deadline. A fake port records what the flow asks of its connection.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { LockBlocks, type LockBlockPort } from '../src/lock/block-flow.js';
import type { LockMethodSetting } from '../src/lock/lock-method.js';
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

/** Stands for the shipped rules of every release line: what a block no loaded rule names is counted by. */
const CENSUS = createRuleSet(parseRuleFile('rules:\n  - name: shipped-lock\n    prefix: "shipped:"\n', 'census.yaml').rules, [
  'census.yaml',
]);

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

function setup(options: { mode?: 'enforce' | 'observe'; lockMethod?: LockMethodSetting; asking?: boolean } = {}) {
  const port = new FakePort();
  const stats = new Stats();
  const blocks = new LockBlocks(port, port.replies, {
    mode: options.mode ?? 'enforce',
    census: CENSUS,
    holdMs: 10,
    lockMethod: options.lockMethod ?? 'script',
    stats,
  });
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
  describe('inside the client’s own transaction', () => {
    it('sends the block as the client wrote it, with NX added to the EXPIRE, and nothing waits', () => {
      const { port, stats, offer } = setup({ lockMethod: 'transaction' });
      const block = Buffer.concat([cmd('multi'), cmd('incrby', 'lock:a', '1'), cmd('Expire', 'lock:a', '60'), cmd('EXEC')]);
      expect(offer(block)).toBe(false);
      const withNx = Buffer.concat([cmd('multi'), cmd('incrby', 'lock:a', '1'), cmd('Expire', 'lock:a', '60', 'NX'), cmd('EXEC')]);
      expect(port.upstream).toEqual([withNx.toString('latin1')]);
      expect([port.events, port.captures.length, port.client]).toEqual([['sent 4 complete'], 0, '']);
      expect([stats.blocksSeen, stats.blocksRewritten, stats.rewrittenBy.transaction]).toEqual([1, 1, 1]);
    });

    it('gives PEXPIRE its NX too, and keeps the bytes Redis skips after a count line', () => {
      const { port, offer } = setup({ lockMethod: 'transaction' });
      const expire = Buffer.from('*3\r\n$7\r\nPEXPIRE\r\n$6\r\nlock:b\r\n$4\r\n9000\r\n');
      const block = Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:b'), expire, cmd('EXEC')]);
      offer(block);
      expect(port.upstream.join('')).toBe(
        Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:b'), cmd('PEXPIRE', 'lock:b', '9000', 'NX'), cmd('EXEC')]).toString('latin1'),
      );
    });
  });

  describe('auto: the server’s version decides, asked once per connection', () => {
    const hello = (server: string, version: string): string =>
      `*14\r\n$6\r\nserver\r\n$${server.length}\r\n${server}\r\n$7\r\nversion\r\n$${version.length}\r\n${version}\r\n` +
      '$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:5\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n';

    it('Redis 7.0 or later, and Valkey: in the transaction; the client waits only for the first block', () => {
      for (const [server, version] of [
        ['redis', '7.0.15'],
        ['redis', '8.0.2'],
        ['valkey', '8.1.1'],
      ]) {
        const { port, offer } = setup({ lockMethod: 'auto' });
        expect(offer(lockAttempt('lock:a', 60))).toBe(true);
        expect([port.upstream, port.events]).toEqual([[cmd('HELLO').toString('latin1')], ['hold']]);
        port.reply(hello(server, version));
        expect(port.upstream[1]).toContain('$2\r\nNX\r\n');
        expect(port.events).toEqual(['hold', 'sent 4 complete', 'resume']);
        expect(offer(lockAttempt('lock:a', 60))).toBe(false); // no second HELLO
        expect(port.upstream.length).toBe(3);
      }
    });

    it('RESP3’s map reads the same', () => {
      const { port, offer } = setup({ lockMethod: 'auto' });
      offer(lockAttempt('lock:a', 60));
      port.reply('%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.4\r\n');
      expect(port.upstream[1]).toContain('$2\r\nNX\r\n');
    });

    it('before 7.0, or when HELLO is refused as it is before 6.2: the script', () => {
      for (const reply of [
        hello('redis', '6.2.14'),
        "-ERR wrong number of arguments for 'hello' command\r\n",
        "-ERR unknown command 'HELLO'\r\n",
      ]) {
        const { port, offer } = setup({ lockMethod: 'auto' });
        offer(lockAttempt('lock:a', 60));
        port.reply(reply);
        expect(port.upstream[1]).toBe(cmd('EVALSHA', LOCK_SCRIPT_SHA, '1', 'lock:a', 'INCRBY', '1', 'EXPIRE', '60').toString('latin1'));
        expect(port.events).not.toContain('resume'); // still waiting, for the script's reply now
        port.reply('*2\r\n:1\r\n:1\r\n');
        expect(port.events.at(-1)).toBe('resume');
      }
    });

    it('after ASKING, which HELLO uses up: ASKING again right before the block, its +OK kept by the proxy', () => {
      const { port, offer } = setup({ lockMethod: 'auto', asking: true });
      offer(lockAttempt('lock:a', 60));
      port.reply(hello('redis', '7.0.15'));
      expect(port.upstream[1]).toBe(cmd('ASKING').toString('latin1'));
      expect(port.upstream[2]).toContain('$2\r\nNX\r\n');
      expect(port.captures.length).toBe(1); // ASKING's +OK
      port.reply('+OK\r\n');
      expect(port.client).toBe('');
    });

    it('not authenticated yet: the block goes as it is (Redis refuses it), and the next block asks again', () => {
      const { port, stats, offer } = setup({ lockMethod: 'auto' });
      const block = lockAttempt('lock:a', 60);
      offer(block);
      port.reply('-NOAUTH HELLO must be called with the client already authenticated\r\n');
      expect(port.upstream[1]).toBe(block.toString('latin1'));
      expect(port.events).toEqual(['hold', 'sent 4 complete', 'resume']);
      expect(stats.releases.get('not-authenticated')).toBe(1);
      offer(block);
      expect(port.upstream[2]).toBe(cmd('HELLO').toString('latin1'));
    });
  });

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
      port.reply('*2\r\n:2\r\n:0\r\n');
      expect(port.client).toBe('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:2\r\n:0\r\n');
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

  it('in observe mode, counts the block and sends it unchanged', () => {
    const { port, stats, offer } = setup();
    expect(offer(lockAttempt('watch:a', 60))).toBe(false);
    expect(port.upstream).toEqual([lockAttempt('watch:a', 60).toString('latin1')]);
    expect(port.events).toEqual(['sent 4 complete']);
    expect(stats.blocksObserved).toBe(1);
  });

  it('sends a whole lock-shaped block no loaded rule names as it came, counted by prefix, and as an attempt when a shipped rule names its key', () => {
    const { port, stats, offer } = setup({ lockMethod: 'transaction' });
    for (const key of ['other:1', 'shipped:1', 'shipped:2']) {
      expect(offer(lockAttempt(key, 60))).toBe(false);
      expect(port.upstream.at(-1)).toBe(lockAttempt(key, 60).toString('latin1'));
    }
    expect(port.events).toEqual(['sent 4 complete', 'sent 4 complete', 'sent 4 complete']);
    expect(Object.fromEntries(stats.uncovered)).toEqual({ 'other:': 1, 'shipped:': 2 });
    expect(stats.attempts.get('shipped-lock')).toMatchObject({ oldShape: 2, fixedShape: 0 });
    expect([stats.attempts.has('other'), stats.blocksSeen, stats.releases.get('no-rule')]).toEqual([false, 0, 3]);
    // A block a loaded rule names is that rule's attempt, and not uncovered.
    expect(offer(lockAttempt('lock:1', 60))).toBe(false);
    expect([stats.attempts.get('locks')?.oldShape, stats.blocksSeen, [...stats.uncovered.values()]]).toEqual([1, 1, [1, 2]]);
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

    it('stops the deadline once the block is complete', () => {
      const { port, stats, blocks, offer } = setup({ lockMethod: 'transaction' });
      blocks.awaitMore();
      offer(lockAttempt('lock:a', 60));
      vi.advanceTimersByTime(100);
      expect([port.events, stats.releases.get('hold-timeout')]).toEqual([['sent 4 complete'], undefined]);
    });
  });
});
