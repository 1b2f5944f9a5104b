/**
 * Connection churn: clients that connect per request (PHP, cron jobs, health checks, redis-cli
 * in scripts) and pools that reconnect after a restart. `concurrency` workers each open a
 * connection of one of several kinds, let it run to its end and close it, as fast as the
 * machine allows, for `seconds`:
 *
 * - PING then QUIT; a protocol error (Redis answers and closes); a Stalwart lock block, then
 *   the client closes; SUBSCRIBE then RESET; HELLO 3; half a lock block, then the client
 *   leaves (the proxy holds it until the end of the stream).
 *
 * Each worker checks only that its connection ended the way Redis ends it (the integrity stress
 * checks bytes); what is measured is the process's memory meanwhile (/proc, polled).
 */
import { Buffer } from 'node:buffer';
import net from 'node:net';
import { clearInterval, clearTimeout, setInterval, setTimeout } from 'node:timers';
import { command, HOST } from './processes.js';
import type { ProcMemory } from './memory.js';

interface Kind {
  readonly name: string;
  readonly bytes: Buffer;
  /** The replies are in: the client may close (for kinds that Redis closes itself, never asked). */
  readonly done: (received: string) => boolean;
  /** The client ends its side right after sending. */
  readonly endAtOnce?: boolean;
}

const LOCK_KEY = Buffer.concat([Buffer.from([0x17]), Buffer.alloc(8, 0x42)]);

export const CHURN_KINDS: readonly Kind[] = [
  { name: 'quit', bytes: Buffer.concat([command('PING'), command('QUIT')]), done: () => false },
  { name: 'protocol-error', bytes: Buffer.from('*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n:1\r\n'), done: () => false },
  {
    name: 'lock-block',
    bytes: Buffer.concat([command('MULTI'), command('INCRBY', LOCK_KEY, '1'), command('EXPIRE', LOCK_KEY, '3600'), command('EXEC')]),
    done: (r) => /\*2\r\n:\d+\r\n:\d\r\n$/.test(r),
  },
  {
    name: 'subscribe-reset',
    bytes: Buffer.concat([command('SUBSCRIBE', 'churn'), command('RESET')]),
    done: (r) => r.endsWith('+RESET\r\n'),
  },
  { name: 'hello-3', bytes: command('HELLO', '3'), done: (r) => r.includes('modules') },
  { name: 'half-block', bytes: Buffer.from('*1\r\n$5\r\nMULTI\r\n*3\r\n$6\r\nINCRBY\r\n'), done: () => false, endAtOnce: true },
];

export interface ChurnResult {
  seconds: number;
  connections: number;
  perSecond: number;
  /** Connections that did not end as Redis ends them (no reply, an error). */
  failed: number;
  /** Before the churn, and the highest VmRSS seen during it (polled every 20 ms) with VmHWM after. */
  before: ProcMemory;
  peakRss: number;
  after: ProcMemory;
}

/** One connection of `kind`; resolves true once it closed after its replies, false on a failure or after 10 s. */
function oneConnection(port: number, kind: Kind): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, HOST);
    let received = '';
    let settled = false;
    const finish = (ok: boolean): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => finish(false), 10_000);
    socket.on('data', (chunk: Buffer) => {
      received += chunk.toString('latin1');
      if (kind.done(received)) socket.end();
    });
    socket.on('error', () => finish(false));
    socket.on('close', () => finish(kind.endAtOnce === true || received.length > 0));
    socket.on('connect', () => {
      socket.write(kind.bytes);
      if (kind.endAtOnce) socket.end();
    });
  });
}

export interface ChurnOptions {
  concurrency: number;
  seconds: number;
  /** The memory of the process under the churn, read now (polled every 20 ms meanwhile). */
  memory: () => ProcMemory;
}

/** Runs the churn against `port`. */
export async function churn(port: number, options: ChurnOptions): Promise<ChurnResult> {
  const before = options.memory();
  let peakRss = before.rss;
  const poller = setInterval(() => {
    peakRss = Math.max(peakRss, options.memory().rss);
  }, 20);
  const t0 = Date.now();
  const deadline = t0 + options.seconds * 1000;
  let connections = 0;
  let failed = 0;
  try {
    await Promise.all(
      Array.from({ length: options.concurrency }, async (_, worker) => {
        for (let n = worker; Date.now() < deadline; n += options.concurrency) {
          const ok = await oneConnection(port, CHURN_KINDS[n % CHURN_KINDS.length]);
          connections++;
          if (!ok) failed++;
        }
      }),
    );
  } finally {
    clearInterval(poller);
  }
  const seconds = (Date.now() - t0) / 1000;
  const after = options.memory();
  return { seconds, connections, perSecond: connections / seconds, failed, before, peakRss: Math.max(peakRss, after.rss), after };
}
