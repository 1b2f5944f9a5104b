/**
 * Which node's view of the cluster the proxy believes (src/cluster/views.ts):
 * the rule, on views as topology.ts reads them. The proxy's own refreshes
 * against real nodes are in e2e/cluster-mode.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { ClusterNodeInfo } from '../src/cluster/topology.js';
import { believedView, slotsServed, type ViewSource } from '../src/cluster/views.js';

const node = (id: string, port: number, role: 'master' | 'replica', slots: Array<[number, number]> = []): ClusterNodeInfo => ({
  id,
  host: '127.0.0.1',
  port,
  hostname: '',
  role,
  healthy: true,
  slots,
});

/** Three masters serving every slot, one replica. */
const CLUSTER = [
  node('m1', 7001, 'master', [[0, 5460]]),
  node('m2', 7002, 'master', [[5461, 10922]]),
  node('m3', 7003, 'master', [[10923, 16383]]),
  node('r1', 7004, 'replica'),
];
/** A node removed from the cluster and reset: alone, serving nothing. */
const LONE = [node('x9', 7009, 'master')];
/** The same cluster with slot 100 unassigned, as every node sees it. */
const HOLED = [
  node('m1', 7001, 'master', [
    [0, 99],
    [101, 5460],
  ]),
  ...CLUSTER.slice(1),
];

const source = (port: number): ViewSource => ({ host: '127.0.0.1', port, label: `n${port}` });

/** Asks from a table of answers by port (an Error rejects), recording who was asked. */
function asker(answers: Record<number, ClusterNodeInfo[] | Error>): {
  ask: (s: ViewSource) => Promise<ClusterNodeInfo[]>;
  asked: number[];
} {
  const asked: number[] = [];
  return {
    asked,
    ask: (s) => {
      asked.push(s.port);
      const answer = answers[s.port];
      return answer instanceof Error ? Promise.reject(answer) : Promise.resolve(answer);
    },
  };
}

describe('slotsServed', () => {
  it('counts each slot its masters serve once, ignoring replicas and ranges out of bounds', () => {
    expect(slotsServed(CLUSTER)).toBe(16384);
    expect(slotsServed(LONE)).toBe(0);
    expect(slotsServed(HOLED)).toBe(16383);
    expect(slotsServed([node('a', 1, 'master', [[0, 10]]), node('b', 2, 'master', [[5, 20]]), node('c', 3, 'replica', [[30, 40]])])).toBe(
      21,
    );
    expect(slotsServed([node('a', 1, 'master', [[16000, 20000]])])).toBe(384);
  });
});

describe('believedView', () => {
  it('believes the first view that serves every slot, asking no further', async () => {
    const { ask, asked } = asker({ 7001: CLUSTER, 7002: CLUSTER });
    const view = await believedView([source(7001), source(7002)], ask, 'node');
    expect(view).toEqual({ nodes: CLUSTER, complete: true, believedFrom: ['127.0.0.1:7001'], setAside: new Map() });
    expect(asked).toEqual([7001]);
  });

  it('sets aside a lone node that answers first, and believes the next node that sees the whole cluster', async () => {
    const { ask, asked } = asker({ 7009: LONE, 7001: CLUSTER });
    const view = await believedView([source(7009), source(7001)], ask, 'node');
    expect(view.nodes).toBe(CLUSTER);
    expect(view.setAside).toEqual(new Map([['127.0.0.1:7009', 0]]));
    expect(asked).toEqual([7009, 7001]);
  });

  it('believes a view with slots unassigned when more than half of the nodes asked share it', async () => {
    const { ask } = asker({ 7009: LONE, 7001: HOLED, 7002: HOLED, 7003: HOLED });
    const view = await believedView([7009, 7001, 7002, 7003].map(source), ask, 'node');
    expect(view).toMatchObject({ nodes: HOLED, complete: false, believedFrom: ['127.0.0.1:7001', '127.0.0.1:7002', '127.0.0.1:7003'] });
    expect(view.setAside).toEqual(new Map([['127.0.0.1:7009', 0]]));
  });

  it('does not believe a lone view when the other nodes asked do not answer: they count as asked', async () => {
    const down = new Error('cannot connect: ECONNREFUSED');
    const { ask } = asker({ 7009: LONE, 7001: down, 7002: down });
    await expect(believedView([7009, 7001, 7002].map(source), ask, 'node')).rejects.toThrow(
      'no view of the cluster to believe: none serves all 16384 slots, and no more than half of the 3 node(s) asked agree (127.0.0.1:7009 sees 1 node(s) serving 0 slot(s); n7001: cannot connect: ECONNREFUSED; n7002: cannot connect: ECONNREFUSED)',
    );
  });

  it('believes the only node asked, if it is the only one (a seed at start)', async () => {
    const { ask } = asker({ 7009: LONE });
    expect(await believedView([source(7009)], ask, 'seed')).toMatchObject({ nodes: LONE, complete: false });
  });

  it('asks each address once, and says which failed when none answers', async () => {
    const { ask, asked } = asker({ 7001: new Error('cannot connect: ECONNREFUSED') });
    await expect(believedView([source(7001), source(7001)], ask, 'seed')).rejects.toThrow(
      'no seed answered CLUSTER SHARDS/NODES (n7001: cannot connect: ECONNREFUSED)',
    );
    expect(asked).toEqual([7001]);
  });

  it('stops gathering after five views that do not serve every slot', async () => {
    const lone = (port: number) => [node(`x${port}`, port, 'master')];
    const answers = Object.fromEntries([1, 2, 3, 4, 5, 6, 7].map((port) => [port, lone(port)]));
    const { ask, asked } = asker(answers);
    await expect(believedView([1, 2, 3, 4, 5, 6, 7].map(source), ask, 'node')).rejects.toThrow(
      /no more than half of the 5 node\(s\) asked/,
    );
    expect(asked).toEqual([1, 2, 3, 4, 5]);
  });
});
