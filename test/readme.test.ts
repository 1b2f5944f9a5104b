/**
 * The documentation (README.md and docs/*.md): every setting the proxy has is
 * documented in it, with its flag and its environment variable, and every flag
 * any of its files mentions exists.
 */
import { describe, expect, it } from 'vitest';
import { envName, OPTIONS } from '../src/settings.js';
import { PROGRAM_FLAGS } from './support/cli-flags.js';
import { docFiles, docsText } from './support/docs.js';

/** Flags of other programs quoted in the documentation. */
const OTHER_FLAGS = new Set([
  'build-arg',
  'signal',
  'force-recreate',
  // docker run and docker compose run, for a one-off check
  'rm',
  'no-deps',
  'from-file',
  'network',
  'env-file',
  'pipe',
  'name',
  'appendonly',
  // docker/podman run and build in the container section
  'read-only',
  'read-only-tmpfs',
  'memory',
  'format',
  'secret',
  // npm, useradd and systemctl in the systemd steps
  'prefix',
  'system',
  'no-create-home',
  'shell',
  'now',
  'allow-scripts',
  'quiet',
  // git and Redis's own test suite (runtest), run against the proxy
  'branch',
  'enable-debug-command',
  'enable-protected-configs',
  'enable-module-command',
  'host',
  'port',
  'tags',
  'single',
  // podman's ulimits, and mmdebstrap for a base image built from Debian packages
  'ulimit',
  'variant',
  // podman's and Docker's run of an image carried in
  'pull',
]);

describe('README.md and docs/', () => {
  it('document every setting, its flag and its environment variable', () => {
    const docs = docsText();
    for (const name of Object.keys(OPTIONS)) {
      expect(docs, `--${name}`).toContain(`--${name}`);
      const variable = envName(name);
      const short = variable.replace(/^(REDIS_LOCK_PROXY_\w+?)_(KEY|PASSWORD)$/, '_$2');
      expect(docs.includes(variable) || docs.includes(short), variable).toBe(true);
    }
  });

  it('mention no flag the proxy does not have, in any file', () => {
    const known = new Set([...PROGRAM_FLAGS, ...OTHER_FLAGS]);
    const unknown = docFiles().flatMap(({ file, text }) =>
      // Link targets are not text: an anchor such as #docker-compose-stalwart--proxy-sidecar--redis names no flag.
      [...new Set([...text.replace(/\]\([^)]*\)/g, ']()').matchAll(/`[^`]*?--([a-z][a-z0-9-]+)/g)].map((m) => m[1]))]
        .filter((flag) => !known.has(flag))
        .map((flag) => `${file}: --${flag}`),
    );
    expect(unknown).toEqual([]);
  });
});
