/**
 * Stalwart's stand-in in the examples' tests: a container (the proxy's image,
 * for its Node) that sends given bytes, Stalwart's exact lock pipelines among
 * them, to given addresses, and prints what came back. Each exchange ends with
 * QUIT, so the server's close marks the end of the replies.
 */
import { cmd, splitFrames } from '../../support/resp.js';

export interface Exchange {
  name: string;
  host: string;
  port: number;
  bytes: Buffer;
}

/**
 * Runs in the container as `node -e CLIENT_SCRIPT <exchanges>`: connects
 * (retrying while the address refuses, as an application retries a proxy
 * still starting), writes, reads until the server closes, prints one
 * `exchange` line per address, then idles until SIGTERM.
 */
const CLIENT_SCRIPT = `
const net = require('node:net');
const exchanges = JSON.parse(Buffer.from(process.argv[1], 'base64').toString());
process.on('SIGTERM', () => process.exit(0));
const deadline = Date.now() + 120000;
function exchange(x) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(x.port, x.host);
    const chunks = [];
    socket.on('connect', () => socket.write(Buffer.from(x.bytes, 'base64')));
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('error', (err) => {
      if (chunks.length || Date.now() > deadline) return reject(err);
      setTimeout(() => exchange(x).then(resolve, reject), 200);
    });
    socket.on('close', (hadError) => { if (!hadError) resolve(Buffer.concat(chunks)); });
  });
}
(async () => {
  for (const x of exchanges) {
    const replies = await exchange(x);
    console.log('exchange ' + JSON.stringify({ name: x.name, replies: replies.toString('base64') }));
  }
  setInterval(() => {}, 1 << 30);
})().catch((err) => { console.log('exchange failed: ' + err.message); process.exit(1); });
`;

/** The container's command: Node with the script and the exchanges. */
export function clientCommand(exchanges: Exchange[]): string[] {
  const encoded = exchanges.map((x) => ({ ...x, bytes: x.bytes.toString('base64') }));
  // Trimmed: podman 4.3's kube play passes a manifest through two YAML libraries, and a string
  // that starts with a line break does not survive the trip.
  return ['node', '-e', CLIENT_SCRIPT.trim(), Buffer.from(JSON.stringify(encoded)).toString('base64')];
}

/** `bytes` and then QUIT: the server answers +OK and closes. */
export function thenQuit(bytes: Buffer): Buffer {
  return Buffer.concat([bytes, cmd('QUIT')]);
}

/** The replies of each exchange the client's output reports, as frames; throws on a failure line. */
export function exchangesIn(logs: string): Map<string, string[]> {
  const failed = /^exchange failed: .*$/m.exec(logs);
  if (failed) throw new Error(`the client container: ${failed[0]}`);
  const results = new Map<string, string[]>();
  for (const [, json] of logs.matchAll(/^exchange (\{.*\})$/gm)) {
    const { name, replies } = JSON.parse(json) as { name: string; replies: string };
    results.set(
      name,
      splitFrames(Buffer.from(replies, 'base64')).frames.map((frame) => frame.toString('latin1')),
    );
  }
  return results;
}
