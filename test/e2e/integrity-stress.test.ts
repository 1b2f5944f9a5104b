/**
 * Every client gets exactly its own bytes: the integrity stress (test/stress/), short. 32
 * clients and their subscribers at once, each checking every reply byte for byte against an
 * exact model: values of heavy-tailed sizes made of records that name their owner, pipelines
 * written in random splits down to one byte a write, slow readers, transactions, Stalwart lock
 * blocks, pub/sub, RESP3 clients with CLIENT TRACKING on (their invalidation pushes come between
 * replies and, on Redis 6, inside EXEC's array: taken out and checked apart). Through the proxy
 * (its own process) with each lock method over TCP, and
 * over a unix socket, a TLS upstream and in front of a cluster; against Redis directly, which
 * shows that the model is Redis's own; and through relays that misplace, drop or repeat one
 * chunk, which the stress must catch.
 *
 * What the server cannot do is skipped, with the reason: the transaction way without `EXPIRE ...
 * NX` (before Redis 7.0), TLS where the server was built without it.
 *
 * The seed is new each run and printed with any failure; STRESS_SEED=<n> repeats it.
 * `npm run stress -- --seconds N --seed S` runs the stress for as long as asked.
 */
import { describe, expect, it } from 'vitest';
import { startFaultyRelay, type Fault } from '../stress/faulty-relay.js';
import { describeReport, runStress, type StressReport } from '../stress/run.js';
import { startTarget, type TargetOptions } from '../stress/setups.js';
import { startedServerFacts } from '../support/server-facts.js';

const SEED = process.env.STRESS_SEED === undefined ? Math.floor(Math.random() * 2 ** 31) : Number(process.env.STRESS_SEED);
const MiB = 1024 * 1024;
const SHORT = { seed: SEED, seconds: 3, clients: 32, pairs: 8, slowShare: 0.25, maxValueBytes: 2 * MiB };
/** Setting up a cluster of containers on a busy machine takes a while; the run itself a few seconds. */
const TIMEOUT_MS = 240_000;

interface Stressed {
  readonly report: StressReport;
  readonly label: string;
  /** The server has HELLO 3 and CLIENT TRACKING (Redis 6.0 on): the run must have had RESP3 clients. */
  readonly resp3: boolean;
}

async function stressed(options: TargetOptions): Promise<Stressed> {
  const target = await startTarget(options);
  try {
    await target.flush();
    const facts = await startedServerFacts();
    const report = await runStress({
      ...SHORT,
      resubscribe: facts.has('reset'),
      lockFixed: target.lockFixed,
      endpointFor: target.endpointFor,
    });
    const errors = target.proxyErrors();
    return { report, label: target.label + (errors === '' ? '' : `\nthe proxy said on stderr:\n${errors}`), resp3: facts.version[0] >= 6 };
  } finally {
    await target.stop();
  }
}

/** Every byte right, and enough of every kind checked for that to mean something. */
function expectAllRight({ report, label, resp3 }: Stressed): void {
  const text = describeReport(report, label);
  expect(report.failures, text).toEqual([]);
  expect(report.replies, text).toBeGreaterThan(500);
  const kinds = ['set', 'get', 'multi', 'lock', 'publish', ...(resp3 ? ['get-lock', 'invalidate'] : [])];
  for (const op of kinds) expect(report.commands.get(op) ?? 0, `${op}: ${text}`).toBeGreaterThan(0);
  if (resp3) expect(report.resp3Clients, text).toBeGreaterThan(0);
}

describe('the integrity stress', () => {
  it('predicts Redis itself, byte for byte', { timeout: TIMEOUT_MS }, async () => {
    expectAllRight(await stressed({ transport: 'tcp', lockMethod: null }));
  });

  for (const lockMethod of ['auto', 'transaction', 'script'] as const) {
    it(
      `through the proxy over TCP, lock method ${lockMethod}: every client gets exactly its own bytes`,
      { timeout: TIMEOUT_MS },
      async (ctx) => {
        if (lockMethod === 'transaction') ctx.skip(...(await startedServerFacts()).skipUnless('expire-nx'));
        expectAllRight(await stressed({ transport: 'tcp', lockMethod }));
      },
    );
  }

  for (const transport of ['unix', 'tls', 'cluster'] as const) {
    it(`through the proxy over ${transport}: every client gets exactly its own bytes`, { timeout: TIMEOUT_MS }, async (ctx) => {
      if (transport === 'tls') ctx.skip(...(await startedServerFacts()).skipUnless('tls'));
      expectAllRight(await stressed({ transport, lockMethod: 'auto' }));
    });
  }
});

describe('the integrity stress catches a relay that breaks the rule once', () => {
  for (const fault of ['misplace', 'drop', 'repeat'] as const satisfies readonly Fault[]) {
    it(
      `one chunk ${fault === 'misplace' ? "given another connection's bytes" : fault === 'drop' ? 'left out' : 'sent twice'}`,
      { timeout: TIMEOUT_MS },
      async () => {
        const redis = await startTarget({ transport: 'tcp', lockMethod: null });
        const relay = await startFaultyRelay(redis.endpointFor(''), fault, 50);
        try {
          await redis.flush();
          const report = await runStress({
            ...SHORT,
            seconds: 2,
            clients: 8,
            pairs: 2,
            stallMs: 3000,
            resubscribe: false,
            lockFixed: false,
            endpointFor: () => relay.endpoint,
          });
          const text = describeReport(report, `a relay that does "${fault}" once`);
          expect(relay.faulted, text).toBe(true);
          expect(report.failures.length, text).toBeGreaterThan(0);
          if (fault === 'misplace') {
            // The report says whose bytes they were: another client's.
            const foreign = report.failures.some((failure) => {
              const own = /^client (\d+)/.exec(failure.connection)?.[1];
              return [...failure.detail.matchAll(/client (\d+) key/g)].some((match) => match[1] !== own);
            });
            expect(foreign, text).toBe(true);
          }
        } finally {
          await relay.close();
          await redis.stop();
        }
      },
    );
  }
});
