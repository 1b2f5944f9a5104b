/**
 * Runs the built command line (`node dist/cli.js`) as an operator would, and
 * reads its JSON log lines.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';

export const ROOT = path.resolve(import.meta.dirname, '../..');
export const CLI = path.join(ROOT, 'dist', 'cli.js');
/** The package's version, as --version and the start-up line give it. */
export const VERSION = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

/** `npm test` builds dist/ first; a bare `vitest run` may not have. */
export async function ensureBuilt(): Promise<void> {
  if (existsSync(CLI)) return;
  const npx = process.platform === 'win32' ? 'npx.cmd' : 'npx';
  await promisify(execFile)(npx, ['tsc', '-p', 'tsconfig.build.json'], { cwd: ROOT });
}

/**
 * The test process's environment without any REDIS_LOCK_PROXY_* setting, plus `extra`. npm's own
 * variables go too (`npm test` sets them): the proxy then runs as a service starts it, not as if
 * npm had launched it.
 */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    // NOTIFY_SOCKET too: a test run inside a systemd service must not report readiness for it.
    if (!name.startsWith('REDIS_LOCK_PROXY_') && !name.startsWith('npm_') && name !== 'NOTIFY_SOCKET') env[name] = value;
  }
  // The admin server is on by default on one fixed port: parallel CLI processes would fight over it.
  return { ...env, REDIS_LOCK_PROXY_ADMIN_LISTEN: 'off', ...extra };
}

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

export class Cli {
  stdout = '';
  stderr = '';
  readonly exited: Promise<Exit>;
  private readonly child: ChildProcess;
  private wake: (() => void) | undefined;

  /** `executable`: an installed command to run instead of this checkout's `node dist/cli.js`. */
  constructor(args: string[], env: NodeJS.ProcessEnv, executable?: string) {
    this.child =
      executable === undefined
        ? spawn(process.execPath, [CLI, ...args], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] })
        : spawn(executable, args, { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    this.child.stdout?.on('data', (chunk: Buffer) => {
      this.stdout += chunk.toString('utf8');
      this.wake?.();
    });
    this.child.stderr?.on('data', (chunk: Buffer) => {
      this.stderr += chunk.toString('utf8');
      this.wake?.();
    });
    this.exited = new Promise((resolve) => {
      this.child.once('close', (code, signal) => {
        this.wake?.();
        resolve({ code, signal, stdout: this.stdout, stderr: this.stderr });
      });
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** The JSON log lines printed on stdout so far. */
  logLines(): Array<Record<string, unknown>> {
    return jsonLogLines(this.stdout);
  }

  /** Waits for a log line with message `msg`; fails if the process exits or time runs out first. */
  async waitForLog(msg: string, timeoutMs = 10_000): Promise<Record<string, unknown>> {
    const deadline = Date.now() + timeoutMs;
    let exited = false;
    void this.exited.then(() => (exited = true));
    for (;;) {
      const line = this.logLines().find((l) => l.msg === msg);
      if (line) return line;
      if (exited || Date.now() > deadline) {
        throw new Error(`no "${msg}" log line (exited: ${exited}). stdout:\n${this.stdout}\nstderr:\n${this.stderr}`);
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 50);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  }

  kill(signal: NodeJS.Signals): void {
    this.child.kill(signal);
  }

  /** Makes sure the process is gone (for finally blocks). */
  async stop(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
    await this.exited;
  }
}

/** The JSON log lines in a proxy's standard output (pino writes one object a line). */
export function jsonLogLines(stdout: string): Array<Record<string, unknown>> {
  return stdout
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

/** Runs the CLI to completion. */
export async function runCli(args: string[], env: Record<string, string> = {}, timeoutMs = 10_000, executable?: string): Promise<Exit> {
  const cli = new Cli(args, cleanEnv(env), executable);
  const timer = setTimeout(() => cli.kill('SIGKILL'), timeoutMs);
  const exit = await cli.exited;
  clearTimeout(timer);
  return exit;
}
