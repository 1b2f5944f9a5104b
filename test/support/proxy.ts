/**
 * Starts the proxy in the test process, in front of a test Redis, with rules
 * from YAML text or files, and a logger whose lines the test can read.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { loadRules } from '../../src/rules/loader.js';
import { startProxy, type ProxyServer } from '../../src/server.js';
import { Stats } from '../../src/stats.js';
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
}

export async function startTestProxy(opts: TestProxyOptions): Promise<TestProxy> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-rules-'));
  const files = (opts.rules ?? [TEST_RULES]).map((text, i) => {
    const file = path.join(dir, `${i}.yaml`);
    fs.writeFileSync(file, text);
    return file;
  });
  const rules = loadRules(opts.rules === undefined ? [STALWART_RULES, ...files] : files);
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(...chunk.toString().split('\n').filter((l) => l !== ''));
      done();
    },
  });
  const log = pino({ level: 'debug' }, sink);
  const stats = new Stats();
  const server: ProxyServer = await startProxy(
    { host: '127.0.0.1', port: 0 },
    {
      upstream: parseUpstreamUrl(opts.upstream),
      rules: () => rules,
      holdMs: opts.holdMs ?? 10,
      connectTimeoutMs: opts.connectTimeoutMs ?? 2000,
      log,
      stats,
    },
  );
  return {
    port: server.address.port,
    stats,
    logs: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>),
    close: async () => {
      await server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
