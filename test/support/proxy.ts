/**
 * Starts the proxy in the test process, in front of a test Redis, with rules
 * from YAML text or files, and a logger whose lines the test can read.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import type { ListenerTls, UpstreamTls } from '../../src/config.js';
import { RuleStore } from '../../src/rules/store.js';
import { startProxy, type ProxyServer } from '../../src/server.js';
import { Stats } from '../../src/stats.js';
import { UpstreamConnector } from '../../src/upstream/connect.js';
import { parseUpstreamUrl } from '../../src/upstream/target.js';

export const STALWART_RULES = path.resolve(import.meta.dirname, '../../rules/stalwart.yaml');

/** Rules for tests: Stalwart's, plus text prefixes `lock:` (enforce) and `watch:` (observe). */
export const TEST_RULES = `rules:
  - name: test-lock
    prefix: "lock:"
  - name: test-observe
    prefix: "watch:"
    mode: observe
`;

export interface TestProxy {
  readonly port: number;
  readonly stats: Stats;
  readonly server: ProxyServer;
  readonly rules: RuleStore;
  /** The rule files in force (in a temporary directory the test may rewrite). */
  readonly ruleFiles: readonly string[];
  /** Parsed log lines written so far. */
  logs(): Array<Record<string, unknown>>;
  close(): Promise<void>;
}

export interface TestProxyOptions {
  upstream: string;
  /** YAML rule texts, written to a temporary directory (default: Stalwart's rules and TEST_RULES). */
  rules?: string[];
  holdMs?: number;
  connectTimeoutMs?: number;
  mode?: 'enforce' | 'observe';
  maxFrameBytes?: number;
  idleTimeoutMs?: number;
  lockPipelining?: boolean;
  maxConnections?: number;
  upstreamTls?: UpstreamTls;
  listenerTls?: ListenerTls;
}

export async function startTestProxy(opts: TestProxyOptions): Promise<TestProxy> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-rules-'));
  const files = (opts.rules ?? [TEST_RULES]).map((text, i) => {
    const file = path.join(dir, `${i}.yaml`);
    fs.writeFileSync(file, text);
    return file;
  });
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(...chunk.toString().split('\n').filter((l) => l !== ''));
      done();
    },
  });
  const log = pino({ level: 'debug' }, sink);
  const stats = new Stats();
  const rules = new RuleStore(opts.rules === undefined ? [STALWART_RULES, ...files] : files, log, stats);
  const server: ProxyServer = await startProxy(
    { listen: { host: '127.0.0.1', port: 0 }, tls: opts.listenerTls, maxConnections: opts.maxConnections },
    {
      upstream: new UpstreamConnector(parseUpstreamUrl(opts.upstream), opts.upstreamTls ?? null),
      rules: () => rules.current,
      mode: opts.mode ?? 'enforce',
      holdMs: opts.holdMs ?? 10,
      connectTimeoutMs: opts.connectTimeoutMs ?? 2000,
      maxFrameBytes: opts.maxFrameBytes ?? 512 * 1024 * 1024,
      idleTimeoutMs: opts.idleTimeoutMs ?? 0,
      lockPipelining: opts.lockPipelining ?? false,
      log,
      stats,
    },
  );
  return {
    port: server.address.port,
    stats,
    server,
    rules,
    ruleFiles: files,
    logs: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>),
    close: async () => {
      rules.close();
      await server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
