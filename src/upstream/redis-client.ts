/**
 * ioredis connections of the proxy's own to the upstream, for what it asks itself (a cluster's
 * topology, the lock scan, the `locks` command): the URL's credentials and database, TLS as
 * the proxy's upstream settings say, and no retries or offline queue (a failure is reported,
 * not hidden).
 */
import { Redis, type RedisOptions } from 'ioredis';
import type { UpstreamTls } from '../config.js';
import { upstreamTlsOptions } from './connect.js';
import type { UpstreamTarget } from './target.js';

/**
 * Options for a connection to `target`, or to `node` (another node of the same deployment: a
 * cluster master, the master of the moment) with the target's credentials and TLS.
 */
export function upstreamRedisOptions(
  target: UpstreamTarget,
  tls: UpstreamTls | null,
  timeoutMs: number,
  node?: { host: string; port: number },
): RedisOptions {
  const where: RedisOptions =
    node !== undefined
      ? { host: node.host, port: node.port }
      : target.path !== undefined
        ? { path: target.path }
        : { host: target.host, port: target.port };
  return {
    ...where,
    username: target.username,
    password: target.password,
    db: target.db, // a cluster has only 0 (the config refuses another); behind Sentinel, the URL's
    ...(target.tls ? { tls: upstreamTlsOptions(tls, where.host) } : {}),
    ...reportingOptions(timeoutMs),
  };
}

/**
 * A connection that reports rather than hides: it connects when asked, never retries or queues,
 * and sends no CLIENT SETINFO/SETNAME (an error reply to one of those, say a proxy's "upstream
 * unreachable", would be swallowed, and only the connection's close be seen).
 */
export function reportingOptions(timeoutMs: number): RedisOptions {
  return {
    lazyConnect: true,
    connectTimeout: timeoutMs,
    commandTimeout: timeoutMs,
    enableReadyCheck: false,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    disableClientInfo: true,
  };
}

/**
 * Connects, and says why when it cannot: the client's error event knows better than the failed
 * connect (a refused AUTH, a TLS failure). The caller disconnects.
 */
export async function connectRedis(options: RedisOptions): Promise<{ redis: Redis; lastError: () => Error | undefined }> {
  const redis = new Redis(options);
  let lastError: Error | undefined;
  redis.on('error', (error: Error) => {
    lastError = error;
  });
  try {
    await redis.connect();
  } catch (error) {
    redis.disconnect();
    throw lastError ?? error;
  }
  return { redis, lastError: () => lastError };
}

/** An error reply from the server (as opposed to a connection problem). */
export function isReplyError(error: unknown): boolean {
  return error instanceof Error && error.name === 'ReplyError';
}
