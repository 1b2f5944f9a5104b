/**
 * ioredis connections of the proxy's own to the upstream, for what it asks itself (a cluster's
 * topology, the lock scan, the `locks` command): the URL's credentials and database, TLS as
 * the proxy's upstream settings say, and no retries or offline queue (a failure is reported,
 * not hidden).
 */
import net from 'node:net';
import { Redis, type RedisOptions } from 'ioredis';
import type { UpstreamTls } from '../config.js';
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
  const host = where.host;
  return {
    ...where,
    username: target.username,
    password: target.password,
    db: target.db, // a cluster has only 0 (the config refuses another); behind Sentinel, the URL's
    ...(target.tls ? { tls: tlsOptions(tls, host) } : {}),
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

/** rediss://: the CA, client certificate and server name given, else the system's CAs and the host. */
function tlsOptions(tls: UpstreamTls | null, host: string | undefined): NonNullable<RedisOptions['tls']> {
  // SNI carries host names only; an IP address is verified against the certificate's IP entries.
  const servername = tls?.servername ?? (host !== undefined && net.isIP(host) === 0 ? host : undefined);
  return { ca: tls?.ca, cert: tls?.cert, key: tls?.key, servername, rejectUnauthorized: !(tls?.insecure ?? false) };
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
