#!/usr/bin/env node
/**
 * Entry point: `redis-lock-proxy --listen HOST:PORT --upstream URL [--rules PATH]...`
 */
import { readFileSync } from 'node:fs';
import { resolveConfig, USAGE, type Config } from './config.js';
import { createLogger } from './log.js';
import { loadRules } from './rules/loader.js';
import { startProxy } from './server.js';
import { Stats } from './stats.js';

function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
  return pkg.version;
}

async function run(config: Config): Promise<void> {
  const log = createLogger(config.logLevel);
  const rules = loadRules([...config.rulePaths]);
  const byMode = { enforce: 0, observe: 0 };
  for (const rule of rules.rules) byMode[rule.mode]++;
  const stats = new Stats();
  const server = await startProxy(config.listen, {
    upstream: config.upstream,
    rules: () => rules,
    holdMs: config.holdMs,
    connectTimeoutMs: config.connectTimeoutMs,
    log,
    stats,
  });
  log.info(
    {
      listen: `${server.address.host}:${server.address.port}`,
      upstream: config.upstream.display,
      ruleFiles: rules.files,
      rules: rules.rules.map((r) => `${r.name} (${r.mode})`),
      enforce: byMode.enforce,
      observe: byMode.observe,
      version: packageVersion(),
    },
    'redis-lock-proxy listening',
  );
  const stop = (signal: string): void => {
    log.info({ signal }, 'shutting down');
    void server.close().then(() => process.exit(0));
  };
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
}

async function main(): Promise<void> {
  try {
    const request = resolveConfig(process.argv.slice(2), process.env);
    if (request.kind === 'help') {
      process.stdout.write(USAGE);
      return;
    }
    if (request.kind === 'version') {
      process.stdout.write(`${packageVersion()}\n`);
      return;
    }
    await run(request.config);
  } catch (err) {
    const error = err as NodeJS.ErrnoException;
    process.stderr.write(`redis-lock-proxy: ${error.message}\n`);
    process.exitCode = error.code === 'ECONFIG' || error.code === 'ERULEFILE' ? 2 : 1;
  }
}

void main();
