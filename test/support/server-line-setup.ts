/**
 * Runs before each test file of a server-line project (server-lines.ts): the redis-server and
 * redis-cli that the file's tests start from the PATH must be the line's, or the file fails here
 * rather than test another server unnoticed.
 */
import { spawnSync } from 'node:child_process';
import { LINE_VERSION_ENV } from './server-lines.js';

const version = process.env[LINE_VERSION_ENV];
if (!version) throw new Error(`${LINE_VERSION_ENV} is not set: this setup file belongs to a server-line project (server-lines.ts)`);
for (const binary of ['redis-server', 'redis-cli']) {
  const ran = spawnSync(binary, ['--version'], { encoding: 'utf8' });
  const said = `${ran.stdout ?? ''}${ran.stderr ?? ''}`.trim() || String(ran.error);
  // redis-server says `Redis server v=6.0.16 ...`, redis-cli `redis-cli 6.0.16`.
  if (!new RegExp(`(^|[ =])${version.replaceAll('.', '\\.')}( |$)`).test(said)) {
    throw new Error(
      `the ${binary} on this test process's PATH is not ${version}: it says ${JSON.stringify(said)} (PATH=${process.env.PATH})`,
    );
  }
}
