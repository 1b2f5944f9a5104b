/**
 * UpstreamWatch's clock (--upstream-timeout-ms), on fake timers: when it starts, what counts as
 * progress, and what stops it. The behaviour in front of a real Redis is in
 * e2e/upstream-sanity.test.ts.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { UpstreamWatch, type UpstreamWatchPort } from '../src/session/upstream-watch.js';

const TIMEOUT_MS = 1000;

/** A session with `due` replies outstanding, recording when the watch gives up on it. */
class FakeSession implements UpstreamWatchPort {
  due = 0;
  silent: number[] = [];
  get awaitingReply(): boolean {
    return this.due > 0;
  }
  upstreamSilent(): void {
    this.silent.push(Date.now());
  }
  fault(error: unknown): void {
    throw error;
  }
}

describe('UpstreamWatch', () => {
  let session: FakeSession;
  let watch: UpstreamWatch;

  beforeEach(() => {
    vi.useFakeTimers({ now: 0 });
    session = new FakeSession();
    watch = new UpstreamWatch(TIMEOUT_MS, session);
  });
  afterEach(() => {
    watch.stop();
    vi.useRealTimers();
  });

  /** The client sends one request. */
  const send = (): void => {
    session.due++;
    watch.sent();
  };
  /** Redis answers `n` requests in one read. */
  const answer = (n = 1): void => {
    session.due -= n;
    watch.heard();
  };

  it('gives up when nothing comes for the whole timeout while a reply is due', () => {
    send();
    vi.advanceTimersByTime(TIMEOUT_MS - 1);
    expect(session.silent).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(session.silent).toEqual([TIMEOUT_MS]);
  });

  it('counts any bytes from Redis as progress: a long pipeline answered bit by bit is not cut', () => {
    for (let i = 0; i < 10; i++) send();
    for (let i = 0; i < 10; i++) {
      vi.advanceTimersByTime(TIMEOUT_MS - 100);
      answer();
    }
    vi.advanceTimersByTime(10 * TIMEOUT_MS);
    expect(session.silent).toEqual([]);
  });

  it('gives a request sent after all replies came the whole timeout, not what the one before left', () => {
    send();
    vi.advanceTimersByTime(10);
    answer();
    vi.advanceTimersByTime(TIMEOUT_MS - 20); // idle, nothing due
    send(); // 10 ms before the first request's clock would have run out
    vi.advanceTimersByTime(TIMEOUT_MS - 1);
    expect(session.silent).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(session.silent).toEqual([2 * TIMEOUT_MS - 10]);
  });

  it('lets a blocking command wait, and watches the connection again once it is answered', () => {
    send();
    watch.blockingSent();
    vi.advanceTimersByTime(5 * TIMEOUT_MS);
    expect(session.silent).toEqual([]);
    answer();
    send(); // an ordinary command on the same connection
    vi.advanceTimersByTime(TIMEOUT_MS);
    expect(session.silent).toEqual([6 * TIMEOUT_MS]);
  });

  it('does not run while the proxy reads nothing from Redis (a client slow to read), and runs whole again after', () => {
    send();
    vi.advanceTimersByTime(TIMEOUT_MS - 100);
    watch.pause(true);
    vi.advanceTimersByTime(5 * TIMEOUT_MS);
    expect(session.silent).toEqual([]);
    watch.pause(false);
    vi.advanceTimersByTime(TIMEOUT_MS - 1);
    expect(session.silent).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(session.silent).toEqual([7 * TIMEOUT_MS - 100]);
  });

  it('never fires once stopped', () => {
    send();
    watch.stop();
    vi.advanceTimersByTime(10 * TIMEOUT_MS);
    expect(session.silent).toEqual([]);
  });
});
