/**
 * Talking to one sentinel, for the monitor (sentinel.ts): the settings of its connections, the
 * queries and the parsing of their replies and of `+switch-master` messages, waits that end on
 * time or when the monitor closes, and closing a connection for good. What the answers mean
 * for the proxy is the monitor's business.
 */
import { Redis, type RedisOptions } from 'ioredis';
import { ClosedError, TimeoutError } from '../errors.js';
import type { Address } from '../address.js';

const CONNECT_TIMEOUT_MS = 2_000;
const MAX_RECONNECT_DELAY_MS = 2_000;
/** Upper bound on waiting for ioredis to report a closed connection in endClient(). */
const CLOSE_WAIT_MS = 1_000;
const DISCONNECT_TIMEOUT_MS = 100;

/** Where a sentinel is, and the credentials for the sentinels themselves. */
export interface SentinelEndpoint {
  readonly host: string;
  readonly port: number;
  readonly username?: string;
  readonly password?: string;
}

/** ioredis settings for a connection to a sentinel, for queries or for the subscription. */
export function sentinelClientOptions(sentinel: SentinelEndpoint): RedisOptions {
  return {
    host: sentinel.host,
    port: sentinel.port,
    username: sentinel.username,
    password: sentinel.password,
    lazyConnect: true,
    // Queries made while (re)connecting wait for the connection; a failed
    // attempt rejects them at once (maxRetriesPerRequest 0) and our own
    // timeouts bound the rest.
    enableOfflineQueue: true,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    // A sentinel's INFO has no `loading` field to wait for, and ACL users
    // for sentinels are often not allowed INFO.
    enableReadyCheck: false,
    // No CLIENT SETINFO on connect: ioredis (5.x, redis/event_handler.js) declares the connection
    // ready once those replies are in, even when the connection closed meanwhile (a sentinel behind
    // something that accepts and drops connections), and then queues every query forever on a
    // connection it believes ready. A sentinel needs no library name.
    disableClientInfo: true,
    connectTimeout: CONNECT_TIMEOUT_MS,
    // How long a disconnect waits for the socket to close before destroying it.
    disconnectTimeout: DISCONNECT_TIMEOUT_MS,
    keepAlive: 10_000,
    retryStrategy: (attempt: number) => Math.min(100 * 2 ** Math.min(attempt, 5), MAX_RECONNECT_DELAY_MS),
  };
}

/** `SENTINEL get-master-addr-by-name`: the reply as sent (see parseAddress). */
export function queryMasterAddress(client: Redis, masterName: string): Promise<unknown> {
  return client.call('SENTINEL', 'get-master-addr-by-name', masterName);
}

/** Why a query failed, in words: ioredis reports a failed connection attempt only as "max retries per request". */
export function failureReason(err: unknown, timeoutMs: number, client: Redis, lastError: string | undefined): string {
  // A query waiting on a connection that is being made again: the last connection error says why.
  if (err instanceof TimeoutError) return client.status !== 'ready' && lastError ? lastError : `no answer within ${timeoutMs} ms`;
  const message = err instanceof Error ? err.message : String(err);
  if (client.status !== 'ready' && lastError && /max retries|Connection is closed/i.test(message)) return lastError;
  return message;
}

/**
 * `promise`, or a TimeoutError after `ms`, or a ClosedError as soon as
 * `signal` aborts (a command queued on a client between reconnect attempts
 * is never settled by ioredis once that client is disconnected).
 */
export function withTimeout<T>(promise: Promise<T>, ms: number, signal: AbortSignal): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new TimeoutError(`no answer within ${ms} ms`)), ms);
    onAbort = () => reject(new ClosedError('sentinel monitor closed'));
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
  });
  return Promise.race([promise, limit]).finally(() => {
    clearTimeout(timer);
    if (onAbort) signal.removeEventListener('abort', onAbort);
  });
}

/** `["127.0.0.1", "6379"]` → address; anything else → undefined. */
export function parseAddress(reply: unknown): Address | undefined {
  if (!Array.isArray(reply) || reply.length !== 2) return undefined;
  const [host, portText] = reply as unknown[];
  if (typeof host !== 'string' || host === '' || typeof portText !== 'string' || !/^\d{1,5}$/.test(portText)) return undefined;
  const port = Number(portText);
  if (port < 1 || port > 65535) return undefined;
  return { host, port };
}

/**
 * A `+switch-master` message, `<master-name> <old-ip> <old-port> <new-ip> <new-port>`: the
 * master's name (which may hold spaces) and its new address (undefined when malformed);
 * undefined for a message too short to be one.
 */
export function parseSwitchMessage(message: string): { name: string; to: Address | undefined } | undefined {
  const parts = message.split(' ');
  if (parts.length < 5) return undefined;
  return { name: parts.slice(0, -4).join(' '), to: parseAddress([parts[parts.length - 2], parts[parts.length - 1]]) };
}

/**
 * Disconnects an ioredis client for good and waits until nothing of it is
 * left. A client between reconnect attempts never reports 'end'; ioredis
 * then only runs its disconnectTimeout timer on the old socket, which is
 * waited out so that close() leaves no timer behind.
 */
export function endClient(client: Redis): Promise<void> {
  const status = client.status;
  if (status === 'end') return Promise.resolve();
  if (status === 'wait') {
    client.disconnect(); // never connected: ends synchronously
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    if (status === 'reconnecting') {
      client.disconnect();
      setTimeout(resolve, DISCONNECT_TIMEOUT_MS + 10);
      return;
    }
    const timer = setTimeout(resolve, CLOSE_WAIT_MS);
    client.once('end', () => {
      clearTimeout(timer);
      resolve();
    });
    client.disconnect();
  });
}
