/**
 * The README is the front door: every setting the proxy has is documented
 * there, with its environment variable, and every flag it mentions exists.
 */
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { envName, OPTIONS } from '../src/settings.js';
import { PROGRAM_FLAGS } from './support/cli-flags.js';

const README = fs.readFileSync(path.resolve(import.meta.dirname, '../README.md'), 'utf8');
/** Flags of other programs quoted in the README. */
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
  // git and Redis's own test suite (runtest), run against the proxy
  'branch',
  'enable-debug-command',
  'host',
]);

describe('README', () => {
  it('documents every setting, its flag and its environment variable', () => {
    for (const name of Object.keys(OPTIONS)) {
      expect(README, `--${name}`).toContain(`--${name}`);
      const variable = envName(name);
      const short = variable.replace(/^(REDIS_LOCK_PROXY_\w+?)_(KEY|PASSWORD)$/, '_$2');
      expect(README.includes(variable) || README.includes(short), variable).toBe(true);
    }
  });

  it('mentions no flag the proxy does not have', () => {
    const known = new Set([...PROGRAM_FLAGS, ...OTHER_FLAGS]);
    const mentioned = new Set([...README.matchAll(/`[^`]*?--([a-z][a-z0-9-]+)/g)].map((m) => m[1]));
    const unknown = [...mentioned].filter((flag) => !known.has(flag));
    expect(unknown).toEqual([]);
  });
});
