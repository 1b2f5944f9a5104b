/**
 * WriteBatch: the writes made while one chunk is processed leave together, one write for one
 * piece, one write of a copy for several small ones and one corked writev for several that are
 * large together; outside a batch a write goes out at once.
 */
import type net from 'node:net';
import { describe, expect, it } from 'vitest';
import { WriteBatch } from '../src/session/write-batch.js';

function recording() {
  const events: string[] = [];
  const socket = { cork: () => events.push('cork'), uncork: () => events.push('uncork') } as unknown as net.Socket;
  const batch = new WriteBatch(socket, (bytes) => events.push(`send ${bytes.toString()}`));
  return { events, batch };
}

describe('WriteBatch', () => {
  it('sends at once outside a batch', () => {
    const { events, batch } = recording();
    batch.add(Buffer.from('a'));
    expect(events).toEqual(['send a']);
  });

  it('sends one piece with one write, and several small ones copied into one write, at the end of the outermost batch', () => {
    const { events, batch } = recording();
    batch.begin();
    batch.add(Buffer.from('a'));
    batch.end();
    expect(events).toEqual(['send a']);
    events.length = 0;
    batch.begin();
    batch.add(Buffer.from('b'));
    batch.begin(); // a nested batch (the script reply lets stalled client bytes through)
    batch.add(Buffer.from('c'));
    batch.end();
    expect(events).toEqual([]);
    batch.add(Buffer.from('d'));
    batch.end();
    expect(events).toEqual(['send bcd']);
  });

  it('corks pieces that are more than 16 KiB together into one writev, each written as it is', () => {
    const events: string[] = [];
    const sent: Buffer[] = [];
    const socket = { cork: () => events.push('cork'), uncork: () => events.push('uncork') } as unknown as net.Socket;
    const batch = new WriteBatch(socket, (bytes) => {
      events.push(`send ${bytes.length}`);
      sent.push(bytes);
    });
    const pieces = [Buffer.alloc(10_000, 'a'), Buffer.alloc(6_384, 'b'), Buffer.from('c')];
    batch.begin();
    for (const piece of pieces) batch.add(piece);
    batch.end();
    expect(events).toEqual(['cork', 'send 10000', 'send 6384', 'send 1', 'uncork']);
    expect(sent.every((bytes, i) => bytes === pieces[i])).toBe(true);
    events.length = 0;
    // 16 KiB in all is still one copy, in order.
    batch.begin();
    batch.add(pieces[0]);
    batch.add(pieces[1]);
    batch.end();
    expect(events).toEqual(['send 16384']);
    expect(sent[3].equals(Buffer.concat([pieces[0], pieces[1]]))).toBe(true);
  });

  it('flushes on demand (before a socket is ended), and keeps working afterwards', () => {
    const { events, batch } = recording();
    batch.begin();
    batch.add(Buffer.from('x'));
    batch.flush();
    expect(events).toEqual(['send x']);
    batch.add(Buffer.from('y'));
    batch.end();
    expect(events).toEqual(['send x', 'send y']);
  });
});
