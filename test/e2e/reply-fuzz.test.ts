/**
 * Reply-side fuzzing: one bad reply from the upstream must cost at most the connection it came on.
 * The proxy (the built command line, its own process, so that a crash is seen as one) runs in front
 * of a stand-in upstream (test/support/reply-fuzz-upstream.ts) that answers fuzz connections with
 * seeded replies, mostly plausible and now and then mis-framed, not RESP, cut short or followed by
 * a close, while it relays bystander connections to a real Redis. Fuzz clients send lock blocks on
 * the shipped rules' keys (so that EXEC's array is taken aside and restored), HELLO 3 and plain
 * commands, and take whatever comes back. Bystanders, open for the whole run, check every reply
 * byte for byte. At the end the process still runs, /healthz answers, and a new connection works.
 *
 * The run is bounded (MAX_CASES fuzz connections or MAX_MS, whichever comes first) and seeded: the
 * seed is printed, and FUZZ_SEED=<seed> repeats each case's requests and replies (not their timing).
 */
import { randomInt } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { Cli, cleanEnv, ensureBuilt, type Exit } from '../support/cli.js';
import { sample } from '../support/metrics.js';
import { freePort } from '../support/ports.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { Bystander, fuzzCase } from '../support/reply-fuzz-clients.js';
import { Rng, streamSeed } from '../support/reply-fuzz-replies.js';
import { startFuzzUpstream, type FuzzUpstream } from '../support/reply-fuzz-upstream.js';
import { RawClient } from '../support/resp.js';
import { serverFacts } from '../support/server-facts.js';

const SEED = process.env.FUZZ_SEED !== undefined && process.env.FUZZ_SEED !== '' ? Number(process.env.FUZZ_SEED) >>> 0 : randomInt(2 ** 32);
const MAX_CASES = 2000;
const MAX_MS = 20_000;
/** Fuzz connections at once: enough to overlap faults with each other and with the bystanders. */
const FUZZ_WORKERS = 8;
const BYSTANDERS = 3;
/** The share of replies that go wrong: high enough that most connections meet one. */
const MISFRAME_RATE = 0.15;
/** How long a bystander waits for its replies: generous, for a busy 2-core CI machine (a fault shows as wrong bytes or a close, not as slowness). */
const REPLY_TIMEOUT_MS = 30_000;

let redis: RedisServer | undefined;
let upstream: FuzzUpstream | undefined;
let proxy: Cli | undefined;
let port = 0;
let adminPort = 0;
/** The server has EXPIRE ... NX: bystanders send lock blocks of their own too. */
let expireNx = false;

beforeAll(async () => {
  if (!Number.isSafeInteger(SEED)) throw new Error(`FUZZ_SEED must be a number, not ${JSON.stringify(process.env.FUZZ_SEED)}`);
  await ensureBuilt();
  redis = await startRedis();
  // Asked, not assumed (the file also runs against server images): without EXPIRE ... NX a
  // bystander's lock block would get Redis's refusal of the NX, not the reply it expects.
  const link = await RawClient.connect(redis.port, redis.host);
  expireNx = (await serverFacts(link)).has('expire-nx');
  await link.close();
  upstream = await startFuzzUpstream({ redisHost: redis.host, redisPort: redis.port, seed: SEED, misframeRate: MISFRAME_RATE });
  port = await freePort();
  adminPort = await freePort();
  proxy = new Cli(
    [
      ...['--listen', `127.0.0.1:${port}`, '--upstream', `redis://127.0.0.1:${upstream.port}`],
      // The method is given: the proxy asks no HELLO of its own, so every command the stand-in reads is a client's.
      ...['--lock-method', 'transaction', '--admin-listen', `127.0.0.1:${adminPort}`, '--shutdown-timeout-ms', '1000'],
    ],
    cleanEnv(),
  );
  await proxy.waitForLog('redis-lock-proxy listening');
});

afterAll(async () => {
  if (proxy !== undefined) {
    proxy.kill('SIGTERM');
    await Promise.race([proxy.exited, sleep(5000)]);
    await proxy.stop();
  }
  await upstream?.close();
  await redis?.stop();
});

/** /metrics as text, or '' when the proxy does not answer (it is gone: the failure says so). */
async function metricsText(): Promise<string> {
  return fetch(`http://127.0.0.1:${adminPort}/metrics`).then(
    (response) => response.text(),
    () => '',
  );
}

/** Lock blocks sent with the fix, every rule: the fuzz reached the path where EXEC's reply is taken aside. */
function rewrittenBlocks(metrics: string): number {
  let sum = 0;
  for (const match of metrics.matchAll(/^redis_lock_proxy_blocks_total\{[^}]*outcome="rewritten"[^}]*\} (\d+)$/gm)) sum += Number(match[1]);
  return sum;
}

/** The end of a long text, for failure messages. */
const tail = (text: string, chars = 3000): string => (text.length > chars ? `…${text.slice(-chars)}` : text);

it('a bad reply costs at most its own connection: the process runs on, and bystanders get exactly their own bytes', async () => {
  const cli = proxy as Cli;
  const counts = (upstream as FuzzUpstream).counts;
  console.log(`reply fuzz: seed ${SEED} (FUZZ_SEED=${SEED} repeats it)`);
  const failures: string[] = [];
  let stop = false;
  const fail = (message: string): void => {
    failures.push(message);
    stop = true;
  };
  let exit: Exit | undefined;
  void cli.exited.then((e) => {
    exit = e;
    fail(`the proxy process exited (code ${e.code}, signal ${e.signal}) during the run`);
  });

  const started = performance.now();
  const bystanders = await Promise.all(
    Array.from({ length: BYSTANDERS }, (_, i) => Bystander.open(port, i, new Rng(streamSeed(SEED, i, 4)), REPLY_TIMEOUT_MS, expireNx)),
  );
  let cases = 0;
  let fuzzDone = false;
  const fuzzWorker = async (): Promise<void> => {
    while (!stop && cases < MAX_CASES && performance.now() - started < MAX_MS) {
      const n = cases++;
      await fuzzCase(port, n, new Rng(streamSeed(SEED, n, 1)));
    }
  };
  // Bystanders run for as long as the fuzz does, then one round more: after every fault, too.
  const bystanderWorker = async (bystander: Bystander): Promise<void> => {
    try {
      while (!fuzzDone && !stop) await bystander.round(REPLY_TIMEOUT_MS);
      if (!stop) await bystander.round(REPLY_TIMEOUT_MS);
    } catch (err) {
      fail((err as Error).message);
    }
  };
  const watching = bystanders.map(bystanderWorker);
  await Promise.all(Array.from({ length: FUZZ_WORKERS }, fuzzWorker));
  fuzzDone = true;
  await Promise.all(watching);
  const seconds = ((performance.now() - started) / 1000).toFixed(1);

  const metrics = exit === undefined ? await metricsText() : '';
  const faults = sample(metrics, 'redis_lock_proxy_session_faults_total');
  const rounds = bystanders.reduce((sum, b) => sum + b.rounds, 0);
  const mib = (bystanders.reduce((sum, b) => sum + b.bytesChecked, 0) / 2 ** 20).toFixed(1);
  console.log(
    `reply fuzz: seed ${SEED}: ${cases} fuzz cases (connections), ${counts.replies} replies generated, ${counts.misframed} mis-framed ` +
      `(or a close in their place); ${rounds} bystander rounds, ${mib} MiB checked byte for byte; ${seconds} s; ` +
      `lock blocks rewritten: ${metrics === '' ? 'unknown' : rewrittenBlocks(metrics)}; session faults: ${faults ?? 'not counted'}`,
  );

  if (failures.length > 0) {
    // A bystander's close is often the first sign of a crash: give the process a moment to be seen gone.
    await Promise.race([cli.exited, sleep(1000)]);
    const seen = [...new Set(failures)].filter((f) => !f.startsWith('the proxy process exited'));
    // A crash first, with its stack; else what the bystanders saw, then the proxy's last log lines.
    const report =
      exit === undefined
        ? [...seen, `the proxy still runs; its log ends:\n${tail(cli.stdout)}`]
        : [`the proxy process exited (code ${exit.code}, signal ${exit.signal}); its stderr ends:\n${tail(exit.stderr)}`, ...seen];
    throw new Error(`after ${cases} fuzz cases (seed ${SEED}):\n${report.join('\n')}`);
  }

  // Nothing arrived that a bystander did not ask for.
  await Promise.all(bystanders.map((b) => b.expectNothingMore(200)));
  for (const bystander of bystanders) bystander.close();
  expect(exit).toBeUndefined();
  expect((await fetch(`http://127.0.0.1:${adminPort}/healthz`)).status).toBe(200);
  // A new connection after all that: the proxy still serves (lock blocks included).
  const fresh = await Bystander.open(port, BYSTANDERS, new Rng(streamSeed(SEED, BYSTANDERS, 4)), REPLY_TIMEOUT_MS, expireNx);
  for (let i = 0; i < 5; i++) await fresh.round(REPLY_TIMEOUT_MS);
  await fresh.expectNothingMore(100);
  fresh.close();
  expect(counts.fuzzConnections).toBeGreaterThan(0);
  expect(counts.bystanderConnections).toBe(BYSTANDERS + 1);
}, 120_000);
