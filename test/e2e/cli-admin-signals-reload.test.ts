/**
 * The built command line while it runs: the admin endpoints scraped over
 * HTTP, signals (SIGHUP the moment it listens, SIGTERM through npx, SIGTERM
 * with a busy connection, SIGTERM with standard output a closed pipe), and rule reloads on SIGHUP and when a watched
 * file changes. (Starting it, settings and config file: cli-startup.test.ts.)
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs, { writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { METRICS_MAX_AGE_MS } from '../../src/admin/server.js';
import type { Readable } from 'node:stream';
import { Cli, CLI, cleanEnv, ensureBuilt, ROOT, runCli } from '../support/cli.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { freePort } from '../support/ports.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';

let redis: RedisServer;
let tmp: string;

beforeAll(async () => {
  await ensureBuilt();
  redis = await startRedis();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-cliops-'));
}, 120_000);

afterAll(async () => {
  await redis?.stop();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

const RULES = 'rules:\n  - name: ops-lock\n    prefix: "lock:"\n';

function writeTmp(name: string, text: string): string {
  const file = path.join(tmp, name);
  fs.writeFileSync(file, text);
  return file;
}

async function attempt(port: number, key: string): Promise<string> {
  const client = await RawClient.connect(port);
  try {
    client.write(lockAttempt(key, 60));
    return (await client.readReplies(4)).toString('latin1');
  } finally {
    await client.close();
  }
}

/**
 * Lowers a lock's lease to 5 s in Redis itself, so that an attempt that re-armed it would show;
 * returns the PTTL the key has after `attempt` ran.
 */
async function pttlAfter(key: Buffer | string, attempt: () => Promise<void>): Promise<number> {
  expect(await exchange(redis.port, cmd('PEXPIRE', key, '5000'), 1)).toBe(':1\r\n');
  await attempt();
  return Number(/^:(-?\d+)\r\n$/.exec(await exchange(redis.port, cmd('PTTL', key), 1))?.[1]);
}

/** An attempt through `port` left the lease it found (lowered to 5 s by pttlAfter). */
async function expectLeaseKept(key: Buffer | string, attempt: () => Promise<void>): Promise<void> {
  const pttl = await pttlAfter(key, attempt);
  expect(pttl).toBeGreaterThan(0);
  expect(pttl).toBeLessThanOrEqual(5000);
}

function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function startCli(extra: string[], env: Record<string, string> = {}): Promise<{ cli: Cli; port: number; adminPort: number }> {
  const port = await freePort();
  const adminPort = await freePort();
  const cli = new Cli(
    ['--listen', `127.0.0.1:${port}`, '--upstream', redis.url, '--admin-listen', `127.0.0.1:${adminPort}`, ...extra],
    cleanEnv(env),
  );
  await cli.waitForLog('redis-lock-proxy listening');
  return { cli, port, adminPort };
}

describe('admin endpoints', () => {
  it('serves metrics, liveness and readiness', async () => {
    const rules = writeTmp('admin.yaml', RULES);
    const { cli, port, adminPort } = await startCli(['--rules', rules]);
    try {
      const base = `http://127.0.0.1:${adminPort}`;
      expect(await attempt(port, 'lock:admin')).toBe(attemptReplies(1, 1));
      // Redis's own answer; the lease stays.
      await expectLeaseKept('lock:admin', async () => {
        expect(await attempt(port, 'lock:admin')).toBe(attemptReplies(2, 1));
      });

      const metrics = await (await fetch(`${base}/metrics`)).text();
      expect(metrics).toContain('redis_lock_proxy_blocks_total{rule="ops-lock",outcome="rewritten"} 2');
      expect(metrics).toContain('redis_lock_proxy_blocks_total{rule="ops-lock",outcome="seen"} 2');
      expect(metrics).toMatch(/redis_lock_proxy_connections_total 2\b/);
      expect(metrics).toMatch(/redis_lock_proxy_upstream_connect_seconds_count 2\b/);
      expect(metrics).toMatch(/redis_lock_proxy_client_bytes_received_total [1-9]\d*/);
      expect(metrics).toContain('redis_lock_proxy_process_resident_memory_bytes');

      const health = await fetch(`${base}/healthz`);
      expect(health.status).toBe(200);
      const ready = await fetch(`${base}/readyz`);
      expect(ready.status).toBe(200);
      expect(await ready.text()).toMatch(/^ready: upstream 127\.0\.0\.1:\d+ answers PING/);
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });

  it('refuses to start when the admin port is taken, naming the setting', async () => {
    const adminPort = await freePort();
    const blocker = net.createServer().listen(adminPort, '127.0.0.1');
    await new Promise((r) => blocker.once('listening', r));
    try {
      const exit = await runCli(['--listen', '127.0.0.1:0', '--upstream', redis.url, '--admin-listen', `127.0.0.1:${adminPort}`]);
      expect(exit.code).toBe(1);
      expect(exit.stderr).toContain(`admin-listen 127.0.0.1:${adminPort}: listen EADDRINUSE`);
    } finally {
      blocker.close();
    }
  });

  it('is not ready while the upstream is down', async () => {
    const down = await freePort();
    const port = await freePort();
    const adminPort = await freePort();
    const cli = new Cli(
      ['--listen', `127.0.0.1:${port}`, '--upstream', `redis://127.0.0.1:${down}`, '--admin-listen', `127.0.0.1:${adminPort}`],
      cleanEnv(),
    );
    try {
      await cli.waitForLog('redis-lock-proxy listening');
      const ready = await fetch(`http://127.0.0.1:${adminPort}/readyz`);
      expect(ready.status).toBe(503);
      expect(await ready.text()).toMatch(/^not ready: upstream 127\.0\.0\.1:\d+ unreachable: .*ECONNREFUSED/);
      expect((await fetch(`http://127.0.0.1:${adminPort}/healthz`)).status).toBe(200);
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });
});

describe('signals', () => {
  it('handles SIGHUP sent the moment the listening line is out (every handler is installed first)', async () => {
    const rules = writeTmp('race.yaml', RULES);
    const TRIES = 16;
    const outcomes = await Promise.all(
      Array.from({ length: TRIES }, async () => {
        const cli = new Cli(
          ['--listen', `127.0.0.1:${await freePort()}`, '--upstream', redis.url, '--admin-listen', 'off', '--rules', rules],
          cleanEnv(),
        );
        try {
          await cli.waitForLog('redis-lock-proxy listening');
          cli.kill('SIGHUP');
          await cli.waitForLog('rules reloaded');
          cli.kill('SIGTERM');
          return (await cli.exited).code;
        } catch (error) {
          return `${(error as Error).message.slice(0, 200)}; exit ${JSON.stringify(await Promise.race([cli.exited, Promise.resolve(null)]))}`;
        } finally {
          await cli.stop();
        }
      }),
    );
    expect(outcomes).toEqual(Array(TRIES).fill(0));
  }, 60_000);

  it('started with npx, stops when npx is sent SIGTERM instead of staying behind with its ports', async () => {
    const port = await freePort();
    const npx = new Cli(
      ['redis-lock-proxy', '--listen', `127.0.0.1:${port}`, '--upstream', redis.url, '--admin-listen', 'off'],
      // npx installs this checkout as a linked package the first time, and that runs its `prepare`
      // (npm run build): dist/ would be rewritten under the other test files' running proxies.
      cleanEnv({ npm_config_ignore_scripts: 'true' }),
      'npx',
    );
    let proxyPid: number | undefined;
    try {
      proxyPid = (await npx.waitForLog('redis-lock-proxy listening', 30_000)).pid as number;
      expect(proxyPid).not.toBe(npx.pid); // npx runs the proxy as a child of its own
      npx.kill('SIGTERM');
      const running = proxyPid;
      await expect.poll(() => isRunning(running), { timeout: 10_000, interval: 100 }).toBe(false);
      await expect(RawClient.connect(port)).rejects.toThrow(/ECONNREFUSED/);
    } finally {
      await npx.stop();
      if (proxyPid !== undefined && isRunning(proxyPid)) process.kill(proxyPid, 'SIGKILL');
    }
  }, 60_000);

  it('says in its last line how many connections finished and how many were cut at --shutdown-timeout-ms', async () => {
    const { cli, port } = await startCli(['--shutdown-timeout-ms', '500']);
    const blocked = await RawClient.connect(port);
    const idle = await RawClient.connect(port);
    try {
      blocked.write(cmd('BLPOP', 'signals:cut', '0'));
      idle.write(cmd('PING'));
      expect((await idle.readReplies(1)).toString()).toBe('+PONG\r\n');
      const admin = await RawClient.connect(redis.port);
      await expect.poll(async () => /^blocked_clients:(\d+)/m.exec(await admin.call('INFO', 'clients'))?.[1]).toBe('1');
      await admin.close();
      cli.kill('SIGTERM');
      expect((await cli.exited).code).toBe(0);
      expect(cli.logLines().at(-1)).toMatchObject({
        msg: 'shut down',
        level: 40,
        connections: 2,
        finished: 1,
        cutAtDeadline: 1,
        timeoutMs: 500,
      });
      await blocked.readUntilClosed(2000);

      // Nothing in flight: nothing cut, and an info line.
      const quiet = await startCli([]);
      quiet.cli.kill('SIGTERM');
      expect((await quiet.cli.exited).code).toBe(0);
      expect(quiet.cli.logLines().at(-1)).toMatchObject({ msg: 'shut down', level: 30, connections: 0, finished: 0, cutAtDeadline: 0 });
    } finally {
      blocked.destroy();
      idle.destroy();
      await cli.stop();
    }
  });

  it('waits for a busy connection on SIGTERM, and exits at once on a second signal', async () => {
    const { cli, port } = await startCli(['--shutdown-timeout-ms', '30000']);
    try {
      const blocked = await RawClient.connect(port);
      blocked.write(cmd('BLPOP', 'signals:never', '0'));
      await new Promise((r) => setTimeout(r, 100));
      cli.kill('SIGTERM');
      await cli.waitForLog('shutting down: finishing in-flight requests');
      await new Promise((r) => setTimeout(r, 200));
      expect(blocked.isClosed).toBe(false); // still waiting for its reply
      cli.kill('SIGTERM');
      const exit = await cli.exited;
      expect(exit.code).toBe(1);
      expect(cli.logLines().some((l) => l.msg === 'second signal: exiting now')).toBe(true);
      await blocked.readUntilClosed(2000);
    } finally {
      await cli.stop();
    }
  });
});

describe('configuration reload on SIGHUP: the rollout steps as docs/rollout.md writes them', () => {
  /** Waits for a log line `msg` after the first `seen` of them; returns it. */
  async function nextLog(cli: Cli, msg: string, seen: number): Promise<Record<string, unknown>> {
    const of = () => cli.logLines().filter((l) => l.msg === msg);
    await expect.poll(() => of().length, { timeout: 10_000, message: `a new "${msg}" line` }).toBeGreaterThan(seen);
    return of()[seen];
  }
  const count = (cli: Cli, msg: string) => cli.logLines().filter((l) => l.msg === msg).length;
  /** A series as scraped once everything so far is in: /metrics is rendered at most once per METRICS_MAX_AGE_MS. */
  const metric = async (adminPort: number, series: string) => {
    await new Promise((resolve) => setTimeout(resolve, METRICS_MAX_AGE_MS + 50));
    const text = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith(`${series} `));
    return line === undefined ? 0 : Number(line.slice(series.length + 1));
  };

  it('observe, watch, set mode: enforce in the config file and send SIGHUP, verify; the log shows the mode in force', async () => {
    const port = await freePort();
    const adminPort = await freePort();
    const settings = (mode: string, listen = `127.0.0.1:${port}`) =>
      `listen: ${listen}\nupstream: ${redis.url}\nadmin-listen: 127.0.0.1:${adminPort}\nmode: ${mode}\nstalwart: 0.16.3\n`;
    const config = writeTmp('rollout.yaml', settings('observe'));
    const cli = new Cli(['--config', config], cleanEnv({ REDIS_LOCK_PROXY_ADMIN_LISTEN: '' }));
    const seen = '{rule="stalwart-task-lock",outcome="seen"}';
    try {
      // 1. Deployed in observe mode.
      const listening = await cli.waitForLog('redis-lock-proxy listening');
      expect(listening).toMatchObject({ mode: 'observe', rules: ['stalwart-task-lock (observe)', 'stalwart-queue-lock (observe)'] });
      // 2. Watch: forwarded unchanged (a loser re-arms), logged, counted as observed; ready.
      const observedKey = taskLockKey(1n);
      const observed = lockAttempt(observedKey, 60);
      expect(await exchange(port, observed, 4)).toBe(attemptReplies(1, 1));
      const rearmed = await pttlAfter(observedKey, async () => {
        expect(await exchange(port, observed, 4)).toBe(attemptReplies(2, 1));
      });
      expect(rearmed).toBeGreaterThan(5000);
      await cli.waitForLog('observe: lock block would be rewritten');
      expect(await metric(adminPort, `redis_lock_proxy_blocks_total{rule="stalwart-task-lock",outcome="observed"}`)).toBe(2);
      expect((await fetch(`http://127.0.0.1:${adminPort}/readyz`)).status).toBe(200);
      // A reload that changes nothing says the mode in force.
      cli.kill('SIGHUP');
      expect(await nextLog(cli, 'rules reloaded', 0)).toMatchObject({
        mode: 'observe',
        rules: ['stalwart-task-lock (observe)', 'stalwart-queue-lock (observe)'],
      });

      // 3. Enforce: mode: enforce in the config file, and SIGHUP.
      writeFileSync(config, settings('enforce'));
      cli.kill('SIGHUP');
      expect(await nextLog(cli, 'rules reloaded', 1)).toMatchObject({
        mode: 'enforce',
        rules: ['stalwart-task-lock (enforce)', 'stalwart-queue-lock (enforce)'],
      });
      expect(await nextLog(cli, 'settings reloaded', 0)).toMatchObject({ settings: { mode: 'enforce' } });
      const enforcedKey = taskLockKey(2n);
      const enforced = lockAttempt(enforcedKey, 60);
      expect(await exchange(port, enforced, 4)).toBe(attemptReplies(1, 1));
      await expectLeaseKept(enforcedKey, async () => {
        expect(await exchange(port, enforced, 4)).toBe(attemptReplies(2, 1));
      });
      expect(await metric(adminPort, `redis_lock_proxy_blocks_total{rule="stalwart-task-lock",outcome="rewritten"}`)).toBe(2);
      expect(await metric(adminPort, `redis_lock_proxy_blocks_total${seen}`)).toBe(4);

      // 4. Verify through the address Stalwart uses.
      const verified = await runCli(['verify', '--via', `127.0.0.1:${port}`, '--stalwart', '0.16.3']);
      expect(verified.stdout).toMatch(/^verify: OK: 2 rule\(s\) enforce the fix/);

      // A setting that needs a restart is named, and the running value stays.
      writeFileSync(config, settings('enforce', `127.0.0.1:${await freePort()}`));
      cli.kill('SIGHUP');
      expect(await nextLog(cli, 'settings changed that apply only when the proxy is restarted; the running values stay', 0)).toMatchObject({
        level: 40,
        settings: ['listen'],
      });
      expect(await exchange(port, cmd('PING'), 1)).toBe('+PONG\r\n');

      // A configuration that does not read keeps everything in force, naming the file and the key.
      writeFileSync(config, settings('enforce') + 'hold-ms: ten\n');
      const refusedBefore = count(cli, 'configuration reload refused; the settings and rules in force stay');
      cli.kill('SIGHUP');
      const refused = await nextLog(cli, 'configuration reload refused; the settings and rules in force stay', refusedBefore);
      expect(refused.err).toBe(`config file ${config}, line 6, setting "hold-ms": hold-ms must be an integer from 1 to 60000, got "ten"`);
      const stillKey = taskLockKey(3n);
      const still = lockAttempt(stillKey, 60);
      expect(await exchange(port, still, 4)).toBe(attemptReplies(1, 1));
      await expectLeaseKept(stillKey, async () => {
        expect(await exchange(port, still, 4)).toBe(attemptReplies(2, 1));
      });
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });
});

describe('a reload whose config file value a flag or a variable overrides', () => {
  it('says which source won: --mode observe, mode: enforce in the file, then SIGHUP', async () => {
    const port = await freePort();
    const file = (mode: string) => `listen: 127.0.0.1:${port}\nupstream: ${redis.url}\nmode: ${mode}\nhold-ms: 25\n`;
    const config = writeTmp('overridden.yaml', file('observe'));
    const cli = new Cli(['--config', config, '--mode', 'observe'], cleanEnv({ REDIS_LOCK_PROXY_HOLD_MS: '30' }));
    const message = 'config file settings overridden by flags or environment variables: their values in the file do not apply';
    try {
      // At start the file agrees with the flag on the mode; the variable wins over its hold-ms.
      await cli.waitForLog('redis-lock-proxy listening');
      expect(cli.logLines().find((l) => l.msg === message)).toMatchObject({
        level: 30,
        settings: {
          'hold-ms': {
            inForce: '30',
            from: 'REDIS_LOCK_PROXY_HOLD_MS',
            notApplied: 25,
            in: `config file ${config}, line 4, setting "hold-ms"`,
          },
        },
      });
      writeFileSync(config, file('enforce'));
      cli.kill('SIGHUP');
      await cli.waitForLog('rules reloaded');
      await expect
        .poll(() => cli.logLines().filter((l) => l.msg === message)[1])
        .toMatchObject({
          level: 40,
          trigger: 'SIGHUP',
          settings: {
            mode: { inForce: 'observe', from: 'flag --mode', notApplied: 'enforce', in: `config file ${config}, line 3, setting "mode"` },
            'hold-ms': { inForce: '30', from: 'REDIS_LOCK_PROXY_HOLD_MS' },
          },
        });
      expect(cli.logLines().find((l) => l.msg === 'rules reloaded')).toMatchObject({ mode: 'observe' });
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });
});

describe('shutdown when standard output is a closed pipe (`... | head -1`)', () => {
  /** The proxy with stdout a pipe whose reader goes away after the first line, as `| head -1` does. */
  async function startHeadOne(extra: string[]): Promise<{ child: ChildProcess; port: number; exited: Promise<number | null> }> {
    const port = await freePort();
    const child = spawn(
      process.execPath,
      [CLI, '--listen', `127.0.0.1:${port}`, '--upstream', redis.url, '--admin-listen', 'off', ...extra],
      { cwd: ROOT, env: cleanEnv(), stdio: ['ignore', 'pipe', 'ignore'] },
    );
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    const stdout = child.stdout as Readable;
    await new Promise<void>((resolve, reject) => {
      let text = '';
      stdout.on('data', (chunk: Buffer) => {
        text += chunk.toString();
        if (text.includes('"redis-lock-proxy listening"')) resolve();
      });
      void exited.then(() => reject(new Error(`exited before listening: ${text}`)));
    });
    stdout.destroy(); // the reader is gone: the proxy's next line meets EPIPE
    return { child, port, exited };
  }

  /** Resolves with the exit code, or with 'running' if the process is still there after `ms`. */
  const within = (exited: Promise<number | null>, ms: number) =>
    Promise.race([exited, new Promise<'running'>((resolve) => setTimeout(() => resolve('running'), ms))]);

  it('exits on SIGTERM', async () => {
    const { child, exited } = await startHeadOne(['--shutdown-timeout-ms', '1000']);
    try {
      child.kill('SIGTERM');
      expect(await within(exited, 8000)).toBe(0);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('closes a busy connection at --shutdown-timeout-ms and exits', async () => {
    const { child, port, exited } = await startHeadOne(['--shutdown-timeout-ms', '500']);
    const blocked = await RawClient.connect(port);
    try {
      blocked.write(cmd('BLPOP', 'signals:never', '0'));
      await new Promise((r) => setTimeout(r, 100));
      child.kill('SIGTERM');
      expect(await within(exited, 8000)).toBe(0);
      await blocked.readUntilClosed(2000);
    } finally {
      child.kill('SIGKILL');
      await blocked.close();
    }
  });

  it('exits at once on a second signal', async () => {
    const { child, port, exited } = await startHeadOne(['--shutdown-timeout-ms', '30000']);
    const blocked = await RawClient.connect(port);
    try {
      blocked.write(cmd('BLPOP', 'signals:never', '0'));
      await new Promise((r) => setTimeout(r, 100));
      child.kill('SIGTERM');
      expect(await within(exited, 500)).toBe('running'); // waiting for the busy connection
      child.kill('SIGINT');
      expect(await within(exited, 5000)).toBe(1);
    } finally {
      child.kill('SIGKILL');
      await blocked.close();
    }
  });
});

describe('rule reload', () => {
  it('reloads on SIGHUP, refuses a broken file and keeps the old rules', async () => {
    const rules = writeTmp('hup.yaml', RULES);
    const { cli, port } = await startCli(['--rules', rules]);
    try {
      const client = await RawClient.connect(port); // stays open across reloads
      fs.writeFileSync(rules, RULES + '    mode: observe\n');
      cli.kill('SIGHUP');
      await cli.waitForLog('rules reloaded');
      client.write(lockAttempt('lock:hup', 60));
      expect((await client.readReplies(4)).toString()).toBe(attemptReplies(1, 1));
      await cli.waitForLog('observe: lock block would be rewritten'); // the log and the reply travel apart

      fs.writeFileSync(rules, 'rules:\n  - name: x\n    prefix_hex: "zz"\n');
      cli.kill('SIGHUP');
      const refused = await cli.waitForLog('rule reload refused; the previous rules stay in force');
      expect(String(refused.err)).toContain('prefix_hex');
      client.write(cmd('PING'));
      expect((await client.readReplies(1)).toString()).toBe('+PONG\r\n');
      await client.close();
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });

  it('reloads when a watched rule file changes', async () => {
    const dir = path.join(tmp, 'watched');
    fs.mkdirSync(dir);
    fs.writeFileSync(path.join(dir, 'a.yaml'), RULES);
    const { cli, port } = await startCli(['--rules', dir, '--watch-rules']);
    try {
      expect(await attempt(port, 'lock:w1')).toBe(attemptReplies(1, 1));
      fs.writeFileSync(path.join(dir, 'b.yaml'), 'rules:\n  - name: more\n    prefix: "other:"\n');
      await cli.waitForLog('rules reloaded');
      const line = cli.logLines().find((l) => l.msg === 'rules reloaded');
      expect(line?.rules).toEqual(['ops-lock (enforce)', 'more (enforce)']);
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });
});
