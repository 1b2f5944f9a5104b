/** The operator commands (verify, locks) run in-process, as the CLI dispatcher runs them, their output captured. */
import type { Io } from '../../src/ops/command.js';

export interface OpResult {
  code: number;
  stdout: string;
  stderr: string;
}

export type Op = (argv: string[], io: Io) => Promise<number>;

/** Runs a subcommand with `environment` as its whole environment. */
export async function runOp(op: Op, argv: string[], environment: NodeJS.ProcessEnv = {}): Promise<OpResult> {
  let stdout = '';
  let stderr = '';
  const code = await op(argv, {
    stdout: (text) => (stdout += text),
    stderr: (text) => (stderr += text),
    env: environment,
  });
  return { code, stdout, stderr };
}
