/**
 * RefusalLog on its own (fake timers): the first refused client connection is logged at once,
 * the ones after it are counted, with their errors, and logged as one line per period while
 * they go on. (With a proxy whose upstream is down: e2e/refused-connections-log.test.ts.)
 */
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { RefusalLog } from '../src/upstream/refusal-log.js';

function capturing() {
  const lines: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
      done();
    },
  });
  return { log: pino({ level: 'info' }, sink), lines };
}

const flushed = () => new Promise((resolve) => setImmediate(resolve));

describe('RefusalLog', () => {
  beforeEach(() => vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] }));
  afterEach(() => vi.useRealTimers());

  it('logs the first refusal at once and the rest as one line per period, with counts by error', async () => {
    const { log, lines } = capturing();
    const refusals = new RefusalLog(log, 10_000);
    for (let i = 0; i < 1500; i++)
      refusals.refused('redis://r:6379', '10.0.0.1:6379', i % 3 === 0 ? 'connect ETIMEDOUT' : 'connect ECONNREFUSED');
    await flushed();
    expect(lines.map((l) => l.msg)).toEqual(['upstream unreachable']);
    expect(lines[0]).toMatchObject({ level: 40, upstream: 'redis://r:6379', address: '10.0.0.1:6379', err: 'connect ETIMEDOUT' });

    vi.advanceTimersByTime(10_000);
    await flushed();
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatchObject({
      msg: 'upstream unreachable: more client connections refused',
      level: 40,
      upstream: 'redis://r:6379',
      refused: 1499,
      periodMs: 10_000,
      errors: { 'connect ECONNREFUSED': 1000, 'connect ETIMEDOUT': 499 },
    });

    // Still refusing: one line for the next period.
    refusals.refused('redis://r:6379', '10.0.0.1:6379', 'connect ECONNREFUSED');
    vi.advanceTimersByTime(10_000);
    await flushed();
    expect(lines[2]).toMatchObject({ refused: 1, errors: { 'connect ECONNREFUSED': 1 } });

    // A quiet period ends the count; the next refusal is logged at once again.
    vi.advanceTimersByTime(10_000);
    refusals.refused('redis://r:6379', '10.0.0.1:6379', 'connect ECONNREFUSED');
    await flushed();
    expect(lines.map((l) => l.msg).slice(3)).toEqual(['upstream unreachable']);
    refusals.close();
  });
});
