/**
 * Admin HTTP server: /metrics (Prometheus), /healthz (the process answers),
 * /readyz (the proxy can serve). Loopback by default (see --admin-listen);
 * it has no authentication, so it should not be exposed beyond the host or
 * the pod.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import type { Logger } from '../log.js';

/** How long /readyz waits for the readiness check before answering 503. */
const READY_TIMEOUT_MS = 2000;

const TEXT = 'text/plain; charset=utf-8';

export interface Readiness {
  ok: boolean;
  detail: string;
}

export interface AdminServerOptions {
  registry: Registry;
  /** Whether the proxy can serve; `detail` is shown after "ready:" / "not ready:". */
  ready: () => Promise<Readiness>;
  log: Logger;
}

export interface AdminServer {
  /** The address actually bound (port 0 resolved). */
  address: { host: string; port: number };
  /** Stops listening and closes every open connection, keep-alive ones included. */
  close(): Promise<void>;
}

interface Reply {
  status: number;
  body: string;
  contentType?: string;
  headers?: Record<string, string>;
}

export async function startAdminServer(listen: { host: string; port: number }, opts: AdminServerOptions): Promise<AdminServer> {
  const { log } = opts;

  const server = createServer((req, res) => {
    respond(req, res, opts).catch((err: unknown) => {
      log.error({ err, method: req.method, url: req.url }, 'admin request failed');
      if (!res.headersSent) {
        send(req, res, { status: 500, body: 'internal error\n' });
      } else {
        res.destroy();
      }
    });
  });

  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error): void => reject(err);
    server.once('error', onError);
    server.listen(listen.port, listen.host, () => {
      server.off('error', onError);
      resolve();
    });
  });
  server.on('error', (err) => log.error({ err }, 'admin server error'));

  const bound = server.address() as AddressInfo;
  const address = { host: bound.address, port: bound.port };
  log.info({ host: address.host, port: address.port }, 'admin server listening');

  let closing: Promise<void> | undefined;
  return {
    address,
    close() {
      closing ??= new Promise<void>((resolve) => {
        // The callback runs once every connection is gone; its error
        // (server not running) cannot happen as close is only called once.
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}

async function respond(req: IncomingMessage, res: ServerResponse, opts: AdminServerOptions): Promise<void> {
  // The path alone: no URL parsing, so "//host/metrics" is not mistaken for "/metrics".
  const url = req.url ?? '/';
  const query = url.indexOf('?');
  const path = query === -1 ? url : url.slice(0, query);

  if (path !== '/metrics' && path !== '/healthz' && path !== '/readyz') {
    send(req, res, { status: 404, body: 'not found\n' });
    return;
  }
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    send(req, res, { status: 405, body: 'method not allowed\n', headers: { Allow: 'GET, HEAD' } });
    return;
  }

  switch (path) {
    case '/metrics': {
      const body = await opts.registry.metrics();
      send(req, res, { status: 200, body, contentType: opts.registry.contentType });
      return;
    }
    case '/healthz':
      send(req, res, { status: 200, body: 'ok\n' });
      return;
    case '/readyz': {
      const readiness = await checkReady(opts);
      send(req, res, {
        status: readiness.ok ? 200 : 503,
        body: `${readiness.ok ? 'ready' : 'not ready'}: ${oneLine(readiness.detail)}\n`,
      });
      return;
    }
  }
}

/** The readiness check, bounded by READY_TIMEOUT_MS; a check that throws counts as not ready. */
async function checkReady(opts: AdminServerOptions): Promise<Readiness> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<Readiness>((resolve) => {
    timer = setTimeout(() => resolve({ ok: false, detail: 'readiness check timed out' }), READY_TIMEOUT_MS);
  });
  try {
    // Promise.race subscribes to the check, so its late rejection after a
    // timeout is handled rather than reported as unhandled.
    return await Promise.race([Promise.resolve().then(() => opts.ready()), timeout]);
  } catch (err) {
    opts.log.warn({ err }, 'readiness check failed');
    return { ok: false, detail: `readiness check failed: ${err instanceof Error ? err.message : String(err)}` };
  } finally {
    clearTimeout(timer);
  }
}

/** Keeps a detail on the status line it is printed on. */
function oneLine(text: string): string {
  return text.replace(/[\r\n]+/g, ' ');
}

function send(req: IncomingMessage, res: ServerResponse, reply: Reply): void {
  const body = Buffer.from(reply.body, 'utf8');
  res.writeHead(reply.status, {
    'Content-Type': reply.contentType ?? TEXT,
    'Content-Length': body.length,
    'Cache-Control': 'no-store',
    ...reply.headers,
  });
  // HEAD: the same status and headers (Content-Length included), no body.
  if (req.method === 'HEAD') res.end();
  else res.end(body);
}
