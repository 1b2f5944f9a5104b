/**
 * examples/systemd/stalwart-after-proxy.conf, Stalwart's drop-in, as far as a host without systemd
 * running can check it: `systemd-analyze verify` accepts Stalwart's unit with it (beside the
 * example proxy unit); it orders Stalwart after the proxy with only dependencies that carry
 * nothing from the proxy to a running Stalwart (no Requires=, Requisite=, BindsTo= or PartOf=:
 * each would stop or restart Stalwart with every stop or restart of the proxy); and its
 * ExecStartPre, run as systemd runs it (the shell command, with a stand-in for `systemctl` that
 * answers as systemd would), refuses Stalwart's start, naming why, unless the proxy is active.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from './support/cli.js';

const run = promisify(execFile);
const DROP_IN = path.join(ROOT, 'examples/systemd/stalwart-after-proxy.conf');
const PROXY_UNIT = path.join(ROOT, 'examples/systemd/redis-lock-proxy.service');

/** Stalwart's unit as its install script makes it, in the parts that matter here. */
const STALWART_UNIT = `[Unit]
Description=Stalwart
After=network-online.target

[Service]
Type=simple
ExecStart=/bin/sleep infinity
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
`;

describe('examples/systemd/stalwart-after-proxy.conf', () => {
  const dropIn = fs.readFileSync(DROP_IN, 'utf8');
  let dir: string;
  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-drop-in-'));
  });
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('passes systemd-analyze verify as a drop-in of Stalwart’s unit, beside the proxy’s unit', async () => {
    const units = path.join(dir, 'units');
    fs.mkdirSync(path.join(units, 'stalwart.service.d'), { recursive: true });
    fs.writeFileSync(path.join(units, 'stalwart.service'), STALWART_UNIT);
    fs.copyFileSync(DROP_IN, path.join(units, 'stalwart.service.d', 'stalwart-after-proxy.conf'));
    // The proxy's unit as installed, but with a command this host has where the proxy's would be.
    const proxyUnit = fs.readFileSync(PROXY_UNIT, 'utf8').replaceAll('/usr/local/bin/redis-lock-proxy', '/bin/true');
    fs.writeFileSync(path.join(units, 'redis-lock-proxy.service'), proxyUnit);
    for (const other of fs.readdirSync(path.dirname(PROXY_UNIT)).filter((file) => file.endsWith('.socket')))
      fs.copyFileSync(path.join(path.dirname(PROXY_UNIT), other), path.join(units, other));
    const { stdout, stderr } = await run('systemd-analyze', ['verify', path.join(units, 'stalwart.service')]);
    expect(stdout + stderr).toBe('');
  });

  it('orders Stalwart after the proxy and pulls it in, with no dependency that stops or restarts Stalwart with the proxy', () => {
    const settings = dropIn
      .split('\n')
      .filter((line) => /^[A-Za-z]+=/.test(line))
      .map((line) => line.slice(0, line.indexOf('=')));
    expect(dropIn).toMatch(/^Wants=redis-lock-proxy\.service$/m);
    expect(dropIn).toMatch(/^After=redis-lock-proxy\.service$/m);
    for (const propagating of ['Requires', 'Requisite', 'BindsTo', 'PartOf', 'PropagatesStopTo', 'StopPropagatedFrom'])
      expect(settings, propagating).not.toContain(propagating);
  });

  describe('its ExecStartPre, as systemd runs it', () => {
    /** The command after `ExecStartPre=+/bin/sh -c `, unquoted as systemd unquotes one single-quoted word. */
    const script = /^ExecStartPre=\+\/bin\/sh -c '([^']*)'$/m.exec(dropIn)?.[1];

    /** Runs it with `systemctl` answering `exitStatus`; how it ended, and what systemctl was asked. */
    async function startCheck(exitStatus: number): Promise<{ code: number; stderr: string; asked: string }> {
      const bin = fs.mkdtempSync(path.join(dir, 'bin-'));
      const asked = path.join(bin, 'asked');
      fs.writeFileSync(path.join(bin, 'systemctl'), `#!/bin/sh\necho "$@" >>"${asked}"\nexit ${exitStatus}\n`, { mode: 0o755 });
      const env = { ...process.env, PATH: `${bin}:${process.env.PATH}` };
      const result = await run('/bin/sh', ['-c', script ?? 'exit 99'], { env }).then(
        ({ stderr }) => ({ code: 0, stderr }),
        (err: { code: number; stderr: string }) => ({ code: err.code, stderr: err.stderr }),
      );
      return { ...result, asked: fs.existsSync(asked) ? fs.readFileSync(asked, 'utf8') : '' };
    }

    it('is a shell command run as root ("+"), whatever Stalwart’s user', () => {
      expect(script).toBeDefined();
    });

    it('lets Stalwart start while the proxy is active', async () => {
      const active = await startCheck(0);
      expect(active).toEqual({ code: 0, stderr: '', asked: 'is-active --quiet redis-lock-proxy.service\n' });
    });

    it('refuses Stalwart’s start while the proxy is not active (inactive, failed, activating), naming why', async () => {
      // systemctl is-active exits 3 for every state but active and reloading.
      const inactive = await startCheck(3);
      expect(inactive.code).toBe(1);
      expect(inactive.stderr).toBe(
        'redis-lock-proxy.service is not running: Stalwart starts only behind a running proxy (journalctl -u redis-lock-proxy says why it is not)\n',
      );
    });
  });
});
