/**
 * Upstream discovery through Redis Sentinel: which Redis is the master of a
 * named group right now, and when that changes.
 *
 * A master address is believed only when a majority of the configured
 * sentinels name it (sentinel-vote.ts), at start-up and at every poll. The
 * monitor keeps two connections to every sentinel: one for `SENTINEL
 * get-master-addr-by-name` queries and one subscribed to `+switch-master`.
 * An event is not believed on its sender's word: it makes the monitor ask
 * every sentinel at once, and again every FOLLOW_POLL_MS for FOLLOW_WINDOW_MS,
 * so that the proxy switches as soon as a majority has learnt of a failover
 * (the other sentinels hear of it from the leader within about two seconds,
 * through their hello messages). Polling every `pollMs` covers what events
 * cannot: events lost, subscriptions down, restarted sentinels.
 *
 * When fewer than a majority name one master (sentinels down, partitioned, or
 * disagreeing), the master in use stays: the monitor says so once in the log,
 * and `agreement()` says so for /readyz and the metrics, until a majority
 * names a master again.
 *
 * Sentinel trouble never throws out of the monitor and never emits 'error':
 * it is logged (once per state change of each sentinel) and the last known
 * master stays in use.
 *
 * The queries, their replies and the connections' settings are in
 * sentinel-client.ts; this file decides when to ask and what to follow.
 */
import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { formatAddress, type Address } from '../address.js';
import { TimeoutError } from '../errors.js';
import type { Logger } from '../log.js';
import {
  endClient,
  failureReason,
  parseAddress,
  parseSwitchMessage,
  queryMasterAddress,
  sentinelClientOptions,
  withTimeout,
} from './sentinel-client.js';
import { describeAnswers, majorityOf, tally, type Answer, type Tally } from './sentinel-vote.js';

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

/** Whether a majority of the sentinels named the master in use at the last poll; `detail` says what they said when not. */
export interface Agreement {
  readonly majority: boolean;
  readonly detail: string;
}

/** How long start() keeps asking the sentinels for a master a majority names. */
const START_TIMEOUT_MS = 5_000;
/** Between two rounds of questions at start-up. */
const START_RETRY_MS = 250;
/** How long one poll waits for a sentinel's answer. */
const POLL_QUERY_TIMEOUT_MS = 2_000;
const DEFAULT_POLL_MS = 5_000;
/** After a +switch-master event: poll this often (and never more often), for this long. */
const FOLLOW_POLL_MS = 250;
const FOLLOW_WINDOW_MS = 10_000;
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

/** One round of questions: every sentinel's answer (undefined: not in yet), and their tally. */
interface Round {
  readonly answers: ReadonlyArray<Answer | undefined>;
  readonly tally: Tally;
}

export class SentinelMonitor extends EventEmitter<SentinelMonitorEvents> {
  private readonly links: Link[];
  private readonly masterName: string;
  private readonly pollMs: number;
  private readonly log: Logger;
  private readonly majority: number;
  private current!: Address;
  /** What the sentinels said at the last poll that found no majority; undefined while a majority agrees. */
  private disagreement: string | undefined;
  private started = false;
  private closed = false;
  private closing: Promise<void> | undefined;
  /** Aborted by close(): settles every query still waiting. */
  private readonly aborter = new AbortController();
  private pollTimer: NodeJS.Timeout | undefined;
  private polling = false;
  /** An event came while a poll was out (or during start-up): poll again as soon as allowed. */
  private pollAgain = false;
  private lastPollAt = 0;
  /** Until when events keep the polls fast (Date.now()). */
  private followUntil = 0;

  private constructor(opts: SentinelOptions) {
    super();
    this.masterName = opts.masterName;
    this.pollMs = opts.pollMs ?? DEFAULT_POLL_MS;
    this.log = opts.log;
    this.links = opts.sentinels.map((s) => this.createLink(s.host, s.port, opts));
    this.majority = majorityOf(this.links.length);
  }

  /**
   * Connects to the sentinels and resolves once a majority of them name the
   * same master. Rejects, naming the sentinels, the master name and what each
   * said, if that does not happen within about five seconds.
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

  /** Whether a majority of the sentinels named the master in use at the last poll. */
  agreement(): Agreement {
    const master = formatAddress(this.current.host, this.current.port);
    if (this.disagreement === undefined) {
      return { majority: true, detail: `a majority of the sentinels (${this.majority} of ${this.links.length}) names master ${master}` };
    }
    return {
      majority: false,
      detail: `no majority of the sentinels (${this.majority} of ${this.links.length}) names one master; keeping master ${master} (${this.disagreement})`,
    };
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
    const deadline = Date.now() + START_TIMEOUT_MS;
    for (;;) {
      const round = await this.askAll(Math.max(1, deadline - Date.now()));
      if (this.closed) throw new Error(`sentinel ${this.masterName}: closed during startup`);
      const { winner, votes, noMaster, answered } = round.tally;
      if (winner !== undefined) {
        this.current = freeze(winner);
        this.started = true;
        this.log.info(
          {
            sentinelMaster: this.masterName,
            master: formatAddress(winner.host, winner.port),
            sentinels: `${votes} of ${this.links.length} name it`,
          },
          'sentinel: master found',
        );
        this.schedulePoll(this.pollAgain ? 0 : this.pollMs);
        return;
      }
      const said = describeAnswers(this.sentinelNames(), round.answers);
      if (noMaster >= this.majority || (noMaster > 0 && noMaster === answered && Date.now() >= deadline)) {
        throw new Error(`sentinel: none of the sentinels ${this.sentinelList()} knows a master named "${this.masterName}" (${said})`);
      }
      if (Date.now() >= deadline) {
        const what =
          answered === 0
            ? `none of the sentinels ${this.sentinelList()} answered within ${START_TIMEOUT_MS} ms when asked for master "${this.masterName}"`
            : `no majority of the sentinels ${this.sentinelList()} (${this.majority} of ${this.links.length}) named one master "${this.masterName}" within ${START_TIMEOUT_MS} ms`;
        throw new Error(`sentinel: ${what} (${said})`);
      }
      await sleep(Math.min(START_RETRY_MS, Math.max(0, deadline - Date.now())), undefined, { signal: this.aborter.signal }).catch(() => {});
    }
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

  /**
   * Asks every sentinel at once; resolves as soon as a majority names one master, or once every
   * sentinel has answered or failed (each within `timeoutMs`).
   */
  private askAll(timeoutMs: number): Promise<Round> {
    const answers: Array<Answer | undefined> = this.links.map(() => undefined);
    return new Promise((resolve) => {
      let pending = this.links.length;
      this.links.forEach((link, i) => {
        void this.ask(link, timeoutMs).then((answer) => {
          answers[i] = answer;
          pending--;
          const counted = tally(answers, this.links.length);
          if (counted.winner !== undefined || pending === 0) resolve({ answers: [...answers], tally: counted });
        });
      });
    });
  }

  /** One sentinel's view of the master. Never rejects. */
  private async ask(link: Link, timeoutMs: number): Promise<Answer> {
    let reply: unknown;
    try {
      reply = await withTimeout(queryMasterAddress(link.cmd, this.masterName), timeoutMs, this.aborter.signal);
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
    return { kind: 'master', address };
  }

  // -------------------------------------------------------------------------
  // Changes
  // -------------------------------------------------------------------------

  /**
   * A sentinel says the master switched. Any sentinel can say anything, so this only makes the
   * monitor ask them all, now and for a while (the others learn of a real failover within
   * seconds); what a majority then names is followed.
   */
  private onSwitchMessage(link: Link, message: string): void {
    if (this.closed) return;
    const parsed = parseSwitchMessage(message);
    if (parsed === undefined || parsed.name !== this.masterName) return;
    this.log.debug({ sentinel: link.address, message }, 'sentinel: +switch-master; asking every sentinel');
    this.followUntil = Date.now() + FOLLOW_WINDOW_MS;
    if (!this.started || this.polling) {
      this.pollAgain = true;
      return;
    }
    this.schedulePoll(Math.max(0, this.lastPollAt + FOLLOW_POLL_MS - Date.now()));
  }

  private switchTo(to: Address, votes: number): void {
    const from = this.current;
    this.current = freeze(to);
    this.log.info(
      {
        sentinelMaster: this.masterName,
        from: formatAddress(from.host, from.port),
        to: formatAddress(to.host, to.port),
        cause: `a majority of the sentinels names it (${votes} of ${this.links.length})`,
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
    if (this.closed || this.polling) return;
    this.polling = true;
    this.lastPollAt = Date.now();
    try {
      await this.pollOnce();
    } catch (err) {
      // Nothing above is meant to throw; never let a poll take the process down.
      this.log.warn({ sentinelMaster: this.masterName, err: (err as Error).message }, 'sentinel: poll failed');
    } finally {
      this.polling = false;
      const following = this.pollAgain || Date.now() < this.followUntil;
      this.pollAgain = false;
      this.schedulePoll(following ? Math.max(0, this.lastPollAt + FOLLOW_POLL_MS - Date.now()) : this.pollMs);
    }
  }

  private async pollOnce(): Promise<void> {
    const timeoutMs = Math.min(POLL_QUERY_TIMEOUT_MS, Math.max(this.pollMs, 500));
    const round = await this.askAll(timeoutMs);
    if (this.closed) return;
    const { winner, votes } = round.tally;
    if (winner === undefined) {
      this.noMajority(round);
      return;
    }
    if (this.disagreement !== undefined) {
      this.disagreement = undefined;
      this.log.info(
        { sentinelMaster: this.masterName, master: formatAddress(winner.host, winner.port), sentinels: `${votes} of ${this.links.length}` },
        'sentinel: a majority of the sentinels names the master again',
      );
    }
    if (!sameAddress(winner, this.current)) this.switchTo(winner, votes);
  }

  /** Fewer than a majority name one master: the master in use stays; said once in the log until a majority agrees again. */
  private noMajority(round: Round): void {
    const said = describeAnswers(this.sentinelNames(), round.answers);
    const first = this.disagreement === undefined;
    this.disagreement = said;
    if (!first) return;
    this.log.warn(
      {
        sentinelMaster: this.masterName,
        master: formatAddress(this.current.host, this.current.port),
        majority: `${this.majority} of ${this.links.length}`,
        sentinels: said,
      },
      'sentinel: no majority of the sentinels names one master; keeping the current master',
    );
  }

  private sentinelNames(): string[] {
    return this.links.map((link) => link.address);
  }

  private sentinelList(): string {
    return this.sentinelNames().join(',');
  }
}

function sameAddress(a: Address, b: Address): boolean {
  return a.host === b.host && a.port === b.port;
}

function freeze(address: Address): Address {
  return Object.freeze({ host: address.host, port: address.port });
}
