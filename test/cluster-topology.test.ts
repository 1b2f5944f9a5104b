/**
 * Reading a cluster's nodes from CLUSTER SHARDS (as ioredis returns it to a
 * RESP2 connection) and from CLUSTER NODES (Redis before 7.0, or an ACL that
 * refuses SHARDS). Replies as redis-server 7.0.15 writes them.
 */
import { describe, expect, it } from 'vitest';
import { parseNodes, parseShards } from '../src/cluster/topology.js';

const NODES = [
  '07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,node-4.example slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected',
  '67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922',
  '292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master,fail - 1426238316232 1426238315231 3 disconnected 10923-16383',
  'e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca :30001@31001 myself,master - 0 0 1 connected 0-5460 [5461->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1] 7000',
  '6ec23923021cf3ffec47632106199cb7f496ce01 :0@0 master,noaddr - 1426238316232 1426238315231 5 disconnected',
  'a1b2c3d4e5f60718293a4b5c6d7e8f9012345678 127.0.0.1:30007@31007 handshake - 0 0 0 connected',
  '',
].join('\n');

describe('parseNodes', () => {
  const nodes = parseNodes(NODES, '10.0.0.1');

  it('lists nodes with an address, leaving out those without one and those still in handshake', () => {
    expect(nodes.map((n) => `${n.host}:${n.port}`)).toEqual(['127.0.0.1:30004', '127.0.0.1:30002', '127.0.0.1:30003', '10.0.0.1:30001']);
  });

  it('reads ids, roles, health, host names and served slots (not slots being moved)', () => {
    expect(nodes[0]).toEqual({
      id: '07c37dfeb235213a872192d90877d0cd55635b91',
      host: '127.0.0.1',
      port: 30004,
      hostname: 'node-4.example',
      role: 'replica',
      healthy: true,
      slots: [],
    });
    expect(nodes[1]).toMatchObject({ role: 'master', healthy: true, slots: [[5461, 10922]], hostname: '' });
    expect(nodes[2]).toMatchObject({ role: 'master', healthy: false });
    // The node asked, known to itself without an IP: it is where the question went.
    expect(nodes[3]).toMatchObject({
      id: 'e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca',
      host: '10.0.0.1',
      slots: [
        [0, 5460],
        [7000, 7000],
      ],
    });
  });
});

/** A SHARDS node as ioredis returns it: a flat array of field names and values. */
const node = (fields: Record<string, string | number>): Array<string | number> => Object.entries(fields).flat();

const SHARDS = [
  [
    'slots',
    [0, 5460, 7000, 7000],
    'nodes',
    [
      node({
        id: 'm1',
        port: 30001,
        'tls-port': 40001,
        ip: '127.0.0.1',
        endpoint: '127.0.0.1',
        hostname: 'n1.example',
        role: 'master',
        'replication-offset': 14,
        health: 'online',
      }),
      node({ id: 'r1', 'tls-port': 40004, ip: '', endpoint: '?', role: 'replica', 'replication-offset': 14, health: 'loading' }),
    ],
  ],
  [
    'slots',
    [],
    'nodes',
    [node({ id: 'm2', port: 30002, ip: '127.0.0.2', endpoint: '127.0.0.2', role: 'master', 'replication-offset': 0, health: 'fail' })],
  ],
];

describe('parseShards', () => {
  it('reads every node of every shard, with the slot ranges of its shard for masters', () => {
    expect(parseShards(SHARDS, '10.0.0.1', false)).toEqual([
      {
        id: 'm1',
        host: '127.0.0.1',
        port: 30001,
        hostname: 'n1.example',
        role: 'master',
        healthy: true,
        slots: [
          [0, 5460],
          [7000, 7000],
        ],
      },
      { id: 'r1', host: '10.0.0.1', port: 40004, hostname: '', role: 'replica', healthy: false, slots: [] },
      { id: 'm2', host: '127.0.0.2', port: 30002, hostname: '', role: 'master', healthy: false, slots: [] },
    ]);
  });

  it('dials the TLS port of a node that has both when the seeds are rediss://', () => {
    expect(parseShards(SHARDS, '10.0.0.1', true).map((n) => n.port)).toEqual([40001, 40004, 30002]);
  });

  it('refuses a reply that is not a list of shards', () => {
    expect(() => parseShards('OK', '10.0.0.1', false)).toThrow('CLUSTER SHARDS: unexpected reply');
  });
});
