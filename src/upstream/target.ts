/**
 * Where the proxy connects for each client connection, parsed from a Redis
 * URL as redis-rs and ioredis write them:
 *
 *   redis://[[user]:password@]host[:port][/db]
 *   rediss://...          the same over TLS
 *   unix:///path/to/redis.sock[?db=N&user=U&password=P]
 *
 * Credentials and a database in the URL are applied by the proxy on every
 * upstream connection before any client byte is forwarded, so that clients
 * that send no AUTH or SELECT of their own get the connection the operator
 * configured.
 */
import { ConfigError } from '../errors.js';
import { encodeCommand } from '../resp/encode.js';

export interface UpstreamTarget {
  /** The URL with its password masked, for logs and error replies. */
  readonly display: string;
  readonly host?: string;
  readonly port?: number;
  readonly path?: string;
  readonly username?: string;
  readonly password?: string;
  readonly db: number;
  /** rediss://: connect with TLS. */
  readonly tls: boolean;
}

const DEFAULT_PORT = 6379;

function parseDb(text: string, url: string): number {
  if (!/^\d{1,9}$/.test(text)) throw new ConfigError(`upstream URL ${url}: database must be a non-negative integer, got "${text}"`);
  return Number(text);
}

function masked(url: URL): string {
  const copy = new URL(url.href);
  if (copy.password) copy.password = '***';
  if (copy.searchParams.has('password')) copy.searchParams.set('password', '***');
  return copy.href.replace('password=%2A%2A%2A', 'password=***');
}

/** Masks what looks like a password in a URL that could not be parsed, for error messages. */
function maskedText(text: string): string {
  return text.replace(/(\/\/[^:@/]*:)[^@/]*@/, '$1***@').replace(/(password=)[^&]*/, '$1***');
}

function decode(part: string, what: string, display: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    // No cause kept, here and below: the original error repeats the text, password included.
    throw new ConfigError(`upstream URL ${display}: the ${what} is not validly percent-encoded (write % as %25)`);
  }
}

export function parseUpstreamUrl(text: string): UpstreamTarget {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new ConfigError(`upstream URL "${maskedText(text)}" is not a valid URL (expected redis://host:port or unix:///path)`);
  }
  const display = masked(url);
  const username = url.username ? decode(url.username, 'user name', display) : undefined;
  const password = url.password ? decode(url.password, 'password', display) : undefined;
  switch (url.protocol) {
    case 'redis:':
    case 'rediss:': {
      if (!url.hostname) throw new ConfigError(`upstream URL ${display}: missing host`);
      const host = url.hostname.replace(/^\[(.*)\]$/, '$1'); // IPv6 literals come bracketed
      const port = url.port ? Number(url.port) : DEFAULT_PORT;
      const dbText = url.pathname.replace(/^\//, '');
      const db = dbText === '' ? 0 : parseDb(dbText, display);
      if (username !== undefined && password === undefined) {
        throw new ConfigError(`upstream URL ${display}: a user name needs a password (redis://user:password@host)`);
      }
      return { display, host, port, username, password, db, tls: url.protocol === 'rediss:' };
    }
    case 'unix:':
    case 'redis+unix:': {
      if (!url.pathname) throw new ConfigError(`upstream URL ${display}: missing socket path`);
      const db = url.searchParams.has('db') ? parseDb(url.searchParams.get('db') ?? '', display) : 0;
      const socketUser = url.searchParams.get('user') ?? username;
      const socketPassword = url.searchParams.get('password') ?? password;
      if (socketUser !== undefined && socketPassword === undefined) {
        throw new ConfigError(`upstream URL ${display}: a user name needs a password (?user=U&password=P)`);
      }
      return {
        display,
        path: decode(url.pathname, 'socket path', display),
        username: socketUser,
        password: socketPassword,
        db,
        tls: false,
      };
    }
    default:
      throw new ConfigError(`upstream URL ${display}: unsupported scheme "${url.protocol}" (use redis://, rediss:// or unix://)`);
  }
}

/** Commands the proxy sends on each new upstream connection (AUTH, SELECT), one reply each. */
export function setupCommands(target: UpstreamTarget): Buffer[] {
  const commands: Buffer[] = [];
  if (target.password !== undefined) {
    commands.push(
      target.username !== undefined ? encodeCommand('AUTH', target.username, target.password) : encodeCommand('AUTH', target.password),
    );
  }
  if (target.db !== 0) commands.push(encodeCommand('SELECT', String(target.db)));
  return commands;
}
