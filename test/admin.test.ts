import net from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { Gauge, Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { createMetricsRegistry } from '../src/admin/metrics.js';
import { readRulesView, rulesView } from '../src/admin/rules-view.js';
import { createRuleSet, parseRuleFile } from '../src/rules/loader.js';
import { FdBudget } from '../src/admin/fd-budget.js';
import { MAX_CONNECTIONS, METRICS_MAX_AGE_MS, startAdminServer, type AdminRefusal } from '../src/admin/server.js';
import type { Logger } from '../src/log.js';
import { Stats } from '../src/stats.js';
import { newVerifyNonce, verifyClientName, VerifyRuns } from '../src/verify-connection.js';
import { cmd } from './support/resp.js';
import { frameHeads } from './support/scan.js';

const P = 'redis_lock_proxy_';

/** A logger whose JSON lines are kept in `lines`. */
function captureLogger(): { log: Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString('utf8').split('\n')) if (line !== '') lines.push(JSON.parse(line));
      done();
    },
  });
  return { log: pino({ level: 'debug' }, sink), lines };
}

type Ready = () => Promise<{ ok: boolean; detail: string }>;

const servers: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

async function start(
  opts: { stats?: Stats; registry?: Registry; ready?: Ready; fdBudget?: FdBudget; rules?: () => unknown; verifyRuns?: VerifyRuns } = {},
) {
  const stats = opts.stats ?? new Stats();
  const registry = opts.registry ?? createMetricsRegistry(stats, { rulesLoaded: () => 2 });
  const { log, lines } = captureLogger();
  const refusals: AdminRefusal[] = [];
  const server = await startAdminServer(
    { host: '127.0.0.1', port: 0 },
    {
      registry,
      ready: opts.ready ?? (async () => ({ ok: true, detail: 'upstream reachable' })),
      log,
      fdBudget: opts.fdBudget,
      onRefused: (reason) => refusals.push(reason),
      rules: opts.rules,
      verifyRuns: opts.verifyRuns,
    },
  );
  servers.push(server);
  const base = `http://127.0.0.1:${server.address.port}`;
  return { stats, registry, server, base, lines, refusals };
}

/** A connection to the admin port that sends `bytes` and then nothing; resolves when it is open. */
async function idleConnection(port: number, bytes = ''): Promise<net.Socket & { closedAt?: number }> {
  const socket: net.Socket & { closedAt?: number } = net.connect({ host: '127.0.0.1', port });
  socket.on('error', () => {});
  socket.on('close', () => (socket.closedAt = Date.now()));
  socket.resume(); // reads (and drops) what the server sends, so its close is seen
  await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
  if (bytes !== '') socket.write(bytes);
  return socket;
}

async function scrape(base: string): Promise<string[]> {
  const res = await fetch(`${base}/metrics`);
  expect(res.status).toBe(200);
  return (await res.text()).split('\n');
}

/** The filled-in Stats most tests scrape. */
function filledStats(): Stats {
  const stats = new Stats();
  stats.connectionsOpen = 3;
  stats.connectionsTotal = 10;
  stats.connectionsRejected = 1;
  stats.commandsForwarded = 1234;
  stats.bytesFromClients = 5000;
  stats.bytesFromUpstream = 7000;
  stats.upstreamConnectFailures = 2;
  stats.scriptReloads = 4;
  stats.ruleReloads = 5;
  stats.ruleReloadFailures = 1;
  stats.blockSeen('r1');
  stats.blockSeen('r1');
  stats.blockRewritten('r1', 'transaction');
  stats.blockSeen('r1');
  stats.blockRewritten('r1', 'script');
  stats.blockSeen('r1');
  stats.blockClosed('r1');
  stats.blockFallback('r1', 'NOPERM');
  stats.blockSeen('r2');
  stats.blockObserved('r2');
  stats.blockFallback('r2', 'BUSY');
  stats.blockFallback('r2', 'BUSY');
  stats.countRelease('hold-timeout');
  stats.countRelease('hold-timeout');
  stats.countRelease('client-closed');
  stats.upstreamConnected(0.0003); // le=0.0005
  stats.upstreamConnected(0.003); // le=0.005
  stats.upstreamConnected(0.004); // le=0.005
  stats.upstreamConnected(0.005); // le=0.005 (bounds are inclusive)
  stats.upstreamConnected(0.2); // le=0.25
  stats.upstreamConnected(7); // +Inf only
  return stats;
}

describe('createMetricsRegistry', () => {
  it('exposes counters and gauges with their types, values and labels', async () => {
    const { base } = await start({ stats: filledStats() });
    const lines = await scrape(base);

    const expected = [
      `# TYPE ${P}connections_open gauge`,
      `${P}connections_open 3`,
      `# TYPE ${P}connections_total counter`,
      `${P}connections_total 10`,
      `# TYPE ${P}connections_rejected_total counter`,
      `${P}connections_rejected_total 1`,
      `# TYPE ${P}commands_forwarded_total counter`,
      `${P}commands_forwarded_total 1234`,
      `# TYPE ${P}client_bytes_received_total counter`,
      `${P}client_bytes_received_total 5000`,
      `# TYPE ${P}upstream_bytes_received_total counter`,
      `${P}upstream_bytes_received_total 7000`,
      `# TYPE ${P}upstream_connect_failures_total counter`,
      `${P}upstream_connect_failures_total 2`,
      `# TYPE ${P}blocks_total counter`,
      `${P}blocks_total{rule="r1",outcome="seen"} 4`,
      `${P}blocks_total{rule="r1",outcome="rewritten"} 2`,
      `${P}blocks_total{rule="r1",outcome="observed"} 0`,
      `${P}blocks_total{rule="r1",outcome="closed"} 1`,
      `${P}blocks_total{rule="r2",outcome="seen"} 1`,
      `${P}blocks_total{rule="r2",outcome="rewritten"} 0`,
      `${P}blocks_total{rule="r2",outcome="observed"} 1`,
      `# TYPE ${P}blocks_rewritten_total counter`,
      `${P}blocks_rewritten_total{method="transaction"} 1`,
      `${P}blocks_rewritten_total{method="script"} 1`,
      `# TYPE ${P}block_fallbacks_total counter`,
      `${P}block_fallbacks_total{rule="r1",reason="NOPERM"} 1`,
      `${P}block_fallbacks_total{rule="r2",reason="BUSY"} 2`,
      `# TYPE ${P}block_releases_total counter`,
      `${P}block_releases_total{reason="hold-timeout"} 2`,
      `${P}block_releases_total{reason="client-closed"} 1`,
      `# TYPE ${P}script_reloads_total counter`,
      `${P}script_reloads_total 4`,
      `# TYPE ${P}rule_reloads_total counter`,
      `${P}rule_reloads_total{result="ok"} 5`,
      `${P}rule_reloads_total{result="failed"} 1`,
      `# TYPE ${P}rules_loaded gauge`,
      `${P}rules_loaded 2`,
    ];
    for (const line of expected) expect(lines).toContain(line);
    // Every metric of ours has a HELP line.
    for (const line of expected.filter((l) => l.startsWith('# TYPE '))) {
      expect(lines.some((l) => l.startsWith(`# HELP ${line.split(' ')[2]} `))).toBe(true);
    }
  });

  it('exposes the connect latency as a Prometheus histogram with cumulative buckets', async () => {
    const { base } = await start({ stats: filledStats() });
    const lines = await scrape(base);
    const name = `${P}upstream_connect_seconds`;
    const start_ = lines.indexOf(`# TYPE ${name} histogram`);
    expect(start_).toBeGreaterThan(0);
    expect(lines[start_ - 1]).toBe(`# HELP ${name} Time to connect to the upstream Redis, in seconds.`);
    expect(lines.slice(start_ + 1, start_ + 18)).toEqual([
      `${name}_bucket{le="0.0005"} 1`,
      `${name}_bucket{le="0.001"} 1`,
      `${name}_bucket{le="0.0025"} 1`,
      `${name}_bucket{le="0.005"} 4`,
      `${name}_bucket{le="0.01"} 4`,
      `${name}_bucket{le="0.025"} 4`,
      `${name}_bucket{le="0.05"} 4`,
      `${name}_bucket{le="0.1"} 4`,
      `${name}_bucket{le="0.25"} 5`,
      `${name}_bucket{le="0.5"} 5`,
      `${name}_bucket{le="1"} 5`,
      `${name}_bucket{le="2.5"} 5`,
      `${name}_bucket{le="5"} 5`,
      `${name}_bucket{le="+Inf"} 6`,
      `${name}_sum 7.2123`,
      `${name}_count 6`,
      '',
    ]);
  });

  it('exposes an empty histogram and zero counters before anything happened', async () => {
    const { base } = await start();
    const lines = await scrape(base);
    expect(lines).toContain(`${P}connections_total 0`);
    expect(lines).toContain(`${P}upstream_connect_seconds_bucket{le="0.0005"} 0`);
    expect(lines).toContain(`${P}upstream_connect_seconds_bucket{le="+Inf"} 0`);
    expect(lines).toContain(`${P}upstream_connect_seconds_sum 0`);
    expect(lines).toContain(`${P}upstream_connect_seconds_count 0`);
    expect(lines).toContain(`${P}rule_reloads_total{result="ok"} 0`);
    expect(lines).toContain(`${P}rule_reloads_total{result="failed"} 0`);
    // Labelled counters without any series yet still declare themselves.
    expect(lines).toContain(`# TYPE ${P}blocks_total counter`);
    expect(lines.some((l) => l.startsWith(`${P}blocks_total{`))).toBe(false);
  });

  it('reads Stats afresh at each scrape', async () => {
    const stats = new Stats();
    let rules = 1;
    const registry = createMetricsRegistry(stats, { rulesLoaded: () => rules });
    const { base } = await start({ stats, registry });

    stats.connectionsTotal = 1;
    stats.connectionsOpen = 1;
    stats.blockSeen('r1');
    stats.upstreamConnected(0.0007);
    let lines = await scrape(base);
    expect(lines).toContain(`${P}connections_total 1`);
    expect(lines).toContain(`${P}connections_open 1`);
    expect(lines).toContain(`${P}blocks_total{rule="r1",outcome="seen"} 1`);
    expect(lines).toContain(`${P}upstream_connect_seconds_bucket{le="0.001"} 1`);
    expect(lines).toContain(`${P}upstream_connect_seconds_count 1`);
    expect(lines).toContain(`${P}rules_loaded 1`);
    expect(lines.some((l) => l.includes('rule="r9"'))).toBe(false);

    stats.connectionsTotal = 5;
    stats.connectionsOpen = 0;
    stats.blockSeen('r1');
    stats.blockSeen('r9');
    stats.blockFallback('r9', 'NOSCRIPT');
    stats.ruleReloadFailures++;
    stats.upstreamConnected(0.0007);
    stats.upstreamConnected(3);
    rules = 4;
    await new Promise((resolve) => setTimeout(resolve, METRICS_MAX_AGE_MS + 50)); // the next rendering
    lines = await scrape(base);
    // Counters are the totals, not added to what the previous scrape saw.
    expect(lines).toContain(`${P}connections_total 5`);
    expect(lines).toContain(`${P}connections_open 0`);
    expect(lines).toContain(`${P}blocks_total{rule="r1",outcome="seen"} 2`);
    expect(lines).toContain(`${P}blocks_total{rule="r9",outcome="seen"} 1`);
    expect(lines).toContain(`${P}block_fallbacks_total{rule="r9",reason="NOSCRIPT"} 1`);
    expect(lines).toContain(`${P}rule_reloads_total{result="failed"} 1`);
    expect(lines).toContain(`${P}upstream_connect_seconds_bucket{le="0.001"} 2`);
    expect(lines).toContain(`${P}upstream_connect_seconds_bucket{le="5"} 3`);
    expect(lines).toContain(`${P}upstream_connect_seconds_bucket{le="+Inf"} 3`);
    expect(lines).toContain(`${P}upstream_connect_seconds_count 3`);
    expect(lines).toContain(`${P}rules_loaded 4`);

    // A third scrape without changes shows the same totals (reset + add, not add).
    const again = await scrape(base);
    expect(again).toContain(`${P}connections_total 5`);
    expect(again).toContain(`${P}blocks_total{rule="r1",outcome="seen"} 2`);
  });

  it('exposes the process metrics, prefixed', async () => {
    const { base } = await start();
    const lines = await scrape(base);
    expect(lines).toContain(`# TYPE ${P}process_cpu_user_seconds_total counter`);
    expect(lines).toContain(`# TYPE ${P}process_start_time_seconds gauge`);
    expect(lines).toContain(`# TYPE ${P}nodejs_heap_size_total_bytes gauge`);
    expect(lines).toContain(`# TYPE ${P}nodejs_eventloop_lag_seconds gauge`);
    expect(lines.some((l) => l.startsWith(`${P}process_cpu_user_seconds_total `))).toBe(true);
  });

  it('gives a fresh registry per call and leaves rules_loaded and rule_file_info out unless asked', async () => {
    const a = createMetricsRegistry(new Stats());
    const b = createMetricsRegistry(new Stats(), { ruleFiles: () => ['rules/stalwart.yaml', 'x"y.yaml'] });
    expect(a).not.toBe(b);
    const textA = await a.metrics();
    const textB = await b.metrics();
    expect(textA).not.toContain(`${P}rules_loaded`);
    expect(textA).not.toContain(`${P}rule_file_info`);
    expect(textB.split('\n')).toContain(`${P}rule_file_info{file="rules/stalwart.yaml"} 1`);
    expect(textB.split('\n')).toContain(`${P}rule_file_info{file="x\\"y.yaml"} 1`);
  });

  it("exposes build_info: the version, the Node.js version and the rules' releases, as they are at each scrape", async () => {
    let releases = 'Stalwart 0.15.0 - 0.15.5';
    const registry = createMetricsRegistry(new Stats(), { build: () => ({ version: '1.2.3', ruleReleases: releases }) });
    const info = async () => (await registry.metrics()).split('\n').filter((l) => l.startsWith(`${P}build_info`));
    expect(await info()).toEqual([
      `${P}build_info{version="1.2.3",node_version="${process.version}",rule_releases="Stalwart 0.15.0 - 0.15.5"} 1`,
    ]);
    releases = 'Stalwart 0.16.0 - 0.16.15'; // the rules were reloaded
    expect(await info()).toEqual([
      `${P}build_info{version="1.2.3",node_version="${process.version}",rule_releases="Stalwart 0.16.0 - 0.16.15"} 1`,
    ]);
    expect(await createMetricsRegistry(new Stats()).metrics()).not.toContain(`${P}build_info`);
  });

  it('keeps the scrape working when a total is not a valid counter value', async () => {
    const stats = new Stats();
    stats.connectionsTotal = Number.NaN;
    stats.commandsForwarded = -1;
    const lines = (await createMetricsRegistry(stats).metrics()).split('\n');
    expect(lines).toContain(`${P}connections_total 0`);
    expect(lines).toContain(`${P}commands_forwarded_total 0`);
  });
});

describe('startAdminServer', () => {
  it('serves /metrics with the registry content type', async () => {
    const { base, registry } = await start();
    const res = await fetch(`${base}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe(registry.contentType);
    expect(res.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    const text = await res.text();
    expect(text.endsWith('\n')).toBe(true);
    expect(text).toContain(`# TYPE ${P}connections_open gauge`);
  });

  it('answers /healthz and ignores a query string', async () => {
    const { base } = await start();
    for (const path of ['/healthz', '/healthz?verbose=1']) {
      const res = await fetch(base + path);
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toBe('text/plain; charset=utf-8');
      expect(await res.text()).toBe('ok\n');
    }
  });

  it('answers /readyz from the readiness check', async () => {
    let state = { ok: true, detail: 'upstream 127.0.0.1:6379 reachable' };
    const { base } = await start({ ready: async () => state });

    let res = await fetch(`${base}/readyz`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('ready: upstream 127.0.0.1:6379 reachable\n');

    state = { ok: false, detail: 'upstream unreachable: ECONNREFUSED\nsecond line' };
    res = await fetch(`${base}/readyz`);
    expect(res.status).toBe(503);
    expect(await res.text()).toBe('not ready: upstream unreachable: ECONNREFUSED second line\n');
  });

  it('answers /readyz with 503 when the check times out after 2 s', async () => {
    const { base } = await start({ ready: () => new Promise(() => {}) });
    const started = Date.now();
    const res = await fetch(`${base}/readyz`);
    const elapsed = Date.now() - started;
    expect(res.status).toBe(503);
    expect(await res.text()).toBe('not ready: readiness check timed out\n');
    expect(elapsed).toBeGreaterThanOrEqual(1900);
    expect(elapsed).toBeLessThan(5000);
  });

  it('answers /readyz with 503 when the check throws, and logs it', async () => {
    const { base, lines } = await start({
      ready: async () => {
        throw new Error('sentinel lookup failed');
      },
    });
    const res = await fetch(`${base}/readyz`);
    expect(res.status).toBe(503);
    expect(await res.text()).toBe('not ready: readiness check failed: sentinel lookup failed\n');
    expect(lines.some((l) => l.msg === 'readiness check failed')).toBe(true);
  });

  it('answers 404 for other paths', async () => {
    const { base } = await start();
    for (const path of ['/metricsx', '/verify/abcd1234', '/rules', '/metrics/', '/nope', '//host/metrics']) {
      const res = await fetch(base + path);
      expect(res.status, path).toBe(404);
      expect(await res.text()).toBe('not found\n');
    }
    // An unknown path is 404 whatever the method.
    const res = await fetch(`${base}/nope`, { method: 'POST', body: 'x' });
    expect(res.status).toBe(404);
    await res.text();
  });

  it('lists the rules in force on /rules, as JSON verify reads back; 404 where none are given', async () => {
    const file = parseRuleFile(
      'releases: App 1.0.0 - 1.2.0\nrules:\n  - name: app-lock\n    prefix: "lock:"\n  - name: app-watch\n    prefix: "watch:"\n    mode: observe\n',
      'app.yaml',
    );
    const set = createRuleSet(file.rules, ['app.yaml'], file.releases);
    let mode: 'enforce' | 'observe' = 'enforce';
    const withRules = await start({ rules: () => rulesView(set, mode, '9.9.9', 'instance-1') });
    const get = async () => fetch(`${withRules.base}/rules`);
    const res = await get();
    expect([res.status, res.headers.get('content-type')]).toEqual([200, 'application/json; charset=utf-8']);
    const view = readRulesView(await res.json());
    expect(view).toEqual({
      version: '9.9.9',
      instance: 'instance-1',
      mode: 'enforce',
      releases: 'App 1.0.0 - 1.2.0',
      files: ['app.yaml'],
      rules: [
        { name: 'app-lock', mode: 'enforce', definition: set.rules[0].definition },
        { name: 'app-watch', mode: 'observe', definition: set.rules[1].definition },
      ],
    });
    mode = 'observe'; // a reload: the next answer says so
    expect(readRulesView(await (await get()).json()).rules.map((r) => r.mode)).toEqual(['observe', 'observe']);
    expect(() => readRulesView({ version: '1', mode: 'sometimes' })).toThrow(/not a list of rules/);
    expect(() => readRulesView({ ...view, instance: undefined })).toThrow(/not a list of rules/);

    const { base } = await start();
    expect((await fetch(`${base}/rules`)).status).toBe(404);
  });

  it('lists its endpoints on /, one a line with what each answers', async () => {
    const { base } = await start();
    const res = await fetch(`${base}/`);
    expect([res.status, res.headers.get('content-type')]).toEqual([200, 'text/plain; charset=utf-8']);
    expect(await res.text()).toBe(
      [
        '/         this list',
        '/metrics  Prometheus metrics',
        '/healthz  200 while the process runs',
        '/readyz   200 while the proxy can serve (rules loaded, Redis answers), else 503',
        '',
      ].join('\n'),
    );
    const head = await fetch(`${base}/`, { method: 'HEAD' });
    expect([head.status, await head.text()]).toEqual([200, '']);

    // With the rules and the verify runs, those too.
    const full = await start({ rules: () => ({}), verifyRuns: new VerifyRuns() });
    const list = (await (await fetch(`${full.base}/`)).text()).split('\n');
    expect(list.map((line) => line.split(' ')[0])).toEqual(['/', '/metrics', '/healthz', '/readyz', '/rules', '/verify/NONCE', '']);
    expect(list[5]).toMatch(/^\/verify\/NONCE {2}200 when a verify run's connection came through this proxy, else 404$/);
  });

  it("says on /verify/<nonce> whether a verify run's connection came through, with its instance id", async () => {
    const runs = new VerifyRuns();
    const { log } = captureLogger();
    const server = await startAdminServer(
      { host: '127.0.0.1', port: 0 },
      { registry: createMetricsRegistry(new Stats()), ready: async () => ({ ok: true, detail: '' }), log, verifyRuns: runs },
    );
    servers.push(server);
    const ask = (nonce: string) => fetch(`http://127.0.0.1:${server.address.port}/verify/${nonce}`);
    const nonce = newVerifyNonce();
    const unseen = await ask(nonce);
    expect([unseen.status, await unseen.text()]).toEqual([
      404,
      `not seen: no connection of verify run ${nonce} came through this proxy lately\n`,
    ]);
    for (const { scanner } of frameHeads(cmd('CLIENT', 'SETNAME', verifyClientName(nonce)))) runs.named(scanner);
    const seen = await ask(nonce);
    expect([seen.status, seen.headers.get('content-type')]).toEqual([200, 'application/json; charset=utf-8']);
    expect(await seen.json()).toEqual({ instance: runs.instance, nonce });
    // What is not a nonce is not a path.
    for (const other of ['', 'ABCD1234', `${nonce}/x`, 'abc', '../rules']) {
      const res = await ask(other);
      expect([res.status, await res.text()], other).toEqual([404, 'not found\n']);
    }
  });

  it('answers 405 with Allow for other methods', async () => {
    const { base } = await start();
    for (const method of ['POST', 'PUT', 'DELETE', 'OPTIONS']) {
      const res = await fetch(`${base}/metrics`, { method, body: method === 'POST' || method === 'PUT' ? 'payload' : undefined });
      expect(res.status, method).toBe(405);
      expect(res.headers.get('allow')).toBe('GET, HEAD');
      expect(await res.text()).toBe('method not allowed\n');
    }
    // The connection is still usable afterwards.
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
  });

  it('answers HEAD like GET without a body', async () => {
    // A registry without process metrics, so that two scrapes are the same size.
    const registry = new Registry();
    new Gauge({
      name: 'fixed',
      help: 'a fixed value',
      registers: [registry],
      collect() {
        this.set(42);
      },
    });
    const { base } = await start({ registry, ready: async () => ({ ok: false, detail: 'starting' }) });

    const get = await fetch(`${base}/metrics`);
    const body = await get.text();
    expect(body).toBe('# HELP fixed a fixed value\n# TYPE fixed gauge\nfixed 42\n');
    expect(get.headers.get('content-length')).toBe(String(body.length));
    const head = await fetch(`${base}/metrics`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(head.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    expect(head.headers.get('content-length')).toBe(String(body.length));
    expect(await head.text()).toBe('');

    const health = await fetch(`${base}/healthz`, { method: 'HEAD' });
    expect(health.status).toBe(200);
    expect(health.headers.get('content-length')).toBe('3');
    expect(await health.text()).toBe('');

    const ready = await fetch(`${base}/readyz`, { method: 'HEAD' });
    expect(ready.status).toBe(503);
    expect(ready.headers.get('content-length')).toBe(String('not ready: starting\n'.length));
    expect(await ready.text()).toBe('');

    const missing = await fetch(`${base}/nope`, { method: 'HEAD' });
    expect(missing.status).toBe(404);
    expect(await missing.text()).toBe('');
  });

  it('answers 500 and logs when serving fails', async () => {
    const registry = new Registry();
    new Gauge({
      name: 'broken',
      help: 'throws when collected',
      registers: [registry],
      collect() {
        throw new Error('collector exploded');
      },
    });
    const { base, lines } = await start({ registry });
    const res = await fetch(`${base}/metrics`);
    expect(res.status).toBe(500);
    expect(await res.text()).toBe('internal error\n');
    const logged = lines.find((l) => l.msg === 'admin request failed');
    expect(logged).toBeDefined();
    expect(logged?.level).toBe(50);
    expect((logged?.err as { message?: string } | undefined)?.message).toBe('collector exploded');
    // Other endpoints keep working.
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
  });

  it('reports the bound address and closes with keep-alive connections open', async () => {
    const { server, base, lines } = await start();
    expect(server.address.host).toBe('127.0.0.1');
    expect(server.address.port).toBeGreaterThan(0);
    expect(lines.some((l) => l.msg === 'admin server listening' && l.port === server.address.port)).toBe(true);

    // fetch keeps this connection alive after the response.
    const res = await fetch(`${base}/healthz`);
    expect(await res.text()).toBe('ok\n');

    const closed = Date.now();
    await server.close();
    expect(Date.now() - closed).toBeLessThan(1000);
    await server.close(); // a second close is harmless
    await expect(fetch(`${base}/healthz`)).rejects.toThrow();
  });

  it(`holds at most ${MAX_CONNECTIONS} connections: more are closed as they come, counted and logged`, async () => {
    const { server, base, lines, refusals } = await start();
    const sockets = await Promise.all(Array.from({ length: MAX_CONNECTIONS + 10 }, () => idleConnection(server.address.port)));
    try {
      await expect.poll(() => sockets.filter((s) => s.closedAt !== undefined).length, { timeout: 5000 }).toBe(10);
      expect(refusals.filter((r) => r === 'connections')).toHaveLength(10);
      expect(
        lines.find((l) => l.msg === 'admin server: connections refused (the connection cap, or file descriptors kept for clients)'),
      ).toMatchObject({
        level: 40,
        refused: { connections: 1 },
        maxConnections: MAX_CONNECTIONS,
      });
      // Once connections go, new ones are served.
      for (const socket of sockets) socket.destroy();
      await expect.poll(async () => (await fetch(`${base}/healthz`).catch(() => undefined))?.status, { timeout: 5000 }).toBe(200);
    } finally {
      for (const socket of sockets) socket.destroy();
    }
  });

  it('closes a connection whose request does not arrive in time (slow headers, or nothing at all)', async () => {
    const { server } = await start();
    const started = Date.now();
    const slow = await idleConnection(server.address.port, 'GET /metrics HTTP/1.1\r\nHost: x\r\n');
    const silent = await idleConnection(server.address.port);
    try {
      // Headers are due within 5 s; Node looks every second.
      await expect.poll(() => slow.closedAt !== undefined && silent.closedAt !== undefined, { timeout: 15_000, interval: 200 }).toBe(true);
      expect((slow.closedAt ?? 0) - started).toBeGreaterThanOrEqual(4_500);
      console.info(
        `admin: slow headers closed after ${(slow.closedAt ?? 0) - started} ms, a silent connection after ${(silent.closedAt ?? 0) - started} ms`,
      );
    } finally {
      slow.destroy();
      silent.destroy();
    }
  }, 20_000);

  it('never takes the file descriptors kept for clients', async () => {
    // 1,000 open of a limit of 1,024, with 64 kept: no room for an admin connection.
    const { base, refusals } = await start({ fdBudget: new FdBudget(1024, 64, () => 1000) });
    await expect(fetch(`${base}/healthz`)).rejects.toThrow();
    expect(refusals).toContain('file-descriptors');
    // 900 open: room.
    const roomy = await start({ fdBudget: new FdBudget(1024, 64, () => 900) });
    expect((await fetch(`${roomy.base}/healthz`)).status).toBe(200);
  });

  it(`renders /metrics once per ${METRICS_MAX_AGE_MS} ms however many ask`, async () => {
    const registry = new Registry();
    let collected = 0;
    new Gauge({
      name: 'renders',
      help: 'how many times the registry was rendered',
      registers: [registry],
      collect() {
        this.set(++collected);
      },
    });
    const { base } = await start({ registry });
    const texts = await Promise.all(Array.from({ length: 20 }, async () => (await fetch(`${base}/metrics`)).text()));
    expect(collected).toBe(1);
    expect(new Set(texts).size).toBe(1);
    await new Promise((resolve) => setTimeout(resolve, METRICS_MAX_AGE_MS + 100));
    expect(await (await fetch(`${base}/metrics`)).text()).toContain('renders 2');
  });

  it('fails to start on an address in use', async () => {
    const { server } = await start();
    const { log } = captureLogger();
    await expect(
      startAdminServer(
        { host: '127.0.0.1', port: server.address.port },
        { registry: new Registry(), ready: async () => ({ ok: true, detail: '' }), log },
      ),
    ).rejects.toMatchObject({ code: 'EADDRINUSE' });
  });
});
