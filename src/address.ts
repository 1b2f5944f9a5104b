/**
 * A host and port as text, written the one way the proxy writes them (logs, messages, keys of
 * the cluster's node maps) and read back the same way: `host:port`, with an IPv6 literal in
 * brackets.
 */
import { ConfigError } from './errors.js';

export interface Address {
  readonly host: string;
  readonly port: number;
}

/** `127.0.0.1:6380`, `redis-1.svc:6379`, `[::1]:6380`. */
export function formatAddress(host: string, port: number): string {
  // Only an IPv6 literal holds a colon; unbracketed, its last group would read as the port.
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/**
 * `HOST:PORT` (`[v6]:PORT`; a bare `PORT` means 127.0.0.1), as formatAddress writes it; `what`
 * names the setting in the error.
 */
export function parseAddress(text: string, what = 'listen address'): Address {
  const match = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(text) ?? /^()()(\d+)$/.exec(text);
  const port = match ? Number(match[3]) : NaN;
  if (!match || !(port >= 0 && port <= 65535)) {
    throw new ConfigError(`${what} "${text}" is not HOST:PORT (for example 127.0.0.1:6380 or [::1]:6380)`);
  }
  const host = match[1] ?? match[2];
  return { host: host === '' ? '127.0.0.1' : host, port };
}

/** `::ffff:127.0.0.1` (an IPv4 peer of a dual-stack socket) is 127.0.0.1; any other address as it is. */
export function unmappedIpv4(address: string): string {
  return address.replace(/^::ffff:(?=\d+\.\d+\.\d+\.\d+$)/i, '');
}
