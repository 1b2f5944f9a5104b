/**
 * Node addresses in cluster replies, rewritten to the proxy's listeners.
 *
 * A cluster client learns where nodes are from CLUSTER SLOTS, SHARDS and
 * NODES (REPLICAS and SLAVES use NODES lines), and from -MOVED / -ASK errors.
 * Each such address is replaced by the proxy listener in front of that node,
 * so that the client never connects to a node directly. Everything else in
 * the reply stays byte for byte as Redis sent it.
 *
 * An endpoint of "?" or "" (cluster-preferred-endpoint-type unknown-endpoint,
 * or a node without the hostname asked for) means "the host you are connected
 * to": it is kept, because the client is connected to the proxy.
 *
 * Only nodes of the proxy's own topology have listeners. A reply can name any
 * address (a script can return `-MOVED 1 <anywhere>`, a node can be told to
 * meet anyone): an address the topology does not have is left as Redis wrote
 * it, and never dialled.
 */
import { decodeReply, encodeReply, integerOf, pairsOf, setInteger, setText, textOf, type RespValue } from '../resp/value.js';

/** The proxy's node listeners, as the rewriting needs them. */
export interface NodeDirectory {
  /** Listener port of the node with this cluster node id, if known. */
  portForId(id: string): number | undefined;
  /**
   * Listener port of the node at this upstream address (an IP or host name
   * and a port), if the proxy knows the node. Nodes come only from the
   * proxy's own topology queries: an address seen only in a reply gets no
   * listener, and is never dialled.
   */
  portForAddress(host: string, port: number): number | undefined;
  /** A -MOVED was seen: the slot map changed (the topology is refreshed soon). */
  noteRedirect(): void;
  /**
   * A reply named this address, which no node of the topology has: the reply
   * names it as Redis wrote it. Counted and logged; the topology is asked
   * again soon (the node may have joined since).
   */
  unknownNode(host: string, port: number, where: 'redirect' | 'topology'): void;
  /** Settles once the topology has been asked again and new listeners are bound, or after the connect timeout. */
  askAgain(): Promise<void>;
}

/** rewriteRedirect's answer for a redirect to an address that no node of the topology has. */
export class UnknownNode {
  constructor(
    readonly host: string,
    readonly port: number,
  ) {}
}

/** What one client connection's replies are rewritten with. */
export interface Announce {
  /** Written wherever a node address was: the announce host, or the address the client connected to. */
  readonly host: string;
  /** The upstream host of this connection: what an endpoint of "?" or "" stands for. */
  readonly upstreamHost: string;
  /** The proxy reaches nodes over TLS: a node's TLS port is the one it knows it by. */
  readonly tls?: boolean;
  /** The client's own connection is TLS: CLUSTER SHARDS names the listener `tls-port`, else `port`. */
  readonly listenerTls?: boolean;
}

/** CLUSTER subcommands whose replies carry node addresses. */
export type TopologyReply = 'slots' | 'shards' | 'nodes' | 'replicas';

const SUBCOMMANDS = new Map<string, TopologyReply>([
  ['slots', 'slots'],
  ['shards', 'shards'],
  ['nodes', 'nodes'],
  ['replicas', 'replicas'],
  ['slaves', 'replicas'],
]);

/** The reply kind of `CLUSTER <subcommand>`, or null when its reply names no node address. */
export function topologyReplyOf(subcommand: string): TopologyReply | null {
  return SUBCOMMANDS.get(subcommand.toLowerCase()) ?? null;
}

function isNull(value: RespValue): boolean {
  return (value.kind === 'bulk' && value.data === null) || value.type === 0x5f; /* _ */
}

function unspecified(endpoint: string): boolean {
  return endpoint === '' || endpoint === '?';
}

/** Splits `host:port` at its last colon (Redis writes IPv6 addresses unbracketed). */
function splitAddress(address: string): { host: string; port: number } | null {
  const colon = address.lastIndexOf(':');
  if (colon === -1) return null;
  const port = address.slice(colon + 1);
  if (!/^\d{1,5}$/.test(port)) return null;
  return { host: address.slice(0, colon).replace(/^\[(.*)\]$/, '$1'), port: Number(port) };
}

/** The listener port of a node named in a reply: by id, else by address. */
function lookup(nodes: NodeDirectory, announce: Announce, id: string | null, endpoint: string, port: number): number | undefined {
  return (id !== null ? nodes.portForId(id) : undefined) ?? nodes.portForAddress(nodeHost(announce, endpoint), port);
}

/** The host a reply names a node by: an endpoint of "?" or "" is the host of this connection's node. */
function nodeHost(announce: Announce, endpoint: string): string {
  return unspecified(endpoint) ? announce.upstreamHost : endpoint;
}

const REDIRECT = /^-(MOVED|ASK) (\d+) (.*)$/;

/**
 * Rewrites a `-MOVED slot host:port` or `-ASK slot host:port` error line
 * (CRLF included); returns null for any other error, and an UnknownNode for
 * a redirect to an address no node of the topology has (the caller decides:
 * wait for the topology to be asked again, or pass the line on as it is).
 */
export function rewriteRedirect(line: Buffer, nodes: NodeDirectory, announce: Announce): Buffer | null | UnknownNode {
  if (line.length < 6 || (line[1] !== 0x4d && line[1] !== 0x41)) return null; // neither -M(OVED) nor -A(SK)
  const match = REDIRECT.exec(line.toString('latin1', 0, line.length - 2));
  if (match === null) return null;
  const address = splitAddress(match[3]);
  if (address === null) return null;
  if (match[1] === 'MOVED') nodes.noteRedirect();
  const port = lookup(nodes, announce, null, address.host, address.port);
  if (port === undefined) return new UnknownNode(nodeHost(announce, address.host), address.port);
  // Redis writes an IPv6 address unbracketed here; so does the proxy.
  const host = unspecified(address.host) ? address.host : announce.host;
  return Buffer.from(`-${match[1]} ${match[2]} ${host}:${port}\r\n`, 'latin1');
}

/**
 * Rewrites the reply to a CLUSTER SLOTS, SHARDS, NODES or REPLICAS command.
 * `kind` null: the subcommand is not known (an inline command), and the
 * reply's shape tells. A reply of any other shape (an error, for one) is
 * returned unchanged.
 */
export function rewriteTopologyReply(kind: TopologyReply | null, reply: Buffer, nodes: NodeDirectory, announce: Announce): Buffer {
  const value = decodedOrNull(reply);
  if (value === null) return reply;
  const rewrite = new Rewriter(nodes, announce);
  const changed = kind === null ? rewrite.anyShape(value) : rewrite.byKind(kind, value);
  return changed ? encodeReply(value) : reply;
}

/** The reply as a tree; null when it cannot be read (it then goes to the client as it is). */
function decodedOrNull(reply: Buffer): RespValue | null {
  try {
    return decodeReply(reply).value;
  } catch {
    return null;
  }
}

/** A CLUSTER SLOTS-like command queued in a transaction: its position among the queued commands. */
export interface QueuedTopology {
  readonly index: number;
  readonly kind: TopologyReply | null;
}

/** Rewrites the replies of queued CLUSTER SLOTS-like commands inside an EXEC reply. */
export function rewriteExecReply(entries: readonly QueuedTopology[], reply: Buffer, nodes: NodeDirectory, announce: Announce): Buffer {
  const value = decodedOrNull(reply);
  if (value === null) return reply;
  if (value.kind !== 'aggregate' || value.items === null) return reply; // aborted, or WATCH failed
  const rewrite = new Rewriter(nodes, announce);
  let changed = false;
  for (const { index, kind } of entries) {
    const item = value.items[index];
    if (item !== undefined) changed = (kind === null ? rewrite.anyShape(item) : rewrite.byKind(kind, item)) || changed;
  }
  return changed ? encodeReply(value) : reply;
}

class Rewriter {
  constructor(
    private readonly nodes: NodeDirectory,
    private readonly announce: Announce,
  ) {}

  byKind(kind: TopologyReply, value: RespValue): boolean {
    switch (kind) {
      case 'slots':
        return this.slots(value);
      case 'shards':
        return this.shards(value);
      case 'nodes':
        return this.nodesText(value);
      case 'replicas':
        return this.replicas(value);
    }
  }

  /** Tells the reply's kind from its shape: for an inline CLUSTER command, whose arguments the proxy does not read. */
  anyShape(value: RespValue): boolean {
    if (value.kind === 'bulk') return this.nodesText(value);
    if (value.kind !== 'aggregate' || value.items === null || value.items.length === 0) return false;
    const first = value.items[0];
    if (first.kind === 'bulk') return this.replicas(value);
    if (first.kind !== 'aggregate' || first.items === null) return false;
    if (integerOf(first.items[0]) !== null && first.items[0].kind === 'line') return this.slots(value);
    if (pairsOf(first)?.some(([key]) => key === 'nodes')) return this.shards(value);
    return false;
  }

  /** CLUSTER SLOTS: `[start, end, [endpoint, port, id, {ip, hostname}], ...replicas]` per range. */
  private slots(value: RespValue): boolean {
    if (value.kind !== 'aggregate' || value.items === null) return false;
    let changed = false;
    for (const range of value.items) {
      if (range.kind !== 'aggregate' || range.items === null) continue;
      for (const node of range.items.slice(2)) {
        if (node.kind !== 'aggregate' || node.items === null || node.items.length < 2) continue;
        const [endpointValue, portValue, idValue, metadata] = node.items;
        // unknown-endpoint: a null instead of the host.
        const endpoint = isNull(endpointValue) ? '' : textOf(endpointValue);
        const port = integerOf(portValue);
        if (endpoint === null || port === null) continue;
        const proxyPort = this.listenerOf(textOf(idValue), endpoint, port);
        if (proxyPort === undefined) continue;
        if (!unspecified(endpoint)) setText(endpointValue, this.announce.host);
        setInteger(portValue, proxyPort);
        for (const [key, field] of pairsOf(metadata) ?? []) {
          if (key === 'ip' || key === 'hostname') this.hostField(field);
        }
        changed = true;
      }
    }
    return changed;
  }

  /** CLUSTER SHARDS: `[{slots, nodes: [{id, port, tls-port, ip, endpoint, hostname, ...}]}]`. */
  private shards(value: RespValue): boolean {
    if (value.kind !== 'aggregate' || value.items === null) return false;
    let changed = false;
    for (const shard of value.items) {
      const nodeList = pairsOf(shard)?.find(([key]) => key === 'nodes')?.[1];
      if (nodeList === undefined || nodeList.kind !== 'aggregate' || nodeList.items === null) continue;
      for (const node of nodeList.items) {
        const fields = new Map(pairsOf(node) ?? []);
        const id = textOf(fields.get('id'));
        const ip = textOf(fields.get('ip')) ?? '';
        const endpoint = textOf(fields.get('endpoint')) ?? ip;
        const portValue = this.announce.tls
          ? (fields.get('tls-port') ?? fields.get('port'))
          : (fields.get('port') ?? fields.get('tls-port'));
        const port = integerOf(portValue);
        if (port === null) continue;
        const proxyPort = this.listenerOf(id, unspecified(ip) ? endpoint : ip, port);
        if (proxyPort === undefined) continue;
        this.listenerPort(node, proxyPort);
        for (const [key, field] of fields) {
          if (key === 'ip' || key === 'hostname') {
            this.hostField(field);
          } else if (key === 'endpoint' && !unspecified(textOf(field) ?? '')) {
            setText(field, this.announce.host);
          }
        }
        changed = true;
      }
    }
    return changed;
  }

  /**
   * A SHARDS node lists `port` (plain) and/or `tls-port`, as Redis serves it.
   * The proxy serves it on one listener, plain or TLS as the client's own
   * connection: one field, named for that, with the listener's port.
   */
  private listenerPort(node: RespValue, proxyPort: number): void {
    if (node.kind !== 'aggregate' || node.items === null) return;
    const items = node.items;
    let placed = false;
    for (let i = 0; i < items.length; i += 2) {
      const key = textOf(items[i]);
      if (key !== 'port' && key !== 'tls-port') continue;
      if (placed) {
        items.splice(i, 2);
        i -= 2;
        continue;
      }
      setText(items[i], this.announce.listenerTls ? 'tls-port' : 'port');
      setInteger(items[i + 1], proxyPort);
      placed = true;
    }
  }

  /** CLUSTER REPLICAS / SLAVES: one NODES line per replica. */
  private replicas(value: RespValue): boolean {
    if (value.kind !== 'aggregate' || value.items === null) return false;
    let changed = false;
    for (const item of value.items) changed = this.nodesText(item) || changed;
    return changed;
  }

  /** CLUSTER NODES text: `<id> <ip:port@cport[,hostname]> <flags> ...` per line. */
  private nodesText(value: RespValue): boolean {
    const text = textOf(value);
    if (text === null) return false;
    let changed = false;
    const lines = text.split('\n').map((line) => {
      const fields = line.split(' ');
      if (fields.length < 3) return line;
      const address = this.nodeAddress(fields[0], fields[1]);
      if (address === null) return line;
      fields[1] = address;
      changed = true;
      return fields.join(' ');
    });
    if (changed) setText(value, lines.join('\n'));
    return changed;
  }

  /** `ip:port@cport[,hostname]` with the proxy's listener; null when it names no reachable node. */
  private nodeAddress(id: string, field: string): string | null {
    const at = field.indexOf('@');
    if (at === -1) return null;
    const address = splitAddress(field.slice(0, at));
    if (address === null || address.port === 0) return null; // a node without an address yet
    const proxyPort = this.listenerOf(id, address.host, address.port);
    if (proxyPort === undefined) return null;
    const comma = field.indexOf(',', at);
    const bus = comma === -1 ? field.slice(at) : field.slice(at, comma);
    const hostname = comma === -1 ? null : field.slice(comma + 1);
    const host = address.host === '' ? '' : this.announce.host;
    return `${host}:${proxyPort}${bus}${hostname === null ? '' : `,${hostname === '' ? '' : this.announce.host}`}`;
  }

  /** The listener port of a node the reply names; a node the topology does not have is left as Redis wrote it. */
  private listenerOf(id: string | null, endpoint: string, port: number): number | undefined {
    const proxyPort = lookup(this.nodes, this.announce, id, endpoint, port);
    if (proxyPort === undefined) this.nodes.unknownNode(nodeHost(this.announce, endpoint), port, 'topology');
    return proxyPort;
  }

  /** An ip or hostname field: the announce host, unless the node has none. */
  private hostField(field: RespValue): void {
    const text = textOf(field);
    if (text !== null && text !== '' && text !== '?') setText(field, this.announce.host);
  }
}
