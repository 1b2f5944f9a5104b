/**
 * A closed connection frees everything it held at once: nothing (a timer of the lingering close,
 * the wait for Redis's close after QUIT, a hold deadline, the bound on a reply of the proxy's
 * own) keeps a Session, its two sockets and their buffers alive once both sockets are closed.
 * Clients that connect per request (PHP, cron jobs, health checks, redis-cli in scripts) would
 * otherwise keep the memory of every connection of the last seconds.
 *
 * v8.queryObjects counts the Session objects still reachable (it collects garbage first); every
 * kind of connection is opened and closed, then none may be left.
 */
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import v8 from 'node:v8';
import { beforeAll, describe, expect, it } from 'vitest';
import { Session } from '../../src/session/session.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { cmd } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { lockAttempt, taskLockKey } from '../support/stalwart.js';

const env = redisAndProxy();
let facts: ServerFacts;
beforeAll(async () => {
  facts = await serverFacts(env.admin);
});

/** Sends `bytes`, reads until `done` says the replies are in (or Redis closed), then closes; resolves once closed. */
function oneConnection(bytes: Buffer, done: (received: string) => boolean, endFirst = false): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(env.proxy.port, '127.0.0.1');
    let received = '';
    const timer = setTimeout(() => reject(new Error(`no end of the replies within 10 s; got ${JSON.stringify(received)}`)), 10_000);
    socket.on('data', (chunk: Buffer) => {
      received += chunk.toString('latin1');
      if (done(received)) socket.end();
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      clearTimeout(timer);
      resolve();
    });
    socket.on('connect', () => {
      socket.write(bytes);
      if (endFirst) socket.end();
    });
  });
}

const KINDS: Array<[string, () => Promise<void>]> = [
  ['PING then QUIT', () => oneConnection(Buffer.concat([cmd('PING'), cmd('QUIT')]), (r) => r === '+PONG\r\n+OK\r\n')],
  [
    'a protocol error',
    () => oneConnection(Buffer.from('*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n:1\r\n'), (r) => r.includes('-ERR Protocol')),
  ],
  ['a lock block', () => oneConnection(lockAttempt(taskLockKey(4242n), 600), (r) => /\*2\r\n:\d+\r\n:\d\r\n$/.test(r))],
  [
    'SUBSCRIBE, then RESET',
    () =>
      oneConnection(Buffer.concat([cmd('SUBSCRIBE', 'c'), cmd('RESET'), cmd('PING')]), (r) =>
        // Where the server has no RESET (before 6.2) it refuses it, and the connection stays subscribed.
        r.endsWith(facts.has('reset') ? '+RESET\r\n+PONG\r\n' : '*2\r\n$4\r\npong\r\n$0\r\n\r\n'),
      ),
  ],
  ['HELLO 3', () => oneConnection(cmd('HELLO', '3'), (r) => r.includes('modules'))],
  ['half a lock block, then gone', () => oneConnection(Buffer.from('*1\r\n$5\r\nMULTI\r\n*3\r\n$6\r\nINCRBY\r\n'), () => false, true)],
];

describe('a closed connection', () => {
  it('leaves no Session behind, whatever kind it was', async () => {
    const before = v8.queryObjects(Session, { format: 'count' }) as number;
    for (let round = 0; round < 5; round++) {
      await Promise.all(KINDS.flatMap(([, open]) => Array.from({ length: 10 }, () => open())));
    }
    // Every client has closed; the proxy's sides close within moments (a generous 3 s on a busy
    // machine, well before the 10 s of a lingering close's longest wait), and then nothing may
    // hold their sessions.
    const deadline = Date.now() + 3000;
    let left = v8.queryObjects(Session, { format: 'count' }) as number;
    while (left > before && Date.now() < deadline) {
      await sleep(200);
      left = v8.queryObjects(Session, { format: 'count' }) as number;
    }
    expect(env.proxy.stats.connectionsOpen).toBe(0);
    expect(left - before).toBe(0);
  });
});
