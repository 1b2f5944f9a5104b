/**
 * `verify`: the check itself. Through the proxy, as an application talks to it (ioredis,
 * `multi().incrby().expire().exec()`), each rule's scratch key gets a first lock attempt, which
 * must set the expiry, then a lowered TTL, then a second attempt, which must leave that TTL
 * alone. All under one deadline; the scratch key is deleted afterwards, also on failure.
 */
import { Redis } from 'ioredis';
import type { Address } from '../address.js';
import { RuleFailure } from '../errors.js';
import { describeKey } from '../key-text.js';
import type { Rule, RuleSet } from '../rules/types.js';
import { isReplyError, reportingOptions } from '../upstream/redis-client.js';
import { connectionFault, describeError, notRespHint, speaksResp } from './command.js';
import type { SlotRanges } from '../cluster/topology.js';
import { probe, ProbeRefused, servedSlots, unusedScratchKey } from './verify-scratch.js';

/** The first attempt's expiry, and the lowered TTL a second attempt must not push forward. */
const FIRST_EXPIRE_SECONDS = 60;
const LOWERED_PTTL_MS = 30_000;

/** The proxy to verify through, as the options give it. */
export interface ProxyEndpoint {
  readonly via: Address;
  /** `via` as text, for messages. */
  readonly viaText: string;
  readonly timeoutMs: number;
  /** The name the connection is given: verify's, with this run's nonce (verify-connection.ts). */
  readonly clientName: string;
  readonly username: string | undefined;
  readonly password: string | undefined;
}

export type Outcome = { kind: 'ok' } | { kind: 'failed'; message: string };

/** What the check is doing, for the message when the deadline passes. */
interface Progress {
  step: string;
}

/**
 * Verifies every rule in `enforce` through the proxy, within `timeoutMs` in all; `rearmed` says
 * what a re-armed expiry means, given what is known of the proxy's rules (verify-rules.ts).
 */
export function verifyRules(
  proxy: ProxyEndpoint,
  rules: RuleSet,
  enforce: readonly Rule[],
  rearmed: string,
  timeoutMs: number,
  verbose: (line: string) => void,
): Promise<Outcome> {
  const progress: Progress = { step: 'connecting' };
  return withDeadline(timeoutMs, progress, (signal) => verifyAll(proxy, rules, enforce, rearmed, signal, progress, verbose));
}

/** Runs `work` with an overall deadline; `signal` aborts when the deadline passes. */
async function withDeadline(timeoutMs: number, progress: Progress, work: (signal: AbortSignal) => Promise<Outcome>): Promise<Outcome> {
  const controller = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<Outcome>((resolve) => {
    timer = setTimeout(() => {
      controller.abort();
      resolve({ kind: 'failed', message: `timed out after ${timeoutMs} ms while ${progress.step}` });
    }, timeoutMs);
  });
  try {
    return await Promise.race([
      work(controller.signal).then(
        (outcome) => outcome,
        (error: unknown) => ({ kind: 'failed' as const, message: describeError(error) }),
      ),
      timedOut,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Whether `proxy` answers as Redis or redis-lock-proxy does (PING), within its timeout, on a
 * connection named as verify's: for a release with nothing to verify, and so that the proxy
 * there sees this run's name before verify asks an admin endpoint whether it did.
 */
export function checkAnswers(proxy: ProxyEndpoint, verbose: (line: string) => void): Promise<Outcome> {
  const progress: Progress = { step: 'connecting' };
  return withDeadline(proxy.timeoutMs, progress, (signal) =>
    withConnection(proxy, signal, progress, verbose, async (redis, lastError) => {
      progress.step = `sending PING to ${proxy.viaText}`;
      try {
        await nameConnection(redis, proxy.clientName);
        const pong = await redis.ping();
        if (pong !== 'PONG') return { kind: 'failed', message: `${proxy.viaText} answered PING with ${JSON.stringify(pong)}` };
      } catch (error) {
        if (signal.aborted) throw error;
        return { kind: 'failed', message: failureMessage(error, lastError(), proxy.viaText) };
      }
      verbose(`${proxy.viaText} answers PING`);
      return { kind: 'ok' };
    }),
  );
}

async function verifyAll(
  proxy: ProxyEndpoint,
  rules: RuleSet,
  enforce: readonly Rule[],
  rearmed: string,
  signal: AbortSignal,
  progress: Progress,
  verbose: (line: string) => void,
): Promise<Outcome> {
  return withConnection(proxy, signal, progress, verbose, async (redis, lastError) => {
    let slots: Promise<SlotRanges | null> | undefined;
    for (const rule of enforce) {
      progress.step = `verifying rule ${rule.name}`;
      try {
        slots ??= nameConnection(redis, proxy.clientName).then(() => servedSlots(redis, verbose));
        await verifyRule(redis, rules, rule, await slots, rearmed, verbose);
      } catch (error) {
        if (signal.aborted) throw error;
        return { kind: 'failed', message: `rule ${rule.name}: ${failureMessage(error, lastError(), proxy.viaText)}` };
      }
    }
    return { kind: 'ok' };
  });
}

/**
 * Names the connection as verify's (CLIENT SETNAME), so that the proxy counts its lock blocks
 * apart from the application's, logs them as verify's, and remembers this run. A server that refuses the name (an ACL without CLIENT, a
 * password not given yet) is still verified: the commands after it say what is wrong, and the
 * proxy recognises the name as it passes, whatever Redis answers. The proxy's own refusal (its
 * upstream unreachable) and a lost connection are failures.
 */
async function nameConnection(redis: Redis, name: string): Promise<void> {
  try {
    await redis.call('CLIENT', 'SETNAME', name);
  } catch (error) {
    if (isReplyError(error) && !/^ERR redis-lock-proxy:/.test((error as Error).message)) return;
    throw error;
  }
}

/** Connects to `proxy` as an application does, runs `work`, and disconnects; the deadline's abort closes the connection. */
async function withConnection(
  proxy: ProxyEndpoint,
  signal: AbortSignal,
  progress: Progress,
  verbose: (line: string) => void,
  work: (redis: Redis, lastError: () => Error | undefined) => Promise<Outcome>,
): Promise<Outcome> {
  const redis = new Redis({
    host: proxy.via.host,
    port: proxy.via.port,
    username: proxy.username,
    password: proxy.password,
    ...reportingOptions(proxy.timeoutMs),
  });
  let lastError: Error | undefined;
  redis.on('error', (error: Error) => {
    lastError = error; // failures surface through the commands' promises; keep the cause
  });
  // The deadline closes the connection, which fails whatever command is pending.
  const onAbort = () => redis.disconnect();
  progress.step = `connecting to ${proxy.viaText}`;
  signal.addEventListener('abort', onAbort, { once: true });
  try {
    try {
      await redis.connect();
    } catch (error) {
      const reason = describeError(lastError ?? error);
      return { kind: 'failed', message: `cannot connect to ${proxy.viaText}: ${notRespHint(reason, proxy.viaText)}` };
    }
    verbose(`connected to ${proxy.viaText}`);
    return await work(redis, () => lastError);
  } finally {
    signal.removeEventListener('abort', onAbort);
    redis.disconnect();
  }
}

/** Why a rule's check failed: the rule's own failure, or what went wrong with the connection or command. */
function failureMessage(error: unknown, lastError: Error | undefined, viaText: string): string {
  if (error instanceof RuleFailure || error instanceof ProbeRefused) return error.message;
  const fault = connectionFault(error, lastError);
  if (fault !== undefined) {
    const reason = describeError(fault);
    return speaksResp(reason) ? `connection to ${viaText} failed: ${withAuthHint(reason)}` : notRespHint(reason, viaText);
  }
  return withAuthHint(describeError(error));
}

function withAuthHint(message: string): string {
  if (/^(NOAUTH|WRONGPASS)\b/.test(message)) {
    return `${message} (give --password, --user, or REDIS_LOCK_PROXY_VERIFY_PASSWORD)`;
  }
  return message;
}

async function verifyRule(
  redis: Redis,
  rules: RuleSet,
  rule: Rule,
  slots: SlotRanges | null,
  rearmed: string,
  verbose: (line: string) => void,
): Promise<void> {
  const key = await unusedScratchKey(redis, rules, rule, slots);
  const shown = describeKey(key);
  verbose(`rule ${rule.name}: scratch key ${shown}`);
  try {
    const first = await lockAttempt(redis, key);
    verbose(`rule ${rule.name}: attempt 1: counter ${first.counter}, expiry reply ${first.expirySet}`);
    if (first.counter !== 1 || first.expirySet !== 1) {
      throw new RuleFailure(
        rule.name,
        `first attempt on scratch key ${shown} returned counter ${first.counter} and expiry flag ` +
          `${first.expirySet} (expected 1 and 1)`,
      );
    }
    const lowered = await probe('PEXPIRE', redis.pexpire(key, LOWERED_PTTL_MS));
    if (lowered !== 1) {
      throw new RuleFailure(rule.name, `PEXPIRE on scratch key ${shown} returned ${lowered} (expected 1)`);
    }
    const second = await lockAttempt(redis, key);
    const pttl = await probe('PTTL', redis.pttl(key));
    verbose(`rule ${rule.name}: attempt 2: counter ${second.counter}, expiry reply ${second.expirySet}, pttl ${pttl} ms`);
    // The reply is `1` either way (the proxy gives the client what Redis alone answers): only the
    // expiry left in Redis tells whether the second attempt re-armed it.
    if (pttl > LOWERED_PTTL_MS) {
      throw new RuleFailure(rule.name, `second attempt re-armed the expiry (pttl ${pttl} ms): ${rearmed}`);
    }
    if (second.counter !== 2) {
      throw new RuleFailure(
        rule.name,
        `second attempt on scratch key ${shown} returned counter ${second.counter} (expected 2): ` + 'something else wrote to it',
      );
    }
    if (pttl < 0) {
      throw new RuleFailure(rule.name, `scratch key ${shown} lost its expiry (pttl ${pttl}) after the second attempt`);
    }
    verbose(`rule ${rule.name}: OK`);
  } finally {
    // Best effort: the key expires within 60 s anyway.
    await redis.del(key).catch(() => undefined);
  }
}

interface AttemptResult {
  counter: number | string;
  expirySet: number | string;
}

/** Stalwart's lock attempt, as an application sends it. */
async function lockAttempt(redis: Redis, key: Buffer): Promise<AttemptResult> {
  const replies = await redis.multi().incrby(key, 1).expire(key, FIRST_EXPIRE_SECONDS).exec();
  if (replies === null) throw new Error('the transaction was aborted (EXEC returned nil)');
  if (replies.length !== 2) throw new Error(`EXEC returned ${replies.length} replies (expected 2)`);
  const [[incrError, counter], [expireError, expirySet]] = replies;
  if (incrError) throw new Error(`INCRBY failed: ${incrError.message}`, { cause: incrError });
  if (expireError) throw new Error(`EXPIRE failed: ${expireError.message}`, { cause: expireError });
  return { counter: replyValue(counter), expirySet: replyValue(expirySet) };
}

function replyValue(value: unknown): number | string {
  return typeof value === 'number' ? value : String(value);
}
