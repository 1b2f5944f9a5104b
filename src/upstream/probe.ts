/**
 * Is the upstream reachable? One short connection: the URL's AUTH/SELECT if
 * any, then PING. Used by /readyz.
 */
import { encodeCommand } from '../resp/encode.js';
import { ReplyScanner } from '../resp/reply-scanner.js';
import type { UpstreamConnector } from './connect.js';

const PING = encodeCommand('PING');

export function probeUpstream(connector: UpstreamConnector, timeoutMs: number): Promise<{ ok: boolean; detail: string }> {
  return new Promise((resolve) => {
    const { socket, address } = connector.connect();
    const commands = [...connector.setup, PING];
    let received = Buffer.alloc(0);
    const finish = (ok: boolean, detail: string): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve({ ok, detail });
    };
    const timer = setTimeout(() => finish(false, `upstream ${address} did not answer PING within ${timeoutMs} ms`), timeoutMs);
    socket.on('error', (err) => finish(false, `upstream ${address} unreachable: ${err.message}`));
    socket.write(Buffer.concat(commands));
    socket.on('data', (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
      const replies = countReplies(received);
      if (replies === NOT_RESP) {
        const shown = JSON.stringify(
          received
            .subarray(0, 16)
            .toString('latin1')
            .replace(/[^\x20-\x7e]/g, '?'),
        );
        finish(false, `upstream ${address} does not speak RESP (it answered ${shown}...)`);
        return;
      }
      if (replies < commands.length) return;
      // -NOAUTH means reachable: the clients bring their own credentials.
      const error = /^-(?!NOAUTH)(.*)$/m.exec(received.toString('latin1'));
      if (error) finish(false, `upstream ${address} answered: ${error[1].trim()}`);
      else finish(true, `upstream ${address} answers PING`);
    });
  });
}

/** countReplies' answer for bytes that are not RESP. */
const NOT_RESP = -1;

function countReplies(bytes: Buffer): number {
  const scanner = new ReplyScanner();
  scanner.newChunk();
  scanner.scan(bytes, 0, Number.MAX_SAFE_INTEGER);
  return scanner.error === '' ? scanner.replies : NOT_RESP;
}

/**
 * The server's answer to HELLO (without arguments: it changes nothing) on a short connection of
 * the proxy's own, after the URL's AUTH/SELECT: the address it reached and HELLO's reply, or null
 * when it cannot tell (unreachable, the setup refused, no answer within `timeoutMs`).
 */
export function askHello(
  connector: UpstreamConnector,
  hello: Buffer,
  timeoutMs: number,
): Promise<{ address: string; reply: Buffer } | null> {
  return new Promise((resolve) => {
    const { socket, address } = connector.connect();
    const setup = connector.setup.length;
    let received = Buffer.alloc(0);
    const finish = (answer: { address: string; reply: Buffer } | null): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(answer);
    };
    const timer = setTimeout(() => finish(null), timeoutMs);
    timer.unref();
    socket.on('error', () => finish(null));
    socket.write(Buffer.concat([...connector.setup, hello]));
    socket.on('data', (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
      const scanner = new ReplyScanner();
      scanner.newChunk();
      let afterSetup = 0;
      if (setup > 0) {
        afterSetup = scanner.scan(received, 0, setup);
        if (scanner.error !== '') return finish(null);
        if (scanner.replies < setup) return;
      }
      // AUTH and SELECT answer +OK: anything else, and the question is the client connection's.
      if (setup > 0 && /^-/m.test(received.toString('latin1', 0, afterSetup))) return finish(null);
      const end = scanner.scan(received, afterSetup, 1);
      if (scanner.error !== '') return finish(null);
      if (scanner.replies === 1) finish({ address, reply: received.subarray(afterSetup, end) });
    });
  });
}
