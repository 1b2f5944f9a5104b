/**
 * A fault on one connection's data path ends that connection, never the process: an exception
 * thrown while a chunk is handled (injected here, where the code has none left to find) closes
 * that client's connection as a network failure would, is logged with its cause and counted,
 * while another client, mid-conversation, goes on with exactly its own bytes.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { RequestFlow } from '../../src/session/request-flow.js';
import { ReplyStream } from '../../src/session/reply-stream.js';
import { sample } from '../support/metrics.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { RawClient } from '../support/resp.js';

const env = redisAndProxy({ proxy: { admin: true } });
const TRIGGER = 'fault-37-trigger';

/** Each side's chunk handler, to put back after a test. */
const originals = { request: RequestFlow.prototype.process, reply: ReplyStream.prototype.process };
afterEach(() => {
  RequestFlow.prototype.process = originals.request;
  ReplyStream.prototype.process = originals.reply;
});

/** Makes `side`'s chunk handler throw on a chunk that holds TRIGGER, as a defect would. */
function injectFault(side: 'request' | 'reply'): void {
  const original = originals[side];
  const faulty = function (this: RequestFlow & ReplyStream, chunk: Buffer): void {
    if (chunk.includes(TRIGGER)) throw new RangeError(`injected fault (${side} side)`);
    original.call(this, chunk);
  };
  if (side === 'request') RequestFlow.prototype.process = faulty;
  else ReplyStream.prototype.process = faulty;
}

describe('a fault fails one connection', () => {
  for (const side of ['request', 'reply'] as const) {
    it(`on the ${side} side: that connection closes, logged and counted; another goes on`, async () => {
      const faults = env.proxy.stats.sessionFaults;
      const bystander = await RawClient.connect(env.proxy.port);
      expect(await bystander.call('SET', 'k37', 'before')).toBe('+OK\r\n');
      injectFault(side);
      const victim = await RawClient.connect(env.proxy.port);
      // A reply holds the trigger when the request's value does: ECHO sends it back.
      victim.write(side === 'request' ? `ECHO ${TRIGGER}\r\n` : `*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$16\r\n${TRIGGER}\r\n`);
      await victim.readUntilClosed(10_000);
      expect(victim.isClosed).toBe(true);
      expect({ counted: env.proxy.stats.sessionFaults }).toEqual({ counted: faults + 1 });
      const line = [...env.proxy.logs()].reverse().find((entry) => String(entry.msg).startsWith("fault on this connection's data path"));
      expect(line?.level).toBe(50);
      expect(JSON.stringify(line?.err)).toContain(`injected fault (${side} side)`);
      // The bystander, and a new connection, carry on; the metric says what happened.
      expect(await bystander.call('GET', 'k37')).toBe('$6\r\nbefore\r\n');
      const next = await RawClient.connect(env.proxy.port);
      expect(await next.call('PING')).toBe('+PONG\r\n');
      if (side === 'request') {
        // /metrics is rendered at most once a few seconds: its first scrape here shows this fault.
        expect(sample(await env.proxy.metrics(), 'redis_lock_proxy_session_faults_total')).toBe(faults + 1);
      }
      await next.close();
      await bystander.close();
    });
  }
});
