#!/usr/bin/env node
/**
 * Entry point.
 *
 *   redis-lock-proxy [options]            run the proxy
 *   redis-lock-proxy check [options]      check what a start would use, without starting
 *   redis-lock-proxy verify --via ADDR    prove the fix through a running proxy
 *   redis-lock-proxy locks --upstream URL list (and release) lock keys
 *
 * Signals: SIGTERM/SIGINT shut down gracefully (a second one exits at once),
 * SIGHUP reloads the configuration and the rules.
 */
// First: how the heap grows is set before anything else is loaded (heap-growth.ts).
import './heap-growth.js';
import { packageVersion, startApp, type App } from './app.js';
import { rereadConfig, resolveConfig, type Config } from './config.js';
import { ConfigError, ConfigProblems } from './errors.js';
import { takeInheritedSockets } from './listen-fds.js';
import { createLogger, exitAfterLog, type Logger } from './log.js';
import type { Io } from './ops/command.js';
import { serviceNotifier } from './service-notify.js';
import { USAGE } from './settings.js';
import { announceReadiness } from './startup-readiness.js';

async function run(config: Config, argv: string[]): Promise<void> {
  const log = createLogger(config.logLevel, config.logTime);
  // Socket activation: the listeners systemd passed, if any (the variables are removed either way).
  const app = await startApp(config, log, takeInheritedSockets(process.env, process.pid));
  const notifier = await serviceNotifier(process.env, log);
  let stopReadiness = (): void => {};
  // Every signal handler is in place before the proxy says it is listening: a supervisor may
  // send SIGHUP or SIGTERM the moment it reads that line.
  // SIGHUP reads the configuration again (the same flags and environment, the config file as it is now).
  process.on('SIGHUP', () => app.reload('SIGHUP', () => rereadConfig(argv, process.env)));
  const shutdown = handleShutdownSignals(
    () => app.config.shutdownTimeoutMs,
    log,
    app,
    () => {
      stopReadiness();
      notifier?.send('STOPPING=1');
    },
  );
  stopWithLauncher(log, shutdown);
  log.info(app.describe(), 'redis-lock-proxy listening');
  stopReadiness = announceReadiness(app, log, notifier);
}

/** How long the last log lines may take to go out when the process ends (a reader that is gone: not at all). */
const LOG_GRACE_MS = 1000;
/** After a second signal, the last line's grace: the process ends at once. */
const SECOND_SIGNAL_LOG_GRACE_MS = 100;
/** What closing the admin server, Sentinel and the lock scan may take after the connections are closed. */
const SHUTDOWN_REST_MS = 1000;

/**
 * Installs the SIGTERM/SIGINT handlers; returns the shutdown they start, for other triggers. The
 * process ends within the shutdown timeout (plus a second for the rest and one for the log)
 * whatever happens: a connection that never finishes is closed at the timeout, and a log reader
 * that is gone or stalls never holds the exit. A second signal ends the process at once.
 */
function handleShutdownSignals(timeoutMs: () => number, log: Logger, app: App, onStopping: () => void): (signal: string) => void {
  let stopping = false;
  const onSignal = (signal: string): void => {
    if (stopping) {
      log.warn({ signal }, 'second signal: exiting now');
      exitAfterLog(1, SECOND_SIGNAL_LOG_GRACE_MS);
      return;
    }
    stopping = true;
    onStopping();
    const timeout = timeoutMs();
    log.info({ signal, connections: app.sessionCount, timeoutMs: timeout }, 'shutting down: finishing in-flight requests');
    const deadline = setTimeout(() => {
      log.error({ timeoutMs: timeout }, 'shutdown did not finish in time; exiting now');
      exitAfterLog(1, LOG_GRACE_MS);
    }, timeout + SHUTDOWN_REST_MS);
    void app.shutdown(timeout).then(({ open, cutAtDeadline }) => {
      clearTimeout(deadline);
      // The summary: how many connections finished what they had in flight, how many were cut.
      log[cutAtDeadline > 0 ? 'warn' : 'info'](
        { connections: open, finished: open - cutAtDeadline, cutAtDeadline, timeoutMs: timeout },
        'shut down',
      );
      exitAfterLog(0, LOG_GRACE_MS);
    });
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));
  return onSignal;
}

/** How often the parent process is looked for, when the proxy was started by npm. */
const LAUNCHER_CHECK_MS = 1000;

/**
 * `npx redis-lock-proxy` (npm exec) runs the proxy as a child of npm, and a SIGTERM sent to npm
 * does not reach it: npm exits and the proxy would go on, orphaned, holding its ports. So when
 * npm started it, the proxy shuts down as on SIGTERM once its parent is gone. Services should
 * start `node dist/cli.js` (or the installed command) directly, so that its PID is the proxy's.
 */
function stopWithLauncher(log: Logger, shutdown: (signal: string) => void): void {
  if (process.env.npm_command === undefined) return;
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    log.warn({ launcher: `npm ${process.env.npm_command}`, parent }, 'the npm process that started the proxy is gone; shutting down');
    shutdown('launcher exit');
  }, LAUNCHER_CHECK_MS);
  timer.unref();
}

/** The operator commands, each in a module of its own, loaded only when used. */
const SUBCOMMANDS = {
  check: () => import('./ops/check.js'),
  verify: () => import('./ops/verify.js'),
  locks: () => import('./ops/locks.js'),
} as const;
type Subcommand = keyof typeof SUBCOMMANDS;

function isSubcommand(name: string | undefined): name is Subcommand {
  return name !== undefined && Object.hasOwn(SUBCOMMANDS, name);
}

async function runSubcommand(name: Subcommand, argv: string[]): Promise<number> {
  const io: Io = {
    stdout: (t) => process.stdout.write(t),
    stderr: (t) => process.stderr.write(t),
    env: process.env,
    stderrIsTerminal: process.stderr.isTTY,
    confirm: process.stdin.isTTY && process.stderr.isTTY ? askOnTerminal : undefined,
  };
  const module = await SUBCOMMANDS[name]();
  return module.run(argv, io);
}

/** A yes/no question on the terminal (standard error, so that standard output stays the command's); only `y` or `yes` is a yes. */
async function askOnTerminal(question: string): Promise<boolean> {
  const { createInterface } = await import('node:readline/promises');
  const terminal = createInterface({ input: process.stdin, output: process.stderr });
  try {
    return /^y(es)?$/i.test((await terminal.question(question)).trim());
  } finally {
    terminal.close();
  }
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  try {
    if (isSubcommand(argv[0])) {
      process.exitCode = await runSubcommand(argv[0], argv.slice(1));
      return;
    }
    if (argv[0] !== undefined && !argv[0].startsWith('-')) {
      throw new ConfigError(
        `unknown command "${argv[0]}": the commands are check (check a configuration without starting), verify (prove ` +
          'the fix through a running proxy) and locks (list and release lock keys); without a command it runs the proxy (see --help)',
      );
    }
    const request = resolveConfig(argv, process.env);
    switch (request.kind) {
      case 'help':
        process.stdout.write(USAGE);
        return;
      case 'version':
        process.stdout.write(`${packageVersion()}\n`);
        return;
      case 'print-config':
        process.stdout.write(request.text);
        return;
      case 'run':
        await run(request.config, argv);
        return;
    }
  } catch (err) {
    const error = err as NodeJS.ErrnoException;
    // Several wrong settings: one line each.
    for (const problem of err instanceof ConfigProblems ? err.problems : [error])
      process.stderr.write(`redis-lock-proxy: ${problem.message}\n`);
    // Exit now: a listener or sentinel connection opened before the failure would keep the process alive.
    exitAfterLog(error.code === 'ECONFIG' || error.code === 'ERULEFILE' ? 2 : 1, LOG_GRACE_MS);
  }
}

void main();
