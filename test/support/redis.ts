/**
 * A real Redis for tests, never a mock: the local `redis-server` binary on a
 * free port in a throwaway directory, or with `REDIS_TEST_IMAGE` set (e.g. a
 * Redis 8 or Valkey image) a container of that image, started through
 * testcontainers on the host's network (server-process.ts); that is how other
 * server versions get tested.
 */
import { HOST, startServerProcess } from './server-process.js';

export interface RedisServer {
  host: string;
  port: number;
  /** `redis://[:password@]host:port` */
  url: string;
  /** Stops the server and cleans up; safe to call twice. */
  stop(): Promise<void>;
  /** Everything the server printed so far. */
  logs(): string;
}

export interface StartRedisOptions {
  /** Extra `redis-server` arguments, e.g. `['--maxmemory', '1mb']`. */
  args?: string[];
  /** Sets `--requirepass`; the readiness check authenticates with it. */
  password?: string;
}

/** Starts a Redis: a container of `REDIS_TEST_IMAGE` if it is set, else the local binary. */
export async function startRedis(opts: StartRedisOptions = {}): Promise<RedisServer> {
  const server = await startServerProcess({
    name: 'redis-server',
    password: opts.password,
    args: (port, dir) => [
      '--port',
      String(port),
      '--bind',
      HOST,
      '--dir',
      dir,
      '--save',
      '',
      '--appendonly',
      'no',
      '--daemonize',
      'no',
      '--protected-mode',
      'no',
      '--loglevel',
      'warning',
      ...passwordArgs(opts.password),
      ...(opts.args ?? []),
    ],
  });
  return {
    host: server.host,
    port: server.port,
    url: redisUrl(server.host, server.port, opts.password),
    stop: server.stop,
    logs: server.logs,
  };
}

function passwordArgs(password: string | undefined): string[] {
  return password !== undefined ? ['--requirepass', password] : [];
}

function redisUrl(host: string, port: number, password: string | undefined): string {
  const auth = password !== undefined ? `:${encodeURIComponent(password)}@` : '';
  return `redis://${auth}${host}:${port}`;
}
