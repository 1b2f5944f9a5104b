/**
 * `locks --release KEY` against a real Redis: it shows the lock first, deletes it only when told
 * to (--yes, or a yes from the terminal; never with --dry-run), and then only if the lock is
 * still the one shown: a lock taken again, tried, or re-armed after it was shown stays.
 */
import { spawn } from 'node:child_process';
import { beforeAll, describe, expect, it } from 'vitest';
import { keyArgument } from '../../src/key-text.js';
import type { Io } from '../../src/ops/command.js';
import { run as locks } from '../../src/ops/locks.js';
import { CLI, cleanEnv, ensureBuilt } from '../support/cli.js';
import { STALWART_RULES } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { attemptCounter, taskLockKey } from '../support/stalwart.js';

const env = redisAndProxy();

beforeAll(async () => {
  await ensureBuilt();
});

/**
 * The built command on a real terminal (a pseudo-terminal made by util-linux's `script`), with
 * `answer` typed once it asks. Resolves with everything the terminal showed.
 */
function onTerminal(args: string[], answer: string): Promise<string> {
  const quoted = [process.execPath, CLI, ...args].map((arg) => `'${arg.replaceAll("'", "'\\''")}'`).join(' ');
  const child = spawn('script', ['-qec', quoted, '/dev/null'], { env: cleanEnv(), stdio: ['pipe', 'pipe', 'pipe'] });
  let shown = '';
  let answered = false;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`no end on the terminal; it showed: ${JSON.stringify(shown)}`));
    }, 20_000);
    child.stdout.on('data', (chunk: Buffer) => {
      shown += chunk.toString('utf8');
      if (!answered && shown.includes('[y/N]')) {
        answered = true;
        child.stdin.write(`${answer}\n`);
      }
    });
    child.on('close', () => {
      clearTimeout(timer);
      resolve(shown);
    });
  });
}

const through = (key: Buffer): Promise<number> => attemptCounter(env.proxy.port, key, 3600);
const exists = async (key: Buffer): Promise<boolean> => (await env.admin.call('EXISTS', key)) === ':1\r\n';

/** `locks` with the person at the terminal answering `answer` (after `meanwhile`, if given). */
async function locksAsked(argv: string[], answer: boolean | undefined, meanwhile?: () => Promise<void>) {
  let stdout = '';
  let stderr = '';
  const questions: string[] = [];
  const io: Io = {
    stdout: (text) => (stdout += text),
    stderr: (text) => (stderr += text),
    env: {},
    confirm:
      answer === undefined
        ? undefined
        : async (question) => {
            questions.push(question);
            await meanwhile?.();
            return answer;
          },
  };
  const code = await locks(['--upstream', env.redis.url, '--rules', STALWART_RULES, ...argv], io);
  return { code, stdout, stderr, questions };
}

describe('locks --release', () => {
  it('deletes nothing without --yes when nobody can be asked (a script), and says what to add', async () => {
    const key = taskLockKey(1n);
    expect(await through(key)).toBe(1); // taken a moment ago
    const result = await locksAsked(['--release', keyArgument(key).slice(1, -1)], undefined);
    expect(result.code).toBe(1);
    expect(result.stdout).toMatch(/^will delete '\\x17(\\x00){7}\\x01': stalwart-task-lock, task 1, counter 1, ttl \d+\.\ds\n$/);
    expect(result.stderr).toBe('locks: nothing deleted: add --yes to delete this lock (or run it in a terminal to be asked)\n');
    expect(await exists(key)).toBe(true);
  });

  it('--dry-run shows the lock and deletes nothing, even with a terminal', async () => {
    const key = taskLockKey(2n);
    expect(await through(key)).toBe(1);
    const result = await locksAsked(['--release-hex', key.toString('hex'), '--dry-run'], true);
    expect(result.code).toBe(0);
    expect(result.questions).toEqual([]);
    expect(result.stdout).toMatch(/^would delete '\\x17(\\x00){7}\\x02': stalwart-task-lock, task 2, .*\ndry run: nothing deleted\n$/);
    expect(await exists(key)).toBe(true);
  });

  it('asks at a terminal: no keeps the lock, yes deletes it', async () => {
    const key = taskLockKey(3n);
    expect(await through(key)).toBe(1);
    const declined = await locksAsked(['--release-hex', key.toString('hex')], false);
    expect(declined.questions).toEqual(['Delete this lock, each only if unchanged since shown? [y/N] ']);
    expect([declined.code, declined.stderr]).toEqual([1, 'locks: nothing deleted\n']);
    expect(await exists(key)).toBe(true);

    const accepted = await locksAsked(['--release-hex', key.toString('hex')], true);
    expect(accepted.code).toBe(0);
    expect(accepted.stdout.split('\n')[1]).toMatch(/^deleted '\\x17(\\x00){7}\\x03': stalwart-task-lock, task 3, counter 1/);
    expect(await exists(key)).toBe(false);
  });

  it('asks on a real terminal (the built command): n keeps the lock, y deletes it', async () => {
    const key = taskLockKey(9n);
    expect(await through(key)).toBe(1);
    const args = ['locks', '--upstream', env.redis.url, '--rules', STALWART_RULES, '--release-hex', key.toString('hex')];
    const declined = await onTerminal(args, 'n');
    expect(declined).toContain('Delete this lock, each only if unchanged since shown? [y/N]');
    expect(declined).toContain('locks: nothing deleted');
    expect(await exists(key)).toBe(true);
    const accepted = await onTerminal(args, 'y');
    expect(accepted).toMatch(/deleted '\\x17(\\x00){7}\\x09': stalwart-task-lock, task 9, counter 1/);
    expect(await exists(key)).toBe(false);
  }, 60_000);

  it('leaves a lock that was released and taken again, tried, or re-armed after it was shown', async () => {
    const retaken = taskLockKey(4n);
    const tried = taskLockKey(5n);
    const rearmed = taskLockKey(6n);
    const untouched = taskLockKey(7n);
    for (const key of [retaken, tried, rearmed, untouched]) expect(await through(key)).toBe(1);
    const result = await locksAsked(
      ['--release-hex', ...[retaken, tried, rearmed, untouched].map((key) => key.toString('hex'))],
      true,
      async () => {
        // While the operator reads the list: another node takes 4 again (same value 1, a new
        // expiry), a contender tries 5, and something re-arms 6 without changing its value.
        await env.admin.call('DEL', retaken);
        await new Promise((resolve) => setTimeout(resolve, 20));
        expect(await through(retaken)).toBe(1);
        expect(await through(tried)).toBe(2);
        expect(await env.admin.call('EXPIRE', rearmed, '7200')).toBe(':1\r\n');
      },
    );
    expect(result.code).toBe(1);
    const outcome = result.stdout.split('\n').slice(4, 8);
    expect(outcome).toEqual([
      expect.stringMatching(/^skipped '\\x17(\\x00){7}\\x04': changed since it was read/),
      expect.stringMatching(/^skipped '\\x17(\\x00){7}\\x05': changed since it was read/),
      expect.stringMatching(/^skipped '\\x17(\\x00){7}\\x06': changed since it was read/),
      expect.stringMatching(/^deleted '\\x17(\\x00){7}\\x07': /),
    ]);
    for (const key of [retaken, tried, rearmed]) expect(await exists(key)).toBe(true);
    expect(await exists(untouched)).toBe(false);
  });

  it('--yes deletes at once, and --json says what happened to each key', async () => {
    const key = taskLockKey(8n);
    expect(await through(key)).toBe(1);
    const result = await locksAsked(['--release-hex', key.toString('hex'), '--yes', '--json'], undefined);
    expect(result.code).toBe(0);
    const records = result.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as { action: string; key_hex: string });
    expect(records.map((r) => [r.action, r.key_hex])).toEqual([
      ['will-delete', key.toString('hex')],
      ['deleted', key.toString('hex')],
    ]);
    expect(await exists(key)).toBe(false);
  });
});
