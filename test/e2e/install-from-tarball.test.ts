/**
 * On a host, as the systemd steps of docs/running.md do it: `npm pack`, then `npm install -g` of the
 * tarball (here into a throwaway prefix). The installed command runs from any directory, finds
 * its shipped rules, proxies, tells systemd it is ready (NOTIFY_SOCKET) and verifies; and
 * `systemd-analyze verify` accepts the example unit with its ExecStart pointing at that
 * installed command, and its socket unit with it.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { createSocket } from 'unix-dgram';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cli, cleanEnv, ensureBuilt, ROOT, runCli, VERSION } from '../support/cli.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { freePort } from '../support/ports.js';

const run = promisify(execFile);
const UNIT = path.join(ROOT, 'examples/systemd/redis-lock-proxy.service');
const SOCKET_UNIT = path.join(ROOT, 'examples/systemd/redis-lock-proxy.socket');

let tmp: string;
let installed: string;
let redis: RedisServer;

beforeAll(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'rlp-install-'));
  redis = await startRedis();
  // npm's own variables (npm test sets them) would point the nested npm at this package's settings.
  const env = cleanEnv();
  // dist/ as `npm test` built it: packing must not rebuild it under the other test files' feet.
  await ensureBuilt();
  const { stdout } = await run('npm', ['pack', '--ignore-scripts', '--pack-destination', tmp, '--silent'], { cwd: ROOT, env });
  const tarball = path.join(tmp, stdout.trim().split('\n').at(-1) as string);
  const prefix = path.join(tmp, 'prefix');
  await run('npm', ['install', '-g', '--prefix', prefix, '--prefer-offline', '--no-audit', '--no-fund', '--silent', tarball], {
    cwd: tmp,
    env,
  });
  installed = path.join(prefix, 'bin', 'redis-lock-proxy');
}, 180_000);

afterAll(async () => {
  await redis?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

describe('the command installed from the tarball', () => {
  it('runs from any directory and finds its shipped rules', async () => {
    const version = await run(installed, ['--version'], { cwd: os.tmpdir(), env: cleanEnv() });
    expect(version.stdout).toBe(`${VERSION}\n`);
    const config = await run(installed, ['--print-config'], { cwd: os.tmpdir(), env: cleanEnv() });
    const rulesDir = path.join(tmp, 'prefix', 'lib', 'node_modules', 'redis-lock-proxy', 'rules', 'stalwart');
    expect(config.stdout).toContain(`rules:\n  - ${rulesDir}\n`);
  });

  it('proxies, tells systemd it is ready, proves the fix with verify, and stops on SIGTERM as its own process', async () => {
    const port = await freePort();
    // As systemd runs it (Type=notify): the installed command's own unix-dgram sends READY=1.
    const notified: string[] = [];
    const notify = createSocket('unix_dgram', (message: Buffer) => notified.push(message.toString()));
    notify.bind(path.join(tmp, 'notify.sock'));
    const cli = new Cli(
      ['--listen', `127.0.0.1:${port}`, '--upstream', redis.url],
      cleanEnv({ NOTIFY_SOCKET: path.join(tmp, 'notify.sock') }),
      installed,
    );
    try {
      const ready = await cli.waitForLog('redis-lock-proxy listening');
      await expect.poll(() => notified, { timeout: 10_000 }).toContainEqual(expect.stringMatching(/^READY=1\n/));
      expect(ready.pid).toBe(cli.pid); // no wrapper process between the service manager and the proxy
      expect(ready.enforce).toBe(19);
      const verify = await runCli(['verify', '--via', `127.0.0.1:${port}`, '--stalwart', '0.15.3'], {}, 10_000, installed);
      expect(verify.stdout).toMatch(/^verify: OK: 12 rule\(s\) enforce the fix through 127\.0\.0\.1:\d+ for Stalwart 0\.15\.0 - 0\.15\.5 /);
      cli.kill('SIGTERM');
      expect((await cli.exited).code).toBe(0);
    } finally {
      await cli.stop();
      notify.close();
    }
  });
});

describe('examples/systemd/redis-lock-proxy.service', () => {
  it('runs check before a reload as the unit does: the example config passes, a broken rule file does not', async () => {
    const unit = readFileSync(UNIT, 'utf8');
    // The environment the unit gives its commands: the config file, here the shipped example.
    const environment = /^Environment=(REDIS_LOCK_PROXY_CONFIG)=(.*)$/m.exec(unit);
    expect(environment?.[2]).toBe('/etc/redis-lock-proxy/config.yaml');
    const command = /^ExecReload=\/usr\/local\/bin\/redis-lock-proxy (.*)$/m.exec(unit)?.[1].split(' ') ?? [];
    expect(command).toEqual(['check']);
    const env = { REDIS_LOCK_PROXY_CONFIG: path.join(ROOT, 'examples/systemd/config.yaml'), REDIS_LOCK_PROXY_ADMIN_LISTEN: '' };
    const ok = await runCli(command, env, 10_000, installed);
    expect(ok.stdout, ok.stderr).toMatch(/^check: OK: listen 127\.0\.0\.1:6380, .*mode observe, /);

    const rules = path.join(tmp, 'broken-rules');
    mkdirSync(rules);
    writeFileSync(path.join(rules, 'site.yaml'), 'rules:\n  - name: site\n    prefix: "site:\n');
    const broken = await runCli([...command, '--rules', rules], env, 10_000, installed);
    expect(broken.code).toBe(2);
    expect(broken.stderr).toContain(`${path.join(rules, 'site.yaml')}: invalid YAML`);
    // A start (ExecStart) refuses the same file itself, with the exit status the unit does not retry.
    const start = await runCli(['--rules', rules], env, 10_000, installed);
    expect(start.code).toBe(2);
    expect(start.stderr).toContain(`${path.join(rules, 'site.yaml')}: invalid YAML`);
    expect(readFileSync(UNIT, 'utf8')).toMatch(/^RestartPreventExitStatus=2$/m);
  });

  it('passes systemd-analyze verify, with ExecStart at the installed command, alone and with its socket unit', async () => {
    const unit = readFileSync(UNIT, 'utf8');
    expect(unit).toMatch(/^ExecStart=\/usr\/local\/bin\/redis-lock-proxy$/m);
    // The unit as docs/running.md installs it, but where this test installed the command.
    const file = path.join(tmp, 'redis-lock-proxy.service');
    writeFileSync(file, unit.replaceAll('/usr/local/bin/redis-lock-proxy', installed));
    const { stdout, stderr } = await run('systemd-analyze', ['verify', file]);
    expect(stdout + stderr).toBe('');
    // The socket unit beside it (its Documentation= too is a file the package holds).
    const socketUnit = readFileSync(SOCKET_UNIT, 'utf8');
    const socketFile = path.join(tmp, 'redis-lock-proxy.socket');
    writeFileSync(socketFile, socketUnit);
    const withSocket = await run('systemd-analyze', ['verify', file, socketFile]);
    expect(withSocket.stdout + withSocket.stderr).toBe('');
    const socketDocumentation = /^Documentation=file:\/\/\/usr\/local\/lib\/node_modules\/redis-lock-proxy\/(\S+)$/m.exec(socketUnit)?.[1];
    expect(existsSync(path.join(tmp, 'prefix', 'lib', 'node_modules', 'redis-lock-proxy', socketDocumentation ?? '-'))).toBe(true);
    // What docs/running.md promises of it.
    // Its Documentation= is a file the installed package holds.
    const documentation = /^Documentation=file:\/\/\/usr\/local\/lib\/node_modules\/redis-lock-proxy\/(\S+)$/m.exec(unit)?.[1];
    expect(documentation).toBeDefined();
    expect(existsSync(path.join(tmp, 'prefix', 'lib', 'node_modules', 'redis-lock-proxy', documentation ?? '-'))).toBe(true);
    for (const line of [
      'Before=stalwart.service stalwart-mail.service',
      'Type=notify', // Stalwart, ordered after it, starts once the proxy listens and Redis answers
      'RestartPreventExitStatus=2', // a configuration error is not retried every 2 s
      // Everything a reload would use is checked first; a reload that does not check goes no further.
      'ExecReload=/usr/local/bin/redis-lock-proxy check\nExecReload=/bin/kill -HUP $MAINPID',
      'Restart=on-failure',
      'NoNewPrivileges=yes',
      'ProtectSystem=strict',
      'User=redis-lock-proxy',
      'StandardOutput=journal',
      // The socket unit when there is one (a restart then refuses no connection); without it the proxy binds --listen.
      'Wants=redis-lock-proxy.socket\nAfter=redis-lock-proxy.socket',
    ]) {
      expect(unit).toContain(`\n${line}\n`);
    }
    // RestartPreventExitStatus= reads the main process's status only: a check in ExecStartPre that
    // failed would be retried every RestartSec until the start limit. The start checks itself.
    expect(unit).not.toMatch(/^ExecStartPre=/m);
  });
});
