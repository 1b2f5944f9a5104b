/**
 * Which answer to its own topology question (CLUSTER SHARDS/NODES) the proxy
 * believes. Each node answers from its own view of the cluster, and a node can
 * be wrong about it: one removed from the cluster (CLUSTER FORGET on the
 * others, CLUSTER RESET on it) keeps running and answers, alone, with a
 * cluster of one node that serves no slot. Believed, that view would drain the
 * listener of every healthy node.
 *
 * A view is believed when its masters serve all 16384 hash slots (what every
 * node of a working cluster reports), or else when more than half of the
 * nodes asked report the same view (a cluster with slots unassigned, as all
 * its nodes see it).
 */
import { formatAddress } from '../address.js';
import { TopologyError } from '../errors.js';
import type { ClusterNodeInfo } from './topology.js';

/** Hash slots of a Redis Cluster (CLUSTER_SLOTS in Redis's cluster.h). */
export const SLOT_COUNT = 16384;
/** Views gathered at most, when none serves every slot, before the majority decides. */
const MAX_VIEWS = 5;

/** A node to ask. */
export interface ViewSource {
  readonly host: string;
  readonly port: number;
  /** How errors name it (a seed by its URL). */
  readonly label: string;
}

export interface BelievedView {
  readonly nodes: readonly ClusterNodeInfo[];
  /** Its masters serve every slot. */
  readonly complete: boolean;
  /** The nodes that answered with it (`host:port`). */
  readonly believedFrom: readonly string[];
  /** Nodes whose view was not believed (`host:port`), with the slots their view serves. */
  readonly setAside: ReadonlyMap<string, number>;
}

interface Answer {
  readonly address: string;
  readonly nodes: ClusterNodeInfo[];
  readonly served: number;
  readonly signature: string;
}

/**
 * Asks `sources` one after another until one answers with a view that serves
 * every slot; failing that, believes the view that more than half of the nodes
 * asked (answering or not) agree on. Throws a TopologyError that says why when
 * no view can be believed. `what` names the sources in that error ("seed").
 */
export async function believedView(
  sources: readonly ViewSource[],
  ask: (source: ViewSource) => Promise<ClusterNodeInfo[]>,
  what: string,
): Promise<BelievedView> {
  const asked = new Set<string>();
  const errors: string[] = [];
  const answers: Answer[] = [];
  for (const source of sources) {
    const address = formatAddress(source.host, source.port);
    if (asked.has(address)) continue;
    if (answers.length >= MAX_VIEWS) break;
    asked.add(address);
    let nodes: ClusterNodeInfo[];
    try {
      nodes = await ask(source);
    } catch (err) {
      errors.push(`${source.label}: ${(err as Error).message}`);
      continue;
    }
    const served = slotsServed(nodes);
    if (served === SLOT_COUNT) return { nodes, complete: true, believedFrom: [address], setAside: setAside(answers, null) };
    answers.push({ address, nodes, served, signature: signature(nodes) });
  }
  if (answers.length === 0) throw new TopologyError(`no ${what} answered CLUSTER SHARDS/NODES (${errors.slice(0, 3).join('; ')})`);
  const agreeing = new Map<string, number>();
  for (const { signature } of answers) agreeing.set(signature, (agreeing.get(signature) ?? 0) + 1);
  const majority = answers.find((answer) => (agreeing.get(answer.signature) as number) * 2 > asked.size);
  if (majority !== undefined) {
    return {
      nodes: majority.nodes,
      complete: false,
      believedFrom: answers.filter((answer) => answer.signature === majority.signature).map((answer) => answer.address),
      setAside: setAside(answers, majority.signature),
    };
  }
  const views = answers.map((answer) => `${answer.address} sees ${answer.nodes.length} node(s) serving ${answer.served} slot(s)`);
  throw new TopologyError(
    `no view of the cluster to believe: none serves all ${SLOT_COUNT} slots, and no more than half of the ${asked.size} node(s) asked agree (${[...views, ...errors].join('; ')})`,
  );
}

/** How many distinct slots the view's masters serve. */
export function slotsServed(nodes: readonly ClusterNodeInfo[]): number {
  const served = new Uint8Array(SLOT_COUNT);
  let count = 0;
  for (const node of nodes) {
    if (node.role !== 'master') continue;
    for (const [start, end] of node.slots) {
      for (let slot = Math.max(0, start); slot <= Math.min(end, SLOT_COUNT - 1); slot++) {
        if (served[slot] === 0) count++;
        served[slot] = 1;
      }
    }
  }
  return count;
}

/** What two views must share to agree: their nodes (id, address, role) and who serves which slots; not health, which each node judges for itself. */
function signature(nodes: readonly ClusterNodeInfo[]): string {
  return nodes
    .map(
      (node) =>
        `${node.id} ${formatAddress(node.host, node.port)} ${node.role} ${node.slots.map(([start, end]) => `${start}-${end}`).join(',')}`,
    )
    .sort()
    .join('\n');
}

function setAside(answers: readonly Answer[], believed: string | null): Map<string, number> {
  return new Map(answers.filter((answer) => answer.signature !== believed).map((answer) => [answer.address, answer.served]));
}
