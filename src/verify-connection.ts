/**
 * `verify`'s own connections. verify names its connection with CLIENT SETNAME, and the session
 * that carries it recognises the name: the lock blocks of such a connection are counted apart
 * (Stats.verify), so that a readiness probe running `verify` does not look like a node still
 * taking locks the old way. lock_attempts_total, blocks_total and the old-shape report count the
 * application's blocks only; verify_blocks_total counts verify's. Every log line the proxy writes
 * about such a connection's blocks says it is verify's probe (verifyLogger).
 *
 * The name also proves which proxy a verify run went through. verify adds a nonce of its run to
 * the name (`redis-lock-proxy-verify-<nonce>`); the proxy remembers the last nonces it saw pass
 * (VerifyRuns), and its admin endpoint says whether it saw one (`GET /verify/<nonce>`). So verify
 * learns that the admin endpoint it took the rules from belongs to the proxy its connection went
 * through, before it judges that proxy by them, without a word on the data port that Redis would
 * not understand: the name goes to Redis as the client sent it. The name, rather than the scratch
 * keys, carries the nonce because it passes first, whatever the rules are (a proxy that only
 * observes sees it too), and because Stalwart's key shapes have no room for a marker.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import type { Logger } from './log.js';
import { Cmd, equalsIgnoreCase } from './resp/commands.js';
import { MAX_CAPTURED_VALUE, type RequestScanner } from './resp/request-scanner.js';
import type { Stats } from './stats.js';

/** The client name verify gives its connection, alone or followed by `-` and its run's nonce. */
export const VERIFY_CLIENT_NAME = 'redis-lock-proxy-verify';

/** A run's nonce: lowercase letters and digits, as many as fit the captured name (23 + 1 + 8 = 32 bytes). */
const NONCE_LENGTH = MAX_CAPTURED_VALUE - VERIFY_CLIENT_NAME.length - 1;
const NONCE_ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';
const NONCE = new RegExp(`^[a-z0-9]{${NONCE_LENGTH}}$`);
/** How many runs' nonces a proxy remembers: verify asks right after its connection passed. */
export const REMEMBERED_RUNS = 64;

const NAME = Buffer.from(VERIFY_CLIENT_NAME);
const SETNAME = Buffer.from('setname');
const DASH = 0x2d;

/** A new run's nonce (about 41 random bits: runs are told apart, nothing is kept secret). */
export function newVerifyNonce(): string {
  return Array.from(randomBytes(NONCE_LENGTH), (byte) => NONCE_ALPHABET[byte % NONCE_ALPHABET.length]).join('');
}

/** Whether `text` has the form of a run's nonce. */
export function isVerifyNonce(text: string): boolean {
  return NONCE.test(text);
}

/** The name a verify run gives its connections. */
export function verifyClientName(nonce: string): string {
  return `${VERIFY_CLIENT_NAME}-${nonce}`;
}

function isSetName(scanner: RequestScanner): boolean {
  if (scanner.cmd !== Cmd.Client || scanner.argc !== 3 || scanner.inline) return false;
  return scanner.keyLength === SETNAME.length && equalsIgnoreCase(scanner.key, 0, SETNAME);
}

/** The nonce in the CLIENT SETNAME name the scanner holds: '' for verify's name alone, undefined when it is not verify's. */
function nonceInName(scanner: RequestScanner): string | undefined {
  const name = scanner.value.subarray(0, scanner.valueLength);
  if (scanner.oversize || name.length < NAME.length || !NAME.equals(name.subarray(0, NAME.length))) return undefined;
  if (name.length === NAME.length) return '';
  const nonce = name.subarray(NAME.length + 1).toString('latin1');
  return name[NAME.length] === DASH && isVerifyNonce(nonce) ? nonce : undefined;
}

/**
 * The verify runs whose connections came through this proxy, for its admin endpoint: this
 * process's instance id, and the last REMEMBERED_RUNS nonces seen, in memory only.
 */
export class VerifyRuns {
  /** New at each start: which running proxy answered. */
  readonly instance: string = randomUUID();
  /** Insertion order is age: the first is the oldest. */
  private readonly nonces = new Set<string>();

  /**
   * A frame passes whose head the scanner holds: true when it is `CLIENT SETNAME` with verify's
   * name (with or without a run's nonce, which is then remembered), false when it is CLIENT
   * SETNAME with another name (the connection is renamed), undefined for any other frame.
   */
  named(scanner: RequestScanner): boolean | undefined {
    if (!isSetName(scanner)) return undefined;
    const nonce = nonceInName(scanner);
    if (nonce === undefined) return false;
    if (nonce !== '') this.remember(nonce);
    return true;
  }

  /** Whether a connection of the run `nonce` came through this proxy lately. */
  saw(nonce: string): boolean {
    return this.nonces.has(nonce);
  }

  private remember(nonce: string): void {
    this.nonces.delete(nonce);
    this.nonces.add(nonce);
    if (this.nonces.size > REMEMBERED_RUNS) this.nonces.delete(this.nonces.values().next().value as string);
  }
}

/**
 * The logger for lines about a verify connection's blocks: each says it is verify's probe, by
 * a field and in its message, so that no operator takes it for an application's lock.
 */
export function verifyLogger(log: Logger): Logger {
  return log.child({ verify: true }, { msgPrefix: "verify's probe, not an application's lock: " });
}

/**
 * One connection's view of the settings its lock blocks run with: the listener's own, read
 * through (a reload's changes included), except that the counters are Stats.verify while
 * `isVerify()` says the connection is verify's.
 */
export function countedApart<T extends { readonly stats: Stats }>(settings: T, isVerify: () => boolean): T {
  return Object.create(settings, {
    stats: { get: () => (isVerify() ? settings.stats.verify : settings.stats) },
  }) as T;
}

/**
 * Whether one connection is verify's, as its CLIENT SETNAME names it (a later name of another
 * kind ends it): its lock blocks are then counted apart (`counting`) and logged as verify's (`log`).
 */
export class VerifyConnection<T extends { readonly stats: Stats }> {
  private named = false;
  /** The logger for a verify connection's blocks, made when first needed. */
  private verifyLog: Logger | undefined;
  /** The settings the connection's lock blocks are counted with. */
  readonly counting: T;

  constructor(
    settings: T & { readonly verifyRuns: VerifyRuns },
    private readonly base: Logger,
  ) {
    this.counting = countedApart<T>(settings, () => this.named);
    this.runs = settings.verifyRuns;
  }

  private readonly runs: VerifyRuns;

  /** A CLIENT frame passes, its head in `scanner`. */
  client(scanner: RequestScanner): void {
    this.named = this.runs.named(scanner) ?? this.named;
  }

  /** The log for lines about this connection's lock blocks: verify's say so. */
  get log(): Logger {
    if (!this.named) return this.base;
    this.verifyLog ??= verifyLogger(this.base);
    return this.verifyLog;
  }
}
