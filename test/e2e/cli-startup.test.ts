/**
 * The built command line, `node dist/cli.js`, as an operator starts it: help
 * and version, startup logging, configuration from flags, environment and a
 * config file (with its precedence, and --print-config), a lock attempt
 * through it, clean shutdown on SIGTERM, and the exit status and message of
 * every startup failure. (Once it runs, its admin endpoints, signals and
 * reloads: cli-admin-signals-reload.test.ts.)
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cli, cleanEnv, ensureBuilt, runCli, VERSION } from '../support/cli.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { closedPort, freePort } from '../support/ports.js';
import { cmd, exchange, RawClient } from '../support/resp.js';
import { attemptReplies, lockAttempt, queueLockKey, taskLockKey } from '../support/stalwart.js';
import { STALWART_RULES } from '../support/proxy.js';

const SHIPPED_FILES = ['0.11', '0.12.5', '0.12', '0.13', '0.15', '0.16', '0.8'].map((line) => path.join(STALWART_RULES, `${line}.yaml`));
const STALWART_016 = path.join(STALWART_RULES, '0.16.yaml');

let redis: RedisServer;
let tmp: string;

beforeAll(async () => {
  await ensureBuilt();
  redis = await startRedis();
  tmp = mkdtempSync(path.join(os.tmpdir(), 'rlp-cli-'));
}, 120_000);

afterAll(async () => {
  await redis?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

// ---------------------------------------------------------------------------
// Running the CLI
// ---------------------------------------------------------------------------

/**
 * Lowers a lock's lease to `ms` in Redis itself (database `db`), so that an attempt that re-armed
 * it would show; returns the PTTL the key has after `attempt` ran.
 */
async function pttlAfter(key: Buffer | string, attempt: () => Promise<void>, ms = 5000, db = 0): Promise<number> {
  const select = cmd('SELECT', String(db));
  expect(await exchange(redis.port, Buffer.concat([select, cmd('PEXPIRE', key, String(ms))]), 2)).toBe('+OK\r\n:1\r\n');
  await attempt();
  const replies = await exchange(redis.port, Buffer.concat([select, cmd('PTTL', key)]), 2);
  return Number(/:(-?\d+)\r\n$/.exec(replies)?.[1]);
}

function writeTmp(name: string, text: string): string {
  const file = path.join(tmp, name);
  writeFileSync(file, text);
  return file;
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

describe('help and version', () => {
  it('--help prints the usage on stdout and exits 0', async () => {
    for (const flag of ['--help', '-h']) {
      const exit = await runCli([flag]);
      expect(exit.code).toBe(0);
      expect(exit.stderr).toBe('');
      expect(exit.stdout).toMatch(/^Usage: redis-lock-proxy \[options\]/);
      for (const option of [
        '--listen',
        '--upstream',
        '--rules',
        '--hold-ms',
        '--connect-timeout-ms',
        '--log-level',
        'REDIS_LOCK_PROXY_UPSTREAM',
      ]) {
        expect(exit.stdout).toContain(option);
      }
    }
  });

  it('--version prints package.json’s version and exits 0', async () => {
    for (const flag of ['--version', '-v']) {
      const exit = await runCli([flag]);
      expect(exit.code).toBe(0);
      expect(exit.stdout).toBe(`${VERSION}\n`);
      expect(exit.stderr).toBe('');
    }
  });
});

describe('running', () => {
  it('logs where it listens and which rules it loaded, proxies a Stalwart lock attempt, and exits 0 on SIGTERM', async () => {
    const port = await freePort();
    const cli = new Cli(['--listen', `127.0.0.1:${port}`, '--upstream', redis.url], cleanEnv());
    try {
      const ready = await cli.waitForLog('redis-lock-proxy listening');
      expect(ready).toMatchObject({
        name: 'redis-lock-proxy',
        level: 30,
        listen: `127.0.0.1:${port}`,
        upstream: redis.url,
        ruleFiles: SHIPPED_FILES,
        releases:
          'Stalwart 0.8.1 - 0.10.7, Stalwart 0.11.0 - 0.11.8, Stalwart 0.12.0 - 0.12.4, Stalwart 0.12.5, ' +
          'Stalwart 0.13.0 - 0.14.1, Stalwart 0.15.0 - 0.15.5, Stalwart 0.16.0 - 0.16.15',
        enforce: 19,
        observe: 0,
        version: VERSION,
      });
      expect(ready.rules).toContain('stalwart-task-lock (enforce)');
      expect(ready.rules).toContain('stalwart-migration-core-lock (enforce)');

      const task = taskLockKey(0x0a0d2an);
      expect(await exchange(port, lockAttempt(task, 3600), 4)).toBe(attemptReplies(1, 1));
      // The loser gets Redis's own answer; the lease it found stays.
      const pttl = await pttlAfter(task, async () => {
        expect(await exchange(port, lockAttempt(task, 3600), 4)).toBe(attemptReplies(2, 1));
      });
      expect(pttl).toBeGreaterThan(0);
      expect(pttl).toBeLessThanOrEqual(5000);
      const queue = queueLockKey(3n, 'remote');
      expect(await exchange(port, Buffer.concat([cmd('PING'), lockAttempt(queue, 600)]), 5)).toBe('+PONG\r\n' + attemptReplies(1, 1));

      // An open connection does not keep it from stopping.
      const idle = await RawClient.connect(port);
      idle.write(cmd('PING'));
      expect((await idle.readReplies(1)).toString()).toBe('+PONG\r\n');
      cli.kill('SIGTERM');
      const exit = await cli.exited;
      expect(exit.code).toBe(0);
      expect(cli.logLines().find((l) => l.msg === 'shutting down: finishing in-flight requests')).toMatchObject({ signal: 'SIGTERM' });
      await expect(idle.readUntilClosed(2000)).resolves.toBeDefined();
      await expect(RawClient.connect(port)).rejects.toThrow(/ECONNREFUSED/);
    } finally {
      await cli.stop();
    }
  });

  it("gives log times as ISO 8601 with --log-time iso, and as pino's milliseconds by default", async () => {
    for (const [flags, time] of [
      [['--log-time', 'iso'], /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/],
      [[], /^\d{13}$/],
    ] as const) {
      const cli = new Cli(['--listen', '127.0.0.1:0', '--upstream', redis.url, ...flags], cleanEnv());
      try {
        const ready = await cli.waitForLog('redis-lock-proxy listening');
        expect(String(ready.time)).toMatch(time);
        expect(typeof ready.time).toBe(flags.length > 0 ? 'string' : 'number');
      } finally {
        cli.kill('SIGTERM');
        await cli.stop();
      }
    }
    const wrong = await runCli(['--log-time', 'local']);
    expect([wrong.code, wrong.stderr]).toEqual([2, 'redis-lock-proxy: log-time must be one of epoch, iso, got "local"\n']);
  });

  it('is configured the same way by REDIS_LOCK_PROXY_* environment variables', async () => {
    const port = await freePort();
    const rules = writeTmp(
      'env-rules.yaml',
      'rules:\n  - name: env-lock\n    prefix: "lock:"\n  - name: env-watch\n    prefix: "watch:"\n    mode: observe\n',
    );
    const cli = new Cli(
      [],
      cleanEnv({
        REDIS_LOCK_PROXY_LISTEN: `127.0.0.1:${port}`,
        REDIS_LOCK_PROXY_UPSTREAM: `${redis.url}/5`,
        REDIS_LOCK_PROXY_RULES: `${rules},${STALWART_016}`,
        REDIS_LOCK_PROXY_HOLD_MS: '20',
        REDIS_LOCK_PROXY_LOG_LEVEL: 'debug',
      }),
    );
    try {
      const ready = await cli.waitForLog('redis-lock-proxy listening');
      expect(ready).toMatchObject({
        listen: `127.0.0.1:${port}`,
        upstream: `${redis.url}/5`,
        ruleFiles: [rules, STALWART_016],
        releases: 'Stalwart 0.16.0 - 0.16.15',
        rules: ['env-lock (enforce)', 'env-watch (observe)', 'stalwart-task-lock (enforce)', 'stalwart-queue-lock (enforce)'],
        enforce: 3,
        observe: 1,
      });
      const block = lockAttempt('lock:env', 60);
      expect(await exchange(port, block, 4)).toBe(attemptReplies(1, 1));
      // Two more in one write: Redis's own answers, and the lease they found stays.
      const pttl = await pttlAfter(
        'lock:env',
        async () => {
          expect(await exchange(port, Buffer.concat([block, block]), 8)).toBe(attemptReplies(2, 1) + attemptReplies(3, 1));
        },
        5000,
        5,
      );
      expect(pttl).toBeGreaterThan(0);
      expect(pttl).toBeLessThanOrEqual(5000);
      // db 5 from the URL, and debug logging from the environment.
      expect(await exchange(redis.port, Buffer.concat([cmd('SELECT', '5'), cmd('GET', 'lock:env')]), 2)).toBe('+OK\r\n$1\r\n3\r\n');
      expect(await cli.waitForLog('client connected')).toMatchObject({ level: 20 }); // the log and the reply travel apart
      cli.kill('SIGINT');
      expect((await cli.exited).code).toBe(0);
    } finally {
      await cli.stop();
    }
  });

  it('--stalwart loads the rules of that release only, and says so', async () => {
    const port = await freePort();
    const cli = new Cli(
      ['--listen', `127.0.0.1:${port}`, '--upstream', redis.url, '--admin-listen', 'off', '--stalwart', '0.12.5'],
      cleanEnv(),
    );
    try {
      expect(await cli.waitForLog('redis-lock-proxy listening')).toMatchObject({
        ruleFiles: [path.join(STALWART_RULES, '0.12.5.yaml')],
        releases: 'Stalwart 0.12.5',
        enforce: 13,
      });
      // Two attempts in one write after the first: the replies are Redis's own either way, the
      // lease tells whether the loser re-armed it.
      const twoMore = async (key: Buffer): Promise<number> => {
        expect(await exchange(port, lockAttempt(key, 3600), 4)).toBe(attemptReplies(1, 1));
        return pttlAfter(key, async () => {
          expect(await exchange(port, Buffer.concat([lockAttempt(key, 3600), lockAttempt(key, 3600)]), 8)).toBe(
            attemptReplies(2, 1) + attemptReplies(3, 1),
          );
        });
      };
      const purge = Buffer.from([0x14, 0, 0, 0, 9]);
      const purgePttl = await twoMore(purge);
      expect(purgePttl).toBeGreaterThan(0);
      expect(purgePttl).toBeLessThanOrEqual(5000);
      // Not a lock of 0.12.5: a 0.16 task lock goes through as sent (the loser re-arms it).
      expect(await twoMore(taskLockKey(77n))).toBeGreaterThan(3_000_000);
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });

  it('flags win over environment variables', async () => {
    const port = await freePort();
    const cli = new Cli(
      ['--listen', `127.0.0.1:${port}`, '--upstream', redis.url],
      cleanEnv({ REDIS_LOCK_PROXY_LISTEN: '127.0.0.1:1', REDIS_LOCK_PROXY_UPSTREAM: 'redis://127.0.0.1:1' }),
    );
    try {
      expect(await cli.waitForLog('redis-lock-proxy listening')).toMatchObject({ listen: `127.0.0.1:${port}`, upstream: redis.url });
      expect(await exchange(port, cmd('PING'), 1)).toBe('+PONG\r\n');
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });

  it('starts with an unreachable upstream and tells each client why it cannot be served', async () => {
    const port = await freePort();
    const deadPort = await closedPort();
    const cli = new Cli(['--listen', `127.0.0.1:${port}`, '--upstream', `redis://:pw@127.0.0.1:${deadPort}`], cleanEnv());
    try {
      await cli.waitForLog('redis-lock-proxy listening');
      const client = await RawClient.connect(port);
      client.write(cmd('PING'));
      const got = (await client.readUntilClosed()).toString('latin1');
      expect(got).toMatch(
        new RegExp(
          `^-ERR redis-lock-proxy: upstream redis://:\\*\\*\\*@127\\.0\\.0\\.1:${deadPort} is unreachable: .*ECONNREFUSED.*\\r\\n$`,
        ),
      );
      const warning = await cli.waitForLog('upstream unreachable');
      expect(warning).toMatchObject({ level: 40, upstream: `redis://:***@127.0.0.1:${deadPort}` });
      // Said once at start too, before any client comes: the upstream named, and the error.
      const atStart = await cli.waitForLog('upstream does not answer; running anyway (clients get an error naming it until it does)');
      expect(atStart).toMatchObject({ level: 40, upstream: `redis://:***@127.0.0.1:${deadPort}` });
      expect(String(atStart.err)).toContain('ECONNREFUSED');
      expect(cli.stdout).not.toContain(':pw@');
    } finally {
      cli.kill('SIGTERM');
      await cli.stop();
    }
  });
});

describe('config file', () => {
  it('is read, and flags and environment variables win over it', async () => {
    const rules = writeTmp('cfg-rules.yaml', 'rules:\n  - name: ops-lock\n    prefix: "lock:"\n');
    const filePort = await freePort();
    const config = writeTmp(
      'proxy.yaml',
      `listen: 127.0.0.1:${filePort}\nupstream: redis://:s3cret@127.0.0.1:1/2\nrules:\n  - ${rules}\nhold-ms: 25\nmode: observe\nadmin-listen: "off"\n`,
    );
    const shown = await runCli(['--config', config, '--print-config', '--hold-ms', '30'], { REDIS_LOCK_PROXY_MODE: 'enforce' });
    expect(shown.code).toBe(0);
    expect(shown.stdout).toContain(`listen: 127.0.0.1:${filePort}`);
    expect(shown.stdout).toContain('upstream: redis://:***@127.0.0.1:1/2');
    expect(shown.stdout).not.toContain('s3cret');
    expect(shown.stdout).toContain('hold-ms: 30'); // flag > file
    expect(shown.stdout).toContain('mode: enforce'); // env > file
    expect(shown.stdout).toContain(rules);

    const running = new Cli(['--config', config, '--upstream', redis.url], cleanEnv());
    try {
      await running.waitForLog('redis-lock-proxy listening');
      expect(await exchange(filePort, lockAttempt('lock:cfg', 60), 4)).toBe(attemptReplies(1, 1));
      expect(running.logLines().find((l) => l.msg === 'redis-lock-proxy listening')).toMatchObject({ mode: 'observe' });
    } finally {
      running.kill('SIGTERM');
      await running.stop();
    }
  });

  it('refuses unknown settings and wrong types, naming the file, the line and the key of each', async () => {
    const typo = writeTmp('typo.yaml', '# the proxy\nlistne: 127.0.0.1:1\nwatch-rules: sometimes\n');
    const exit = await runCli(['--config', typo]);
    expect(exit.code).toBe(2);
    expect(exit.stderr).toBe(
      `redis-lock-proxy: config file ${typo}, line 2, setting "listne": unknown setting (did you mean listen? settings are named like the flags)\n` +
        `redis-lock-proxy: config file ${typo}, line 3, setting "watch-rules": must be true or false, got "sometimes"\n`,
    );
    // A value of the right YAML type that the setting refuses names the file, the line and the key too.
    const ten = writeTmp('ten.yaml', 'hold-ms: ten\n');
    const exit3 = await runCli(['--config', ten]);
    expect(exit3.code).toBe(2);
    expect(exit3.stderr).toBe(
      `redis-lock-proxy: config file ${ten}, line 1, setting "hold-ms": hold-ms must be an integer from 1 to 60000, got "ten"\n`,
    );
    const mode = writeTmp('mode.yaml', 'mode: enforcing\n');
    expect((await runCli(['--config', mode])).stderr).toBe(
      `redis-lock-proxy: config file ${mode}, line 1, setting "mode": mode must be enforce or observe, got "enforcing"\n`,
    );
    const broken = writeTmp('broken.yaml', 'listen: 127.0.0.1:1\nmode: a: b\n');
    const yamlError = (await runCli(['--config', broken])).stderr;
    expect(yamlError.startsWith(`redis-lock-proxy: config file ${broken}: not valid YAML: `)).toBe(true);
    expect(yamlError).toMatch(/ at line 2, column \d+:?\n$/);
  });

  it('refuses an unknown REDIS_LOCK_PROXY_* variable, naming the nearest known one, as an unknown flag', async () => {
    const exit = await runCli([], { REDIS_LOCK_PROXY_HOLDMS: '50' });
    expect([exit.code, exit.stdout]).toEqual([2, '']);
    expect(exit.stderr).toBe(
      'redis-lock-proxy: REDIS_LOCK_PROXY_HOLDMS is not a variable of redis-lock-proxy (did you mean REDIS_LOCK_PROXY_HOLD_MS?)\n',
    );
    const flag = await runCli(['--holdms', '50']);
    expect([flag.code, flag.stderr]).toEqual([2, 'redis-lock-proxy: unknown flag --holdms (did you mean --hold-ms?) (see --help)\n']);
  });

  it('a wrong value in a variable names the variable', async () => {
    const exit = await runCli([], { REDIS_LOCK_PROXY_HOLD_MS: 'ten' });
    expect(exit.code).toBe(2);
    expect(exit.stderr).toBe('redis-lock-proxy: REDIS_LOCK_PROXY_HOLD_MS: hold-ms must be an integer from 1 to 60000, got "ten"\n');
    const listen = await runCli([], { REDIS_LOCK_PROXY_LISTEN: 'localhost' });
    expect(listen.code).toBe(2);
    expect(listen.stderr).toMatch(/^redis-lock-proxy: REDIS_LOCK_PROXY_LISTEN: listen address "localhost" is not HOST:PORT/);
  });
});

describe('startup failures', () => {
  it('a rule file with an invalid rule: exit 2, naming the file, the rule and the field', async () => {
    const file = writeTmp('bad-rule.yaml', 'rules:\n  - name: good\n    prefix: "a:"\n  - name: unquoted-hex\n    prefix_hex: 17\n');
    const exit = await runCli(['--listen', '127.0.0.1:0', '--upstream', redis.url, '--rules', file]);
    expect(exit.code).toBe(2);
    expect(exit.stdout).toBe('');
    expect(exit.stderr).toContain(`redis-lock-proxy: ${file}, line 5: rule 2 ("unquoted-hex"): field "prefix_hex": `);
    expect(exit.stderr).toContain('prefix_hex: "17"'); // the hint
  });

  it('--stalwart with a release that has no bug, or no release at all: exit 2, saying why', async () => {
    const fixed = await runCli(['--listen', '127.0.0.1:0', '--upstream', redis.url, '--stalwart', '0.16.16']);
    expect(fixed.code).toBe(2);
    expect(fixed.stderr).toBe(
      'redis-lock-proxy: stalwart: Stalwart 0.16.16 is not affected: from 0.16.16 on it takes its locks with SET NX EX, ' +
        'whose expiry a failed attempt does not push forward; there are no lock rules to load for it. While nodes of affected ' +
        'releases still run, list every affected release still running (e.g. --stalwart 0.15.3,0.16.9; 0.16.16 may be listed ' +
        'with them), or give no --stalwart at all, which loads the rules of every affected release\n',
    );
    const vague = await runCli(['--listen', '127.0.0.1:0', '--upstream', redis.url], { REDIS_LOCK_PROXY_STALWART: '0.15' });
    expect(vague.code).toBe(2);
    expect(vague.stderr).toContain('"0.15" is not a Stalwart release number: give all three parts, e.g. 0.15.3');
    const own = writeTmp('own-only.yaml', 'rules:\n  - name: own\n    prefix: "a:"\n');
    const none = await runCli(['--listen', '127.0.0.1:0', '--upstream', redis.url, '--rules', own, '--stalwart', '0.15.1']);
    expect(none.code).toBe(2);
    expect(none.stderr).toBe(`redis-lock-proxy: ${own}: no rule file here is for Stalwart 0.15.1 (no file names its releases)\n`);
  });

  it('a rule file that is not valid YAML: exit 2, naming the file', async () => {
    const file = writeTmp('bad-yaml.yaml', 'rules:\n  - name: x\n    prefix: "unterminated\n  - [\n');
    const exit = await runCli(['--listen', '127.0.0.1:0', '--upstream', redis.url, '--rules', file]);
    expect(exit.code).toBe(2);
    expect(exit.stderr).toMatch(new RegExp(`^redis-lock-proxy: ${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: invalid YAML`));
  });

  it('a rule path that does not exist (from the environment): exit 2', async () => {
    const missing = path.join(tmp, 'nope.yaml');
    const exit = await runCli(['--listen', '127.0.0.1:0', '--upstream', redis.url], { REDIS_LOCK_PROXY_RULES: missing });
    expect(exit.code).toBe(2);
    expect(exit.stderr).toBe(
      `redis-lock-proxy: ${missing}: does not exist (a path of the rules setting: --rules, REDIS_LOCK_PROXY_RULES or rules in the config file)\n`,
    );
  });

  it('a bad upstream URL: exit 2 with a clear message', async () => {
    const scheme = await runCli(['--upstream', 'http://cache:6380']);
    expect(scheme.code).toBe(2);
    expect(scheme.stderr).toBe(
      'redis-lock-proxy: upstream URL http://cache:6380/: unsupported scheme "http:" (use redis://, rediss:// or unix://)\n',
    );

    const tlsWithoutRediss = await runCli(['--upstream', 'redis://cache:6380', '--upstream-insecure']);
    expect(tlsWithoutRediss.code).toBe(2);
    expect(tlsWithoutRediss.stderr).toBe('redis-lock-proxy: --upstream-insecure needs a rediss:// upstream URL\n');

    const garbage = await runCli(['--upstream', 'cache:6379x']);
    expect(garbage.code).toBe(2);
    expect(garbage.stderr).toMatch(
      /^redis-lock-proxy: upstream URL "cache:6379x" is not a valid URL|^redis-lock-proxy: upstream URL cache:6379x: unsupported scheme/,
    );

    const noPassword = await runCli([], { REDIS_LOCK_PROXY_UPSTREAM: 'redis://alice@cache' });
    expect(noPassword.code).toBe(2);
    expect(noPassword.stderr).toContain('needs a password');
  });

  // See test/config.test.ts: a stray "%" in the password must not surface as a bare URIError.
  it('a malformed percent-encoding in the upstream password: exit 2, saying which setting is wrong', async () => {
    const exit = await runCli(['--upstream', 'redis://:100%@cache']);
    expect(exit.stderr).toContain('upstream URL');
    expect(exit.code).toBe(2);
  });

  it('an unknown command: exit 2, listing the commands', async () => {
    const exit = await runCli(['lock']);
    expect(exit).toMatchObject({
      code: 2,
      stdout: '',
      stderr:
        'redis-lock-proxy: unknown command "lock": the commands are check (check a configuration without starting), verify ' +
        '(prove the fix through a running proxy) and locks (list and release lock keys); without a command it runs the proxy ' +
        '(see --help)\n',
    });
  });

  it('bad flags: exit 2, pointing at --help', async () => {
    const unknown = await runCli(['--upsteam', 'redis://h']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^redis-lock-proxy: .*--upsteam.*\(see --help\)\n$/);
    const hold = await runCli(['--hold-ms', 'soon']);
    expect(hold.code).toBe(2);
    expect(hold.stderr).toBe('redis-lock-proxy: hold-ms must be an integer from 1 to 60000, got "soon"\n');
    const listen = await runCli(['--listen', 'localhost']);
    expect(listen.code).toBe(2);
    expect(listen.stderr).toContain('HOST:PORT');
  });

  it('an upstream that is the proxy itself: exit 2, saying so', async () => {
    const port = await freePort();
    for (const [listen, upstream] of [
      [`127.0.0.1:${port}`, `redis://127.0.0.1:${port}`],
      [`127.0.0.1:${port}`, `redis://localhost:${port}/2`],
      [`0.0.0.0:${port}`, `redis://127.0.0.1:${port}`],
    ]) {
      const exit = await runCli(['--listen', listen, '--upstream', upstream]);
      expect(exit.code, upstream).toBe(2);
      expect(exit.stderr).toBe(
        `redis-lock-proxy: upstream ${upstream} is the proxy's own listen address ${listen}: ` +
          'every connection would come back through the proxy; point upstream at Redis\n',
      );
    }
    // The same port on another address is another server.
    const other = new Cli(['--listen', `127.0.0.1:${port}`, '--upstream', `redis://127.0.0.2:${port}`], cleanEnv());
    try {
      await other.waitForLog('redis-lock-proxy listening');
    } finally {
      other.kill('SIGTERM');
      await other.stop();
    }
  });

  it('a listen address in use: exits non-zero, naming the address', async () => {
    const blocker = net.createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const { port } = blocker.address() as net.AddressInfo;
    try {
      const exit = await runCli(['--listen', `127.0.0.1:${port}`, '--upstream', redis.url]);
      expect(exit.code).not.toBe(0);
      expect(exit.code).not.toBeNull(); // exited by itself, not killed by the timeout
      expect(exit.stderr).toContain('EADDRINUSE');
      expect(exit.stderr).toContain(`127.0.0.1:${port}`);
      expect(exit.stderr).toMatch(/choose another --listen\)\n$/); // which setting to change
    } finally {
      await new Promise((resolve) => blocker.close(resolve));
    }
  });
});
