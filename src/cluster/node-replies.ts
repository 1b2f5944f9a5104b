/**
 * In front of a Redis Cluster (--cluster), for one client connection: the replies that name nodes are rewritten to name
 * the proxy's listeners instead. The session hands this the frames it forwards (to find
 * CLUSTER SLOTS/SHARDS/NODES/REPLICAS, also queued in a transaction) and the reply stream its
 * -MOVED/-ASK lines; a standalone session has none of this.
 */
import type net from 'node:net';
import type { TLSSocket } from 'node:tls';
import { unmappedIpv4 } from '../address.js';
import { Cmd } from '../resp/commands.js';
import type { RequestScanner } from '../resp/request-scanner.js';
import type { TransactionState } from '../session/transaction-state.js';
import type { Stats } from '../stats.js';
import type { LineWatch, PendingLine } from '../session/error-lines.js';
import {
  rewriteExecReply,
  rewriteRedirect,
  rewriteTopologyReply,
  topologyReplyOf,
  type Announce,
  type NodeDirectory,
  type QueuedTopology,
  type TopologyReply,
  UnknownNode,
} from './rewrite.js';

/** What --cluster gives each session. */
export interface ClusterReplies {
  readonly nodes: NodeDirectory;
  /** Host written into replies; null: the address the client connected to. */
  readonly announceHost: string | null;
}

export class NodeReplies {
  /** CLUSTER topology commands queued in the open transaction: their replies come in EXEC's array. */
  private queuedTopology: QueuedTopology[] = [];
  private announceCache: Announce | undefined;

  constructor(
    private readonly cluster: ClusterReplies,
    private readonly client: net.Socket,
    /** The host of the node this connection goes to. */
    private readonly upstreamHost: string,
    private readonly upstreamTls: boolean,
    private readonly stats: Stats,
  ) {}

  /**
   * The reply stream's -MOVED/-ASK lines (session/error-lines.ts): each is rewritten to name a
   * listener; one that names a node the proxy does not know yet waits until the topology has
   * been asked again. Other error lines go on as they are.
   */
  readonly redirects: LineWatch = {
    couldBe: couldBeRedirect,
    replace: (line) => this.rewriteRedirect(line),
  };

  private rewriteRedirect(line: Buffer): Buffer | null | PendingLine {
    const rewritten = rewriteRedirect(line, this.cluster.nodes, this.announce());
    if (rewritten instanceof UnknownNode) {
      const kept = Buffer.from(line); // the line is a view of a read, valid only during this call
      return { checked: this.cluster.nodes.askAgain(), answer: () => this.redirectNow(kept) };
    }
    if (rewritten !== null) this.stats.redirectsRewritten++;
    return rewritten;
  }

  /** The line rewritten if it is a redirect to a node the proxy knows; else as Redis wrote it. */
  private redirectNow(line: Buffer): Buffer {
    const rewritten = rewriteRedirect(line, this.cluster.nodes, this.announce());
    if (rewritten === null) return line;
    if (rewritten instanceof UnknownNode) {
      this.cluster.nodes.unknownNode(rewritten.host, rewritten.port, 'redirect');
      return line;
    }
    this.stats.redirectsRewritten++;
    return rewritten;
  }

  /**
   * The frame whose head `scanner` holds is being forwarded (`tx` has taken it): the rewrite of
   * its reply when that names nodes, or undefined when the reply goes to the client as it is.
   */
  replyRewrite(scanner: RequestScanner, tx: TransactionState): ((reply: Buffer) => Buffer) | undefined {
    if (tx.opened) this.queuedTopology = [];
    if (scanner.cmd === Cmd.Cluster && scanner.argc >= 2) {
      const kind = this.topologyKind(scanner);
      if (kind === undefined) return undefined;
      if (tx.queuedIndex >= 0) {
        this.queuedTopology.push({ index: tx.queuedIndex, kind });
        return undefined;
      }
      return (reply) => this.counted(reply, rewriteTopologyReply(kind, reply, this.cluster.nodes, this.announce()));
    }
    if (!tx.closed) return undefined;
    const entries = this.queuedTopology;
    this.queuedTopology = [];
    if (scanner.cmd !== Cmd.Exec || entries.length === 0) return undefined;
    return (reply) => this.counted(reply, rewriteExecReply(entries, reply, this.cluster.nodes, this.announce()));
  }

  private counted(reply: Buffer, rewritten: Buffer): Buffer {
    if (rewritten !== reply) this.stats.topologyRepliesRewritten++;
    return rewritten;
  }

  /**
   * For CLUSTER SLOTS, SHARDS, NODES and REPLICAS, which reply carries node addresses; null for
   * an inline CLUSTER, whose subcommand is not captured (its reply's shape tells); undefined for
   * other subcommands.
   */
  private topologyKind(scanner: RequestScanner): TopologyReply | null | undefined {
    if (scanner.inline) return null;
    return topologyReplyOf(scanner.key.toString('latin1', 0, scanner.keyLength)) ?? undefined;
  }

  /** Where this connection's replies point clients: the announce host, or the address the client connected to. */
  private announce(): Announce {
    if (this.announceCache === undefined) {
      const local = unmappedIpv4(this.client.localAddress ?? '127.0.0.1');
      this.announceCache = {
        host: this.cluster.announceHost ?? local,
        upstreamHost: this.upstreamHost,
        tls: this.upstreamTls,
        listenerTls: (this.client as Partial<TLSSocket>).encrypted === true,
      };
    }
    return this.announceCache;
  }
}

const MOVED_PREFIX = Buffer.from('-MOVED ');
const ASK_PREFIX = Buffer.from('-ASK ');

/** Whether the bytes an error line began with could still be `-MOVED ` or `-ASK `. */
function couldBeRedirect(head: Buffer): boolean {
  const prefixOf = (word: Buffer): boolean => {
    const length = Math.min(head.length, word.length);
    return head.subarray(0, length).equals(word.subarray(0, length));
  };
  return prefixOf(MOVED_PREFIX) || prefixOf(ASK_PREFIX);
}
