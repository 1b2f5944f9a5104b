/**
 * `locks --release KEY` against a real Redis: it shows the lock first, deletes it only when told
 * to (--yes, or a yes from the terminal; never with --dry-run), and then only if the lock is
 * still the one shown: a lock taken again, tried, or re-armed after it was shown stays, and so
 * does one that gained or lost its expiry. A live lock (with an expiry) is refused, whatever
 * --yes or the terminal says, unless --release-live is given.
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
const pttl = async (key: Buffer): Promise<number> => Number(/^:(-?\d+)/.exec(await env.admin.call('PTTL', key))?.[1]);

/** A lock taken through the proxy, then stripped of its expiry: abandoned, as a crashed owner's lock of a bypassing node. */
async function abandonedLock(key: Buffer): Promise<void> {
  expect(await through(key)).toBe(1);
  expect(await env.admin.call('PERSIST', key)).toBe(':1\r\n');
}

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
    await abandonedLock(key);
    const result = await locksAsked(['--release', keyArgument(key).slice(1, -1)], undefined);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe(
      "will delete '\\x17\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x01': stalwart-task-lock, task 1, counter 1, ttl none, abandoned: no expiry, never expires\n",
    );
    expect(result.stderr).toBe('locks: nothing deleted: add --yes to delete this lock (or run it in a terminal to be asked)\n');
    expect(await exists(key)).toBe(true);
  });

  it('--dry-run shows the lock and deletes nothing, even with a terminal', async () => {
    const key = taskLockKey(2n);
    await abandonedLock(key);
    const result = await locksAsked(['--release-hex', key.toString('hex'), '--dry-run'], true);
    expect(result.code).toBe(0);
    expect(result.questions).toEqual([]);
    expect(result.stdout).toMatch(/^would delete '\\x17(\\x00){7}\\x02': stalwart-task-lock, task 2, .*\ndry run: nothing deleted\n$/);
    expect(await exists(key)).toBe(true);
  });

  it('asks at a terminal: no keeps the lock, yes deletes it', async () => {
    const key = taskLockKey(3n);
    await abandonedLock(key);
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
    await abandonedLock(key);
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
      ['--release-live', '--release-hex', ...[retaken, tried, rearmed, untouched].map((key) => key.toString('hex'))],
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
    await abandonedLock(key);
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

describe('locks --release of a live lock (one with an expiry)', () => {
  /** A lock held and tried by three contenders since: counter 4, an hour's expiry counting down. */
  async function contendedLock(key: Buffer): Promise<void> {
    for (const counter of [1, 2, 3, 4]) expect(await through(key)).toBe(counter);
  }

  /** The refusal line of a live task lock, contended or not. */
  function refusal(key: Buffer, counter: number): RegExp {
    const contended = counter > 1 ? ` and contended \\(counter ${counter}: others tried to take it\\)` : '';
    const word = keyArgument(key).replace(/[\\^$.*+?()[\]{}|]/g, '\\$&');
    return new RegExp(
      `^refused ${word}: stalwart-task-lock, task ${key.readBigUInt64BE(1)}, counter ${counter}, ttl \\d+\\.\\ds: ` +
        `a live lock, held${contended}; it expires by itself in \\d+\\.\\ds \\(at \\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\dZ, Redis's clock\\)\\. ` +
        'Deleting it lets another node take the lock while its holder still runs the task, so the task runs twice\\. ' +
        'Not deleted: wait for it to expire, or add --release-live to delete it anyway$',
    );
  }

  /** The key is the lock it was: the same counter, and its expiry still counting down from an hour. */
  async function stillHeld(key: Buffer, counter: number): Promise<void> {
    expect(await env.admin.call('GET', key)).toBe(`$1\r\n${counter}\r\n`);
    expect(await pttl(key)).toBeGreaterThan(3_000_000);
  }

  it('is refused with --yes: nothing deleted, the lock keeps its counter and expiry, exit 1', async () => {
    const key = taskLockKey(0x21n);
    await contendedLock(key);
    const result = await locksAsked(['--release', keyArgument(key).slice(1, -1), '--yes'], undefined);
    expect(result.code).toBe(1);
    expect(result.stdout.split('\n')).toEqual([expect.stringMatching(refusal(taskLockKey(0x21n), 4)), '']);
    expect(result.stderr).toBe('');
    await stillHeld(key, 4);
  });

  it('is refused without --yes, at a terminal too, without asking', async () => {
    const key = taskLockKey(0x22n);
    await contendedLock(key);
    for (const answer of [undefined, true]) {
      const result = await locksAsked(['--release-hex', key.toString('hex')], answer);
      expect(result.code).toBe(1);
      expect(result.questions).toEqual([]);
      expect(result.stdout.split('\n')).toEqual([expect.stringMatching(refusal(taskLockKey(0x22n), 4)), '']);
      expect(result.stderr).toBe('');
    }
    // --dry-run says the same: it would not be deleted either.
    const dry = await locksAsked(['--release-hex', key.toString('hex'), '--dry-run'], undefined);
    expect(dry.code).toBe(1);
    expect(dry.stdout.split('\n')).toEqual([expect.stringMatching(refusal(taskLockKey(0x22n), 4)), '']);
    await stillHeld(key, 4);
  });

  it('is refused on a real terminal (the built command), with no question asked', async () => {
    const key = taskLockKey(0x23n);
    expect(await through(key)).toBe(1);
    const shown = await onTerminal(
      ['locks', '--upstream', env.redis.url, '--rules', STALWART_RULES, '--release-hex', key.toString('hex')],
      'y',
    );
    expect(shown).not.toContain('[y/N]');
    expect(shown).toContain('a live lock, held; it expires by itself in');
    expect(shown).toContain('add --release-live to delete it anyway');
    await stillHeld(key, 1);
  }, 60_000);

  it('says so in --json: a refused record with the reason and when it expires', async () => {
    const key = taskLockKey(0x24n);
    await contendedLock(key);
    const result = await locksAsked(['--release-hex', key.toString('hex'), '--yes', '--json'], undefined);
    expect(result.code).toBe(1);
    expect(JSON.parse(result.stdout)).toMatchObject({
      action: 'refused',
      key_hex: key.toString('hex'),
      counter: 4,
      abandoned: false,
      reason: 'live lock: it expires by itself; --release-live deletes it',
      expires_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/),
    });
    await stillHeld(key, 4);
  });

  it('--release-live deletes it: with --yes, or once the terminal says yes to a question that says it is live', async () => {
    const first = taskLockKey(0x25n);
    const second = taskLockKey(0x26n);
    await contendedLock(first);
    await contendedLock(second);
    const withYes = await locksAsked(['--release-live', '--release-hex', first.toString('hex'), '--yes'], undefined);
    expect(withYes.code).toBe(0);
    expect(withYes.stdout.split('\n')).toEqual([
      expect.stringMatching(/^will delete '\\x17(\\x00){7}%': stalwart-task-lock, task 37, counter 4, ttl \d+\.\ds$/),
      expect.stringMatching(/^deleted '\\x17(\\x00){7}%': stalwart-task-lock, task 37, counter 4/),
      '',
    ]);
    expect(await exists(first)).toBe(false);

    const asked = await locksAsked(['--release-hex', second.toString('hex'), '--release-live'], true);
    expect(asked.questions).toEqual(['Delete this lock (live: its task may run twice), each only if unchanged since shown? [y/N] ']);
    expect(asked.code).toBe(0);
    expect(await exists(second)).toBe(false);
  });

  it('among abandoned ones: the live one is refused, the abandoned one deleted, exit 1', async () => {
    const live = taskLockKey(0x27n);
    const abandoned = taskLockKey(0x28n);
    await contendedLock(live);
    await abandonedLock(abandoned);
    const result = await locksAsked(['--release-hex', live.toString('hex'), abandoned.toString('hex'), '--yes'], undefined);
    expect(result.code).toBe(1);
    expect(result.stdout.split('\n')).toEqual([
      expect.stringMatching(refusal(taskLockKey(0x27n), 4)),
      expect.stringMatching(/^will delete '\\x17(\\x00){7}\(': stalwart-task-lock, task 40, counter 1, ttl none, abandoned/),
      expect.stringMatching(/^deleted '\\x17(\\x00){7}\(': /),
      '',
    ]);
    await stillHeld(live, 4);
    expect(await exists(abandoned)).toBe(false);
  });

  it('--release-live goes only with --release or --release-hex', async () => {
    for (const argv of [['--release-live'], ['--release-live', '--release-abandoned', '--yes']]) {
      const result = await locksAsked(argv, undefined);
      expect(result.code).toBe(2);
      expect(result.stderr).toBe(
        'redis-lock-proxy locks: --release-live only goes with --release or --release-hex: it lets them delete the live locks they name\n',
      );
    }
  });
});

describe('locks --release of a lock that gained or lost its expiry after it was shown', () => {
  it('leaves an abandoned lock that has an expiry now: it is live at the delete', async () => {
    const key = taskLockKey(0x31n);
    await abandonedLock(key);
    const result = await locksAsked(['--release-hex', key.toString('hex')], true, async () => {
      // While the operator reads the list, the lock gets an expiry, its value unchanged.
      expect(await env.admin.call('EXPIRE', key, '3600')).toBe(':1\r\n');
    });
    expect(result.code).toBe(1);
    expect(result.stdout.split('\n')[1]).toBe(
      "skipped '\\x17\\x00\\x00\\x00\\x00\\x00\\x00\\x001': it has an expiry now and had none when read (most likely released and taken again): a live lock; left alone",
    );
    expect(await env.admin.call('GET', key)).toBe('$1\r\n1\r\n');
    expect(await pttl(key)).toBeGreaterThan(3_000_000);
  });

  it('leaves an abandoned lock released and taken again before the delete, even with --release-live', async () => {
    const key = taskLockKey(0x32n);
    await abandonedLock(key);
    const result = await locksAsked(['--release-live', '--release-hex', key.toString('hex')], true, async () => {
      await env.admin.call('DEL', key);
      expect(await through(key)).toBe(1); // the same value, 1, and an expiry: a new holder
    });
    expect(result.code).toBe(1);
    expect(JSON.stringify(result.stdout.split('\n')[1])).toContain('it has an expiry now and had none when read');
    expect(await pttl(key)).toBeGreaterThan(3_000_000);
  });

  it('leaves a live lock, shown with --release-live, whose expiry was removed: it is abandoned at the delete', async () => {
    const key = taskLockKey(0x33n);
    expect(await through(key)).toBe(1);
    const result = await locksAsked(['--release-live', '--release-hex', key.toString('hex'), '--json'], true, async () => {
      expect(await env.admin.call('PERSIST', key)).toBe(':1\r\n');
    });
    expect(result.code).toBe(1);
    const records = result.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as { action: string; reason?: string });
    expect(records.map((r) => [r.action, r.reason])).toEqual([
      ['will-delete', undefined],
      ['skipped', 'now-abandoned'],
    ]);
    expect(await exists(key)).toBe(true);
    expect(await pttl(key)).toBe(-1);
  });
});
