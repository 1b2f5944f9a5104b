/**
 * An upstream that is the proxy's own listen address would send every connection back through
 * the proxy, one more hop each time, until the connection limit ("max number of clients
 * reached"). That is a configuration mistake, refused at start: the upstream's port is the
 * listen port, and one of its addresses is one the listener accepts on.
 */
import { lookup } from 'node:dns/promises';
import net from 'node:net';
import os from 'node:os';
import { formatAddress, unmappedIpv4, type Address } from '../address.js';
import { ConfigError } from '../errors.js';
import type { UpstreamTarget } from './target.js';

export async function refuseSelfLoop(listen: Address, upstreams: readonly UpstreamTarget[]): Promise<void> {
  if (listen.port === 0) return; // an ephemeral port: no URL can name it in advance
  let accepted: Set<string> | undefined;
  for (const upstream of upstreams) {
    if (upstream.host === undefined || upstream.port !== listen.port) continue;
    const listening = (accepted ??= await listenerAddresses(listen.host));
    const dialled = await addressesOf(upstream.host);
    if (dialled.some((address) => listening.has(address))) {
      throw new ConfigError(
        `upstream ${upstream.display} is the proxy's own listen address ${formatAddress(listen.host, listen.port)}: ` +
          'every connection would come back through the proxy; point upstream at Redis',
      );
    }
  }
}

/** The addresses a listener on `host` accepts connections on: every local one for a wildcard. */
async function listenerAddresses(host: string): Promise<Set<string>> {
  if (host !== '0.0.0.0' && host !== '::') return new Set(await addressesOf(host));
  const local = Object.values(os.networkInterfaces()).flatMap((list) => (list ?? []).map((entry) => entry.address));
  return new Set([...local, '127.0.0.1', '::1'].map(normalized));
}

/** What a host name resolves to (an unresolvable name is no address of the proxy's). */
async function addressesOf(host: string): Promise<string[]> {
  if (net.isIP(host) !== 0) return [normalized(host)];
  try {
    return (await lookup(host, { all: true })).map((entry) => normalized(entry.address));
  } catch {
    return [];
  }
}

/** One spelling of an address: IPv4 unmapped, IPv6 in lower case. */
function normalized(address: string): string {
  return unmappedIpv4(address).toLowerCase();
}
