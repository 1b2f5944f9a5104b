/**
 * One redis-server in a container of REDIS_TEST_IMAGE, for server-process.ts:
 * started through testcontainers on the host's network, so that it listens on
 * 127.0.0.1:<port> as a local process does and every address the tests use
 * (replicas, sentinels, cluster nodes announcing themselves) means the same
 * inside and out. The temporary directory is mounted at its own path (the
 * server's working directory, certificates, unix sockets), and the server runs
 * as this process's user, so that what it writes there is ours to remove.
 * Host networking takes an engine on Linux.
 *
 * The image's entrypoint must run `redis-server <args>` (the official images'
 * and the test images' do).
 */
import { spawnSync } from 'node:child_process';
import os from 'node:os';
import type { Readable } from 'node:stream';
import type { StartedTestContainer } from 'testcontainers';

export interface ServerContainer {
  /** Everything it printed so far (the last maxLogChars of it). */
  logs(): string;
  hasExited(): boolean;
  /** Removes it; safe to call twice. */
  stop(): Promise<void>;
  /** Removes it at once and synchronously, with the engine's command line: for a test process on its way out. */
  removeNow(): void;
}

/** Starts `redis-server <args>` from `image`, in `dir`. */
export async function startServerContainer(image: string, args: string[], dir: string, maxLogChars: number): Promise<ServerContainer> {
  const tc = await import('testcontainers');
  await assertEngineReachable(tc, image);
  let output = '';
  let exited = false;
  const tmp = os.tmpdir();
  const container: StartedTestContainer = await new tc.GenericContainer(image)
    .withNetworkMode('host')
    .withBindMounts([{ source: tmp, target: tmp, mode: 'rw' }])
    .withWorkingDir(dir)
    .withUser(`${process.getuid?.() ?? 0}:${process.getgid?.() ?? 0}`)
    .withCommand(['redis-server', ...args])
    // No ports are published, so the default wait is over at once: readiness is server-process.ts's
    // to tell (PING, from the server itself).
    .withLogConsumer((stream: Readable) => {
      stream.on('data', (chunk: Buffer | string) => {
        output = (output + chunk.toString()).slice(-maxLogChars);
      });
      // The log stream ends when the container does.
      stream.on('end', () => (exited = true));
    })
    .start()
    .catch((err: Error) => {
      throw new Error(`redis-server from ${image} did not start: ${err.message}`, { cause: err });
    });
  let stopping: Promise<void> | undefined;
  return {
    logs: () => output,
    hasExited: () => exited,
    stop: () => (stopping ??= container.stop().then(() => undefined)),
    removeNow: () => {
      const cli = process.env.CONTAINER_ENGINE || (spawnSync('sh', ['-c', 'command -v podman']).status === 0 ? 'podman' : 'docker');
      // podman's rm --force would first wait out the stop timeout.
      const now = cli.endsWith('podman') ? ['--time', '0'] : [];
      spawnSync(cli, ['rm', '--force', ...now, container.getId()], { stdio: 'ignore' });
    },
  };
}

async function assertEngineReachable(tc: typeof import('testcontainers'), image: string): Promise<void> {
  try {
    await tc.getContainerRuntimeClient();
  } catch (err) {
    throw new Error(
      `REDIS_TEST_IMAGE=${image} is set, but no Docker (or compatible) engine is reachable: ` +
        `${(err as Error).message}. Start one (DOCKER_HOST names its API), or unset REDIS_TEST_IMAGE to use the local redis-server.`,
      { cause: err },
    );
  }
}
