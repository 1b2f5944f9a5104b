/**
 * examples/compose/compose.yaml run by Compose against the engine's Docker
 * API (docker-compose 2 with podman here), as shipped but for the Stalwart
 * service: Stalwart's image cannot be had here, so an override file replaces
 * it with a client that sends Stalwart's exact lock pipeline to
 * 127.0.0.1:6380 in its network namespace, where the proxy listens
 * (`network_mode: service:stalwart`). Its published admin port goes to a
 * port of the engine's choosing, so that parallel runs do not collide.
 *
 * The file's images: `redis:8.0.1` is found, pulled, or stood in for by the
 * Redis 8.0 server image (support/images.ts); the proxy's `build: ../..` is
 * the image built from this checkout's Dockerfile, tagged with the name
 * Compose gives a built service's image, so Compose uses it as built.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it, vi } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { ROOT } from '../support/cli.js';
import { podmanNotes } from '../support/docs.js';
import { cmd } from '../support/resp.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';
import { Container, httpGet, uniqueName } from './support/containers.js';
import { engine, engineExec, exec, execStatus } from './support/engine.js';
import { proxyImage, publicServerImage } from './support/images.js';
import { clientCommand, exchangesIn, thenQuit } from './support/lock-client.js';

const setup = inject('containers');
const COMPOSE_FILE = path.join(ROOT, 'examples/compose/compose.yaml');
const LOWERED_MS = 30_000;

interface ComposeFile {
  services: Record<string, { image?: string; build?: string; environment?: Record<string, string>; stop_grace_period?: string }>;
}
const composeFile = parseYaml(readFileSync(COMPOSE_FILE, 'utf8')) as ComposeFile;

/** `docker-compose` (Compose 2's standalone binary), or the Docker CLI's `docker compose`; the reason when neither runs. */
async function findCompose(): Promise<{ command: string[] } | { reason: string }> {
  for (const command of [['docker-compose'], ['docker', 'compose']]) {
    const version = await execStatus(command[0], [...command.slice(1), 'version', '--short'], { timeoutMs: 60_000 }).catch(() => undefined);
    if (version?.code === 0 && /^v?2\./.test(version.stdout.trim())) return { command };
  }
  return { reason: 'neither docker-compose nor `docker compose` (Compose 2) is installed' };
}

const compose = setup.skip === undefined ? await findCompose() : { reason: setup.skip };
const composeMissing = 'reason' in compose && process.env.CONTAINER_TESTS !== 'required' ? compose.reason : undefined;

describe.skipIf(setup.skip !== undefined || composeMissing !== undefined)('the Compose example', () => {
  const project = uniqueName('compose');
  let dir: string;
  const override = () => path.join(dir, 'stalwart-stand-in.yaml');
  let builtImageName: string;

  /** Runs Compose on the example and the override, as project `project`. */
  function run(args: string[], timeoutMs = 300_000, env: Record<string, string> = {}) {
    if ('reason' in compose) throw new Error(compose.reason);
    const [command, ...prefix] = compose.command;
    return exec(command, [...prefix, '--project-name', project, '--file', COMPOSE_FILE, '--file', override(), ...args], {
      timeoutMs,
      env: { ...process.env, ...env },
    });
  }

  const container = (service: string) => new Container(`${project}-${service}-1`);

  /**
   * podman schedules health checks through systemd timers, and a machine
   * without systemd has none: while `fn` runs, the project's health checks are
   * run every second, as Docker's daemon would run them (and as
   * docs/running.md tells an operator to, "Under podman").
   */
  async function withHealthChecks<T>(fn: () => Promise<T>): Promise<T> {
    if (!(await engine()).podman) return fn();
    let running = true;
    const checks = (async () => {
      while (running) {
        const ids = (await engineExec(['ps', '--quiet', '--filter', `label=com.docker.compose.project=${project}`])).stdout.split('\n');
        for (const id of ids.filter(Boolean)) await engineExec(['healthcheck', 'run', id]).catch(() => undefined);
        await new Promise((resolve) => setTimeout(resolve, 1000));
      }
    })();
    try {
      return await fn();
    } finally {
      running = false;
      await checks;
    }
  }

  const key = taskLockKey(BigInt(Date.now()) * 10n);
  const twin = taskLockKey(BigInt(Date.now()) * 10n + 1n);
  /** Stalwart's lock attempt, PEXPIRE to 30 s, the attempt again and PTTL. */
  const script = (k: Buffer) =>
    thenQuit(Buffer.concat([lockAttempt(k, 60), cmd('PEXPIRE', k, String(LOWERED_MS)), lockAttempt(k, 60), cmd('PTTL', k)]));
  /** Frames: the attempt's 4 replies (0-3), PEXPIRE's (4), the attempt again (5-8), PTTL's (9), QUIT's (10). */
  const pttlOf = (replies: string[]) => Number(/^:(-?\d+)\r\n$/.exec(replies[9])?.[1]);

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'rlp-compose-'));
    const proxy = await proxyImage();
    await publicServerImage(composeFile.services.redis.image ?? '');
    // Compose names a built service's image <project>-<service>.
    builtImageName = `${project}-redis-lock-proxy`;
    await engineExec(['tag', proxy.reference, builtImageName]);
    const client = clientCommand([
      { name: 'proxy', host: '127.0.0.1', port: 6380, bytes: script(key) },
      { name: 'redis', host: 'redis', port: 6379, bytes: script(twin) },
    ]);
    // JSON is YAML; `$$` is Compose's escape for a literal `$`.
    const json = (value: unknown) => JSON.stringify(value).replaceAll('$', '$$$$');
    writeFileSync(
      override(),
      [
        'services:',
        '  stalwart:',
        `    image: ${json(proxy.reference)}`,
        `    entrypoint: ${json(client)}`,
        `    ports: !override ["127.0.0.1::9180"]`,
        '',
      ].join('\n'),
    );
    await withHealthChecks(() => run(['up', '--detach']));
  });

  afterAll(async () => {
    await run(['down', '--volumes', '--remove-orphans']).catch(() => undefined);
    if (builtImageName) await engineExec(['rmi', builtImageName]).catch(() => undefined);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('runs the proxy in Stalwart’s network namespace, observing (rollout step 1): the lock pipeline gets Redis’s own replies', async () => {
    const logs = await vi.waitFor(
      async () => {
        const text = await container('stalwart').logs();
        if (exchangesIn(text).size < 2) throw new Error(`the client has not reported yet:\n${text}`);
        return text;
      },
      { timeout: 120_000, interval: 500 },
    );
    const replies = exchangesIn(logs);
    const [viaProxy, direct] = [replies.get('proxy') ?? [], replies.get('redis') ?? []];
    expect(viaProxy.slice(0, 9)).toEqual(direct.slice(0, 9));
    expect(viaProxy.slice(0, 4).join('')).toBe(attemptReplies(1, 1));
    expect(pttlOf(viaProxy)).toBeGreaterThan(LOWERED_MS);

    const proxy = container('redis-lock-proxy');
    const stalwartId = (await container('stalwart').inspect('{{.Id}}')).trim();
    expect((await proxy.inspect('{{.HostConfig.NetworkMode}}')).trim()).toBe(`container:${stalwartId}`);
    const started = (await proxy.logs()).split('\n').find((line) => line.includes('redis-lock-proxy listening')) ?? '';
    const environment = composeFile.services['redis-lock-proxy'].environment ?? {};
    expect(JSON.parse(started)).toMatchObject({
      mode: environment.REDIS_LOCK_PROXY_MODE,
      upstream: environment.REDIS_LOCK_PROXY_UPSTREAM,
      listen: environment.REDIS_LOCK_PROXY_LISTEN,
    });
  });

  it('publishes the proxy’s admin port on the stalwart service', async () => {
    const published = (await run(['port', 'stalwart', '9180'])).stdout.trim();
    const admin = `http://${published}`;
    expect(await httpGet(`${admin}/readyz`)).toMatchObject({ status: 200 });
    await vi.waitFor(async () =>
      expect((await httpGet(`${admin}/metrics`)).body).toMatch(
        /^redis_lock_proxy_blocks_total\{rule="stalwart-task-lock",outcome="observed"\} 2$/m,
      ),
    );
  });

  it('builds the proxy’s image with Compose as docs/running.md gives it for podman (the classic builder)', async (ctx) => {
    if (!(await engine()).podman) ctx.skip('the note is for podman’s Docker API');
    // The classic builder takes no build secret: where this run gives its builds the CAs of a
    // TLS-inspecting proxy (support/images.ts), its npm ci cannot reach the registry, and the
    // note sends an operator to the build that beforeAll stands for (podman build, tagged).
    if (process.env.NODE_EXTRA_CA_CERTS) ctx.skip('NODE_EXTRA_CA_CERTS: the classic builder cannot take the extra-ca build secret');
    const { env, file, args } = podmanNotes().composeBuild;
    expect(path.join(ROOT, file)).toBe(COMPOSE_FILE);
    await run(args, 900_000, env);
    // Compose's build, not the image tagged with its name before `up`: built without the tests' build arguments.
    const labels = JSON.parse(
      (await engineExec(['image', 'inspect', '--format', '{{json .Config.Labels}}', builtImageName])).stdout,
    ) as Record<string, string>;
    expect(labels).toMatchObject({ 'org.opencontainers.image.title': 'redis-lock-proxy', 'org.opencontainers.image.revision': 'unknown' });
  }, 900_000);

  it('stops the proxy cleanly within its stop_grace_period', async () => {
    const grace = /^(\d+)s$/.exec(composeFile.services['redis-lock-proxy'].stop_grace_period ?? '')?.[1];
    expect((await container('redis-lock-proxy').inspect('{{.Config.StopTimeout}}')).trim()).toBe(grace);
    await run(['stop', 'redis-lock-proxy']);
    expect((await container('redis-lock-proxy').inspect('{{.State.ExitCode}}')).trim()).toBe('0');
    expect(await container('redis-lock-proxy').logs()).toMatch(/"msg":"shut down"/);
  });
});
