/**
 * examples/compose/compose.yaml run by Compose against the engine's Docker
 * API (docker-compose 2 with podman here), as shipped but for the Stalwart
 * service: Stalwart's image cannot be had here, so an override file replaces
 * it with a client that sends Stalwart's exact lock pipeline to
 * 127.0.0.1:6380 in the proxy's network namespace, which it joins
 * (`network_mode: service:redis-lock-proxy`). The proxy's published ports
 * become only its admin port, on a port of the engine's choosing, so that
 * parallel runs do not collide. The start order is checked both ways: the
 * stand-in starts only after the proxy's health check has passed, and not at
 * all when the proxy cannot start.
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

/** A time the engine prints in JSON (RFC 3339, nanoseconds), in milliseconds; NaN for a container never started. */
function engineTime(json: string): number {
  const time = Date.parse(JSON.parse(json) as string);
  return time > 0 ? time : NaN;
}

/**
 * One Compose project of the example and an override file: its own project name (so its
 * containers, network and volumes are its own), run and removed by the test.
 */
class ComposeProject {
  readonly name = uniqueName('compose');
  /** When each container's health check first passed: the time the passing check began (podman, where the test runs them). */
  private readonly firstPassed = new Map<string, number>();

  constructor(private readonly override: string) {}

  /** Runs Compose on the example and the override. */
  run(args: string[], timeoutMs = 300_000, env: Record<string, string> = {}) {
    if ('reason' in compose) throw new Error(compose.reason);
    const [command, ...prefix] = compose.command;
    return exec(command, [...prefix, '--project-name', this.name, '--file', COMPOSE_FILE, '--file', this.override, ...args], {
      timeoutMs,
      env: { ...process.env, ...env },
    });
  }

  container(service: string): Container {
    return new Container(`${this.name}-${service}-1`);
  }

  /**
   * podman schedules health checks through systemd timers, and a machine
   * without systemd has none: while `fn` runs, the project's health checks are
   * run every second, as Docker's daemon would run them (and as
   * docs/running.md tells an operator to, "Under podman").
   */
  async withHealthChecks<T>(fn: () => Promise<T>): Promise<T> {
    if (!(await engine()).podman) return fn();
    let running = true;
    const checks = (async () => {
      while (running) {
        const names = (await engineExec(['ps', '--format', '{{.Names}}', '--filter', `label=com.docker.compose.project=${this.name}`]))
          .stdout;
        for (const name of names.split('\n').filter(Boolean)) {
          const began = Date.now();
          const passed = await engineExec(['healthcheck', 'run', name]).then(
            () => true,
            () => false,
          );
          if (passed && !this.firstPassed.has(name)) this.firstPassed.set(name, began);
        }
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

  /**
   * The earliest moment the service's container can have become healthy: under podman, when the
   * first check that passed began; under Docker, when the earliest passing check in its health
   * log ended.
   */
  async healthySince(service: string): Promise<number> {
    const container = this.container(service);
    if ((await engine()).podman) return this.firstPassed.get(container.name) ?? NaN;
    const health = JSON.parse(await container.inspect('{{json .State.Health}}')) as { Log?: Array<{ End: string; ExitCode: number }> };
    const passed = (health.Log ?? []).filter((check) => check.ExitCode === 0).map((check) => Date.parse(check.End));
    return passed.length ? Math.min(...passed) : NaN;
  }

  /** When the service's container started; NaN if it never did. */
  async startedAt(service: string): Promise<number> {
    return engineTime(await this.container(service).inspect('{{json .State.StartedAt}}'));
  }

  async down(): Promise<void> {
    await this.run(['down', '--volumes', '--remove-orphans']).catch(() => undefined);
  }
}

describe.skipIf(setup.skip !== undefined || composeMissing !== undefined)('the Compose example', () => {
  let dir: string;
  let project: ComposeProject;
  let builtImageName: string;
  let proxyReference: string;

  const key = taskLockKey(BigInt(Date.now()) * 10n);
  const twin = taskLockKey(BigInt(Date.now()) * 10n + 1n);
  /** Stalwart's lock attempt, PEXPIRE to 30 s, the attempt again and PTTL. */
  const script = (k: Buffer) =>
    thenQuit(Buffer.concat([lockAttempt(k, 60), cmd('PEXPIRE', k, String(LOWERED_MS)), lockAttempt(k, 60), cmd('PTTL', k)]));
  /** Frames: the attempt's 4 replies (0-3), PEXPIRE's (4), the attempt again (5-8), PTTL's (9), QUIT's (10). */
  const pttlOf = (replies: string[]) => Number(/^:(-?\d+)\r\n$/.exec(replies[9])?.[1]);

  /**
   * An override file: Stalwart's stand-in in place of `stalwart`, the proxy's ports narrowed to
   * its admin port on a port of the engine's choosing, and `proxyEnvironment` added to the proxy's.
   */
  function writeOverride(file: string, proxyEnvironment: Record<string, string> = {}): string {
    const client = clientCommand([
      { name: 'proxy', host: '127.0.0.1', port: 6380, bytes: script(key) },
      { name: 'redis', host: 'redis', port: 6379, bytes: script(twin) },
    ]);
    // JSON is YAML; `$$` is Compose's escape for a literal `$`.
    const json = (value: unknown) => JSON.stringify(value).replaceAll('$', '$$$$');
    const override = path.join(dir, file);
    writeFileSync(
      override,
      [
        'services:',
        '  redis-lock-proxy:',
        `    ports: !override ["127.0.0.1::9180"]`,
        ...(Object.keys(proxyEnvironment).length ? [`    environment: ${json(proxyEnvironment)}`] : []),
        '  stalwart:',
        `    image: ${json(proxyReference)}`,
        `    entrypoint: ${json(client)}`,
        '',
      ].join('\n'),
    );
    return override;
  }

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'rlp-compose-'));
    const proxy = await proxyImage();
    proxyReference = proxy.reference;
    await publicServerImage(composeFile.services.redis.image ?? '');
    project = new ComposeProject(writeOverride('stalwart-stand-in.yaml'));
    // Compose names a built service's image <project>-<service>.
    builtImageName = `${project.name}-redis-lock-proxy`;
    await engineExec(['tag', proxy.reference, builtImageName]);
    await project.withHealthChecks(() => project.run(['up', '--detach']));
  });

  afterAll(async () => {
    await project?.down();
    if (builtImageName) await engineExec(['rmi', builtImageName]).catch(() => undefined);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('runs Stalwart in the proxy’s network namespace, observing (rollout step 1): the lock pipeline gets Redis’s own replies', async () => {
    const logs = await vi.waitFor(
      async () => {
        const text = await project.container('stalwart').logs();
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

    const proxy = project.container('redis-lock-proxy');
    const proxyId = (await proxy.inspect('{{.Id}}')).trim();
    expect((await project.container('stalwart').inspect('{{.HostConfig.NetworkMode}}')).trim()).toBe(`container:${proxyId}`);
    const started = (await proxy.logs()).split('\n').find((line) => line.includes('redis-lock-proxy listening')) ?? '';
    const environment = composeFile.services['redis-lock-proxy'].environment ?? {};
    expect(JSON.parse(started)).toMatchObject({
      mode: environment.REDIS_LOCK_PROXY_MODE,
      upstream: environment.REDIS_LOCK_PROXY_UPSTREAM,
      listen: environment.REDIS_LOCK_PROXY_LISTEN,
    });
  });

  it('starts Stalwart only once the proxy’s health check has passed', async () => {
    const healthy = await project.healthySince('redis-lock-proxy');
    const stalwartStarted = await project.startedAt('stalwart');
    expect(healthy, 'the proxy’s health check never passed').not.toBeNaN();
    expect(stalwartStarted, 'Stalwart’s stand-in never started').not.toBeNaN();
    expect(stalwartStarted).toBeGreaterThan(healthy);
    // And the proxy after Redis's health check, so that its own check (/readyz) can pass.
    expect(await project.startedAt('redis-lock-proxy')).toBeGreaterThan(await project.healthySince('redis'));
  });

  it('does not start Stalwart when the proxy cannot start', async () => {
    const failing = new ComposeProject(writeOverride('proxy-misconfigured.yaml', { REDIS_LOCK_PROXY_MODE: 'observant' }));
    const failingImage = `${failing.name}-redis-lock-proxy`;
    await engineExec(['tag', proxyReference, failingImage]);
    try {
      const up = await failing.withHealthChecks(() => failing.run(['up', '--detach'], 300_000).catch((err: Error) => err));
      expect(up, '`up` succeeded with a proxy that cannot start').toBeInstanceOf(Error);
      const proxy = failing.container('redis-lock-proxy');
      expect((await proxy.inspect('{{.State.ExitCode}}')).trim()).toBe('2');
      expect(await proxy.logs()).toContain('REDIS_LOCK_PROXY_MODE: mode must be enforce or observe, got "observant"');
      // Created by `up` at most, never started.
      const stalwart = await failing.startedAt('stalwart').catch(() => NaN);
      expect(stalwart, 'Stalwart’s stand-in started without the proxy').toBeNaN();
    } finally {
      await failing.down();
      await engineExec(['rmi', failingImage]).catch(() => undefined);
    }
  });

  it('publishes the proxy’s admin port on its own service', async () => {
    const published = (await project.run(['port', 'redis-lock-proxy', '9180'])).stdout.trim();
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
    await project.run(args, 900_000, env);
    // Compose's build, not the image tagged with its name before `up`: built without the tests' build arguments.
    const labels = JSON.parse(
      (await engineExec(['image', 'inspect', '--format', '{{json .Config.Labels}}', builtImageName])).stdout,
    ) as Record<string, string>;
    expect(labels).toMatchObject({ 'org.opencontainers.image.title': 'redis-lock-proxy', 'org.opencontainers.image.revision': 'unknown' });
  }, 900_000);

  it('stops the proxy cleanly within its stop_grace_period', async () => {
    const grace = /^(\d+)s$/.exec(composeFile.services['redis-lock-proxy'].stop_grace_period ?? '')?.[1];
    const proxy = project.container('redis-lock-proxy');
    expect((await proxy.inspect('{{.Config.StopTimeout}}')).trim()).toBe(grace);
    await project.run(['stop', 'redis-lock-proxy']);
    expect((await proxy.inspect('{{.State.ExitCode}}')).trim()).toBe('0');
    expect(await proxy.logs()).toMatch(/"msg":"shut down"/);
  });
});
