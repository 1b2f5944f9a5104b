/**
 * Admin HTTP server: /metrics (Prometheus), /healthz (the process answers),
 * /readyz (the proxy can serve), /rules (the rules in force, JSON, for
 * `verify`), /verify/<nonce> (whether a verify run's connection came through
 * this proxy), and / (the list of these). Loopback by default (see --admin-listen);
 * it has no authentication, so it should not be exposed beyond the host or
 * the pod.
 *
 * It shares the process, its event loop and its file descriptors with the
 * data path, so whoever reaches it must not be able to starve the clients:
 * it holds at most MAX_CONNECTIONS connections, never takes the last file
 * descriptors (fd-budget.ts), drops connections whose request does not
 * arrive in time, and renders /metrics at most once per METRICS_MAX_AGE_MS
 * however many ask. What it refuses is counted and logged (at most once
 * every REFUSAL_LOG_MS).
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Registry } from 'prom-client';
import type { Logger } from '../log.js';
import { isVerifyNonce, type VerifyRuns } from '../verify-connection.js';
import { FdBudget } from './fd-budget.js';

/** How long /readyz waits for the readiness check before answering 503. */
const READY_TIMEOUT_MS = 2000;
/** Connections at once: scrapers and probes need a handful; more are closed as they come. */
export const MAX_CONNECTIONS = 32;
/** A request's headers must be in within this, the whole request within REQUEST_TIMEOUT_MS. */
const HEADERS_TIMEOUT_MS = 5_000;
const REQUEST_TIMEOUT_MS = 10_000;
/** An idle keep-alive connection is closed after this. */
const KEEP_ALIVE_TIMEOUT_MS = 5_000;
/** How often Node looks for requests past those timeouts (its default, 30 s, lets them linger). */
const TIMEOUT_CHECK_MS = 1_000;
/** /metrics is rendered once, then served as it is for this long. */
export const METRICS_MAX_AGE_MS = 1_000;
/** Refused connections are logged at most this often, with how many since the last line. */
const REFUSAL_LOG_MS = 10_000;

/** Why a connection was refused: the cap on connections, or file descriptors kept for clients. */
export type AdminRefusal = 'connections' | 'file-descriptors';

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
  /** The rules in force as /rules lists them (rules-view.ts); /rules answers 404 without it. */
  rules?: () => unknown;
  /** The verify runs seen on the data port; /verify/<nonce> answers 404 without it. */
  verifyRuns?: Pick<VerifyRuns, 'instance' | 'saw'>;
  /** Told of each connection refused (for a metric). */
  onRefused?: (reason: AdminRefusal) => void;
  /** The file descriptors it may take (default: this process's, from /proc). */
  fdBudget?: FdBudget;
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

/** `listen`: where to bind, or the descriptor of a listening socket systemd passed (socket activation). */
export async function startAdminServer(
  listen: { host: string; port: number } | { fd: number },
  opts: AdminServerOptions,
): Promise<AdminServer> {
  const { log } = opts;
  const metrics = new RenderedMetrics(opts.registry);
  const fds = opts.fdBudget ?? FdBudget.ofThisProcess();
  const refused = refusalLog(log, opts.onRefused);

  const server = createServer(
    {
      headersTimeout: HEADERS_TIMEOUT_MS,
      requestTimeout: REQUEST_TIMEOUT_MS,
      keepAliveTimeout: KEEP_ALIVE_TIMEOUT_MS,
      connectionsCheckingInterval: TIMEOUT_CHECK_MS,
    },
    (req, res) => {
      respond(req, res, opts, metrics).catch((err: unknown) => {
        log.error({ err, method: req.method, url: req.url }, 'admin request failed');
        if (!res.headersSent) {
          send(req, res, { status: 500, body: 'internal error\n' });
        } else {
          res.destroy();
        }
      });
    },
  );
  // Over the cap Node closes a connection as soon as it is accepted, and says so with 'drop'.
  server.maxConnections = MAX_CONNECTIONS;
  server.on('drop', () => refused('connections'));
  server.on('connection', (socket: Socket) => {
    if (fds.take()) return;
    socket.destroy();
    refused('file-descriptors');
  });

  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error): void => reject(err);
    server.once('error', onError);
    const listening = (): void => {
      server.off('error', onError);
      resolve();
    };
    if ('fd' in listen) server.listen({ fd: listen.fd }, listening);
    else server.listen(listen.port, listen.host, listening);
  });
  server.on('error', (err) => log.error({ err }, 'admin server error'));

  const bound = server.address();
  if (bound === null || typeof bound === 'string') {
    server.close();
    throw new Error('not a TCP socket (the admin server listens on TCP only)');
  }
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

async function respond(req: IncomingMessage, res: ServerResponse, opts: AdminServerOptions, metrics: RenderedMetrics): Promise<void> {
  // The path alone: no URL parsing, so "//host/metrics" is not mistaken for "/metrics".
  const url = req.url ?? '/';
  const query = url.indexOf('?');
  const path = query === -1 ? url : url.slice(0, query);

  const verifyNonce = opts.verifyRuns !== undefined && path.startsWith(VERIFY_PATH) ? path.slice(VERIFY_PATH.length) : undefined;
  if (!endpoints(opts).some((endpoint) => endpoint.path === path) && (verifyNonce === undefined || !isVerifyNonce(verifyNonce))) {
    send(req, res, { status: 404, body: 'not found\n' });
    return;
  }
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    send(req, res, { status: 405, body: 'method not allowed\n', headers: { Allow: 'GET, HEAD' } });
    return;
  }

  if (verifyNonce !== undefined) {
    send(req, res, verifyRunReply(verifyNonce, opts.verifyRuns as Pick<VerifyRuns, 'instance' | 'saw'>));
    return;
  }
  switch (path) {
    case '/':
      send(req, res, { status: 200, body: endpointList(opts) });
      return;
    case '/metrics': {
      const body = await metrics.text();
      send(req, res, { status: 200, body, contentType: opts.registry.contentType });
      return;
    }
    case '/healthz':
      send(req, res, { status: 200, body: 'ok\n' });
      return;
    case '/rules':
      send(req, res, { status: 200, body: `${JSON.stringify(opts.rules?.())}\n`, contentType: 'application/json; charset=utf-8' });
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

const VERIFY_PATH = '/verify/';

/** The endpoints this server answers, with a few words on each, as `GET /` lists them. */
function endpoints(opts: AdminServerOptions): Array<{ path: string; what: string }> {
  return [
    { path: '/', what: 'this list' },
    { path: '/metrics', what: 'Prometheus metrics' },
    { path: '/healthz', what: '200 while the process runs' },
    { path: '/readyz', what: '200 while the proxy can serve (rules loaded, Redis answers), else 503' },
    ...(opts.rules === undefined ? [] : [{ path: '/rules', what: 'the rules in force, as JSON (read by verify)' }]),
    ...(opts.verifyRuns === undefined
      ? []
      : [{ path: `${VERIFY_PATH}NONCE`, what: "200 when a verify run's connection came through this proxy, else 404" }]),
  ];
}

function endpointList(opts: AdminServerOptions): string {
  const list = endpoints(opts);
  const width = Math.max(...list.map((endpoint) => endpoint.path.length));
  return list.map((endpoint) => `${endpoint.path.padEnd(width)}  ${endpoint.what}\n`).join('');
}

/**
 * Whether a connection named by the verify run `nonce` came through this proxy lately: verify
 * asks it to learn that this admin endpoint and the data port it went through are one proxy.
 */
function verifyRunReply(nonce: string, runs: Pick<VerifyRuns, 'instance' | 'saw'>): Reply {
  if (runs.saw(nonce)) {
    return { status: 200, body: `${JSON.stringify({ instance: runs.instance, nonce })}\n`, contentType: 'application/json; charset=utf-8' };
  }
  return { status: 404, body: `not seen: no connection of verify run ${nonce} came through this proxy lately\n` };
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

/**
 * /metrics as last rendered: rendering takes milliseconds of the event loop the clients share, so
 * it happens at most once per METRICS_MAX_AGE_MS, and requests that come while it runs wait for
 * that one rendering.
 */
class RenderedMetrics {
  private rendered: { text: string; at: number } | undefined;
  private rendering: Promise<string> | undefined;

  constructor(private readonly registry: Registry) {}

  text(): Promise<string> {
    if (this.rendered !== undefined && Date.now() - this.rendered.at < METRICS_MAX_AGE_MS) return Promise.resolve(this.rendered.text);
    this.rendering ??= this.registry
      .metrics()
      .then((text) => {
        this.rendered = { text, at: Date.now() };
        return text;
      })
      .finally(() => (this.rendering = undefined));
    return this.rendering;
  }
}

/** Counts each refused connection, and logs them at most once every REFUSAL_LOG_MS, with how many and why. */
function refusalLog(log: Logger, onRefused: ((reason: AdminRefusal) => void) | undefined): (reason: AdminRefusal) => void {
  const since = new Map<AdminRefusal, number>();
  let lastLog = 0;
  return (reason) => {
    onRefused?.(reason);
    since.set(reason, (since.get(reason) ?? 0) + 1);
    if (Date.now() - lastLog < REFUSAL_LOG_MS) return;
    lastLog = Date.now();
    const counts = Object.fromEntries(since);
    since.clear();
    log.warn(
      { refused: counts, maxConnections: MAX_CONNECTIONS },
      'admin server: connections refused (the connection cap, or file descriptors kept for clients)',
    );
  };
}
