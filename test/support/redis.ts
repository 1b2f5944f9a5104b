/**
 * A real Redis for tests, never a mock.
 *
 * By default this spawns the local `redis-server` binary on a free port in a
 * throwaway directory (server-process.ts). With `REDIS_TEST_IMAGE` set (e.g. `redis:8`,
 * `valkey/valkey:8`) it runs that image through testcontainers instead, which
 * is how other server versions get tested. testcontainers is imported lazily
 * so the default path never loads it.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { StartedTestContainer } from 'testcontainers';
import { answersPing, HOST, READY_TIMEOUT_MS, startServerProcess } from './server-process.js';

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

/** For the container path; local processes poll in server-process.ts. */
const POLL_INTERVAL_MS = 20;
/** Cap on captured container output, so a chatty --loglevel cannot eat memory. */
const MAX_LOG_CHARS = 1_000_000;

/** Starts a Redis: a container if `REDIS_TEST_IMAGE` is set, else the local binary. */
export async function startRedis(opts: StartRedisOptions = {}): Promise<RedisServer> {
  const image = process.env.REDIS_TEST_IMAGE;
  return image ? startContainer(image, opts) : startLocal(opts);
}

// ---------------------------------------------------------------------------
// Local redis-server
// ---------------------------------------------------------------------------

async function startLocal(opts: StartRedisOptions): Promise<RedisServer> {
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

// ---------------------------------------------------------------------------
// Container (REDIS_TEST_IMAGE)
// ---------------------------------------------------------------------------

async function startContainer(image: string, opts: StartRedisOptions): Promise<RedisServer> {
  const tc = await import('testcontainers');
  await assertDockerReachable(tc, image);

  const userArgs = opts.args ?? [];
  // Docker port mapping makes connections non-local, so protected mode must be
  // off; the official images do that only for some command forms.
  const command = ['redis-server', '--protected-mode', 'no', ...passwordArgs(opts.password), ...userArgs];
  // "Ready to accept connections" is a notice; with a quieter --loglevel only
  // the port can tell readiness.
  const waitStrategy = userArgs.includes('--loglevel') ? tc.Wait.forListeningPorts() : tc.Wait.forLogMessage(/Ready to accept connections/);

  let output = '';
  const container: StartedTestContainer = await new tc.GenericContainer(image)
    .withExposedPorts(6379)
    .withCommand(command)
    .withWaitStrategy(waitStrategy)
    .withLogConsumer((stream) => {
      stream.on('data', (chunk: Buffer | string) => {
        output = (output + chunk.toString()).slice(-MAX_LOG_CHARS);
      });
    })
    .start();

  const host = container.getHost();
  const port = container.getMappedPort(6379);
  let stopping: Promise<void> | undefined;
  const handle: RedisServer = {
    host,
    port,
    url: redisUrl(host, port, opts.password),
    stop: () => (stopping ??= container.stop().then(() => undefined)),
    logs: () => output,
  };
  await waitForContainerPing(handle, opts.password);
  return handle;
}

/** The log line can precede the port mapping being usable from the host; PING is the real test. */
async function waitForContainerPing(server: RedisServer, password: string | undefined): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (await answersPing({ host: server.host, port: server.port, password })) return;
    await sleep(POLL_INTERVAL_MS);
  }
  const logs = server.logs();
  await server.stop();
  throw new Error(`container Redis at ${server.url} did not answer PING. Output:\n${logs}`);
}

async function assertDockerReachable(tc: typeof import('testcontainers'), image: string): Promise<void> {
  try {
    await tc.getContainerRuntimeClient();
  } catch (err) {
    throw new Error(
      `REDIS_TEST_IMAGE=${image} is set, but no Docker (or compatible) engine is reachable: ` +
        `${(err as Error).message}. Start Docker, or unset REDIS_TEST_IMAGE to use the local redis-server.`,
      { cause: err },
    );
  }
}

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

function passwordArgs(password: string | undefined): string[] {
  return password !== undefined ? ['--requirepass', password] : [];
}

function redisUrl(host: string, port: number, password: string | undefined): string {
  const auth = password !== undefined ? `:${encodeURIComponent(password)}@` : '';
  return `redis://${auth}${host}:${port}`;
}
