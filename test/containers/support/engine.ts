/**
 * The container engine the container tests drive: podman or Docker, through
 * its command line (build, run, exec, kube play) and, for testcontainers and
 * Compose, through its Docker API (`DOCKER_HOST`).
 *
 * Whether container tests run is CONTAINER_TESTS's to say:
 * - `auto` (the default): they run when an engine answers, and are skipped,
 *   with the reason, when none does;
 * - `required` (CI): they run, and a missing engine fails them;
 * - `off`: they are skipped.
 */
import { execFile, type ExecFileException, type ExecFileOptionsWithStringEncoding } from 'node:child_process';

export type ContainerTestsMode = 'auto' | 'required' | 'off';

/** CONTAINER_TESTS, checked. */
export function containerTestsMode(): ContainerTestsMode {
  const value = process.env.CONTAINER_TESTS ?? 'auto';
  if (value === 'auto' || value === 'required' || value === 'off') return value;
  throw new Error(`CONTAINER_TESTS=${value}: expected auto, required or off`);
}

export interface Engine {
  /** The command line: `podman` or `docker`. */
  cli: string;
  /** What `<cli> version` says of the engine, e.g. `podman 4.3.1`. */
  description: string;
  /** Whether the engine is podman (kube play, `healthcheck run`, `build --format docker`). */
  podman: boolean;
}

export type EngineProbe = { engine: Engine; reason?: undefined } | { engine?: undefined; reason: string };

/** Generous: a busy shared machine, and an engine that starts its first container. */
const PROBE_TIMEOUT_MS = 60_000;

let probed: Promise<EngineProbe> | undefined;

/**
 * The engine, or why there is none. CONTAINER_ENGINE names the command line;
 * otherwise podman if it is installed, else docker.
 */
export function findEngine(): Promise<EngineProbe> {
  return (probed ??= probe());
}

/** The engine; throws with the reason when there is none. */
export async function engine(): Promise<Engine> {
  const found = await findEngine();
  if (found.engine) return found.engine;
  throw new Error(`no container engine: ${found.reason}`);
}

async function probe(): Promise<EngineProbe> {
  const cli = process.env.CONTAINER_ENGINE || ((await onPath('podman')) ? 'podman' : 'docker');
  if (!(await onPath(cli))) return { reason: `${cli} is not installed (set CONTAINER_ENGINE to the engine's command)` };
  const podman = cli.endsWith('podman');
  const version = await exec(cli, ['version', '--format', '{{.Server.Version}}'], { timeoutMs: PROBE_TIMEOUT_MS }).catch(
    (err: Error) => err,
  );
  if (version instanceof Error) return { reason: `\`${cli} version\` failed: ${oneLine(version.message)}` };
  if (podman) {
    // podman has no daemon to be up: whether it can start a container (its OCI runtime, cgroup
    // manager and default ulimits fit this host) shows only when it starts one. The host's root
    // file system under a throwaway overlay needs no image.
    const started = await exec(cli, ['run', '--rm', '--network', 'none', '--rootfs', '/:O', 'true'], { timeoutMs: PROBE_TIMEOUT_MS }).catch(
      (err: Error) => err,
    );
    if (started instanceof Error) return { reason: `podman cannot start a container: ${oneLine(started.message)}` };
  }
  const api = await dockerApiProbe(podman);
  if (api) return { reason: api };
  return { engine: { cli, podman, description: `${podman ? 'podman' : 'docker'} ${version.stdout.trim()}` } };
}

/**
 * testcontainers and Compose reach the engine through its Docker API. podman
 * serves one only while `podman system service` runs, and testcontainers finds
 * it through DOCKER_HOST; its reaper (Ryuk) is an image from Docker Hub, so it
 * must be off where no registry is reachable.
 */
async function dockerApiProbe(podman: boolean): Promise<string | undefined> {
  const { getContainerRuntimeClient } = await import('testcontainers');
  try {
    await getContainerRuntimeClient();
    return undefined;
  } catch (err) {
    const hint = podman
      ? 'start `podman system service --time=0 unix:///run/podman/podman.sock` and set DOCKER_HOST=unix:///run/podman/podman.sock'
      : 'start Docker, or set DOCKER_HOST';
    return `the engine's Docker API is not reachable (${oneLine((err as Error).message)}): ${hint}`;
  }
}

export interface ExecResult {
  stdout: string;
  stderr: string;
}

export interface ExecOptions {
  /** Default 10 minutes: image builds on a busy machine. */
  timeoutMs?: number;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
}

/** What exec and execStatus give execFile: the default timeout, room for a build's output, and the caller's environment and folder. */
function execFileOptions(opts: ExecOptions): ExecFileOptionsWithStringEncoding {
  return { timeout: opts.timeoutMs ?? 600_000, maxBuffer: 64 * 1024 * 1024, env: opts.env ?? process.env, cwd: opts.cwd };
}

/** Runs a command; rejects with its command line, exit status and standard error when it fails. */
export function exec(command: string, args: string[], opts: ExecOptions = {}): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    execFile(command, args, execFileOptions(opts), (err: ExecFileException | null, stdout, stderr) => {
      if (!err) return resolve({ stdout, stderr });
      const status = err.killed ? `killed (${err.signal ?? 'timeout'})` : `exit ${err.code}`;
      reject(new Error(`\`${[command, ...args].join(' ')}\`: ${status}\n${tail(stderr || stdout)}`, { cause: err }));
    });
  });
}

export interface ExitStatus extends ExecResult {
  /** The exit status; null when a signal ended it. */
  code: number | null;
}

/** Runs a command and resolves with how it ended, whatever that was (it rejects only if it cannot start). */
export function execStatus(command: string, args: string[], opts: ExecOptions = {}): Promise<ExitStatus> {
  return new Promise((resolve, reject) => {
    execFile(command, args, execFileOptions(opts), (err: ExecFileException | null, stdout, stderr) => {
      if (err && typeof err.code !== 'number' && !err.killed) return reject(err);
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr });
    });
  });
}

/** Runs the engine's command line. */
export async function engineExec(args: string[], opts: ExecOptions = {}): Promise<ExecResult> {
  return exec((await engine()).cli, args, opts);
}

/** A message on one line, for the one-line summaries. */
function oneLine(text: string): string {
  return text
    .split('\n')
    .map((line) => line.trim())
    .filter(Boolean)
    .join(' ');
}

/** The end of a long output, for error messages. */
function tail(text: string, lines = 30): string {
  return text.trimEnd().split('\n').slice(-lines).join('\n');
}

async function onPath(command: string): Promise<boolean> {
  return exec('sh', ['-c', `command -v "$1" >/dev/null`, 'sh', command], { timeoutMs: 10_000 }).then(
    () => true,
    () => false,
  );
}
