/**
 * HELLO 3's reply, the first a RESP3 client of the integrity stress gets: Redis's own map of what
 * it is (server, version, proto 3, the connection's id, mode, role, modules). All of it but the id
 * is the same for every connection to one server line, so a probe connection asks for it before
 * the run, and each client's reply must be that one byte for byte, its own id apart.
 */
import { RawClient } from '../support/resp.js';
import type { Endpoint } from './client.js';
import type { Segment } from './expected.js';

/** The id field of HELLO's map, and what stands for any id in the template. */
const ID = /\$2\r\nid\r\n:(0|[1-9][0-9]*)\r\n/;
const ANY_ID = '$2\r\nid\r\n:<id>\r\n';

/** The template of HELLO 3's reply (the probe's, its id left out), or why the server refused HELLO 3 (before Redis 6.0). */
export type HelloProbe = { readonly template: string } | { readonly refused: string };

/** Asks `endpoint` for HELLO 3's reply on a connection of its own. */
export async function probeHello(endpoint: Endpoint): Promise<HelloProbe> {
  const link = await RawClient.connect(endpoint.port, endpoint.host);
  try {
    const reply = await link.call('HELLO', '3');
    if (reply.startsWith('-')) return { refused: reply.trim() };
    if (!reply.startsWith('%') || !ID.test(reply))
      throw new Error(`HELLO 3 answered ${JSON.stringify(reply)}, no map with the connection's id`);
    return { template: reply.replace(ID, ANY_ID) };
  } finally {
    await link.close();
  }
}

/** The segment of HELLO 3's reply: the template, with an id of the connection's own. */
export function helloSegment(template: string): Segment {
  return {
    kind: 'frame',
    what: 'HELLO 3',
    endsReply: true,
    check: (frame) => {
      const text = frame.toString('latin1');
      if (ID.test(text) && text.replace(ID, ANY_ID) === template) return null;
      return `differs from the probe connection's ${JSON.stringify(template)}, the id apart`;
    },
  };
}
