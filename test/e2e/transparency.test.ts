/**
 * Transparency: whatever a client sends that is not a lock block it must get
 * byte for byte what Redis itself would have sent.
 *
 * A seeded generator writes a few hundred mixed commands (all data types,
 * errors, transactions, WATCH, binary keys and values, `lock:` keys used in
 * ways that are not the lock shape, and real lock blocks on keys that have no
 * expiry, where the rewrite must not show). The same plan (same batches, same
 * TCP splits) runs once directly against Redis and once through the proxy,
 * each from a fresh FLUSHALL, and the two reply streams must be identical, as
 * must the lock keys' expiries after each batch (a rewritten block answers as
 * Redis does: only the expiry it leaves shows it).
 *
 * A failure prints the seed; `TRANSPARENCY_SEED=<n>` runs just that seed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Rng } from '../bench/random.js';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { cmd, RawClient, splitFrames } from '../support/resp.js';
import { attemptReplies, queueLockKey, taskLockKey } from '../support/stalwart.js';

const env = redisAndProxy();

/** Empties Redis between the direct and the proxied run within one test (the fixture does it before each test). */
async function flushAll(): Promise<void> {
  env.admin.write(cmd('FLUSHALL'));
  expect((await env.admin.readReplies(1)).toString()).toBe('+OK\r\n');
}

const adminCall = (...args: (string | Buffer)[]): Promise<string> => env.admin.call(...args);

// ---------------------------------------------------------------------------
// Command plans
// ---------------------------------------------------------------------------

type Arg = string | Buffer;

/** One request frame and the number of top-level replies it gets (0 for empty frames and blank lines). */
interface Step {
  frame: Buffer;
  replies: number;
  label: string;
}

type Split = { kind: 'whole' } | { kind: 'pieces'; sizes: number[]; delayMs: number } | { kind: 'bytewise' };

interface Batch {
  steps: Step[];
  bytes: Buffer;
  replies: number;
  split: Split;
}

interface Plan {
  seed: number;
  steps: Step[];
  batches: Batch[];
}

function show(arg: Arg): string {
  const text = typeof arg === 'string' ? arg : arg.toString('latin1');
  const quoted = JSON.stringify(text.length > 40 ? `${text.slice(0, 40)}...(${text.length} bytes)` : text);
  return /^[\x21-\x7e]+$/.test(text) && text.length <= 40 ? text : quoted;
}

function step(...args: Arg[]): Step {
  return { frame: cmd(...args), replies: 1, label: args.map(show).join(' ') };
}

/** An inline (telnet-style) command line; `replies` is 0 for a blank line. */
function inline(line: string): Step {
  return { frame: Buffer.from(line, 'latin1'), replies: line.trim() === '' ? 0 : 1, label: `inline ${JSON.stringify(line)}` };
}

function raw(bytes: string): Step {
  return { frame: Buffer.from(bytes, 'latin1'), replies: 0, label: `raw ${JSON.stringify(bytes)}` };
}

/** Mixed letter case, as different clients send it. */
function anyCase(rng: Rng, name: string): string {
  return rng.weighted([
    [3, name.toUpperCase()],
    [1, name.toLowerCase()],
    [1, [...name].map((c, i) => (i % 2 ? c.toLowerCase() : c.toUpperCase())).join('')],
  ]);
}

// Pools. Everything here is deterministic to print: no TTLs, no randomness, and
// small collections (listpack encodings) so that HGETALL order is insertion order.
const BIN_KEY = Buffer.from([0x6b, 0x00, 0x0d, 0x0a, 0xff]);
/** 0x17 and 9 more bytes: one byte too long for the Stalwart task-lock pattern. */
const NEAR_TASK_KEY = Buffer.from([0x17, 0x00, 0x0d, 0x0a, 0x00, 0x01, 0x02, 0x03, 0x0d, 0x0a]);
const KEYS: Arg[] = ['a', 'b', 'c', 'n', 'lock:x', 'lock:y', 'watch:w', BIN_KEY, NEAR_TASK_KEY];
const SHORT_VALUES: Arg[] = [
  '0',
  '1',
  '42',
  '-7',
  '007',
  '3.5',
  'hello',
  '',
  'a\r\nb',
  'lock:x',
  Buffer.from([0x00, 0x0d, 0x0a, 0x00, 0xff]),
  '9223372036854775807',
  '-9223372036854775808',
];
const VALUES: Arg[] = [...SHORT_VALUES, 'x'.repeat(300), Buffer.from('\r\n\0'.repeat(100), 'latin1')];
/** Larger than the proxy's read buffers, with CRLFs inside, to cross chunk boundaries. */
const BIG_VALUE = Buffer.from('*1\r\n$4\r\nPING\r\n\0'.repeat(5000), 'latin1');
const FIELDS: Arg[] = ['f1', 'f2', 'f\r\n3', Buffer.from([0x00])];
const MEMBERS: Arg[] = ['m1', 'm2', 'm\r\n3', '1', '2', Buffer.from([0xff, 0x00])];
const SCORES = ['1', '2.5', '-3', '0', '+inf', '-inf', '1e3', 'nope'];
const INTS = ['1', '5', '-2', '0', '100', 'notint', '9223372036854775807', '+1'];
const OFFSETS = ['0', '1', '-1', '2', '-3', '10', '100'];

/** Keys that get real lock blocks: the proxy rewrites these (when nothing else stops it). */
const LOCK_KEYS: Arg[] = ['lock:blk', taskLockKey(0x0d0a000dn), queueLockKey(0x0a0dn, 'q\r\n\0')];
/** A key in observe mode: blocks on it are forwarded unchanged, so they may run with an expiry set. */
const OBSERVED_KEY = 'watch:obs';

class Generator {
  constructor(private readonly rng: Rng) {}

  key(): Arg {
    return this.rng.pick(KEYS);
  }

  value(): Arg {
    return this.rng.chance(0.01) ? BIG_VALUE : this.rng.pick(VALUES);
  }

  /** One command, one reply: the bulk of the traffic. */
  simple(): Step {
    const r = this.rng;
    const k = () => this.key();
    const v = () => this.value();
    const sv = () => r.pick(SHORT_VALUES);
    const kind = r.weighted<() => Step>([
      // strings
      [4, () => step('SET', k(), v())],
      [1, () => step('SET', k(), v(), r.pick(['NX', 'XX', 'GET']))],
      [4, () => step('GET', k())],
      [1, () => step('APPEND', k(), sv())],
      [1, () => step('STRLEN', k())],
      [2, () => step('INCR', k())],
      [1, () => step('INCRBY', k(), r.pick(INTS))],
      [1, () => step('DECR', k())],
      [1, () => step('MSET', k(), v(), k(), sv())],
      [1, () => step('MGET', k(), k(), k())],
      [1, () => step('GETRANGE', k(), r.pick(OFFSETS), r.pick(OFFSETS))],
      [1, () => step('SETRANGE', k(), r.pick(['0', '1', '5', '-1']), sv())],
      [1, () => step('SETNX', k(), sv())],
      [1, () => step('GETDEL', k())],
      // lists
      [2, () => step('RPUSH', k(), v(), sv())],
      [1, () => step('LPUSH', k(), sv())],
      [2, () => step('LRANGE', k(), r.pick(OFFSETS), r.pick(OFFSETS))],
      [1, () => (r.chance(0.5) ? step('LPOP', k()) : step('LPOP', k(), r.pick(['1', '2', '0', '-1'])))],
      [1, () => step('LLEN', k())],
      [1, () => step('LINDEX', k(), r.pick(OFFSETS))],
      // hashes (short values keep them listpacks: HGETALL in insertion order)
      [2, () => step('HSET', k(), r.pick(FIELDS), sv(), r.pick(FIELDS), sv())],
      [1, () => step('HGET', k(), r.pick(FIELDS))],
      [1, () => step('HGETALL', k())],
      [1, () => step('HDEL', k(), r.pick(FIELDS))],
      [1, () => step('HINCRBY', k(), r.pick(FIELDS), r.pick(INTS))],
      [1, () => step('HLEN', k())],
      // sets (no listing: member order of a hashtable is not defined)
      [2, () => step('SADD', k(), r.pick(MEMBERS), r.pick(MEMBERS))],
      [1, () => step('SISMEMBER', k(), r.pick(MEMBERS))],
      [1, () => step('SCARD', k())],
      [1, () => step('SREM', k(), r.pick(MEMBERS))],
      // sorted sets
      [2, () => step('ZADD', k(), r.pick(SCORES), r.pick(MEMBERS))],
      [1, () => step('ZRANGE', k(), '0', '-1', 'WITHSCORES')],
      [1, () => step('ZINCRBY', k(), r.pick(SCORES), r.pick(MEMBERS))],
      [1, () => step('ZSCORE', k(), r.pick(MEMBERS))],
      // keyspace
      [1, () => step('EXISTS', k(), k())],
      [1, () => step('DEL', k(), k())],
      [2, () => step('TYPE', k())],
      [1, () => step('RENAME', k(), k())],
      // connection
      [1, () => step('ECHO', v())],
      [1, () => (r.chance(0.5) ? step('PING') : step('PING', sv()))],
      // errors: unknown command, wrong arity (of transaction commands: see the arity tests below)
      [1, () => step(r.pick(['NOSUCHCMD', 'foobar', 'GETT']), sv())],
      [1, () => r.pick([step('GET'), step('SET', k()), step('HSET', k(), 'f'), step('LPUSH', k()), step('ZADD', k(), '1')])],
    ]);
    return kind();
  }

  /** Commands allowed inside a plain transaction body. */
  queued(): Step[] {
    const r = this.rng;
    return r.weighted<() => Step[]>([
      [20, () => [this.simple()]],
      [2, () => this.expireThenPersist()],
      [1, () => [step('WATCH', this.key())]], // "not allowed inside MULTI": aborts the transaction
      [1, () => [step('MULTI')]], // nested: an error that does not abort
    ])();
  }

  /** EXPIRE with a TTL far beyond the test, then PERSIST: never a lock shape (PERSIST is not EXEC). */
  expireThenPersist(): Step[] {
    const key = this.key();
    return [step(anyCase(this.rng, 'expire'), key, '100000'), step('PERSIST', key)];
  }

  transaction(): Step[] {
    const r = this.rng;
    const body: Step[] = [];
    const length = r.int(0, 5);
    while (body.length < length) body.push(...this.queued());
    const end = r.weighted([
      [7, step(anyCase(r, 'exec'))],
      [2, step(anyCase(r, 'discard'))],
      [1, step('EXEC', 'x')], // wrong arity inside MULTI: Redis aborts the transaction (EXECABORT)
    ]);
    return [step(anyCase(r, 'multi')), ...body, end];
  }

  watched(): Step[] {
    const r = this.rng;
    const keys = [this.key(), ...(r.chance(0.3) ? [this.key()] : [])];
    const steps: Step[] = [step('WATCH', ...keys)];
    for (let i = r.int(0, 2); i > 0; i--) steps.push(this.simple()); // may touch a watched key: EXEC then fails
    if (r.chance(0.2)) steps.push(step('UNWATCH'));
    steps.push(step('MULTI'));
    for (let i = r.int(1, 3); i > 0; i--) steps.push(this.simple());
    steps.push(step('EXEC'));
    return steps;
  }

  /** `lock:` keys in transactions that are not the lock shape: the proxy must release them verbatim. */
  lockLookalike(): Step[] {
    const r = this.rng;
    const key = r.pick(['lock:x', 'lock:y']);
    const other = key === 'lock:x' ? 'lock:y' : 'lock:x';
    return r.pick<Step[]>([
      [step('MULTI'), step('INCR', key), step('GET', key), step('EXEC')],
      [step('MULTI'), step('GET', key), step('INCR', key), step('EXEC')],
      [step('MULTI'), step('INCRBY', key, '2'), step('EXPIRE', key, '100000'), step('PERSIST', key), step('EXEC')],
      [step('MULTI'), step('INCRBY', key, '1'), step('EXPIRE', other, '100000'), step('EXEC'), step('PERSIST', other)],
      [step('MULTI'), step('INCRBY', key, '01'), step('EXPIRE', key, '100000'), step('EXEC'), step('PERSIST', key)],
      [step('MULTI'), step('INCRBY', key, '1'), step('EXPIRE', key, '100000', 'NX'), step('EXEC'), step('PERSIST', key)],
      [step('MULTI'), step('INCR', key), step('EXPIRE', key, '100000'), step('DISCARD')],
      [step('MULTI'), step('INCR', key), step('EXPIRE', key, '0'), step('EXEC')],
      [step('MULTI'), step('SET', key, 'v'), step('EXEC')],
    ]);
  }

  /** A lock block exactly as the proxy rewrites it. */
  lockBlock(key: Arg): Step[] {
    const r = this.rng;
    const seconds = r.chance(0.5);
    const increment = r.chance(0.3)
      ? step(anyCase(r, 'incr'), key)
      : step(anyCase(r, 'incrby'), key, r.pick(['1', '1', '2', '-1', '0', '100']));
    const ttl = seconds ? r.pick(['60', '3600', '100000']) : r.pick(['60000', '5000000']);
    return [step(anyCase(r, 'multi')), increment, step(anyCase(r, seconds ? 'expire' : 'pexpire'), key, ttl), step(anyCase(r, 'exec'))];
  }

  /**
   * A rewritten lock block must be indistinguishable from the original when
   * the key has no expiry: so each one follows something that removes the
   * expiry (and sometimes makes the increment fail, which must land in the
   * EXEC array as Redis puts it).
   */
  lockBlockWithoutExpiry(): Step[] {
    const r = this.rng;
    const key = r.pick(LOCK_KEYS);
    const reset = r.pick<Step[]>([
      [step('DEL', key)],
      [step('PERSIST', key)],
      [step('SET', key, r.pick(['17', '-3', '0']))],
      [step('SET', key, 'not-a-number')],
      [step('SET', key, '9223372036854775807')], // overflow
      [step('DEL', key), step('RPUSH', key, 'x')], // WRONGTYPE
    ]);
    return [...reset, ...this.lockBlock(key)];
  }

  /**
   * Lock blocks the proxy must not rewrite, on keys that may well have an
   * expiry: a rewrite would show in the expiry it leaves (the old one, where
   * Redis sets the block's), which each run reads after every batch
   * (lockExpiries); its replies are Redis's own either way.
   */
  lockBlockLeftAlone(): Step[] {
    const r = this.rng;
    const key = r.pick(LOCK_KEYS);
    return r.pick<() => Step[]>([
      // under WATCH, untouched (EXEC runs) or touched (EXEC fails)
      () => [step('WATCH', key), ...this.lockBlock(key)],
      () => [step('WATCH', key, 'a'), step('SET', 'a', '1'), ...this.lockBlock(key)],
      () => [step('WATCH', key), step('INCR', key), ...this.lockBlock(key)],
      // a rule in observe mode
      () => this.lockBlock(OBSERVED_KEY),
    ])();
  }

  unit(): Step[] {
    const r = this.rng;
    return r.weighted<() => Step[]>([
      [55, () => [this.simple()]],
      [4, () => this.expireThenPersist()],
      [10, () => this.transaction()],
      [6, () => this.watched()],
      [5, () => this.lockLookalike()],
      [10, () => this.lockBlockWithoutExpiry()],
      [5, () => this.lockBlockLeftAlone()],
      [2, () => [raw(r.pick(['*0\r\n', '*-1\r\n']))]], // empty frames: no reply
      [2, () => [inline(r.pick(['PING\r\n', 'GET a\r\n', 'EXISTS a b lock:x\r\n', 'TYPE n\n', '\r\n', '\n', 'ECHO x\r\n']))]],
      [1, () => [step('SELECT', '1'), this.simple(), step('SELECT', '0')]],
      [
        1,
        () => {
          const key = this.key();
          return [step('SET', key, BIG_VALUE), step('GET', key), step('GETRANGE', key, '-20', '-1')];
        },
      ],
      [1, () => [step('RESET')]], // +RESET, and back to RESP2 in a RESP3 run
    ])();
  }
}

function randomSplit(rng: Rng, length: number): Split {
  const kind = rng.weighted([
    [4, 'whole'],
    [4, 'pieces'],
    [2, 'slow-pieces'],
    [1, 'stalled-pieces'],
    [length <= 400 ? 1 : 0, 'bytewise'],
  ] as const);
  if (kind === 'whole') return { kind };
  if (kind === 'bytewise') return { kind };
  const stalled = kind === 'stalled-pieces';
  const sizes = Array.from({ length: rng.int(1, stalled ? 3 : 8) }, () => rng.int(1, Math.max(1, Math.ceil(length / 4))));
  // Gaps longer than the proxy's hold deadline (10 ms in tests) release a held MULTI mid-block.
  const delayMs = kind === 'slow-pieces' ? rng.int(1, 2) : stalled ? rng.int(12, 15) : 0;
  return { kind: 'pieces', sizes, delayMs };
}

function makePlan(seed: number, minSteps: number): Plan {
  const rng = new Rng(seed);
  const gen = new Generator(rng);
  const steps: Step[] = [];
  while (steps.length < minSteps) steps.push(...gen.unit());
  const batches: Batch[] = [];
  for (let i = 0; i < steps.length;) {
    const batchSteps = steps.slice(i, i + rng.int(1, 50));
    i += batchSteps.length;
    const bytes = Buffer.concat(batchSteps.map((s) => s.frame));
    const replies = batchSteps.reduce((n, s) => n + s.replies, 0);
    batches.push({ steps: batchSteps, bytes, replies, split: randomSplit(rng, bytes.length) });
  }
  return { seed, steps, batches };
}

async function send(client: RawClient, batch: Batch): Promise<void> {
  const split = batch.split;
  if (split.kind === 'whole') client.write(batch.bytes);
  else if (split.kind === 'bytewise') await client.writeSplit(batch.bytes, 'bytewise');
  else await client.writeSplit(batch.bytes, split.sizes, { delayMs: split.delayMs });
}

interface RunResult {
  /** HELLO 3's reply, when the run was RESP3 (holds the connection id: not compared as is). */
  hello: string | undefined;
  replies: Buffer;
  /** lockExpiries() after each batch. */
  expiries: string[];
}

/** The lock blocks' expiries, 60 s to 100000 s: each run lasts seconds, so a PTTL names the one set. */
const EXPIRY_BOUNDS: ReadonlyArray<[ms: number, name: string]> = [
  [60_000, '60s'],
  [3_600_000, '3600s'],
  [5_000_000, '5000s'],
  [100_000_000, '100000s'],
];

/**
 * Which expiry each lock key (and the observed one) has in db 0, read directly: -2 (no key), -1
 * (none) or the lock block expiry that set it. The same plan gives the same whichever the run's
 * speed; a block rewritten where Redis would have set its expiry leaves another.
 */
async function lockExpiries(): Promise<string> {
  const keys = [...LOCK_KEYS, OBSERVED_KEY];
  env.admin.write(Buffer.concat(keys.map((key) => cmd('PTTL', key))));
  const replies = splitFrames(await env.admin.readReplies(keys.length)).frames;
  return replies
    .map((reply) => {
      const pttl = Number(/^:(-?\d+)\r\n$/.exec(reply.toString('latin1'))?.[1]);
      return pttl < 0 ? String(pttl) : (EXPIRY_BOUNDS.find(([ms]) => pttl <= ms)?.[1] ?? `${pttl}ms`);
    })
    .join(' ');
}

/** Runs the plan on a fresh connection to `port`, from an empty database, reading each batch's replies. */
async function execute(port: number, plan: Plan, resp3: boolean): Promise<RunResult> {
  await flushAll();
  const client = await RawClient.connect(port);
  try {
    let hello: string | undefined;
    if (resp3) {
      client.write(cmd('HELLO', '3'));
      hello = (await client.readReplies(1)).toString('latin1');
    }
    const out: Buffer[] = [];
    const expiries: string[] = [];
    for (const batch of plan.batches) {
      await send(client, batch);
      if (batch.replies > 0) out.push(await client.readReplies(batch.replies));
      expiries.push(await lockExpiries());
    }
    // Nothing may be left over: the next reply must be this PING's.
    client.write(cmd('PING', 'end-of-run'));
    out.push(await client.readReplies(1));
    return { hello, replies: Buffer.concat(out), expiries };
  } finally {
    await client.close();
  }
}

/** Describes the first difference between the two reply streams, with the command that got it. */
function describeDifference(plan: Plan, resp3: boolean, direct: Buffer, proxied: Buffer): string | undefined {
  if (direct.equals(proxied)) return undefined;
  const d = splitFrames(direct).frames;
  let p: Buffer[];
  try {
    p = splitFrames(proxied).frames;
  } catch {
    p = []; // not even RESP: every reply differs
  }
  let i = 0;
  while (i < d.length && i < p.length && d[i].equals(p[i])) i++;
  // Map reply index i to the step that received it.
  let seen = 0;
  let stepIndex = plan.steps.length; // the final PING
  for (let s = 0; s < plan.steps.length; s++) {
    if (seen + plan.steps[s].replies > i) {
      stepIndex = s;
      break;
    }
    seen += plan.steps[s].replies;
  }
  const context = plan.steps
    .slice(Math.max(0, stepIndex - 8), stepIndex + 1)
    .map((s, j, all) => `${j === all.length - 1 ? '>>' : '  '} ${s.label}`)
    .join('\n');
  const frame = (b: Buffer | undefined) => (b === undefined ? '(none)' : JSON.stringify(b.toString('latin1').slice(0, 300)));
  return (
    `seed ${plan.seed} (${resp3 ? 'RESP3' : 'RESP2'}): reply #${i} differs, for step #${stepIndex}\n` +
    `${context}\n` +
    `direct:  ${frame(d[i])}\nproxied: ${frame(p[i])}\n` +
    `(direct ${direct.length} bytes / ${d.length} replies, proxied ${proxied.length} bytes / ${p.length} replies)\n` +
    `reproduce with TRANSPARENCY_SEED=${plan.seed}`
  );
}

/** Describes the first batch after which the lock keys' expiries differ, with its commands. */
function describeExpiryDifference(plan: Plan, resp3: boolean, direct: string[], proxied: string[]): string | undefined {
  const i = direct.findIndex((expiries, n) => expiries !== proxied[n]);
  if (i === -1) return undefined;
  return (
    `seed ${plan.seed} (${resp3 ? 'RESP3' : 'RESP2'}): the lock keys' expiries differ after batch #${i}\n` +
    `${plan.batches[i].steps.map((s) => `   ${s.label}`).join('\n')}\n` +
    `direct:  ${direct[i]}\nproxied: ${proxied[i]}\n` +
    `reproduce with TRANSPARENCY_SEED=${plan.seed}`
  );
}

/** The HELLO reply without its connection id. */
function maskId(hello: string | undefined): string | undefined {
  return hello?.replace(/(\$2\r\nid\r\n):\d+\r\n/, '$1:<id>\r\n');
}

const STEPS_PER_RUN = 400;
const DEFAULT_SEEDS = [1, 2, 3, 0xc0ffee, 20240611, 987654321];
const SEEDS = process.env.TRANSPARENCY_SEED ? [Number(process.env.TRANSPARENCY_SEED)] : DEFAULT_SEEDS;

describe('random traffic: direct and through the proxy give the same bytes', () => {
  for (const resp3 of [false, true]) {
    for (const seed of SEEDS) {
      it(`${resp3 ? 'RESP3' : 'RESP2'}, seed ${seed}`, async () => {
        const plan = makePlan(seed, STEPS_PER_RUN);
        const rewrittenBefore = env.proxy.stats.blocksRewritten;
        const direct = await execute(env.redis.port, plan, resp3);
        const proxied = await execute(env.proxy.port, plan, resp3);
        expect(describeDifference(plan, resp3, direct.replies, proxied.replies)).toBeUndefined();
        expect(describeExpiryDifference(plan, resp3, direct.expiries, proxied.expiries)).toBeUndefined();
        expect(maskId(proxied.hello), `seed ${seed}`).toBe(maskId(direct.hello));
        if (resp3) expect(proxied.hello).toMatch(/^%7\r\n/);
        // The comparison means something only if the rewrite really ran in the middle of it all.
        expect(env.proxy.stats.blocksRewritten - rewrittenBefore, `seed ${seed}: no block was rewritten`).toBeGreaterThan(0);
      });
    }
  }

  it('the generator is deterministic and covers what it should', () => {
    const a = makePlan(42, STEPS_PER_RUN);
    const b = makePlan(42, STEPS_PER_RUN);
    expect(Buffer.concat(a.steps.map((s) => s.frame)).equals(Buffer.concat(b.steps.map((s) => s.frame)))).toBe(true);
    expect(a.batches.map((x) => x.split)).toEqual(b.batches.map((x) => x.split));
    const labels = DEFAULT_SEEDS.flatMap((seed) => makePlan(seed, STEPS_PER_RUN).steps.map((s) => s.label.toUpperCase()));
    for (const name of ['HGETALL', 'ZRANGE', 'WATCH', 'DISCARD', 'EXEC X', 'NOSUCHCMD', 'INLINE', 'RAW', 'PEXPIRE', 'RESET']) {
      expect(
        labels.some((l) => l.startsWith(name)),
        name,
      ).toBe(true);
    }
  });
});

describe('inline commands', () => {
  // Its own proxy with a generous hold deadline: the byte-by-byte run must not depend on how busy the machine is.
  let proxy: TestProxy | undefined;
  beforeAll(async () => {
    proxy = await startTestProxy({ upstream: env.redis.url, holdMs: 250 });
  });
  afterAll(async () => {
    await proxy?.close();
  });
  const blank = ['\r\n', '\n', '   \r\n'];
  const lines = [
    'PING\r\n',
    blank[0],
    'SET a b\r\n',
    'GET a\r\n',
    blank[1],
    'ECHO hello\r\n',
    'INCR n\n',
    'EXISTS a n missing\r\n',
    blank[2],
    'GET\r\n', // wrong arity
    'NOSUCHCMD x\r\n',
    // Inline lock blocks are never rewritten: the second one re-arms the expiry as in Redis (:1).
    'MULTI\r\n',
    'INCRBY lock:i 1\r\n',
    'EXPIRE lock:i 100\r\n',
    'EXEC\r\n',
    'MULTI\r\n',
    'INCRBY lock:i 1\r\n',
    'EXPIRE lock:i 100\r\n',
    'EXEC\r\n',
    'PERSIST lock:i\r\n', // so that the RESP block below, which is rewritten, reads the same as in Redis
    'PING\r\n',
  ];
  const mixed = Buffer.concat([
    Buffer.from(lines.join(''), 'latin1'),
    cmd('GET', 'a'),
    Buffer.from('\r\nPING\r\n', 'latin1'),
    cmd('MULTI'),
    cmd('INCRBY', 'lock:i', '1'),
    cmd('EXPIRE', 'lock:i', '100'),
    cmd('EXEC'), // a RESP block after inline ones
    Buffer.from('ECHO after\r\n', 'latin1'),
  ]);
  const replies = lines.filter((l) => l.trim() !== '').length + 1 + 1 + 4 + 1;

  async function run(port: number, bytes: Buffer, count: number, split: Split): Promise<string> {
    await flushAll();
    const client = await RawClient.connect(port);
    try {
      await send(client, { steps: [], bytes, replies: count, split });
      return (await client.readReplies(count)).toString('latin1');
    } finally {
      await client.close();
    }
  }

  const splits: Array<[string, Split]> = [
    ['in one write', { kind: 'whole' }],
    ['byte by byte', { kind: 'bytewise' }],
    ['in uneven pieces', { kind: 'pieces', sizes: [3, 1, 7, 2, 11, 5, 1, 1, 13, 4, 6], delayMs: 1 }],
  ];
  for (const [name, split] of splits) {
    it(`match Redis, ${name}`, async () => {
      const direct = await run(env.redis.port, mixed, replies, split);
      const rewrittenBefore = (proxy as TestProxy).stats.blocksRewritten;
      const proxied = await run((proxy as TestProxy).port, mixed, replies, split);
      expect(proxied).toBe(direct);
      expect(direct).toMatch(/^\+PONG\r\n\+OK\r\n\$1\r\nb\r\n/);
      // Both inline blocks ran as sent (the second one re-armed the expiry), the RESP one was rewritten.
      expect(proxied).toContain('*2\r\n:1\r\n:1\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:2\r\n:1\r\n');
      expect(proxied).toContain('*2\r\n:3\r\n:1\r\n');
      expect((proxy as TestProxy).stats.blocksRewritten - rewrittenBefore).toBe(1);
    });
  }

  it('match Redis with quoting (the proxy stops interpreting), then a lock block is left alone', async () => {
    const bytes = Buffer.concat([
      Buffer.from('SET "q k" "v\\r\\nw"\r\nGET "q k"\r\nECHO \'it\\\'s\'\r\nSET lock:q 1\r\nEXPIRE lock:q 100\r\n', 'latin1'),
      cmd('MULTI'),
      cmd('INCRBY', 'lock:q', '1'),
      cmd('EXPIRE', 'lock:q', '1000'), // longer than the 100 s it finds: re-armed, it shows
      cmd('EXEC'),
    ]);
    const direct = await run(env.redis.port, bytes, 9, { kind: 'whole' });
    const proxied = await run((proxy as TestProxy).port, bytes, 9, { kind: 'whole' });
    expect(proxied).toBe(direct);
    expect(proxied).toMatch(/\*2\r\n:2\r\n:1\r\n$/);
    expect(Number(/^:(-?\d+)/.exec(await adminCall('PTTL', 'lock:q'))?.[1])).toBeGreaterThan(100_000); // re-armed: not rewritten
  });
});

/**
 * Transaction commands that Redis rejects for their arity (before running
 * them) do not change the connection's state in Redis, and so do not change
 * the proxy's: it tracks MULTI/WATCH state only on the exact arities (of
 * inline commands too). Each case compares with the same server's own reply.
 */
describe('transaction commands with the wrong number of arguments leave the state as Redis does', () => {
  const block = Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:k', '1'), cmd('EXPIRE', 'lock:k', '100'), cmd('EXEC')]);

  /** Runs `bytes` directly and through the proxy from the same starting state; returns both, with the key's expiry state. */
  async function both(setup: Arg[][], bytes: Buffer, replies: number): Promise<{ direct: string; proxied: string }> {
    const run = async (port: number): Promise<string> => {
      await flushAll();
      for (const command of setup) await adminCall(...command);
      const client = await RawClient.connect(port);
      let out: string;
      try {
        client.write(bytes);
        out = (await client.readReplies(replies, 2000)).toString('latin1');
      } catch (err) {
        out = `<${(err as Error).message}>`;
      } finally {
        client.destroy();
      }
      const pttl = Number(/^:(-?\d+)/.exec(await adminCall('PTTL', 'lock:k'))?.[1]);
      return `${out} | expiry ${pttl < 0 ? pttl : pttl <= 5000 ? '<=5s' : '>5s'}`;
    };
    return { direct: await run(env.redis.port), proxied: await run(env.proxy.port) };
  }

  it('DISCARD x inside MULTI: the transaction goes on (and aborts at EXEC), the block in it is not rewritten', async () => {
    for (const discard of [cmd('DISCARD', 'x'), Buffer.from('DISCARD x\r\n')]) {
      const { direct, proxied } = await both([], Buffer.concat([cmd('MULTI'), discard, block, cmd('PING')]), 7);
      // The nested MULTI's error text differs between servers (Valkey: "Command not allowed inside a transaction").
      expect(direct).toMatch(
        /^\+OK\r\n-ERR [^\r]*\r\n-ERR [^\r]*\r\n\+QUEUED\r\n\+QUEUED\r\n-EXECABORT [^\r]*\r\n\+PONG\r\n \| expiry -2$/,
      );
      expect(proxied).toBe(direct);
    }
  });

  it('UNWATCH x: Redis keeps the WATCH, the proxy forgets it and rewrites the block (EXEC should fail)', async () => {
    for (const unwatch of [cmd('UNWATCH', 'x'), Buffer.from('UNWATCH x\r\n')]) {
      const bytes = Buffer.concat([cmd('WATCH', 'lock:k'), unwatch, cmd('SET', 'lock:k', '6'), block, cmd('PING')]);
      const { direct, proxied } = await both([['SET', 'lock:k', '5', 'PX', '5000']], bytes, 8);
      expect(direct).toMatch(/^\+OK\r\n-ERR [^\r]*\r\n\+OK\r\n\+OK\r\n\+QUEUED\r\n\+QUEUED\r\n\*-1\r\n\+PONG\r\n \| expiry -1$/);
      expect(proxied).toBe(direct);
    }
  });

  it('RESET x: Redis keeps the WATCH, the proxy forgets it and rewrites the block', async () => {
    const bytes = Buffer.concat([cmd('WATCH', 'lock:k'), cmd('RESET', 'x'), cmd('SET', 'lock:k', '6'), block, cmd('PING')]);
    const { direct, proxied } = await both([['SET', 'lock:k', '5', 'PX', '5000']], bytes, 8);
    expect(direct).toMatch(/\*-1\r\n\+PONG\r\n \| expiry -1$/);
    expect(proxied).toBe(direct);
  });

  it('MULTI x: Redis is not in a transaction, the proxy thinks it is and misses the WATCH that follows', async () => {
    const bytes = Buffer.concat([cmd('MULTI', 'x'), cmd('WATCH', 'lock:k'), cmd('EXEC'), cmd('SET', 'lock:k', '6'), block, cmd('PING')]);
    const { direct, proxied } = await both([['SET', 'lock:k', '5', 'PX', '5000']], bytes, 9);
    expect(direct).toMatch(
      /^-ERR [^\r]*\r\n\+OK\r\n-ERR [^\r]*\r\n\+OK\r\n\+OK\r\n\+QUEUED\r\n\+QUEUED\r\n\*-1\r\n\+PONG\r\n \| expiry -1$/,
    );
    expect(proxied).toBe(direct);
  });

  it('WATCH with no key: Redis watches nothing, and the block after it is rewritten', async () => {
    const { direct, proxied } = await both([['SET', 'lock:k', '1', 'PX', '5000']], Buffer.concat([cmd('WATCH'), block]), 5);
    expect(direct).toMatch(/^-ERR [^\r]*\r\n/);
    expect(direct).toContain(attemptReplies(2, 1));
    expect(direct).toMatch(/ \| expiry >5s$/); // Redis re-arms the lock
    // Redis's own replies; the lock keeps its expiry.
    expect(proxied).toBe(direct.replace(/ \| expiry >5s$/, ' | expiry <=5s'));
  });
});
