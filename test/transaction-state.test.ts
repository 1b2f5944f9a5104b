/**
 * TransactionState, without sockets: frames scanned from bytes go in, their meaning and the
 * MULTI/WATCH/ASKING state come out, as Redis would hold them (the end-to-end tests check
 * the same rules against a real server's replies).
 */
import { describe, expect, it } from 'vitest';
import { FrameMeaning, TransactionState } from '../src/session/transaction-state.js';
import { cmd } from './support/resp.js';
import { frameHeads } from './support/scan.js';

/** Feeds `bytes` to a fresh scanner and the state, frame by frame; returns each frame's meaning. */
function feed(tx: TransactionState, bytes: Buffer | string): FrameMeaning[] {
  const meanings: FrameMeaning[] = [];
  for (const { scanner } of frameHeads(Buffer.from(bytes))) meanings.push(tx.frame(scanner));
  return meanings;
}

describe('TransactionState', () => {
  it('opens on MULTI and closes on EXEC or DISCARD, counting what is queued', () => {
    const tx = new TransactionState();
    expect(feed(tx, cmd('MULTI'))).toEqual([FrameMeaning.Reply]);
    expect([tx.inMulti, tx.opened, tx.canStartBlock]).toEqual([true, true, false]);
    feed(tx, Buffer.concat([cmd('SET', 'a', '1'), cmd('INCR', 'a')]));
    expect([tx.queued, tx.queuedIndex]).toEqual([2, 1]);
    feed(tx, cmd('EXEC'));
    expect([tx.inMulti, tx.closed, tx.queuedIndex, tx.canStartBlock]).toEqual([false, true, -1, true]);
    feed(tx, Buffer.concat([cmd('MULTI'), cmd('DISCARD')]));
    expect([tx.inMulti, tx.closed]).toEqual([false, true]);
  });

  it('does not count QUIT inside MULTI as queued: Redis runs it at once', () => {
    const tx = new TransactionState();
    feed(tx, Buffer.concat([cmd('MULTI'), cmd('SET', 'a', '1'), cmd('QUIT')]));
    expect([tx.queued, tx.queuedIndex]).toEqual([1, -1]);
  });

  it('changes nothing on the wrong arity, as Redis refuses those commands before they run', () => {
    const tx = new TransactionState();
    feed(tx, cmd('MULTI', 'x'));
    expect(tx.inMulti).toBe(false);
    feed(tx, cmd('WATCH'));
    expect(tx.watching).toBe(false);
    feed(tx, cmd('WATCH', 'k'));
    expect(tx.watching).toBe(true);
    feed(tx, Buffer.concat([cmd('UNWATCH', 'x'), cmd('RESET', 'x')]));
    expect(tx.watching).toBe(true);
    feed(tx, Buffer.concat([cmd('MULTI'), cmd('DISCARD', 'y')]));
    expect(tx.inMulti).toBe(true);
    feed(tx, 'DISCARD x\r\n'); // inline too
    expect(tx.inMulti).toBe(true);
    feed(tx, cmd('EXEC'));
    expect([tx.inMulti, tx.watching]).toEqual([false, false]); // EXEC unwatches
  });

  it('ends the transaction on EXEC even when Redis refuses it (it aborts: execCommandAbort)', () => {
    const tx = new TransactionState();
    feed(tx, Buffer.concat([cmd('WATCH', 'k'), cmd('MULTI'), cmd('EXEC', 'x')]));
    expect([tx.inMulti, tx.watching, tx.closed, tx.canStartBlock]).toEqual([false, false, true, true]);
  });

  it('keeps a WATCH set outside a transaction only, and a nested MULTI is not queued', () => {
    const tx = new TransactionState();
    feed(tx, Buffer.concat([cmd('MULTI'), cmd('WATCH', 'k'), cmd('MULTI')]));
    expect([tx.watching, tx.queued, tx.inMulti]).toEqual([false, 0, true]);
    feed(tx, cmd('UNWATCH'));
    expect(tx.queued).toBe(1); // queued inside MULTI, like any command but the transaction's own
  });

  it('keeps the WATCH on an EXEC or DISCARD without MULTI (Redis refuses them)', () => {
    const tx = new TransactionState();
    feed(tx, Buffer.concat([cmd('WATCH', 'k'), cmd('EXEC'), cmd('DISCARD'), cmd('DISCARD', 'x')]));
    expect([tx.watching, tx.closed, tx.canStartBlock]).toEqual([true, false, false]);
  });

  it('unwatches on an EXEC refused for its arity outside MULTI (rejectCommand aborts, unwatching)', () => {
    const tx = new TransactionState();
    feed(tx, Buffer.concat([cmd('WATCH', 'k'), cmd('EXEC', 'x')]));
    expect([tx.watching, tx.inMulti, tx.canStartBlock]).toEqual([false, false, true]);
  });

  it('takes RESET for an unknown command where the server has none (before 6.2): nothing ends', () => {
    const tx = new TransactionState();
    tx.resetKnown = false;
    feed(tx, Buffer.concat([cmd('WATCH', 'k'), cmd('RESET'), cmd('MULTI'), cmd('RESET')]));
    expect([tx.inMulti, tx.watching, tx.closed, tx.queued]).toEqual([true, true, false, 0]);
  });

  it('says what the last frame did, for that frame only', () => {
    const tx = new TransactionState();
    feed(tx, cmd('MULTI'));
    expect([tx.opened, tx.closed, tx.queuedIndex]).toEqual([true, false, -1]);
    feed(tx, cmd('GET', 'k'));
    expect([tx.opened, tx.closed, tx.queuedIndex]).toEqual([false, false, 0]);
    feed(tx, cmd('EXEC'));
    expect([tx.opened, tx.closed, tx.queuedIndex]).toEqual([false, true, -1]);
    feed(tx, cmd('GET', 'k'));
    expect([tx.opened, tx.closed, tx.queuedIndex]).toEqual([false, false, -1]);
  });

  it('queues nothing of the transaction’s own inside it (WATCH, RESET, an empty frame)', () => {
    const tx = new TransactionState();
    feed(tx, Buffer.concat([cmd('MULTI'), cmd('WATCH', 'k'), Buffer.from('*0\r\n'), cmd('SET', 'a', '1')]));
    expect([tx.queued, tx.watching]).toEqual([1, false]);
  });

  it('forgets ASKING once a lock block has used it', () => {
    const tx = new TransactionState();
    feed(tx, cmd('ASKING'));
    tx.blockRewritten();
    expect(tx.afterAsking).toBe(false);
  });

  it('leaves everything on RESET, inside a transaction too', () => {
    const tx = new TransactionState();
    feed(tx, Buffer.concat([cmd('WATCH', 'k'), cmd('MULTI'), cmd('RESET')]));
    expect([tx.inMulti, tx.watching, tx.closed]).toEqual([false, false, true]);
  });

  it('remembers ASKING for exactly one command', () => {
    const tx = new TransactionState();
    feed(tx, cmd('ASKING'));
    expect(tx.afterAsking).toBe(true);
    feed(tx, cmd('GET', 'k'));
    expect(tx.afterAsking).toBe(false);
  });

  it('finds the frames after which replies cannot be counted, and the frames with no reply', () => {
    for (const frame of [
      cmd('SUBSCRIBE', 'c'),
      cmd('PSUBSCRIBE', 'c*'),
      cmd('MONITOR'),
      cmd('CLIENT', 'REPLY', 'OFF'),
      cmd('client', 'reply', 'skip'),
      cmd('CLIENT', 'REPLY'), // refused by Redis (arity), but counted as a pipe all the same
      'CLIENT LIST\r\n',
      'SET k "a b"\r\n',
      cmd('REPLCONF', 'ACK', '0'),
      cmd('replconf', 'getack', '*'),
    ]) {
      expect(feed(new TransactionState(), frame), JSON.stringify(String(frame))).toEqual([FrameMeaning.Untrackable]);
    }
    for (const frame of [cmd('SYNC'), cmd('PSYNC', '?', '-1'), 'SYNC\r\n']) {
      expect(feed(new TransactionState(), frame), JSON.stringify(String(frame))).toEqual([FrameMeaning.Replication]);
    }
    expect(feed(new TransactionState(), Buffer.concat([Buffer.from('\r\n'), Buffer.from('*0\r\n'), cmd('CLIENT', 'LIST')]))).toEqual([
      FrameMeaning.NoReply,
      FrameMeaning.NoReply,
      FrameMeaning.Reply,
    ]);
    for (const frame of [cmd('CLIENT'), cmd('CLIENT', 'REPLI'), cmd('CLIENT', 'KILL', 'ID', '5'), cmd('CLIENT', 'REPLYX', 'ON')]) {
      expect(feed(new TransactionState(), frame), String(frame)).toEqual([FrameMeaning.Reply]);
    }
  });

  it('follows a released lock block: inside the transaction, or out of it after its EXEC', () => {
    const tx = new TransactionState();
    feed(tx, cmd('ASKING'));
    tx.blockSent(2, false); // MULTI and INCRBY went upstream, the rest was not a block
    expect([tx.inMulti, tx.queued, tx.afterAsking]).toEqual([true, 1, false]);
    feed(tx, cmd('GET', 'k'));
    expect(tx.queuedIndex).toBe(1);
    tx.blockSent(4, true);
    expect([tx.inMulti, tx.watching, tx.queued]).toEqual([false, false, 0]);
  });
});
