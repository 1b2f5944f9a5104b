/** Every flag redis-lock-proxy takes: its settings, its command-line-only flags, and those of verify and locks. */
import { LOCKS_FLAGS } from '../../src/ops/locks.js';
import { VERIFY_FLAGS } from '../../src/ops/verify.js';
import { COMMAND_LINE_ONLY_FLAGS, OPTIONS } from '../../src/settings.js';

export const PROGRAM_FLAGS: ReadonlySet<string> = new Set([
  ...Object.keys(OPTIONS),
  ...Object.keys(COMMAND_LINE_ONLY_FLAGS),
  ...Object.keys(VERIFY_FLAGS),
  ...Object.keys(LOCKS_FLAGS),
]);
