/**
 * The notes for podman in docs/running.md, as far as this host can check them without an engine:
 * the ulimits they give are those `.ci/container-engine.sh` makes the container tests run with,
 * the health checks they run by hand are those the Compose example waits on, and the build
 * they give builds the Compose example's proxy. The container tests run them for real: the image
 * under the documented ulimits (containers/image.test.ts), Compose's health checks run by hand
 * and the documented build (containers/compose.test.ts).
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { ROOT } from './support/cli.js';
import { podmanNotes } from './support/docs.js';

describe('docs/running.md, under podman', () => {
  const notes = podmanNotes();

  it('gives one set of ulimits, for one container and for all: what .ci/container-engine.sh gives the container tests', async () => {
    expect(notes.ulimits.length).toBe(2);
    expect(notes.defaultUlimits).toEqual(notes.ulimits);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-containers-conf-'));
    try {
      const { stdout } = await promisify(execFile)(
        'bash',
        ['-c', 'source .ci/container-engine.sh && write_containers_conf && cat "$CONTAINERS_CONF" && ulimit -Hn && ulimit -Hu'],
        { cwd: ROOT, env: { ...process.env, CONTAINER_CACHE: dir } },
      );
      const written = /^default_ulimits = (\[.*\])$/m.exec(stdout)?.[1];
      const [hardFiles, hardProcesses] = stdout.trimEnd().split('\n').slice(-2);
      const files = hardFiles === 'unlimited' ? 1048576 : Number(hardFiles);
      const processes = hardProcesses === 'unlimited' ? 32768 : Math.min(Number(hardProcesses), 32768);
      // The same limits, with this host's open-file limit; the process limit as documented, or lower where the host says so.
      expect(JSON.parse(written ?? '[]')).toEqual([`nofile=${files}:${files}`, `nproc=${processes}:${processes}`]);
      expect(notes.ulimits[1]).toBe('nproc=32768:32768');
      expect(notes.ulimits[0]).toMatch(/^nofile=(\d+):\1$/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('runs by hand the health checks the Compose example waits on, in the order it waits', () => {
    const file = path.join(ROOT, 'examples/compose/compose.yaml');
    const compose = parseYaml(fs.readFileSync(file, 'utf8')) as {
      services: Record<string, { healthcheck?: unknown; depends_on?: Record<string, { condition: string }> | string[] }>;
    };
    const waitedOn = Object.values(compose.services).flatMap((service) =>
      Array.isArray(service.depends_on) || !service.depends_on
        ? []
        : Object.entries(service.depends_on)
            .filter(([, dependency]) => dependency.condition === 'service_healthy')
            .map(([name]) => name),
    );
    // Redis before the proxy, the proxy before Stalwart.
    expect(waitedOn).toEqual(['redis', 'redis-lock-proxy']);
    for (const name of waitedOn) expect(compose.services[name].healthcheck, name).toBeDefined();
    // Compose's name for the service's container: <project>-<service>-1, the project named after the file's directory.
    const project = path.basename(path.dirname(file));
    expect(notes.healthCheck).toBe(
      waitedOn.map((name) => `until podman healthcheck run ${project}-${name}-1; do sleep 1; done`).join('\n'),
    );
  });

  it("builds the Compose example's proxy with the classic builder, or else under the name Compose gives it", () => {
    expect(notes.composeBuild).toEqual({ env: { DOCKER_BUILDKIT: '0' }, file: 'examples/compose/compose.yaml', args: ['build'] });
    const compose = parseYaml(fs.readFileSync(path.join(ROOT, notes.composeBuild.file), 'utf8')) as {
      services: Record<string, { build?: string }>;
    };
    expect(Object.keys(compose.services).filter((name) => compose.services[name].build !== undefined)).toEqual(['redis-lock-proxy']);
    // Behind a TLS-inspecting proxy, built by podman under Compose's name for it: <project>-<service>.
    expect(notes.composeImage).toBe(`${path.basename(path.dirname(notes.composeBuild.file))}-redis-lock-proxy`);
  });
});
