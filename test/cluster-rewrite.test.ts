/**
 * Node addresses in cluster replies and redirects, rewritten to the proxy's
 * listeners (src/cluster/rewrite.ts). Pure functions: the node directory is a
 * fake that records what it was asked, and the replies are the bytes
 * redis-server 7.0.15 sent to a raw socket.
 */
import { describe, expect, it } from 'vitest';
import {
  rewriteRedirect,
  rewriteTopologyReply,
  topologyReplyOf,
  type Announce,
  type NodeDirectory,
  type TopologyReply,
  UnknownNode,
} from '../src/cluster/rewrite.js';
import { decodeReply } from '../src/resp/value.js';

// ---------------------------------------------------------------------------
// Replies of redis-server 7.0.15, as received.
//
// A cluster of three masters on 127.0.0.1:32001-32003 (bus ports 42001-42003),
// asked in RESP2 and after HELLO 3; then with cluster-announce-hostname
// node-1.example and node-2.example set on the first two nodes (the third has
// none), under each cluster-preferred-endpoint-type. TLS_ replies come from a
// TLS cluster (tls-cluster yes, port 0) on the same ports: two masters, and
// 32003 a replica of 32001, which also announces a plaintext port, 31001.
// ---------------------------------------------------------------------------

const ID = {
  m1: '11ef880912f7266b5b4c60ef87036cbb43ad05c0',
  m2: '65f66d1c4e946d4d51e836353888a3986cde47ce',
  m3: 'f316ed1faff4fc895150659a89a8580b6ba766e3',
  tlsMaster1: 'bf770b98406b84b0ab2fdd56712aafec3f4d780f',
  tlsMaster2: '8b368f0b16c8c4ed0cded7948522fddbebaccd7a',
  tlsReplica: '5ce99ee343fe42daf3c70f6ab2fc682264b894aa',
};

// cluster-preferred-endpoint-type ip (the default), no host names.
const SLOTS_RESP2 =
  '*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:32001\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n*0\r\n*3\r\n:5461\r\n:10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:32002\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n*0\r\n*3\r\n:10923\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:32003\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n*0\r\n';
const SLOTS_RESP3 =
  '*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:32001\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n%0\r\n*3\r\n:5461\r\n:10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:32002\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n%0\r\n*3\r\n:10923\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:32003\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n%0\r\n';
const SHARDS_RESP2 =
  '*3\r\n*4\r\n$5\r\nslots\r\n*2\r\n:10923\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n$4\r\nport\r\n:32003\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*4\r\n$5\r\nslots\r\n*2\r\n:5461\r\n:10922\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n$4\r\nport\r\n:32002\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n$4\r\nport\r\n:32001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n';
const SHARDS_RESP3 =
  '*3\r\n%2\r\n$5\r\nslots\r\n*2\r\n:10923\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n%7\r\n$2\r\nid\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n$4\r\nport\r\n:32003\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n%2\r\n$5\r\nslots\r\n*2\r\n:5461\r\n:10922\r\n$5\r\nnodes\r\n*1\r\n%7\r\n$2\r\nid\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n$4\r\nport\r\n:32002\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n%2\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*1\r\n%7\r\n$2\r\nid\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n$4\r\nport\r\n:32001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n';
const NODES_RESP2 =
  '$337\r\nf316ed1faff4fc895150659a89a8580b6ba766e3 127.0.0.1:32003@42003 master - 0 1796026039016 3 connected 10923-16383\n65f66d1c4e946d4d51e836353888a3986cde47ce 127.0.0.1:32002@42002 master - 0 1796026041029 2 connected 5461-10922\n11ef880912f7266b5b4c60ef87036cbb43ad05c0 127.0.0.1:32001@42001 myself,master - 0 1796026039000 1 connected 0-5460\n\r\n';
const NODES_RESP3 =
  '=341\r\ntxt:f316ed1faff4fc895150659a89a8580b6ba766e3 127.0.0.1:32003@42003 master - 0 1796026042033 3 connected 10923-16383\n65f66d1c4e946d4d51e836353888a3986cde47ce 127.0.0.1:32002@42002 master - 0 1796026041029 2 connected 5461-10922\n11ef880912f7266b5b4c60ef87036cbb43ad05c0 127.0.0.1:32001@42001 myself,master - 0 1796026039000 1 connected 0-5460\n\r\n';

// cluster-preferred-endpoint-type hostname: the node without a host name is "?".
const SLOTS_HOSTNAME_RESP2 =
  '*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$14\r\nnode-1.example\r\n:32001\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n*3\r\n:5461\r\n:10922\r\n*4\r\n$14\r\nnode-2.example\r\n:32002\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n*3\r\n:10923\r\n:16383\r\n*4\r\n$1\r\n?\r\n:32003\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n';
const SLOTS_HOSTNAME_RESP3 =
  '*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$14\r\nnode-1.example\r\n:32001\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n%1\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n*3\r\n:5461\r\n:10922\r\n*4\r\n$14\r\nnode-2.example\r\n:32002\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n%1\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n*3\r\n:10923\r\n:16383\r\n*4\r\n$1\r\n?\r\n:32003\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n%1\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n';
const SHARDS_HOSTNAME_RESP2 =
  '*3\r\n*4\r\n$5\r\nslots\r\n*2\r\n:10923\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n$4\r\nport\r\n:32003\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$1\r\n?\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*4\r\n$5\r\nslots\r\n*2\r\n:5461\r\n:10922\r\n$5\r\nnodes\r\n*1\r\n*16\r\n$2\r\nid\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n$4\r\nport\r\n:32002\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$14\r\nnode-2.example\r\n$8\r\nhostname\r\n$14\r\nnode-2.example\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*1\r\n*16\r\n$2\r\nid\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n$4\r\nport\r\n:32001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$14\r\nnode-1.example\r\n$8\r\nhostname\r\n$14\r\nnode-1.example\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n';
const SHARDS_HOSTNAME_RESP3 =
  '*3\r\n%2\r\n$5\r\nslots\r\n*2\r\n:10923\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n%7\r\n$2\r\nid\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n$4\r\nport\r\n:32003\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$1\r\n?\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n%2\r\n$5\r\nslots\r\n*2\r\n:5461\r\n:10922\r\n$5\r\nnodes\r\n*1\r\n%8\r\n$2\r\nid\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n$4\r\nport\r\n:32002\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$14\r\nnode-2.example\r\n$8\r\nhostname\r\n$14\r\nnode-2.example\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n%2\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*1\r\n%8\r\n$2\r\nid\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n$4\r\nport\r\n:32001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$14\r\nnode-1.example\r\n$8\r\nhostname\r\n$14\r\nnode-1.example\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n';
const NODES_HOSTNAME_RESP2 =
  '$367\r\nf316ed1faff4fc895150659a89a8580b6ba766e3 127.0.0.1:32003@42003 master - 0 1796026058097 3 connected 10923-16383\n65f66d1c4e946d4d51e836353888a3986cde47ce 127.0.0.1:32002@42002,node-2.example master - 0 1796026059101 2 connected 5461-10922\n11ef880912f7266b5b4c60ef87036cbb43ad05c0 127.0.0.1:32001@42001,node-1.example myself,master - 0 1796026058000 1 connected 0-5460\n\r\n';
const NODES_HOSTNAME_RESP3 =
  '=371\r\ntxt:f316ed1faff4fc895150659a89a8580b6ba766e3 127.0.0.1:32003@42003 master - 0 1796026060109 3 connected 10923-16383\n65f66d1c4e946d4d51e836353888a3986cde47ce 127.0.0.1:32002@42002,node-2.example master - 0 1796026059101 2 connected 5461-10922\n11ef880912f7266b5b4c60ef87036cbb43ad05c0 127.0.0.1:32001@42001,node-1.example myself,master - 0 1796026059000 1 connected 0-5460\n\r\n';

// cluster-preferred-endpoint-type ip with host names: CLUSTER SLOTS lists them in its 4th element.
const SLOTS_METADATA_RESP2 =
  '*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:32001\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n*2\r\n$8\r\nhostname\r\n$14\r\nnode-1.example\r\n*3\r\n:5461\r\n:10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:32002\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n*2\r\n$8\r\nhostname\r\n$14\r\nnode-2.example\r\n*3\r\n:10923\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:32003\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n*0\r\n';
const SLOTS_METADATA_RESP3 =
  '*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:32001\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n%1\r\n$8\r\nhostname\r\n$14\r\nnode-1.example\r\n*3\r\n:5461\r\n:10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:32002\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n%1\r\n$8\r\nhostname\r\n$14\r\nnode-2.example\r\n*3\r\n:10923\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:32003\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n%0\r\n';

// cluster-preferred-endpoint-type unknown-endpoint: an empty endpoint.
const SHARDS_UNKNOWN_ENDPOINT_RESP2 =
  '*3\r\n*4\r\n$5\r\nslots\r\n*2\r\n:10923\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid\r\n$40\r\nf316ed1faff4fc895150659a89a8580b6ba766e3\r\n$4\r\nport\r\n:32003\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$0\r\n\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*4\r\n$5\r\nslots\r\n*2\r\n:5461\r\n:10922\r\n$5\r\nnodes\r\n*1\r\n*16\r\n$2\r\nid\r\n$40\r\n65f66d1c4e946d4d51e836353888a3986cde47ce\r\n$4\r\nport\r\n:32002\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$0\r\n\r\n$8\r\nhostname\r\n$14\r\nnode-2.example\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*1\r\n*16\r\n$2\r\nid\r\n$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n$4\r\nport\r\n:32001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$0\r\n\r\n$8\r\nhostname\r\n$14\r\nnode-1.example\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n';

// The TLS cluster with a replica.
const TLS_SLOTS_RESP2 =
  '*2\r\n*4\r\n:0\r\n:8191\r\n*4\r\n$9\r\n127.0.0.1\r\n:32001\r\n$40\r\nbf770b98406b84b0ab2fdd56712aafec3f4d780f\r\n*0\r\n*4\r\n$9\r\n127.0.0.1\r\n:32003\r\n$40\r\n5ce99ee343fe42daf3c70f6ab2fc682264b894aa\r\n*0\r\n*3\r\n:8192\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:32002\r\n$40\r\n8b368f0b16c8c4ed0cded7948522fddbebaccd7a\r\n*0\r\n';
const TLS_SLOTS_RESP3 =
  '*2\r\n*4\r\n:0\r\n:8191\r\n*4\r\n$9\r\n127.0.0.1\r\n:32001\r\n$40\r\nbf770b98406b84b0ab2fdd56712aafec3f4d780f\r\n%0\r\n*4\r\n$9\r\n127.0.0.1\r\n:32003\r\n$40\r\n5ce99ee343fe42daf3c70f6ab2fc682264b894aa\r\n%0\r\n*3\r\n:8192\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:32002\r\n$40\r\n8b368f0b16c8c4ed0cded7948522fddbebaccd7a\r\n%0\r\n';
const TLS_SHARDS_RESP2 =
  '*2\r\n*4\r\n$5\r\nslots\r\n*2\r\n:8192\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid\r\n$40\r\n8b368f0b16c8c4ed0cded7948522fddbebaccd7a\r\n$8\r\ntls-port\r\n:32002\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:8191\r\n$5\r\nnodes\r\n*2\r\n*16\r\n$2\r\nid\r\n$40\r\nbf770b98406b84b0ab2fdd56712aafec3f4d780f\r\n$4\r\nport\r\n:31001\r\n$8\r\ntls-port\r\n:32001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:14\r\n$6\r\nhealth\r\n$6\r\nonline\r\n*14\r\n$2\r\nid\r\n$40\r\n5ce99ee343fe42daf3c70f6ab2fc682264b894aa\r\n$8\r\ntls-port\r\n:32003\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$7\r\nreplica\r\n$18\r\nreplication-offset\r\n:14\r\n$6\r\nhealth\r\n$6\r\nonline\r\n';
const TLS_SHARDS_RESP3 =
  '*2\r\n%2\r\n$5\r\nslots\r\n*2\r\n:8192\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n%7\r\n$2\r\nid\r\n$40\r\n8b368f0b16c8c4ed0cded7948522fddbebaccd7a\r\n$8\r\ntls-port\r\n:32002\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n%2\r\n$5\r\nslots\r\n*2\r\n:0\r\n:8191\r\n$5\r\nnodes\r\n*2\r\n%8\r\n$2\r\nid\r\n$40\r\nbf770b98406b84b0ab2fdd56712aafec3f4d780f\r\n$4\r\nport\r\n:31001\r\n$8\r\ntls-port\r\n:32001\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:14\r\n$6\r\nhealth\r\n$6\r\nonline\r\n%7\r\n$2\r\nid\r\n$40\r\n5ce99ee343fe42daf3c70f6ab2fc682264b894aa\r\n$8\r\ntls-port\r\n:32003\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$7\r\nreplica\r\n$18\r\nreplication-offset\r\n:14\r\n$6\r\nhealth\r\n$6\r\nonline\r\n';
const TLS_NODES_RESP2 =
  '$363\r\n8b368f0b16c8c4ed0cded7948522fddbebaccd7a 127.0.0.1:32002@42002 master - 0 1796026114000 1 connected 8192-16383\n5ce99ee343fe42daf3c70f6ab2fc682264b894aa 127.0.0.1:32003@42003 slave bf770b98406b84b0ab2fdd56712aafec3f4d780f 0 1796026115977 0 connected\nbf770b98406b84b0ab2fdd56712aafec3f4d780f 127.0.0.1:32001@42001 myself,master - 0 1796026115000 0 connected 0-8191\n\r\n';
const TLS_REPLICAS_RESP2 =
  '*1\r\n$137\r\n5ce99ee343fe42daf3c70f6ab2fc682264b894aa 127.0.0.1:32003@42003 slave bf770b98406b84b0ab2fdd56712aafec3f4d780f 0 1796026115977 0 connected\r\n';
const TLS_REPLICAS_RESP3 =
  '*1\r\n$137\r\n5ce99ee343fe42daf3c70f6ab2fc682264b894aa 127.0.0.1:32003@42003 slave bf770b98406b84b0ab2fdd56712aafec3f4d780f 0 1796026117990 0 connected\r\n';

// Replies that name no node address.
const CLUSTER_INFO_RESP3 =
  '=514\r\ntxt:cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:3\r\ncluster_size:3\r\ncluster_current_epoch:3\r\ncluster_my_epoch:1\r\ncluster_stats_messages_ping_sent:17\r\ncluster_stats_messages_pong_sent:20\r\ncluster_stats_messages_sent:37\r\ncluster_stats_messages_ping_received:18\r\ncluster_stats_messages_pong_received:17\r\ncluster_stats_messages_meet_received:2\r\ncluster_stats_messages_received:37\r\ntotal_cluster_links_buffer_limit_exceeded:0\r\n\r\n';
const CLUSTER_MYID = '$40\r\n11ef880912f7266b5b4c60ef87036cbb43ad05c0\r\n';
const UNKNOWN_NODE = '-ERR Unknown node 0000\r\n';

// ---------------------------------------------------------------------------
// The fake directory, and expected replies built from the captured ones.
// ---------------------------------------------------------------------------

const HOST = 'px.example';
const ANNOUNCE: Announce = { host: HOST, upstreamHost: 'seed.internal' };

/** Proxy listener ports by node id. */
const PORT_BY_ID = new Map([
  [ID.m1, 7001],
  [ID.m2, 7002],
  [ID.m3, 7003],
  [ID.tlsMaster1, 7011],
  [ID.tlsMaster2, 7012],
  [ID.tlsReplica, 7013],
]);

/** Proxy listener ports by node address: other ports than by id, to tell which lookup answered. */
const PORT_BY_ADDRESS = new Map([
  ['127.0.0.1:32001', 7101],
  ['127.0.0.1:32002', 7102],
  ['127.0.0.1:32003', 7103],
  ['seed.internal:32001', 7201],
  ['seed.internal:32002', 7202],
  ['seed.internal:32003', 7203],
  ['node-1.example:32001', 7301],
  ['node-2.example:32002', 7302],
  ['::1:7000', 7400],
]);

/** A NodeDirectory that answers from tables and records every call, in order. */
class FakeDirectory implements NodeDirectory {
  readonly calls: string[] = [];

  constructor(
    private readonly byId: ReadonlyMap<string, number> = PORT_BY_ID,
    private readonly byAddress: ReadonlyMap<string, number> = PORT_BY_ADDRESS,
  ) {}

  portForId(id: string): number | undefined {
    this.calls.push(`id ${id}`);
    return this.byId.get(id);
  }

  portForAddress(host: string, port: number): number | undefined {
    this.calls.push(`address ${host}:${port}`);
    return this.byAddress.get(`${host}:${port}`);
  }

  noteRedirect(): void {
    this.calls.push('redirect');
  }

  unknownNode(host: string, port: number, where: 'redirect' | 'topology'): void {
    this.calls.push(`unknown ${host}:${port} in ${where}`);
  }

  askAgain(): Promise<void> {
    this.calls.push('ask again');
    return Promise.resolve();
  }
}

/** A directory that knows no node id: every lookup goes by address. */
const byAddressOnly = (): FakeDirectory => new FakeDirectory(new Map());

/** A directory that knows no node at all. */
const knowingNothing = (): FakeDirectory => new FakeDirectory(new Map(), new Map());

const bulk = (text: string): string => `$${text.length}\r\n${text}\r\n`;

/** `text` with every `from` replaced by its `to`, pair after pair. */
const swap = (text: string, pairs: Array<[string, string]>): string => pairs.reduce((out, [from, to]) => out.replaceAll(from, to), text);

/** The integer replies of node ports, as the proxy ports they become. */
const portReplies = (ports: Record<number, number>): Array<[string, string]> =>
  Object.entries(ports).map(([from, to]) => [`:${from}\r\n`, `:${to}\r\n`]);

/** A bulk or verbatim reply with its body edited (a verbatim string's `txt:` stays). */
function withBody(reply: string, pairs: Array<[string, string]>): string {
  const body = swap(reply.slice(reply.indexOf('\r\n') + 2, -2), pairs);
  return `${reply[0]}${body.length}\r\n${body}\r\n`;
}

/** Host names and IPs, as bulk strings, become the announce host. */
const HOSTS_TO_ANNOUNCE: Array<[string, string]> = ['127.0.0.1', 'node-1.example', 'node-2.example'].map((host) => [
  bulk(host),
  bulk(HOST),
]);
const MASTER_PORTS = portReplies({ 32001: 7001, 32002: 7002, 32003: 7003 });
const TLS_PORTS = portReplies({ 31001: 7011, 32001: 7011, 32002: 7012, 32003: 7013 });

/** `ip:port@cport` (and `,hostname`) in NODES lines, with the proxy ports of `ports`. */
const nodeAddresses = (ports: Record<number, number>): Array<[string, string]> => [
  ...Object.entries(ports).map(([from, to]): [string, string] => [`127.0.0.1:${from}@`, `${HOST}:${to}@`]),
  [',node-1.example ', `,${HOST} `],
  [',node-2.example ', `,${HOST} `],
];
/**
 * SHARDS nodes of the TLS cluster, as a client of a plain listener sees them:
 * one `port` field, the listener's, whatever `port`/`tls-port` the node had.
 */
const PLAIN_LISTENER_PORTS: Array<[string, string]> = [
  [`\r\n${ID.tlsMaster1}\r\n$4\r\nport\r\n:31001\r\n$8\r\ntls-port\r\n:32001\r\n`, `\r\n${ID.tlsMaster1}\r\n$4\r\nport\r\n:7011\r\n`],
  [`\r\n${ID.tlsMaster2}\r\n$4\r\nport\r\n:32002\r\n$8\r\ntls-port\r\n:0\r\n`, `\r\n${ID.tlsMaster2}\r\n$4\r\nport\r\n:7012\r\n`],
  ['*16\r\n$2\r\nid', '*14\r\n$2\r\nid'],
  ['%8\r\n$2\r\nid', '%7\r\n$2\r\nid'],
  ['$8\r\ntls-port\r\n', '$4\r\nport\r\n'],
  ...portReplies({ 32002: 7012, 32003: 7013 }),
];

const MASTER_ADDRESSES = nodeAddresses({ 32001: 7001, 32002: 7002, 32003: 7003 });
const TLS_ADDRESSES = nodeAddresses({ 32001: 7011, 32002: 7012, 32003: 7013 });

/** Hand-made from TLS_SHARDS_RESP2: the 32002 master with a plaintext port and a tls-port of 0. */
const TLS_SHARDS_TLS_PORT_0 = swap(TLS_SHARDS_RESP2, [
  [
    `*14\r\n$2\r\nid\r\n$40\r\n${ID.tlsMaster2}\r\n$8\r\ntls-port\r\n:32002\r\n`,
    `*16\r\n$2\r\nid\r\n$40\r\n${ID.tlsMaster2}\r\n$4\r\nport\r\n:32002\r\n$8\r\ntls-port\r\n:0\r\n`,
  ],
]);

/**
 * Hand-made NODES lines: a node without an address yet (noaddr), a node with
 * an empty host name after the comma, and a node that knows its port but not
 * its IP (a node's own line before it meets the others).
 */
const NODES_EDGE_TEXT = [
  `e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca :0@0 master,noaddr - 1318428930 1318428931 0 disconnected`,
  `${ID.m3} 127.0.0.1:32003@42003, master - 0 1796026058097 3 connected 10923-16383`,
  `${ID.m1} :32001@42001 myself,master - 0 0 1 connected 0-5460`,
  '',
].join('\n');
const NODES_EDGE = bulk(NODES_EDGE_TEXT);

interface Case {
  name: string;
  kind: TopologyReply;
  reply: string;
  expected: string;
}

/** Every captured topology reply, and what it becomes with every node id known. */
const CASES: Case[] = [
  { name: 'SLOTS, RESP2', kind: 'slots', reply: SLOTS_RESP2, expected: swap(SLOTS_RESP2, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]) },
  { name: 'SLOTS, RESP3', kind: 'slots', reply: SLOTS_RESP3, expected: swap(SLOTS_RESP3, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]) },
  {
    name: 'SLOTS with host name endpoints and "?", RESP2',
    kind: 'slots',
    reply: SLOTS_HOSTNAME_RESP2,
    expected: swap(SLOTS_HOSTNAME_RESP2, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]),
  },
  {
    name: 'SLOTS with host name endpoints and "?", RESP3',
    kind: 'slots',
    reply: SLOTS_HOSTNAME_RESP3,
    expected: swap(SLOTS_HOSTNAME_RESP3, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]),
  },
  {
    name: 'SLOTS with host name metadata, RESP2',
    kind: 'slots',
    reply: SLOTS_METADATA_RESP2,
    expected: swap(SLOTS_METADATA_RESP2, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]),
  },
  {
    name: 'SLOTS with host name metadata, RESP3',
    kind: 'slots',
    reply: SLOTS_METADATA_RESP3,
    expected: swap(SLOTS_METADATA_RESP3, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]),
  },
  {
    name: 'SLOTS with a replica, RESP2',
    kind: 'slots',
    reply: TLS_SLOTS_RESP2,
    expected: swap(TLS_SLOTS_RESP2, [...HOSTS_TO_ANNOUNCE, ...TLS_PORTS]),
  },
  {
    name: 'SLOTS with a replica, RESP3',
    kind: 'slots',
    reply: TLS_SLOTS_RESP3,
    expected: swap(TLS_SLOTS_RESP3, [...HOSTS_TO_ANNOUNCE, ...TLS_PORTS]),
  },
  { name: 'SHARDS, RESP2', kind: 'shards', reply: SHARDS_RESP2, expected: swap(SHARDS_RESP2, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]) },
  { name: 'SHARDS, RESP3', kind: 'shards', reply: SHARDS_RESP3, expected: swap(SHARDS_RESP3, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]) },
  {
    name: 'SHARDS with host names and "?", RESP2',
    kind: 'shards',
    reply: SHARDS_HOSTNAME_RESP2,
    expected: swap(SHARDS_HOSTNAME_RESP2, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]),
  },
  {
    name: 'SHARDS with host names and "?", RESP3',
    kind: 'shards',
    reply: SHARDS_HOSTNAME_RESP3,
    expected: swap(SHARDS_HOSTNAME_RESP3, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]),
  },
  {
    name: 'SHARDS with empty endpoints, RESP2',
    kind: 'shards',
    reply: SHARDS_UNKNOWN_ENDPOINT_RESP2,
    expected: swap(SHARDS_UNKNOWN_ENDPOINT_RESP2, [...HOSTS_TO_ANNOUNCE, ...MASTER_PORTS]),
  },
  {
    name: 'SHARDS with tls-port and a replica, RESP2',
    kind: 'shards',
    reply: TLS_SHARDS_RESP2,
    expected: swap(TLS_SHARDS_RESP2, [...HOSTS_TO_ANNOUNCE, ...PLAIN_LISTENER_PORTS]),
  },
  {
    name: 'SHARDS with tls-port and a replica, RESP3',
    kind: 'shards',
    reply: TLS_SHARDS_RESP3,
    expected: swap(TLS_SHARDS_RESP3, [...HOSTS_TO_ANNOUNCE, ...PLAIN_LISTENER_PORTS]),
  },
  {
    name: 'SHARDS with a tls-port of 0',
    kind: 'shards',
    reply: TLS_SHARDS_TLS_PORT_0,
    expected: swap(TLS_SHARDS_TLS_PORT_0, [...HOSTS_TO_ANNOUNCE, ...PLAIN_LISTENER_PORTS]),
  },
  { name: 'NODES, RESP2 bulk string', kind: 'nodes', reply: NODES_RESP2, expected: withBody(NODES_RESP2, MASTER_ADDRESSES) },
  { name: 'NODES, RESP3 verbatim string', kind: 'nodes', reply: NODES_RESP3, expected: withBody(NODES_RESP3, MASTER_ADDRESSES) },
  {
    name: 'NODES with host names, RESP2',
    kind: 'nodes',
    reply: NODES_HOSTNAME_RESP2,
    expected: withBody(NODES_HOSTNAME_RESP2, MASTER_ADDRESSES),
  },
  {
    name: 'NODES with host names, RESP3',
    kind: 'nodes',
    reply: NODES_HOSTNAME_RESP3,
    expected: withBody(NODES_HOSTNAME_RESP3, MASTER_ADDRESSES),
  },
  { name: 'NODES with a replica', kind: 'nodes', reply: TLS_NODES_RESP2, expected: withBody(TLS_NODES_RESP2, TLS_ADDRESSES) },
  {
    name: 'NODES with noaddr, an empty host name and an empty IP',
    kind: 'nodes',
    reply: NODES_EDGE,
    expected: withBody(NODES_EDGE, [
      ['127.0.0.1:32003@42003, ', `${HOST}:7003@42003, `],
      [' :32001@42001 ', ' :7001@42001 '],
    ]),
  },
  {
    name: 'REPLICAS, RESP2',
    kind: 'replicas',
    reply: TLS_REPLICAS_RESP2,
    expected: `*1\r\n${withBody(TLS_REPLICAS_RESP2.slice(4), TLS_ADDRESSES)}`,
  },
  {
    name: 'REPLICAS, RESP3',
    kind: 'replicas',
    reply: TLS_REPLICAS_RESP3,
    expected: `*1\r\n${withBody(TLS_REPLICAS_RESP3.slice(4), TLS_ADDRESSES)}`,
  },
];

const latin1 = (text: string): Buffer => Buffer.from(text, 'latin1');

/** rewriteTopologyReply on a latin1 reply, with `nodes`. */
function rewrite(kind: TopologyReply | null, reply: string, nodes: NodeDirectory = new FakeDirectory()): string {
  return rewriteTopologyReply(kind, latin1(reply), nodes, ANNOUNCE).toString('latin1');
}

/** rewriteRedirect on an error line (CRLF added), as a string, null, or `unknown host:port`. */
function redirect(line: string, nodes: NodeDirectory = new FakeDirectory(), announce: Announce = ANNOUNCE): string | null {
  const rewritten = rewriteRedirect(latin1(`${line}\r\n`), nodes, announce);
  if (rewritten instanceof UnknownNode) return `unknown ${rewritten.host}:${rewritten.port}`;
  return rewritten?.toString('latin1').replace(/\r\n$/, '') ?? null;
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

describe('the fixtures', () => {
  it.each(CASES)('are complete replies: $name', ({ reply, expected }) => {
    for (const text of [reply, expected]) expect(decodeReply(latin1(text)).end).toBe(text.length);
    expect(expected).not.toBe(reply);
  });
});

describe('rewriteTopologyReply', () => {
  it.each(CASES)('rewrites every node address in $name, nothing else', ({ kind, reply, expected }) => {
    expect(rewrite(kind, reply)).toBe(expected);
  });

  it('names the listener port tls-port in SHARDS for a client connected over TLS', () => {
    const text = rewriteTopologyReply('shards', latin1(TLS_SHARDS_RESP2), new FakeDirectory(), { ...ANNOUNCE, listenerTls: true }).toString(
      'latin1',
    );
    expect(text).toBe(swap(rewrite('shards', TLS_SHARDS_RESP2), [['$4\r\nport\r\n', '$8\r\ntls-port\r\n']]));
  });

  it.each(CASES)('gives the same result without the kind (an inline command): $name', ({ kind, reply }) => {
    const withKind = new FakeDirectory();
    const withoutKind = new FakeDirectory();
    expect(rewrite(null, reply, withoutKind)).toBe(rewrite(kind, reply, withKind));
    expect(withoutKind.calls).toEqual(withKind.calls);
  });

  it.each(CASES)('asks only by node id when every id is known: $name', ({ kind, reply }) => {
    const nodes = new FakeDirectory();
    rewrite(kind, reply, nodes);
    expect(nodes.calls.length).toBeGreaterThan(0);
    expect(nodes.calls.every((call) => call.startsWith('id '))).toBe(true);
  });

  it.each(CASES)('gives back the same Buffer when the directory knows no node: $name', ({ kind, reply }) => {
    const bytes = latin1(reply);
    expect(rewriteTopologyReply(kind, bytes, knowingNothing(), ANNOUNCE)).toBe(bytes);
  });
});

describe('rewriteTopologyReply by address', () => {
  /** The ports PORT_BY_ADDRESS gives 127.0.0.1:32001-32003. */
  const LOCAL_ADDRESS_PORTS = { 32001: 7101, 32002: 7102, 32003: 7103 };

  it('CLUSTER SLOTS: the endpoint and port, unless an id is known', () => {
    const nodes = byAddressOnly();
    expect(rewrite('slots', SLOTS_RESP2, nodes)).toBe(swap(SLOTS_RESP2, [...HOSTS_TO_ANNOUNCE, ...portReplies(LOCAL_ADDRESS_PORTS)]));
    expect(nodes.calls).toEqual([
      `id ${ID.m1}`,
      'address 127.0.0.1:32001',
      `id ${ID.m2}`,
      'address 127.0.0.1:32002',
      `id ${ID.m3}`,
      'address 127.0.0.1:32003',
    ]);
  });

  it('CLUSTER SLOTS: a host name endpoint by that name, "?" by the upstream host of the connection', () => {
    const nodes = byAddressOnly();
    expect(rewrite('slots', SLOTS_HOSTNAME_RESP3, nodes)).toBe(
      swap(SLOTS_HOSTNAME_RESP3, [...HOSTS_TO_ANNOUNCE, ...portReplies({ 32001: 7301, 32002: 7302, 32003: 7203 })]),
    );
    expect(nodes.calls.filter((call) => call.startsWith('address'))).toEqual([
      'address node-1.example:32001',
      'address node-2.example:32002',
      'address seed.internal:32003',
    ]);
  });

  it('CLUSTER SHARDS: by ip, even with an empty endpoint', () => {
    const nodes = byAddressOnly();
    const expected = swap(SHARDS_UNKNOWN_ENDPOINT_RESP2, [...HOSTS_TO_ANNOUNCE, ...portReplies(LOCAL_ADDRESS_PORTS)]);
    expect(rewrite('shards', SHARDS_UNKNOWN_ENDPOINT_RESP2, nodes)).toBe(expected);
    expect(nodes.calls.filter((call) => call.startsWith('address'))).toEqual([
      'address 127.0.0.1:32003',
      'address 127.0.0.1:32002',
      'address 127.0.0.1:32001',
    ]);
  });

  it('CLUSTER NODES: by ip:port; an empty IP by the upstream host; never for a noaddr line', () => {
    const nodes = byAddressOnly();
    expect(rewrite('nodes', NODES_HOSTNAME_RESP2, nodes)).toBe(withBody(NODES_HOSTNAME_RESP2, nodeAddresses(LOCAL_ADDRESS_PORTS)));
    const edge = byAddressOnly();
    rewrite('nodes', NODES_EDGE, edge);
    expect(edge.calls).toEqual([`id ${ID.m3}`, 'address 127.0.0.1:32003', `id ${ID.m1}`, 'address seed.internal:32001']);
  });

  it('leaves a node the directory does not know as it was, and reports it', () => {
    const onlyFirst = new FakeDirectory(new Map([[ID.m1, 7001]]), new Map([['127.0.0.1:32002', 7102]]));
    const expected = swap(SLOTS_RESP2, [
      [`$9\r\n127.0.0.1\r\n:32001\r\n`, `${bulk(HOST)}:7001\r\n`],
      ['$9\r\n127.0.0.1\r\n:32002\r\n', `${bulk(HOST)}:7102\r\n`],
    ]);
    expect(rewrite('slots', SLOTS_RESP2, onlyFirst)).toBe(expected);
    expect(onlyFirst.calls.filter((call) => call.startsWith('unknown'))).toEqual(['unknown 127.0.0.1:32003 in topology']);
    // "?" is the node this connection goes to: the upstream host.
    const none = knowingNothing();
    rewrite('slots', SLOTS_HOSTNAME_RESP2, none);
    expect(none.calls.filter((call) => call.startsWith('unknown'))).toEqual([
      'unknown node-1.example:32001 in topology',
      'unknown node-2.example:32002 in topology',
      'unknown seed.internal:32003 in topology',
    ]);
  });
});

describe('rewriteTopologyReply on other replies', () => {
  const UNRELATED: Array<[string, string]> = [
    ['an error', UNKNOWN_NODE],
    ['CLUSTER INFO, RESP3', CLUSTER_INFO_RESP3],
    ['CLUSTER INFO, RESP2', bulk(CLUSTER_INFO_RESP3.slice('=514\r\ntxt:'.length, -2))],
    ['CLUSTER MYID', CLUSTER_MYID],
    ['CLUSTER GETKEYSINSLOT, no keys', '*0\r\n'],
    ['CLUSTER GETKEYSINSLOT', '*3\r\n$8\r\nuser:100\r\n$16\r\norder 42 shipped\r\n$15\r\na b@c:1 d e f g\r\n'],
    ['CLUSTER COUNTKEYSINSLOT', ':0\r\n'],
    ['CLUSTER REPLICAS of a master without replicas', '*0\r\n'],
    ['a null reply', '*-1\r\n'],
    ['an incomplete reply', SLOTS_RESP2.slice(0, 40)],
  ];

  it.each(UNRELATED)('gives back %s as the same Buffer, asking nothing', (_name, text) => {
    for (const kind of [null, 'slots', 'shards', 'nodes', 'replicas'] as const) {
      const nodes = new FakeDirectory();
      const reply = latin1(text);
      expect(rewriteTopologyReply(kind, reply, nodes, ANNOUNCE)).toBe(reply);
      expect(nodes.calls).toEqual([]);
    }
  });

  it('gives back a reply of another shape than its kind as it was', () => {
    for (const [kind, reply] of [
      ['slots', SHARDS_RESP3],
      ['shards', SLOTS_RESP2],
      ['nodes', SLOTS_RESP2],
      ['replicas', SLOTS_RESP3],
    ] as const) {
      expect(rewrite(kind, reply)).toBe(reply);
    }
  });
});

describe('topologyReplyOf', () => {
  it.each([
    ['slots', 'slots'],
    ['SLOTS', 'slots'],
    ['Shards', 'shards'],
    ['nodes', 'nodes'],
    ['replicas', 'replicas'],
    ['SLAVES', 'replicas'],
  ])('CLUSTER %s gives %s', (subcommand, kind) => {
    expect(topologyReplyOf(subcommand)).toBe(kind);
  });

  it.each(['info', 'myid', 'getkeysinslot', 'countkeysinslot', 'links', 'slot', 'node', '', 'slots '])(
    'CLUSTER %j gives null',
    (subcommand) => {
      expect(topologyReplyOf(subcommand)).toBeNull();
    },
  );
});

describe('rewriteRedirect', () => {
  it.each([
    ['MOVED to an IP', '-MOVED 12182 127.0.0.1:32003', '-MOVED 12182 px.example:7103', ['redirect', 'address 127.0.0.1:32003']],
    ['ASK to an IP', '-ASK 12182 127.0.0.1:32003', '-ASK 12182 px.example:7103', ['address 127.0.0.1:32003']],
    [
      'MOVED to a host name',
      '-MOVED 3999 node-1.example:32001',
      '-MOVED 3999 px.example:7301',
      ['redirect', 'address node-1.example:32001'],
    ],
    ['ASK to a host name', '-ASK 3999 node-2.example:32002', '-ASK 3999 px.example:7302', ['address node-2.example:32002']],
    ['MOVED to "?"', '-MOVED 12182 ?:32003', '-MOVED 12182 ?:7203', ['redirect', 'address seed.internal:32003']],
    ['MOVED to the unknown endpoint', '-MOVED 12182 :32003', '-MOVED 12182 :7203', ['redirect', 'address seed.internal:32003']],
    ['ASK to the unknown endpoint', '-ASK 3999 :32001', '-ASK 3999 :7201', ['address seed.internal:32001']],
    ['MOVED to an unbracketed IPv6 address', '-MOVED 1 ::1:7000', '-MOVED 1 px.example:7400', ['redirect', 'address ::1:7000']],
    ['MOVED to a bracketed IPv6 address', '-MOVED 1 [::1]:7000', '-MOVED 1 px.example:7400', ['redirect', 'address ::1:7000']],
  ])('rewrites %s', (_name, line, expected, calls) => {
    const nodes = new FakeDirectory();
    expect(redirect(line, nodes)).toBe(expected);
    expect(nodes.calls).toEqual(calls);
  });

  it('writes an IPv6 announce host unbracketed, as Redis does', () => {
    expect(redirect('-MOVED 1 127.0.0.1:32001', new FakeDirectory(), { host: '2001:db8::1', upstreamHost: '::1' })).toBe(
      '-MOVED 1 2001:db8::1:7101',
    );
  });

  it.each([
    '-ERR unknown command',
    '-ERR MOVED 1 127.0.0.1:32001',
    '-moved 1 127.0.0.1:32001',
    '-MOVEDX 1 127.0.0.1:32001',
    '-MOVED',
    '-MOVED 1',
    '-MOVED x 127.0.0.1:32001',
    '-MOVED 1 127.0.0.1',
    '-MOVED 1 127.0.0.1:port',
    '-MOVED 1 127.0.0.1:123456',
    '-ASKING',
    '-A',
    "-CROSSSLOT Keys in request don't hash to the same slot",
    '-TRYAGAIN Multiple keys request during rehashing of slot',
    '-CLUSTERDOWN The cluster is down',
    '-LOADING Redis is loading the dataset in memory',
  ])('returns null for %j, asking nothing', (line) => {
    const nodes = new FakeDirectory();
    expect(redirect(line, nodes)).toBeNull();
    expect(nodes.calls).toEqual([]);
  });

  it('answers UnknownNode for a node the directory has no listener for, leaving the decision to the caller (a MOVED is still noted)', () => {
    const moved = new FakeDirectory();
    expect(redirect('-MOVED 1 10.9.9.9:6379', moved)).toBe('unknown 10.9.9.9:6379');
    expect(moved.calls).toEqual(['redirect', 'address 10.9.9.9:6379']);
    const ask = new FakeDirectory();
    expect(redirect('-ASK 1 ?:6379', ask)).toBe('unknown seed.internal:6379');
    expect(ask.calls).toEqual(['address seed.internal:6379']);
  });
});
