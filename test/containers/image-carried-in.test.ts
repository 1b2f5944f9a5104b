/**
 * The proxy's image carried to a host no registry answers, as docs/running.md gives it ("An image
 * carried in: save and load"): saved to an archive with the engine's `save`, loaded back with
 * `load`, and run from what was loaded with no network but loopback.
 *
 * Under podman the archive is loaded into a storage of this test's own (`--root`, `--runroot`,
 * `--tmpdir` in a folder of its own, the vfs driver, which works on any file system), empty
 * before: what runs there came from the archive and nothing else, as on a host that never had
 * the image. Docker has one storage: there the image is saved under a name of the test's own,
 * that name is removed, and the archive loaded brings it back. Either way only that name and
 * that storage are removed afterwards: the image the other tests use stays as it is.
 *
 * The loaded proxy runs with `--network none`: its `check`, and the proxy serving, in front of a
 * Redis (the server image, itself under `--network none`) reached through its unix socket in a
 * folder both containers mount; `verify` inside the proxy's container proves the fix through it.
 */
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it, vi } from 'vitest';
import { runContainer, uniqueName, type Container } from './support/containers.js';
import { engine, engineExec, execStatus, type ExitStatus } from './support/engine.js';
import { SERVER_FOR_IMAGE_TESTS } from './support/global-setup.js';
import { proxyImage, serverImage, serverImageSpec, type ProxyImage } from './support/images.js';

const setup = inject('containers');

describe.skipIf(setup.skip !== undefined)('the image carried in (save, load, run offline)', () => {
  let image: ProxyImage;
  let dir: string;
  let archive: string;
  /** The engine's command line, on the storage the archive is loaded into. */
  let carried: (args: string[], timeoutMs?: number) => Promise<ExitStatus>;
  /** The loaded image's name. */
  let loaded: string;
  const proxies: string[] = [];
  let redis: Container | undefined;

  /** A carried command that must succeed: its output. */
  async function carriedOk(args: string[], timeoutMs?: number): Promise<string> {
    const result = await carried(args, timeoutMs);
    if (result.code !== 0) throw new Error(`\`${args.join(' ')}\` on the carried-in storage: exit ${result.code}\n${result.stderr}`);
    return result.stdout;
  }

  beforeAll(async () => {
    image = await proxyImage();
    dir = mkdtempSync(path.join(os.tmpdir(), 'rlp-carried-'));
    archive = path.join(dir, 'redis-lock-proxy.tar');
    const { cli, podman } = await engine();
    loaded = `localhost/${uniqueName('carried')}:0.1.0`;
    // The archive names the image by the name it is saved under: a name of this test's own.
    await engineExec(['tag', image.reference, loaded]);
    try {
      await engineExec(['save', '--output', archive, loaded], { timeoutMs: 300_000 });
    } finally {
      await engineExec(['rmi', loaded]).catch(() => undefined);
    }
    if (podman) {
      const store = path.join(dir, 'storage');
      const flags = ['--root', store, '--runroot', `${store}-run`, '--tmpdir', `${store}-tmp`, '--storage-driver', 'vfs'];
      carried = (args, timeoutMs = 300_000) => execStatus(cli, [...flags, ...args], { timeoutMs });
    } else {
      carried = (args, timeoutMs = 300_000) => execStatus(cli, args, { timeoutMs });
    }
    expect((await carried(['image', 'inspect', loaded])).code, `${loaded} before loading`).not.toBe(0);
    await carriedOk(['load', '--input', archive]);
  });

  afterAll(async () => {
    for (const name of proxies) await carried?.(['rm', '--force', name]).catch(() => undefined);
    await redis?.remove();
    // Only the loaded name: under Docker the image behind it is the one the other tests use.
    await carried?.(['rmi', loaded]).catch(() => undefined);
    // The storage of this test's own is its folder.
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('is the image that was saved, whole: its configuration, labels and HEALTHCHECK', async () => {
    interface ImageInspect {
      Config: { Entrypoint: string[]; User: string; Labels: Record<string, string>; Healthcheck?: { Test: string[] } };
      /** podman's place for the HEALTHCHECK; Docker's is Config.Healthcheck. */
      Healthcheck?: { Test: string[] };
    }
    const inspect = async (run: (args: string[]) => Promise<string>, reference: string) => {
      const [found] = JSON.parse(await run(['image', 'inspect', reference])) as ImageInspect[];
      return { ...found.Config, healthcheck: (found.Healthcheck ?? found.Config.Healthcheck)?.Test };
    };
    const saved = await inspect(async (args) => (await engineExec(args)).stdout, image.reference);
    const fromArchive = await inspect(carriedOk, loaded);
    expect(fromArchive.Entrypoint).toEqual(saved.Entrypoint);
    expect(fromArchive.User).toBe('1000:1000');
    expect(fromArchive.Labels).toEqual(saved.Labels);
    expect(fromArchive.healthcheck).toEqual(saved.healthcheck);
    expect(fromArchive.healthcheck?.join(' ')).toContain('/healthz');
    console.info(`archive of ${image.reference}: ${(statSync(archive).size / 1e6).toFixed(0)} MB`);
  });

  it('runs `check` and `--version` with no network', async () => {
    const check = await carried(['run', '--rm', '--pull', 'never', '--network', 'none', loaded, 'check'], 120_000);
    expect(check, check.stderr).toMatchObject({ code: 0 });
    expect(check.stdout).toMatch(/^check: OK: listen 0\.0\.0\.0:6380, /);
    const version = await carried(['run', '--rm', '--pull', 'never', '--network', 'none', loaded, '--version'], 120_000);
    expect(version).toMatchObject({ code: 0, stdout: `${image.version}\n` });
  });

  it('proxies and fixes the lock with no network, in front of a Redis reached through its unix socket', async () => {
    // The socket's folder: Redis (root) makes the socket there, the proxy (uid 1000) connects to it.
    const sockets = path.join(dir, 'sockets');
    mkdirSync(sockets);
    chmodSync(sockets, 0o755);
    redis = await runContainer({
      image: await serverImage(serverImageSpec(SERVER_FOR_IMAGE_TESTS)),
      network: 'none',
      mounts: [{ source: sockets, target: '/sockets' }],
      args: ['--port', '0', '--unixsocket', '/sockets/redis.sock', '--unixsocketperm', '777'],
    });
    await vi.waitFor(() => expect(existsSync(path.join(sockets, 'redis.sock'))).toBe(true), { timeout: 60_000, interval: 200 });

    const name = uniqueName('carried-proxy');
    proxies.push(name);
    const { podman } = await engine();
    await carriedOk([
      'run',
      '--detach',
      '--pull',
      'never',
      '--name',
      name,
      '--network',
      'none',
      '--read-only',
      ...(podman ? ['--read-only-tmpfs=false'] : []),
      '--volume',
      `${sockets}:/sockets`,
      '--env',
      'REDIS_LOCK_PROXY_UPSTREAM=unix:///sockets/redis.sock',
      loaded,
    ]);
    const logs = async () => {
      const result = await carried(['logs', name]);
      return result.stdout + result.stderr;
    };
    await vi.waitFor(
      async () => {
        const text = await logs();
        if (!/redis-lock-proxy listening/.test(text)) throw new Error(`the loaded proxy has not started yet:\n${text.slice(-3000)}`);
      },
      { timeout: 60_000, interval: 200 },
    );
    // Loopback is all the container has.
    const interfaces = await carriedOk([
      'exec',
      name,
      'node',
      '-e',
      'console.log(Object.keys(require("node:os").networkInterfaces()).join(" "))',
    ]);
    expect(interfaces.trim()).toBe('lo');
    // A generous --timeout-ms: the machine may be busy.
    const verify = await carried(['exec', name, 'redis-lock-proxy', 'verify', '--via', '127.0.0.1:6380', '--timeout-ms', '60000'], 120_000);
    expect(verify, `${verify.stderr}\n${await logs()}`).toMatchObject({ code: 0 });
    expect(verify.stdout).toMatch(/^verify: OK: \d+ rule\(s\) enforce the fix through 127\.0\.0\.1:6380/);
  });
});
