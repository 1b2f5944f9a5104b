/**
 * What the operator commands (`verify`, `locks`) share: the I/O they get from the CLI, the
 * parsing of their options, and the wording of their errors.
 */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { UsageError } from '../errors.js';
import { isReplyError } from '../upstream/redis-client.js';

/** What a subcommand gets from the CLI dispatcher. */
export interface Io {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
  /** Standard error is a terminal: progress lines may go there. */
  stderrIsTerminal?: boolean;
  /**
   * Asks the person at the terminal a yes/no question (default no); present only when standard
   * input and standard error are a terminal, so that a script never waits for an answer.
   */
  confirm?: (question: string) => Promise<boolean>;
}

/** Bad options or rule files: says why, as `redis-lock-proxy <command>: ...`, and gives exit code 2. */
export function usageFailed(io: Io, command: 'verify' | 'locks', error: unknown): number {
  io.stderr(`redis-lock-proxy ${command}: ${(error as Error).message}\n`);
  return 2;
}

/** A subcommand's flags, as util.parseArgs takes them. */
export type FlagTable = NonNullable<ParseArgsConfig['options']>;

/** parseArgs, with its complaints as UsageErrors that point to --help. */
export function parseCommandLine<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (error) {
    throw new UsageError(`${(error as Error).message} (see --help)`, { cause: error });
  }
}

/** A count or a time in ms given as an option: an integer from `min` to `max` (default 1 to 9999999); `why` follows the range in the error. */
export function integerOption(option: string, text: string, min = 1, max = 9_999_999, why = ''): number {
  if (!/^\d{1,10}$/.test(text) || Number(text) < min || Number(text) > max) {
    throw new UsageError(`${option} must be an integer from ${min} to ${max}${why}, got "${text}"`);
  }
  return Number(text);
}

/** An environment variable's value; an empty one counts as not set. */
export function nonEmpty(text: string | undefined): string | undefined {
  return text === undefined || text === '' ? undefined : text;
}

export function describeError(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0) {
    return error.errors.map((e) => describeError(e)).join('; ');
  }
  if (error instanceof Error) return error.message;
  return String(error);
}

/**
 * The connection's own error, when it says better than the failed command why the command
 * failed: a dropped connection fails commands with "Stream isn't writeable" (the cause, say a
 * protocol error from something that is not Redis, is in the client's error event), and a
 * refused AUTH (WRONGPASS) comes as an error event while the commands then say only NOAUTH.
 * Undefined when the command's error is the one to report.
 */
export function connectionFault(commandError: unknown, lastError: Error | undefined): Error | undefined {
  if (lastError === undefined) return undefined;
  return !isReplyError(commandError) || isReplyError(lastError) ? lastError : undefined;
}

/** ioredis's words for a reply that is not RESP: `Protocol error, got "H" as reply type byte. Please report this.` */
const NOT_RESP = /^Protocol error, got "(.*)" as reply type byte/;

/** Whether a connection's error leaves the server's RESP in doubt (false: what answered is not Redis). */
export function speaksResp(message: string): boolean {
  return !NOT_RESP.test(message);
}

/** A connection's error, said plainly when what answered at `where` does not speak RESP (an HTTP port, say). */
export function notRespHint(message: string, where: string): string {
  const match = NOT_RESP.exec(message);
  if (match === null) return message;
  return `${where} does not speak RESP (it answered ${JSON.stringify(match[1])}...): give the address of Redis or of redis-lock-proxy`;
}
