/**
 * WriteBatch: the writes made while one chunk is processed leave together, one write for one
 * piece and one corked writev for several; outside a batch a write goes out at once.
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

  it('sends one piece with one write, and several corked together, at the end of the outermost batch', () => {
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
    expect(events).toEqual(['cork', 'send b', 'send c', 'send d', 'uncork']);
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
