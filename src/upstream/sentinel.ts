/**
 * Upstream discovery through Redis Sentinel: which Redis is the master of a
 * named group right now, and when that changes.
 *
 * The monitor keeps two connections to every configured sentinel: one for
 * `SENTINEL get-master-addr-by-name` queries and one subscribed to
 * `+switch-master`, which sentinels publish the moment they switch (or learn
 * of a switch). Polling every `pollMs` covers what events cannot: events
 * published while a subscription was down, restarted sentinels, lost
 * messages.
 *
 * At startup the sentinels are asked in the order given and the first valid
 * answer wins, the way client libraries do it. Afterwards a poll asks all of
 * them and prefers the answer with the highest configuration epoch (ties go
 * to the earlier sentinel), so a sentinel that has not heard of a failover
 * yet cannot switch the proxy back to the old master: an answer that
 * disagrees with the current master and comes with a lower epoch than the
 * one already seen is ignored, unless every poll says so for
 * STALE_ROUNDS_BEFORE_ACCEPT rounds in a row (sentinels whose state was
 * wiped restart at epoch 0). A `+switch-master` event is always followed.
 *
 * Sentinel trouble never throws out of the monitor and never emits 'error':
 * it is logged (once per state change of each sentinel) and the last known
 * master stays in use.
 *
 * The queries, their replies and the connections' settings are in
 * sentinel-client.ts; this file decides what the answers mean.
 */
import { EventEmitter } from 'node:events';
import { Redis } from 'ioredis';
import { formatAddress, type Address } from '../address.js';
import { TimeoutError } from '../errors.js';
import type { Logger } from '../log.js';
import {
  endClient,
  failureReason,
  parseAddress,
  parseSwitchMessage,
  queryEpoch,
  queryMasterAddress,
  sentinelClientOptions,
  withTimeout,
} from './sentinel-client.js';

export interface SentinelOptions {
  sentinels: Array<{ host: string; port: number }>;
  masterName: string;
  /** Credentials for the sentinels themselves (not the master), optional. */
  username?: string;
  password?: string;
  /** How often to re-ask the sentinels even without a +switch-master event (ms, default 5000). */
  pollMs?: number;
  log: Logger;
}

export interface SentinelMonitorEvents {
  /** The master changed; emitted only on a real change of address. */
  switch: [from: Address, to: Address];
}

/** How long start() waits for an answer from the sentinels. */
const START_TIMEOUT_MS = 5_000;
/** How long one poll waits for a sentinel's answer. */
const POLL_QUERY_TIMEOUT_MS = 2_000;
/** How long the epoch lookup after a +switch-master event may take. */
const EVENT_EPOCH_TIMEOUT_MS = 1_000;
const DEFAULT_POLL_MS = 5_000;
/** Polls in a row that must report an older-epoch master before it is believed anyway. */
const STALE_ROUNDS_BEFORE_ACCEPT = 3;
const SWITCH_CHANNEL = '+switch-master';

type LinkState = 'unknown' | 'up' | 'down' | 'no-master';

interface Link {
  readonly address: string;
  /** Queries. */
  readonly cmd: Redis;
  /** Subscribed to +switch-master. */
  readonly sub: Redis;
  state: LinkState;
  /** Last connection error seen on `cmd`, for messages. */
  lastError?: string;
}

type Answer = { kind: 'master'; address: Address; epoch?: number } | { kind: 'no-master' } | { kind: 'failed'; reason: string };

export class SentinelMonitor extends EventEmitter<SentinelMonitorEvents> {
  private readonly links: Link[];
  private readonly masterName: string;
  private readonly pollMs: number;
  private readonly log: Logger;
  private current!: Address;
  /** Highest configuration epoch known for the current master, if sentinels told. */
  private knownEpoch: number | undefined;
  /** Bumped on every change of `current`, so slow polls cannot apply stale answers. */
  private generation = 0;
  private staleRounds = 0;
  private started = false;
  private closed = false;
  private closing: Promise<void> | undefined;
  /** Aborted by close(): settles every query still waiting. */
  private readonly aborter = new AbortController();
  private pollTimer: NodeJS.Timeout | undefined;
  /** A +switch-master event came in during startup: poll right after it. */
  private pollAgain = false;

  private constructor(opts: SentinelOptions) {
    super();
    this.masterName = opts.masterName;
    this.pollMs = opts.pollMs ?? DEFAULT_POLL_MS;
    this.log = opts.log;
    this.links = opts.sentinels.map((s) => this.createLink(s.host, s.port, opts));
  }

  /**
   * Connects to the sentinels and resolves once one of them names the master.
   * Rejects, naming the sentinels and the master name, if none answers within
   * about five seconds or none knows the master.
   */
  static async start(opts: SentinelOptions): Promise<SentinelMonitor> {
    if (opts.sentinels.length === 0) throw new Error('sentinel: no sentinel addresses given');
    if (!opts.masterName) throw new Error('sentinel: no master name given');
    const pollMs = opts.pollMs ?? DEFAULT_POLL_MS;
    if (!Number.isFinite(pollMs) || pollMs <= 0) throw new Error(`sentinel: pollMs must be a positive number, got ${pollMs}`);
    const monitor = new SentinelMonitor(opts);
    try {
      await monitor.discover();
    } catch (err) {
      await monitor.close();
      throw err;
    }
    return monitor;
  }

  /** The current master. */
  get master(): Address {
    return this.current;
  }

  /** The current master (UpstreamLocator). */
  locate(): Address {
    return this.current;
  }

  /** e.g. `sentinel mymaster via 127.0.0.1:26379,127.0.0.1:26380 (master 127.0.0.1:6379)` */
  describe(): string {
    return `sentinel ${this.masterName} via ${this.sentinelList()} (master ${formatAddress(this.current.host, this.current.port)})`;
  }

  /** Disconnects from every sentinel and stops polling; safe to call twice. */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    this.closed = true;
    this.aborter.abort();
    clearTimeout(this.pollTimer);
    this.pollTimer = undefined;
    this.closing = Promise.all(this.links.flatMap((link) => [endClient(link.cmd), endClient(link.sub)])).then(() => undefined);
    return this.closing;
  }

  // -------------------------------------------------------------------------
  // Startup
  // -------------------------------------------------------------------------

  private async discover(): Promise<void> {
    for (const link of this.links) {
      link.cmd.connect().catch(() => {}); // failures arrive as 'error' events and in query results
      link.sub.connect().catch(() => {});
    }
    // All sentinels are asked at once; the answers are taken in order.
    const pending = this.links.map((link) => this.ask(link, START_TIMEOUT_MS));
    const failures: string[] = [];
    let anyAnswered = false;
    for (let i = 0; i < this.links.length; i++) {
      const link = this.links[i];
      const answer = await pending[i];
      if (this.closed) throw new Error(`sentinel ${this.masterName}: closed during startup`);
      if (answer.kind === 'master') {
        this.current = freeze(answer.address);
        this.knownEpoch = answer.epoch;
        this.started = true;
        this.log.info(
          {
            sentinelMaster: this.masterName,
            sentinel: link.address,
            master: formatAddress(answer.address.host, answer.address.port),
            epoch: answer.epoch,
          },
          'sentinel: master found',
        );
        // The remaining answers only matter for reachability logging.
        this.schedulePoll(this.pollAgain ? 0 : this.pollMs);
        return;
      }
      if (answer.kind === 'no-master') {
        anyAnswered = true;
        failures.push(`${link.address}: no master named "${this.masterName}"`);
      } else {
        failures.push(`${link.address}: ${answer.reason}`);
      }
    }
    const what = anyAnswered
      ? `none of the sentinels ${this.sentinelList()} knows a master named "${this.masterName}"`
      : `none of the sentinels ${this.sentinelList()} answered within ${START_TIMEOUT_MS} ms when asked for master "${this.masterName}"`;
    throw new Error(`sentinel: ${what} (${failures.join('; ')})`);
  }

  // -------------------------------------------------------------------------
  // Connections
  // -------------------------------------------------------------------------

  private createLink(host: string, port: number, opts: SentinelOptions): Link {
    const options = sentinelClientOptions({ host, port, username: opts.username, password: opts.password });
    const link: Link = {
      address: formatAddress(host, port),
      cmd: new Redis({ ...options }),
      // Resubscribing is done on every 'ready' below, including the first
      // one, which autoResubscribe would not do after a failed first attempt.
      sub: new Redis({ ...options, autoResubscribe: false }),
      state: 'unknown',
    };

    link.cmd.on('error', (err: Error) => {
      link.lastError = err.message;
    });
    link.cmd.on('ready', () => {
      link.lastError = undefined;
    });
    link.cmd.on('close', () => {
      // Sentinels never heard from, or already known down, are reported by queries.
      if (this.closed || link.state === 'unknown' || link.state === 'down') return;
      this.setState(link, 'down', link.lastError ?? 'connection closed');
    });

    link.sub.on('error', () => {}); // the cmd connection reports reachability
    link.sub.on('ready', () => {
      if (this.closed) return;
      link.sub.subscribe(SWITCH_CHANNEL).catch((err: Error) => {
        if (!this.closed) this.log.debug({ sentinel: link.address, err: err.message }, 'sentinel: subscribe failed');
      });
    });
    link.sub.on('message', (channel: string, message: string) => {
      if (channel === SWITCH_CHANNEL) this.onSwitchMessage(link, message);
    });
    return link;
  }

  private setState(link: Link, state: LinkState, reason?: string): void {
    const previous = link.state;
    if (previous === state || this.closed) return;
    link.state = state;
    const fields = { sentinel: link.address, sentinelMaster: this.masterName };
    if (state === 'down') this.log.warn({ ...fields, err: reason }, 'sentinel unreachable');
    else if (state === 'no-master') this.log.warn(fields, 'sentinel does not know the master');
    else if (state === 'up' && previous !== 'unknown') this.log.info(fields, 'sentinel reachable again');
  }

  /** One sentinel's view of the master. Never rejects. */
  private async ask(link: Link, timeoutMs: number): Promise<Answer> {
    const addressReply = queryMasterAddress(link.cmd, this.masterName);
    // Pipelined with the address query; only used to order answers, so its failure is harmless.
    const epochReply = queryEpoch(link.cmd, this.masterName).catch(() => undefined);
    let reply: unknown;
    try {
      reply = await withTimeout(addressReply, timeoutMs, this.aborter.signal);
    } catch (err) {
      const reason = failureReason(err, timeoutMs, link.cmd, link.lastError);
      this.setState(link, 'down', reason);
      if (err instanceof TimeoutError && !this.closed && link.cmd.status === 'ready') {
        // A connection that does not answer is recycled, so unanswered
        // commands do not pile up and a half-open subscription is renewed.
        link.cmd.disconnect(true);
        if (link.sub.status === 'ready') link.sub.disconnect(true);
      }
      return { kind: 'failed', reason };
    }
    if (reply === null) {
      this.setState(link, 'no-master');
      return { kind: 'no-master' };
    }
    const address = parseAddress(reply);
    if (!address) {
      const reason = `unexpected reply to SENTINEL get-master-addr-by-name: ${JSON.stringify(reply)}`;
      this.setState(link, 'down', reason);
      return { kind: 'failed', reason };
    }
    this.setState(link, 'up');
    const epoch = await withTimeout(epochReply, timeoutMs, this.aborter.signal).catch(() => undefined);
    return { kind: 'master', address, epoch };
  }

  // -------------------------------------------------------------------------
  // Changes
  // -------------------------------------------------------------------------

  private onSwitchMessage(link: Link, message: string): void {
    if (this.closed) return;
    const parsed = parseSwitchMessage(message);
    if (parsed === undefined || parsed.name !== this.masterName) return;
    const to = parsed.to;
    if (!to) {
      this.log.warn({ sentinel: link.address, message }, 'sentinel: malformed +switch-master message');
      return;
    }
    if (!this.started) {
      // Startup is still deciding; a poll right after it settles the matter.
      this.pollAgain = true;
      return;
    }
    this.applyEvent(link, to).catch((err: Error) => {
      // Only a throwing 'switch' listener gets here; it must not become an unhandled rejection.
      this.log.warn({ sentinelMaster: this.masterName, err: err.message }, 'sentinel: handling +switch-master failed');
    });
  }

  private async applyEvent(link: Link, to: Address): Promise<void> {
    // The sentinel's epoch is already the new one when it publishes the
    // event; knowing it lets later polls recognise lagging sentinels.
    const epoch = await withTimeout(queryEpoch(link.cmd, this.masterName), EVENT_EPOCH_TIMEOUT_MS, this.aborter.signal).catch(
      () => undefined,
    );
    if (this.closed) return;
    if (sameAddress(to, this.current)) {
      if (epoch !== undefined && (this.knownEpoch === undefined || epoch > this.knownEpoch)) this.knownEpoch = epoch;
      return;
    }
    this.knownEpoch = epoch;
    this.switchTo(to, `+switch-master from ${link.address}`);
  }

  private switchTo(to: Address, cause: string): void {
    const from = this.current;
    this.current = freeze(to);
    this.generation++;
    this.staleRounds = 0;
    this.log.info(
      {
        sentinelMaster: this.masterName,
        from: formatAddress(from.host, from.port),
        to: formatAddress(to.host, to.port),
        cause,
        epoch: this.knownEpoch,
      },
      'sentinel: master switched',
    );
    this.emit('switch', from, this.current);
  }

  // -------------------------------------------------------------------------
  // Polling
  // -------------------------------------------------------------------------

  private schedulePoll(delayMs: number): void {
    if (this.closed) return;
    clearTimeout(this.pollTimer);
    this.pollTimer = setTimeout(() => {
      this.pollTimer = undefined;
      void this.poll();
    }, delayMs);
    this.pollTimer.unref();
  }

  private async poll(): Promise<void> {
    if (this.closed) return;
    try {
      await this.pollOnce();
    } catch (err) {
      // Nothing above is meant to throw; never let a poll take the process down.
      this.log.warn({ sentinelMaster: this.masterName, err: (err as Error).message }, 'sentinel: poll failed');
    } finally {
      this.schedulePoll(this.pollMs);
    }
  }

  private async pollOnce(): Promise<void> {
    const generation = this.generation;
    const timeoutMs = Math.min(POLL_QUERY_TIMEOUT_MS, Math.max(this.pollMs, 500));
    const answers = await Promise.all(this.links.map((link) => this.ask(link, timeoutMs)));
    // A switch while the poll was out makes its answers old news.
    if (this.closed || generation !== this.generation) return;

    let best: { address: Address; epoch?: number; sentinel: string } | undefined;
    answers.forEach((answer, i) => {
      if (answer.kind !== 'master') return;
      if (!best || (answer.epoch ?? -1) > (best.epoch ?? -1)) best = { ...answer, sentinel: this.links[i].address };
    });
    if (!best) return; // nobody knows better; keep the last known master

    if (sameAddress(best.address, this.current)) {
      this.staleRounds = 0;
      if (best.epoch !== undefined && (this.knownEpoch === undefined || best.epoch > this.knownEpoch)) this.knownEpoch = best.epoch;
      return;
    }
    const stale = best.epoch !== undefined && this.knownEpoch !== undefined && best.epoch < this.knownEpoch;
    if (stale && ++this.staleRounds < STALE_ROUNDS_BEFORE_ACCEPT) {
      this.log.debug(
        {
          sentinelMaster: this.masterName,
          sentinel: best.sentinel,
          reported: formatAddress(best.address.host, best.address.port),
          epoch: best.epoch,
          knownEpoch: this.knownEpoch,
        },
        'sentinel: ignoring a master from an older configuration epoch',
      );
      return;
    }
    if (stale) {
      this.log.warn(
        { sentinelMaster: this.masterName, epoch: best.epoch, knownEpoch: this.knownEpoch },
        'sentinel: all sentinels report an older configuration epoch than seen before; following them',
      );
    }
    this.knownEpoch = best.epoch;
    this.switchTo(best.address, `poll of ${best.sentinel}`);
  }

  private sentinelList(): string {
    return this.links.map((link) => link.address).join(',');
  }
}

function sameAddress(a: Address, b: Address): boolean {
  return a.host === b.host && a.port === b.port;
}

function freeze(address: Address): Address {
  return Object.freeze({ host: address.host, port: address.port });
}
