/**
 * The rewrite decision: integer rules (checked against Redis itself as the
 * oracle), the block matcher, and the translation of the script's reply.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BlockMatcher, BlockStep } from '../src/lock/block-matcher.js';
import { isRedisInteger, isRewritableExpiry } from '../src/lock/integers.js';
import { encodeLockCall, LOCK_SCRIPT, LOCK_SCRIPT_SHA, translateScriptReply } from '../src/lock/script.js';
import { RequestScanner } from '../src/resp/request-scanner.js';
import { createRuleSet, parseRuleFile } from '../src/rules/loader.js';
import { startRedis, type RedisServer } from './support/redis.js';
import { cmd, RawClient } from './support/resp.js';
import { attemptReplies, lockAttempt, taskLockKey } from './support/stalwart.js';
import { frameHeads } from './support/scan.js';

const rules = createRuleSet(parseRuleFile('rules:\n  - name: locks\n    prefix: "lock:"\n', 'test.yaml').rules, ['test.yaml']);

/** Feeds a whole byte stream and returns the matcher's answer for each frame after the first (MULTI). */
function match(bytes: Buffer, ruleSet = rules): { accepted: boolean[]; step: BlockStep; matcher: BlockMatcher } {
  const matcher = new BlockMatcher();
  const accepted: boolean[] = [];
  let first = true;
  for (const { scanner } of frameHeads(bytes)) {
    if (first) {
      expect(BlockMatcher.isBlockStart(scanner)).toBe(true);
      matcher.reset();
      first = false;
    } else {
      accepted.push(matcher.accept(scanner, ruleSet));
    }
  }
  return { accepted, step: matcher.step, matcher };
}

describe('BlockMatcher.couldStillAccept', () => {
  /** After MULTI and `before` (whole frames), feeds the unfinished `partial` and asks. */
  function ask(before: Buffer[], partial: string): boolean {
    const scanner = new RequestScanner();
    const matcher = new BlockMatcher();
    const bytes = Buffer.concat([cmd('MULTI'), ...before, Buffer.from(partial)]);
    for (const { scanner: head } of frameHeads(bytes, scanner)) {
      if (BlockMatcher.isBlockStart(head) && matcher.step === BlockStep.Increment && matcher.rule === undefined) matcher.reset();
      else expect(matcher.accept(head, rules)).toBe(true);
    }
    return matcher.couldStillAccept(scanner);
  }

  it('waits for what may be the next command of the block, and not for anything else', () => {
    expect(ask([], '*3\r\n$6\r\nINCR')).toBe(true);
    expect(ask([], '*2\r\n$4\r\nIN')).toBe(true);
    expect(ask([], '*4')).toBe(false);
    expect(ask([], '*2\r\n$3\r\nGE')).toBe(false);
    expect(ask([], '*3\r\n$6\r\nEXPIRE')).toBe(false);
    const incr = cmd('INCRBY', 'lock:a', '1');
    expect(ask([incr], '*3\r\n$7\r\nPEXPI')).toBe(true);
    expect(ask([incr], '*3\r\n$6\r\nEXPIRE\r\n$6\r\nlock:')).toBe(true);
    expect(ask([incr], '*1\r\n$4\r\nEXEC')).toBe(false);
    expect(ask([incr, cmd('EXPIRE', 'lock:a', '9')], '*1\r\n$4\r\nEX')).toBe(true);
    expect(ask([incr, cmd('EXPIRE', 'lock:a', '9')], '*1\r\n$7\r\nDISC')).toBe(false);
  });
});

describe('isRedisInteger', () => {
  it('follows string2ll', () => {
    for (const ok of ['0', '1', '-1', '42', '9223372036854775807', '-9223372036854775808']) {
      expect(isRedisInteger(Buffer.from(ok)), ok).toBe(true);
    }
    for (const bad of ['', '-', '+1', '01', '-0', '00', ' 1', '1 ', '1.0', '9223372036854775808', '-9223372036854775809', '1e3', '0x10']) {
      expect(isRedisInteger(Buffer.from(bad)), bad).toBe(false);
    }
  });

  describe('agrees with Redis on arbitrary strings', () => {
    let redis: RedisServer;
    let client: RawClient;
    beforeAll(async () => {
      redis = await startRedis();
      client = await RawClient.connect(redis.port);
    });
    afterAll(async () => {
      await client?.close();
      await redis?.stop();
    });

    it('INCRBY accepts exactly the deltas isRedisInteger accepts', async () => {
      const digitsy = fc.stringMatching(/^[-+0 ]?[0-9]{0,20}$/);
      const samples = fc.sample(
        fc.oneof(digitsy, fc.string({ maxLength: 6 }), fc.bigInt({ min: -(2n ** 64n), max: 2n ** 64n }).map(String)),
        400,
      );
      for (const delta of samples) {
        client.write(Buffer.concat([cmd('SET', 'n', '0'), cmd('INCRBY', 'n', delta)]));
        const reply = (await client.readReplies(2)).toString('latin1');
        const redisAccepts = !reply.includes('-ERR value is not an integer');
        expect(isRedisInteger(Buffer.from(delta)), JSON.stringify(delta)).toBe(redisAccepts);
      }
    });
  });
});

describe('isRewritableExpiry', () => {
  it('takes positive expiries up to the limit only', () => {
    expect(isRewritableExpiry(Buffer.from('3600'), false)).toBe(true);
    expect(isRewritableExpiry(Buffer.from('1000000000000'), false)).toBe(true);
    expect(isRewritableExpiry(Buffer.from('1000000000001'), false)).toBe(false);
    expect(isRewritableExpiry(Buffer.from('1000000000000000'), true)).toBe(true);
    for (const bad of ['0', '-1', '+5', '05', '', '1.5', '99999999999999999999']) {
      expect(isRewritableExpiry(Buffer.from(bad), false), bad).toBe(false);
    }
  });
});

describe('BlockMatcher', () => {
  it('matches the Stalwart shape and captures the call', () => {
    const { accepted, step, matcher } = match(lockAttempt('lock:1', 3600));
    expect(accepted).toEqual([true, true, true]);
    expect(step).toBe(BlockStep.Complete);
    const call = matcher.call();
    expect(call.key.toString()).toBe('lock:1');
    expect(call.increment).toBe('INCRBY');
    expect(call.delta.toString()).toBe('1');
    expect(call.expire).toBe('EXPIRE');
    expect(call.ttl.toString()).toBe('3600');
  });

  it('matches INCR / PEXPIRE in any letter case', () => {
    const bytes = Buffer.concat([cmd('multi'), cmd('Incr', 'lock:2'), cmd('pExpire', 'lock:2', '1500'), cmd('exec')]);
    const { accepted, matcher } = match(bytes);
    expect(accepted).toEqual([true, true, true]);
    expect(matcher.call()).toMatchObject({ increment: 'INCR', expire: 'PEXPIRE' });
  });

  it('stops at the first frame that cannot belong to a match', () => {
    const cases: Array<[Buffer, boolean[]]> = [
      [Buffer.concat([cmd('MULTI'), cmd('GET', 'lock:1')]), [false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:1', '1', 'x')]), [false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:1')]), [false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:1', '1')]), [false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:1'), cmd('EXPIRE', 'lock:1')]), [true, false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:1'), cmd('GET', 'lock:1')]), [true, false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:1', '1.5')]), [false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:1'), cmd('EXPIRE', 'lock:2', '5')]), [true, false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:1'), cmd('EXPIRE', 'lock:1', '5', 'NX')]), [true, false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:1'), cmd('EXPIRE', 'lock:1', '0')]), [true, false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:1'), cmd('EXPIRE', 'lock:1', '5'), cmd('DISCARD')]), [true, true, false]],
      [Buffer.concat([cmd('MULTI'), cmd('INCR', 'lock:1'), cmd('EXPIRE', 'lock:1', '5'), cmd('EXEC', 'x')]), [true, true, false]],
      [Buffer.concat([cmd('MULTI'), Buffer.from('INCR lock:1\r\n')]), [false]], // inline
      [Buffer.concat([cmd('MULTI'), cmd('INCR', Buffer.alloc(2000, 'l'))]), [false]], // key too long to capture
    ];
    for (const [bytes, expected] of cases) expect(match(bytes).accepted, bytes.toString('latin1')).toEqual(expected);
  });

  it('follows the shape to its EXEC on a key no rule names, without a rule (such a block is only counted)', () => {
    const { accepted, step, matcher } = match(lockAttempt('other:1', 60));
    expect([accepted, step, matcher.rule]).toEqual([[true, true, true], BlockStep.Complete, undefined]);
    expect(matcher.call().key.toString()).toBe('other:1');
    expect(match(Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'other:1', '1'), cmd('EXPIRE', 'lock:1', '5')])).accepted).toEqual([
      true,
      false,
    ]);
    // A rule named the key: the block is the rule's.
    expect(match(lockAttempt('lock:9', 60)).matcher.rule?.name).toBe('locks');
  });

  it('starts only at MULTI as a RESP array of one argument', () => {
    const starts = (bytes: Buffer | string): boolean => BlockMatcher.isBlockStart([...frameHeads(Buffer.from(bytes))][0].scanner);
    expect(starts(cmd('MULTI'))).toBe(true);
    expect(starts(cmd('multi'))).toBe(true);
    expect(starts('MULTI\r\n')).toBe(false); // inline: typed by a person, never rewritten
    expect(starts(cmd('MULTI', 'x'))).toBe(false);
    expect(starts(cmd('EXEC'))).toBe(false);
  });

  it('accepts binary keys containing CR, LF and NUL', () => {
    const rulesStalwart = createRuleSet(parseRuleFile('rules:\n  - name: t\n    prefix_hex: "17"\n', 'x.yaml').rules, ['x.yaml']);
    const key = taskLockKey(0x0d0a000dn);
    const { accepted, matcher } = match(lockAttempt(key, 3600), rulesStalwart);
    expect(accepted).toEqual([true, true, true]);
    expect(matcher.call().key.equals(key)).toBe(true);
  });
});

describe('the script call and its reply', () => {
  it('encodes EVALSHA with the key and arguments as bulk strings', () => {
    const call = {
      key: Buffer.from('lock:\r\n'),
      increment: 'INCRBY' as const,
      delta: Buffer.from('1'),
      expire: 'EXPIRE' as const,
      ttl: Buffer.from('60'),
    };
    const bytes = encodeLockCall(call, false).toString('latin1');
    expect(bytes).toBe(
      `*8\r\n$7\r\nEVALSHA\r\n$40\r\n${LOCK_SCRIPT_SHA}\r\n$1\r\n1\r\n$7\r\nlock:\r\n\r\n$6\r\nINCRBY\r\n$1\r\n1\r\n$6\r\nEXPIRE\r\n$2\r\n60\r\n`,
    );
    expect(encodeLockCall(call, true).toString('latin1')).toMatch(/^\*8\r\n\$4\r\nEVAL\r\n\$\d+\r\n-- redis-lock-proxy/);
  });

  it('translates every reply shape', () => {
    const created = translateScriptReply(Buffer.from('*2\r\n:1\r\n:1\r\n'));
    expect(created.kind === 'replies' && created.bytes.toString()).toBe(attemptReplies(1, 1));
    // The script left a held lock's expiry alone (:0): the client gets what Redis alone answers
    // an expiry right after the increment, 1.
    const ok = translateScriptReply(Buffer.from('*2\r\n:7\r\n:0\r\n'));
    expect(ok.kind === 'replies' && ok.bytes.toString()).toBe(attemptReplies(7, 1));
    const big = translateScriptReply(Buffer.from('*2\r\n$16\r\n9007199254740993\r\n:0\r\n'));
    expect(big.kind === 'replies' && big.bytes.toString()).toBe(attemptReplies('9007199254740993', 1));
    const err = translateScriptReply(Buffer.from('*2\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n:1\r\n'));
    expect(err.kind === 'replies' && err.bytes.toString()).toBe(
      '+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n:1\r\n',
    );
    expect(translateScriptReply(Buffer.from('-NOSCRIPT No matching script.\r\n'))).toEqual({
      kind: 'error',
      message: '-NOSCRIPT No matching script.',
    });
    const late = translateScriptReply(Buffer.from('*2\r\n:5\r\n-NOPERM no expire\r\n'));
    expect(late.kind === 'replies' && late.bytes.toString()).toBe('+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:5\r\n-NOPERM no expire\r\n');
    for (const odd of [
      '*3\r\n:1\r\n:1\r\n:1\r\n',
      '*2\r\n:1\r\n:2\r\n',
      '+OK\r\n',
      '*2\r\n$3\r\nabc\r\n:1\r\n',
      '*2\r\n:1\r\n',
      '*2\r\n$-1\r\n:1\r\n', // the counter could not be read back
      '*2\r\n_\r\n:1\r\n',
    ]) {
      expect(translateScriptReply(Buffer.from(odd)).kind, odd).toBe('unknown');
    }
  });
});

describe('the script before Redis 7.0 (its branch without redis.acl_check_cmd, run here with the check taken away)', () => {
  const OLD_SERVER_SCRIPT = LOCK_SCRIPT.replace('local check = redis.acl_check_cmd', 'local check = nil');
  let redis: RedisServer;
  let admin: RawClient;
  beforeAll(async () => {
    redis = await startRedis();
    admin = await RawClient.connect(redis.port);
    await admin.call('ACL', 'SETUSER', 'noexpire', 'on', '>pw', '~*', '+@all', '-expire');
    await admin.call('ACL', 'SETUSER', 'nopttl', 'on', '>pw', '~*', '+@all', '-pttl');
    // May read, increment and run scripts, but neither set an expiry nor delete.
    await admin.call(
      'ACL',
      'SETUSER',
      'nodelexpire',
      'on',
      '>pw',
      '~*',
      '+@read',
      '+@string',
      '+@transaction',
      '+@scripting',
      '+@connection',
    );
  });
  afterAll(async () => {
    await admin?.close();
    await redis?.stop();
  });

  /** Runs the old-server branch as `user` (default: the admin user) on lock:old; returns its reply. */
  async function run(user?: string): Promise<string> {
    const client = await RawClient.connect(redis.port);
    try {
      if (user !== undefined) expect(await client.call('AUTH', user, 'pw')).toBe('+OK\r\n');
      return await client.call('EVAL', OLD_SERVER_SCRIPT, '1', 'lock:old', 'INCRBY', '1', 'EXPIRE', '60');
    } finally {
      await client.close();
    }
  }

  it('applies the expiry when the increment creates the key or it has none, and leaves a held lock alone', async () => {
    await admin.call('DEL', 'lock:old');
    expect(await run()).toBe('*2\r\n:1\r\n:1\r\n');
    await admin.call('PEXPIRE', 'lock:old', '5000');
    expect(await run()).toBe('*2\r\n:2\r\n:0\r\n');
    expect(Number(/:(\d+)/.exec(await admin.call('PTTL', 'lock:old'))?.[1])).toBeLessThanOrEqual(5000);
    await admin.call('PERSIST', 'lock:old');
    expect(await run()).toBe('*2\r\n:3\r\n:1\r\n'); // healed
  });

  it('creates no lock whose expiry is refused: an error, and no key, also where the user may not delete', async () => {
    for (const user of ['noexpire', 'nodelexpire']) {
      for (let attempt = 0; attempt < 2; attempt++) {
        await admin.call('DEL', 'lock:old');
        expect(await run(user)).toMatch(/^-/); // the ACL's refusal, in the server's words
        expect(await admin.call('EXISTS', 'lock:old')).toBe(':0\r\n');
      }
    }
  });

  it('writes nothing when the expiry may not be read', async () => {
    await admin.call('DEL', 'lock:old');
    expect(await run('nopttl')).toMatch(/^-/);
    expect(await admin.call('EXISTS', 'lock:old')).toBe(':0\r\n');
  });

  // Trying the expiry is a write, and a script's first write is the last one Redis checks
  // maxmemory for: without the increment that cannot run before it, the lock would be created.
  it('out of memory where there is no lock yet: the OOM, and nothing written, as Redis refuses the increment', async () => {
    await admin.call('DEL', 'lock:old');
    expect(await admin.call('CONFIG', 'SET', 'maxmemory', '1')).toBe('+OK\r\n');
    try {
      expect(await run()).toMatch(/^-[^\r]*OOM command not allowed/);
    } finally {
      expect(await admin.call('CONFIG', 'SET', 'maxmemory', '0')).toBe('+OK\r\n');
    }
    expect(await admin.call('EXISTS', 'lock:old')).toBe(':0\r\n');
  });
});
