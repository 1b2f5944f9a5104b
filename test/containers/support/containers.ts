/**
 * Containers and networks for the container tests, run through the engine's
 * command line the way an operator runs them (`podman run ...`), with names
 * of their own so that parallel runs never meet, and removed afterwards.
 */
import { randomBytes } from 'node:crypto';
import { vi } from 'vitest';
import { engine, engineExec, execStatus, type ExitStatus } from './engine.js';

/** A name no other run uses: `rlp-<what>-<random>`. */
export function uniqueName(what: string): string {
  return `rlp-${what}-${randomBytes(4).toString('hex')}`;
}

export interface Mount {
  source: string;
  target: string;
  readOnly?: boolean;
}

export interface RunOptions {
  image: string;
  name?: string;
  network?: string;
  env?: Record<string, string>;
  /** Arguments after the image: the proxy's flags, or a command. */
  args?: string[];
  /** Replaces the image's entrypoint (the first element; the rest go before `args`). */
  entrypoint?: string[];
  /** Container ports published on 127.0.0.1, each on a port the engine picks. */
  publish?: number[];
  /** A read-only root file system, and nothing writable mounted over it (as Kubernetes' readOnlyRootFilesystem). */
  readOnly?: boolean;
  mounts?: Mount[];
  /** A memory limit (`--memory`), e.g. `256m`. */
  memory?: string;
  /** Resource limits (`--ulimit`), e.g. `nofile=20000:20000`. */
  ulimits?: string[];
}

/** Starts a container in the background. */
export async function runContainer(opts: RunOptions): Promise<Container> {
  const { podman } = await engine();
  const name = opts.name ?? uniqueName('container');
  const [entrypoint, ...entrypointArgs] = opts.entrypoint ?? [];
  const args = [
    'run',
    '--detach',
    '--name',
    name,
    ...(opts.network ? ['--network', opts.network] : []),
    ...Object.entries(opts.env ?? {}).flatMap(([key, value]) => ['--env', `${key}=${value}`]),
    ...(opts.publish ?? []).flatMap((port) => ['--publish', `127.0.0.1::${port}`]),
    // podman mounts tmpfs on /tmp, /var/tmp and /run under --read-only unless told not to.
    ...(opts.readOnly ? ['--read-only', ...(podman ? ['--read-only-tmpfs=false'] : [])] : []),
    ...(opts.mounts ?? []).flatMap((m) => ['--volume', `${m.source}:${m.target}${m.readOnly ? ':ro' : ''}`]),
    ...(opts.memory ? ['--memory', opts.memory] : []),
    ...(opts.ulimits ?? []).flatMap((ulimit) => ['--ulimit', ulimit]),
    ...(entrypoint !== undefined ? ['--entrypoint', entrypoint] : []),
    opts.image,
    ...entrypointArgs,
    ...(opts.args ?? []),
  ];
  await engineExec(args, { timeoutMs: 120_000 });
  return new Container(name);
}

export class Container {
  constructor(readonly name: string) {}

  /** The 127.0.0.1 port a published container port is on. */
  async hostPort(containerPort: number): Promise<number> {
    const { stdout } = await engineExec(['port', this.name, `${containerPort}/tcp`]);
    const port = Number(/:(\d+)\s*$/m.exec(stdout)?.[1]);
    if (!port) throw new Error(`${this.name}: port ${containerPort} is not published (${stdout.trim()})`);
    return port;
  }

  /** The container's address on `network`. */
  async address(network: string): Promise<string> {
    const format = `{{(index .NetworkSettings.Networks "${network}").IPAddress}}`;
    return (await this.inspect(format)).trim();
  }

  /** Runs a command in the container; resolves with how it ended. */
  async exec(command: string[], opts: { user?: string } = {}): Promise<ExitStatus> {
    const { cli } = await engine();
    return execStatus(cli, ['exec', ...(opts.user ? ['--user', opts.user] : []), this.name, ...command], { timeoutMs: 120_000 });
  }

  /** `inspect --format`. */
  async inspect(format: string): Promise<string> {
    return (await engineExec(['container', 'inspect', '--format', format, this.name])).stdout;
  }

  /** The most memory its cgroup has held (MiB): memory.peak (cgroup v2) or memory.max_usage_in_bytes (v1). */
  async memoryPeakMiB(): Promise<number> {
    const read = await this.exec([
      'sh',
      '-c',
      'cat /sys/fs/cgroup/memory.peak 2>/dev/null || cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes',
    ]);
    const bytes = Number(read.stdout.trim());
    if (read.code !== 0 || !Number.isFinite(bytes)) throw new Error(`${this.name}: no memory peak (${read.stdout}${read.stderr})`);
    return bytes / (1024 * 1024);
  }

  /** Everything the container wrote, standard error included. */
  async logs(): Promise<string> {
    const { stdout, stderr } = await engineExec(['logs', this.name]);
    return stdout + stderr;
  }

  /** Polls the logs until one line matches; returns the lines so far. */
  async waitForLog(pattern: RegExp, timeoutMs = 60_000): Promise<string> {
    return vi.waitFor(
      async () => {
        const logs = await this.logs();
        if (!pattern.test(logs)) throw new Error(`${this.name}: no log line matches ${pattern} yet. Logs:\n${logs.slice(-3000)}`);
        return logs;
      },
      { timeout: timeoutMs, interval: 200 },
    );
  }

  /** Sends a signal to the container's main process. */
  async kill(signal: string): Promise<void> {
    await engineExec(['kill', '--signal', signal, this.name]);
  }

  /**
   * `stop`: the image's stop signal, then SIGKILL after `timeoutSeconds` (the
   * engine's default, 10 s, unless given). Resolves with the exit code and how
   * long the stop took.
   */
  async stop(timeoutSeconds?: number): Promise<{ exitCode: number; ms: number }> {
    const started = Date.now();
    await engineExec(['stop', ...(timeoutSeconds === undefined ? [] : ['--time', String(timeoutSeconds)]), this.name], {
      timeoutMs: 120_000,
    });
    const ms = Date.now() - started;
    return { exitCode: Number((await this.inspect('{{.State.ExitCode}}')).trim()), ms };
  }

  /**
   * Runs the image's HEALTHCHECK once, now: podman schedules health checks
   * through systemd timers, which a machine without systemd lacks, and runs one
   * on demand; Docker's daemon runs them on its schedule, so there the check's
   * command is run the way the daemon runs it.
   */
  async healthcheck(): Promise<boolean> {
    const { cli, podman } = await engine();
    if (podman) return (await execStatus(cli, ['healthcheck', 'run', this.name], { timeoutMs: 120_000 })).code === 0;
    const test = JSON.parse(await this.inspect('{{json .Config.Healthcheck.Test}}')) as string[];
    const command = test[0] === 'CMD-SHELL' ? ['sh', '-c', test[1]] : test.slice(1);
    return (await this.exec(command)).code === 0;
  }

  /** Removes the container, running or not; never fails. */
  async remove(): Promise<void> {
    const { podman } = await engine();
    // podman's rm --force stops a running container first, with its stop timeout.
    await engineExec(['rm', '--force', ...(podman ? ['--time', '0'] : []), this.name]).catch(() => undefined);
  }
}

/** A network of its own, on which containers find each other by name. */
export async function createNetwork(): Promise<{ name: string; remove(): Promise<void> }> {
  const name = uniqueName('net');
  await engineExec(['network', 'create', name]);
  return {
    name,
    remove: () =>
      engineExec(['network', 'rm', '--force', name]).then(
        () => undefined,
        () => undefined,
      ),
  };
}

/** GET from outside the container: status and body. */
export async function httpGet(url: string): Promise<{ status: number; body: string }> {
  const response = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  return { status: response.status, body: await response.text() };
}
