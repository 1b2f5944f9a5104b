/** Every flag of this package: the proxy's settings and command-line-only flags, verify's, locks', the benchmark's, the integrity stress's and Redis's suite runner's. */
import { LOCKS_FLAGS } from '../../src/ops/locks.js';
import { BENCH_FLAGS } from '../bench/flags.js';
import { SUITE_FLAGS } from '../redis-suite/flags.js';
import { STRESS_FLAGS } from '../stress/flags.js';
import { VERIFY_FLAGS } from '../../src/ops/verify.js';
import { COMMAND_LINE_ONLY_FLAGS, OPTIONS } from '../../src/settings.js';

export const PROGRAM_FLAGS: ReadonlySet<string> = new Set([
  ...Object.keys(OPTIONS),
  ...Object.keys(COMMAND_LINE_ONLY_FLAGS),
  ...Object.keys(VERIFY_FLAGS),
  ...Object.keys(LOCKS_FLAGS),
  ...Object.keys(BENCH_FLAGS),
  ...Object.keys(STRESS_FLAGS),
  ...Object.keys(SUITE_FLAGS),
]);
