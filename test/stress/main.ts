/**
 * `npm run stress`: the integrity stress (run.ts) for as long as asked, against Redis through
 * the proxy, one configuration after another. It exits 1 when any reply was wrong, printing
 * each with the seed that repeats the run, and 0 when every byte was right.
 *
 * With REDIS_TEST_IMAGE set (e.g. a Valkey image the tests build), every server it starts is a
 * container of that image.
 */
import process from 'node:process';
import { parseArgs } from 'node:util';
import { STRESS_FLAGS } from './flags.js';
import { describeReport, runStress } from './run.js';
import { startedServerFacts } from '../support/server-facts.js';
import { LOCK_METHODS, startTarget, TRANSPORTS, type LockMethod, type Transport } from './setups.js';

const MiB = 1024 * 1024;

const USAGE = `Usage: npm run stress -- [options]

  --seconds N        how long each configuration runs (default 60)
  --seed N           the seed (default: a new one, printed)
  --clients N        client connections, each with keys of its own (default 32, at least 1); one in
                     8 (of 2 to 7, the last) speaks RESP3 with CLIENT TRACKING on, where the
                     server has HELLO 3 (Redis 6.0 on)
  --pairs N          of them, how many publish to a subscriber of their own (default clients / 4)
  --slow-share F     share of connections that read slowly, 0 to 1 (default 0.25)
  --max-value-mib N  largest value (default 4)
  --transport LIST   tcp, unix, tls, cluster, or all (comma-separated; default tcp)
  --lock-method LIST auto, transaction, script, or all (comma-separated; default auto)
  --direct           also run against Redis directly (the model checked against Redis itself)
  --proxy-build DIR  run the proxy built in DIR (another checkout with its own dist/cli.js, e.g. a
                     git worktree of an older commit) instead of this one

Runs the proxy (dist/cli.js, built by npm run stress) in front of a redis-server it starts
(with REDIS_TEST_IMAGE: a container of that image). Exit status: 0 every byte right, 1 a
wrong or missing reply, 2 bad options.`;

function list<T extends string>(text: string, all: readonly T[], name: string): T[] {
  if (text === 'all') return [...all];
  const items = text.split(',').map((item) => item.trim());
  for (const item of items)
    if (!all.includes(item as T)) throw new Error(`--${name}: unknown ${JSON.stringify(item)} (one of ${all.join(', ')}, or all)`);
  return items as T[];
}

function positive(text: string, name: string, min: number): number {
  const n = Number(text);
  if (!Number.isFinite(n) || n < min) throw new Error(`--${name}: ${JSON.stringify(text)} is not a number of at least ${min}`);
  return n;
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: STRESS_FLAGS,
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  let options;
  try {
    const clients = Math.floor(positive(values.clients, 'clients', 1));
    options = {
      seconds: positive(values.seconds, 'seconds', 1),
      seed: values.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : Math.floor(positive(values.seed, 'seed', 0)),
      clients,
      pairs: Math.min(clients, values.pairs === undefined ? Math.floor(clients / 4) : Math.floor(positive(values.pairs, 'pairs', 0))),
      slowShare: Math.min(1, positive(values['slow-share'], 'slow-share', 0)),
      maxValueBytes: Math.floor(positive(values['max-value-mib'], 'max-value-mib', 0.001) * MiB),
      transports: list<Transport>(values.transport, TRANSPORTS, 'transport'),
      methods: list<LockMethod>(values['lock-method'], LOCK_METHODS, 'lock-method'),
    };
  } catch (error) {
    console.error(`${(error as Error).message}\n\n${USAGE}`);
    return 2;
  }
  const runs: Array<{ transport: Transport; lockMethod: LockMethod | null }> = values.direct
    ? [{ transport: 'tcp', lockMethod: null }]
    : [];
  for (const transport of options.transports) for (const lockMethod of options.methods) runs.push({ transport, lockMethod });
  console.log(
    `integrity stress: seed ${options.seed}, ${options.clients} clients (${options.pairs} with a subscriber), ${options.seconds} s per run`,
  );
  const resubscribe = (await startedServerFacts()).has('reset');
  let wrong = 0;
  for (const run of runs) {
    const target = await startTarget({ ...run, proxyBuild: values['proxy-build'] });
    try {
      await target.flush();
      const report = await runStress({ ...options, resubscribe, lockFixed: target.lockFixed, endpointFor: target.endpointFor });
      console.log(describeReport(report, target.label));
      if (report.failures.length > 0) {
        wrong += report.failures.length;
        const errors = target.proxyErrors();
        if (errors !== '') console.log(`  the proxy said on stderr:\n${errors}`);
      }
    } finally {
      await target.stop();
    }
  }
  if (wrong > 0) {
    const again = `npm run stress -- --seed ${options.seed} --seconds ${options.seconds} --clients ${options.clients}`;
    console.log(`FAILED: ${wrong} wrong or missing replies. Repeat with: ${again} (and the same --transport, --lock-method)`);
    return 1;
  }
  console.log('every byte right');
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
