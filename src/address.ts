/**
 * A host and port as text, written the one way the proxy writes them (logs, messages, keys of
 * the cluster's node maps): `host:port`, with an IPv6 literal in brackets, which is the form
 * parseListen (config.ts) reads back.
 */

/** `127.0.0.1:6380`, `redis-1.svc:6379`, `[::1]:6380`. */
export function formatAddress(host: string, port: number): string {
  // Only an IPv6 literal holds a colon; unbracketed, its last group would read as the port.
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}
