/**
 * systemd's part in socket activation, played by a small Python process: it holds listening TCP
 * sockets as a socket unit does, and starts the built command line (`node dist/cli.js`) with them
 * as descriptors 3, 4, ... and LISTEN_FDS, LISTEN_PID (the proxy's own) and LISTEN_FDNAMES set,
 * as systemd starts the unit's service. It keeps its copies while proxies stop and start, so a
 * connection made between two of them waits in the accept queue.
 *
 * Why not Node: a Node process that holds a listening socket also accepts on it, and would take
 * the connections meant for the next proxy. Why not systemd-socket-activate: it becomes the
 * service itself, so it cannot start a second one on the same socket.
 *
 * Each proxy's output comes back as JSON lines on the holder's standard output, with its pid
 * and exit status.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { CLI, jsonLogLines, ROOT } from './cli.js';

const HOLDER = String.raw`
import fcntl, json, os, socket, subprocess, sys, threading

names = sys.argv[1:]
sockets = [socket.create_server(('127.0.0.1', 0), backlog=1024) for _ in names]
ports = [s.getsockname()[1] for s in sockets]
# Descriptors 3, 4, ... are where the proxies find them (sd_listen_fds); moved out of the way first.
high = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD, 100) for s in sockets]
for s in sockets:
    s.close()
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i, inheritable=False)
    os.close(fd)
fds = tuple(range(3, 3 + len(names)))

lock = threading.Lock()
def say(**message):
    with lock:
        sys.stdout.write(json.dumps(message) + '\n')
        sys.stdout.flush()

def forward(n, stream, name):
    for line in stream:
        say(n=n, stream=name, text=line.decode('utf-8', 'replace'))

def run(n, argv, env):
    env = dict(env, LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=':'.join(names))
    # sh execs the proxy: LISTEN_PID, its own pid, is the proxy's.
    child = subprocess.Popen(['sh', '-c', 'export LISTEN_PID=$$; exec "$@"', 'sh'] + argv, env=env, pass_fds=fds,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    say(n=n, pid=child.pid)
    readers = [threading.Thread(target=forward, args=(n, child.stdout, 'stdout')),
               threading.Thread(target=forward, args=(n, child.stderr, 'stderr'))]
    for reader in readers:
        reader.start()
    code = child.wait()
    for reader in readers:
        reader.join()
    say(n=n, exit=code)

say(ports=ports)
for line in sys.stdin:
    request = json.loads(line)
    threading.Thread(target=run, args=(request['n'], request['argv'], request['env']), daemon=True).start()
`;

interface HolderMessage {
  ports?: number[];
  n?: number;
  pid?: number;
  stream?: 'stdout' | 'stderr';
  text?: string;
  exit?: number;
}

/** A proxy the socket unit started. */
export class ActivatedProxy {
  stdout = '';
  stderr = '';
  /** The exit status (negative: the signal's number), once it exited. */
  readonly exited: Promise<number>;
  readonly pid: Promise<number>;
  private exitCode: number | undefined;
  private onPid!: (pid: number) => void;
  private onExit!: (code: number) => void;

  constructor() {
    this.pid = new Promise((resolve) => (this.onPid = resolve));
    this.exited = new Promise((resolve) => (this.onExit = resolve));
  }

  /** The JSON log lines printed on stdout so far. */
  logLines(): Array<Record<string, unknown>> {
    return jsonLogLines(this.stdout);
  }

  /** Waits for a log line with message `msg`; fails if the proxy exits or time runs out first. */
  async waitForLog(msg: string, timeoutMs = 30_000): Promise<Record<string, unknown>> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const line = this.logLines().find((l) => l.msg === msg);
      if (line) return line;
      if (this.exitCode !== undefined || Date.now() > deadline) {
        throw new Error(`no "${msg}" log line (exit: ${this.exitCode}). stdout:\n${this.stdout}\nstderr:\n${this.stderr}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  async kill(signal: NodeJS.Signals): Promise<void> {
    if (this.exitCode === undefined) process.kill(await this.pid, signal);
  }

  /** Makes sure the proxy is gone (for finally blocks). */
  async stop(): Promise<void> {
    await this.kill('SIGKILL').catch(() => {});
    await this.exited;
  }

  /** @internal the holder's report about this proxy. */
  hear(message: HolderMessage): void {
    if (message.pid !== undefined) this.onPid(message.pid);
    if (message.stream === 'stdout') this.stdout += message.text;
    if (message.stream === 'stderr') this.stderr += message.text;
    if (message.exit !== undefined) {
      this.exitCode = message.exit;
      this.onExit(message.exit);
    }
  }
}

export class SocketUnit {
  private readonly proxies = new Map<number, ActivatedProxy>();
  private started = 0;

  private constructor(
    private readonly holder: ChildProcess,
    /** The port of each socket, in LISTEN_FDS order. */
    readonly ports: readonly number[],
  ) {}

  /**
   * Opens one listening socket on 127.0.0.1 per name (FileDescriptorName=: "admin" for the admin
   * server's), in that order.
   */
  static async open(names: readonly string[]): Promise<SocketUnit> {
    const holder = spawn('python3', ['-c', HOLDER, ...names], { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] });
    const lines = createInterface({ input: holder.stdout! });
    let unit: SocketUnit | undefined;
    return new Promise((resolve, reject) => {
      holder.once('error', reject);
      holder.once('exit', (code) => reject(new Error(`the socket holder (python3) exited with ${code}`)));
      lines.on('line', (line) => {
        const message = JSON.parse(line) as HolderMessage;
        if (message.ports !== undefined) {
          unit = new SocketUnit(holder, message.ports);
          resolve(unit);
        } else if (message.n !== undefined) {
          unit?.proxies.get(message.n)?.hear(message);
        }
      });
    });
  }

  /** Starts `node dist/cli.js args` on the sockets, as systemd starts the service. */
  start(args: string[], env: NodeJS.ProcessEnv): ActivatedProxy {
    const n = ++this.started;
    const proxy = new ActivatedProxy();
    this.proxies.set(n, proxy);
    this.holder.stdin!.write(`${JSON.stringify({ n, argv: [process.execPath, CLI, ...args], env })}\n`);
    return proxy;
  }

  /** Stops every proxy it started, then closes the sockets. */
  async close(): Promise<void> {
    await Promise.all([...this.proxies.values()].map((proxy) => proxy.stop()));
    const gone = new Promise((resolve) => this.holder.once('exit', resolve));
    this.holder.stdin!.end();
    await gone;
  }
}
