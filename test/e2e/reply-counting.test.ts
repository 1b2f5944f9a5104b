/**
 * Where the proxy follows a connection's replies (to find its own among them) and Redis does not
 * answer one reply per request: commands that get no reply (REPLCONF ACK), RESET after the
 * connection became a plain pipe (the upstream URL's AUTH and SELECT must follow it, whatever
 * made it a pipe), and a transaction that Redis ends although its EXEC was refused. Each case
 * against the same server's own replies; the RESET cases are skipped, with the reason, where the
 * server has no RESET (before Redis 6.2), and the cases of a RESET that is an unknown command
 * where it has one.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it, type TestContext } from 'vitest';
import { startTestProxy, type TestProxy } from '../support/proxy.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { busyScript, cmd, exchange, RawClient } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';

const env = redisAndProxy();
const call = (...args: Array<string | Buffer>): Promise<string> => env.admin.call(...args);
let facts: ServerFacts;
beforeAll(async () => {
  facts = await serverFacts(env.admin);
});

/** `ACL SETUSER <name> reset on >secret ~* [&*] +@all <rules...>`: every channel open where the server has channel rules. */
async function setUser(name: string, ...rules: string[]): Promise<void> {
  expect(await call('ACL', 'SETUSER', name, 'reset', 'on', '>secret', '~*', ...facts.allChannels(), '+@all', ...rules)).toBe('+OK\r\n');
}

/**
 * A key's PTTL, asked on `client`'s own connection (its database). The proxy gives a lock
 * block's expiry Redis's own answer (1) whether or not it applied it: the lease left as it was
 * shows that the block was fixed.
 */
async function pttlOn(client: RawClient, key: Buffer): Promise<number> {
  client.write(cmd('PTTL', key));
  return Number(/^:(-?\d+)\r\n$/.exec((await client.readReplies(1)).toString('latin1'))?.[1]);
}

/** The lease `client` finds on `key` was lowered to 5 s, and is still no longer. */
async function expectLeaseKept(client: RawClient, key: Buffer, leaseMs = 5000): Promise<void> {
  const pttl = await pttlOn(client, key);
  expect(pttl).toBeGreaterThan(0);
  expect(pttl).toBeLessThanOrEqual(leaseMs);
}

/** The RESET cases: skipped, with the reason, where the server has no RESET. */
function skipWithoutReset(ctx: TestContext): void {
  ctx.skip(...facts.skipUnless('reset'));
}

/**
 * Redis 6.2 may refuse RESET (ACLs, -BUSY; 7.0 never does). After CLIENT REPLY OFF and then
 * SKIP, whether Redis honoured the SKIP, and so whether RESET's answer is the client's, cannot
 * be told: the connection stays a plain pipe (session/reset-marker.ts). That case is skipped
 * there, and tested apart.
 */
function resetMayBeRefused(): boolean {
  return facts.has('reset') && !facts.has('expire-nx');
}

function skipWhereSkippedResetIsUnknown(ctx: TestContext): void {
  skipWithoutReset(ctx);
  ctx.skip(
    resetMayBeRefused(),
    `after CLIENT REPLY OFF then SKIP, a RESET leaves a plain pipe where RESET may be refused: ${facts.server}`,
  );
}

describe('a command Redis never answers', () => {
  it('REPLCONF ACK and GETACK from a normal client: what follows is answered as directly, lock block included', async () => {
    for (const replconf of [cmd('REPLCONF', 'ACK', '0'), cmd('REPLCONF', 'GETACK', '*')]) {
      const key = taskLockKey(7n);
      const batch = Buffer.concat([replconf, lockAttempt(key, 600), cmd('PING'), cmd('GET', 'nokey')]);
      await call('FLUSHALL');
      const direct = await exchange(env.redis.port, batch, 6);
      await call('FLUSHALL');
      const proxied = await exchange(env.proxy.port, batch, 6);
      expect(direct).toBe(attemptReplies(1, 1) + '+PONG\r\n$-1\r\n');
      expect(proxied).toBe(direct);
    }
  });
});

describe('RESET where the server has none (before Redis 6.2): an unknown command, and the connection goes on', () => {
  let withDb: TestProxy | undefined;

  beforeAll(async () => {
    if (facts.has('reset')) return;
    await setUser('app');
    withDb = await startTestProxy({ upstream: `redis://app:secret@127.0.0.1:${env.redis.port}/3` });
  });

  afterAll(async () => {
    await withDb?.close();
    if (!facts.has('reset')) await call('ACL', 'DELUSER', 'app');
  });

  /** `bytes` directly (as the URL's user, in its db) and through the proxy: `replies` replies each, within 5 s. */
  async function bothWays(bytes: Buffer, replies: number): Promise<{ direct: string; proxied: string }> {
    const url = Buffer.concat([cmd('AUTH', 'app', 'secret'), cmd('SELECT', '3')]);
    const direct = (await exchange(env.redis.port, Buffer.concat([url, bytes]), replies + 2)).slice('+OK\r\n+OK\r\n'.length);
    await call('FLUSHALL');
    const proxied = await exchange((withDb as TestProxy).port, bytes, replies);
    return { direct, proxied };
  }

  it('after CLIENT REPLY OFF: its refusal unsent, as directly, and the next replies at once', async (ctx) => {
    ctx.skip(facts.has('reset'), 'this server has RESET');
    const bytes = Buffer.concat([cmd('CLIENT', 'REPLY', 'OFF'), cmd('RESET'), cmd('CLIENT', 'REPLY', 'ON'), cmd('PING')]);
    const { direct, proxied } = await bothWays(bytes, 2);
    expect(direct).toBe('+OK\r\n+PONG\r\n');
    expect(proxied).toBe(direct);
  });

  it('subscribed: refused as Redis refuses it there, and the connection stays subscribed, in its own db', async (ctx) => {
    ctx.skip(facts.has('reset'), 'this server has RESET');
    const bytes = Buffer.concat([
      cmd('SUBSCRIBE', 'ch'),
      cmd('RESET'),
      cmd('PING'),
      cmd('UNSUBSCRIBE', 'ch'),
      cmd('SET', 'no-reset:sub', 'v'),
    ]);
    const { direct, proxied } = await bothWays(bytes, 5);
    expect(proxied).toBe(direct);
    expect(direct).toMatch(/^\*3\r\n\$9\r\nsubscribe\r\n.*-ERR .*\r\n/s);
    expect(await call('SELECT', '3')).toBe('+OK\r\n');
    expect(await call('EXISTS', 'no-reset:sub')).toBe(':1\r\n');
    expect(await call('SELECT', '0')).toBe('+OK\r\n');
  });

  it("the client's SELECT stands after it (no SELECT of the URL's db), and a transaction it is sent in is Redis's", async (ctx) => {
    ctx.skip(facts.has('reset'), 'this server has RESET');
    const bytes = Buffer.concat([
      cmd('SELECT', '2'),
      cmd('RESET'),
      cmd('SET', 'no-reset:db', 'v'),
      cmd('MULTI'),
      cmd('RESET'),
      cmd('EXEC'),
    ]);
    const { direct, proxied } = await bothWays(bytes, 6);
    expect(proxied).toBe(direct);
    expect(direct).toMatch(/-EXECABORT [^\r]*\r\n$/);
    expect(await call('SELECT', '2')).toBe('+OK\r\n');
    expect(await call('EXISTS', 'no-reset:db')).toBe(':1\r\n');
    expect(await call('SELECT', '0')).toBe('+OK\r\n');
    // Lock blocks after it are fixed: the connection was never a pipe.
    const key = taskLockKey(62n);
    const client = await RawClient.connect((withDb as TestProxy).port);
    client.write(Buffer.concat([cmd('RESET'), lockAttempt(key, 3600)]));
    await client.readReplies(5);
    client.write(Buffer.concat([cmd('PEXPIRE', key, '5000'), lockAttempt(key, 3600)]));
    expect((await client.readReplies(5)).toString('latin1')).toBe(':1\r\n' + attemptReplies(2, 1));
    await expectLeaseKept(client, key);
    await client.close();
  });
});

describe('RESET once the connection is a plain pipe', () => {
  let withDb: TestProxy | undefined;
  let noRules: TestProxy | undefined;

  beforeAll(async () => {
    await setUser('app');
    const url = `redis://app:secret@127.0.0.1:${env.redis.port}/3`;
    withDb = await startTestProxy({ upstream: url });
    noRules = await startTestProxy({ upstream: url, rules: [] });
  });

  afterAll(async () => {
    await Promise.all([withDb?.close(), noRules?.close()]);
    await call('ACL', 'DELUSER', 'app');
  });

  /** Where `SET <key> v` after the RESET landed: the URL's db (3), as the proxy's user. */
  async function landedInUrlDb(key: string): Promise<void> {
    expect(await call('SELECT', '3')).toBe('+OK\r\n');
    expect(await call('EXISTS', key)).toBe(':1\r\n');
    expect(await call('SELECT', '0')).toBe('+OK\r\n');
    expect(await call('EXISTS', key)).toBe(':0\r\n');
  }

  const pipes: Array<[string, Buffer, string]> = [
    ['SUBSCRIBE', cmd('SUBSCRIBE', 'ch'), '*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n'],
    ['MONITOR', cmd('MONITOR'), '+OK\r\n'],
    ['CLIENT REPLY OFF', cmd('CLIENT', 'REPLY', 'OFF'), ''],
    ['REPLCONF ACK', cmd('REPLCONF', 'ACK', '0'), ''],
    ['a quoted inline command', Buffer.from('SET "quoted key" v\r\n'), '+OK\r\n'],
  ];
  for (const [name, pipe, pipeReplies] of pipes) {
    it(`after ${name}: the URL's AUTH and SELECT again, their replies kept from the client`, async (ctx) => {
      skipWithoutReset(ctx);
      const key = `after-reset:${name}`;
      const client = await RawClient.connect((withDb as TestProxy).port);
      client.write(Buffer.concat([pipe, cmd('RESET'), cmd('SET', key, 'v'), cmd('CLIENT', 'INFO')]));
      const expected = pipeReplies + '+RESET\r\n+OK\r\n';
      const replies = (await client.readReplies(expected === '+RESET\r\n+OK\r\n' ? 3 : 4)).toString('latin1');
      await client.close();
      expect(replies.startsWith(expected)).toBe(true);
      expect(replies.slice(expected.length)).toMatch(/ db=3 .* user=app /); // CLIENT INFO: the URL's db and user
      await landedInUrlDb(key);
    });
  }

  it('with no rules loaded (a pipe from the start), the same', async (ctx) => {
    skipWithoutReset(ctx);
    const client = await RawClient.connect((noRules as TestProxy).port);
    client.write(Buffer.concat([cmd('SUBSCRIBE', 'ch'), cmd('RESET'), cmd('SET', 'after-reset:no-rules', 'v')]));
    expect((await client.readReplies(3)).toString('latin1')).toBe('*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n+RESET\r\n+OK\r\n');
    await client.close();
    await landedInUrlDb('after-reset:no-rules');
  });

  it('a message that reads like +RESET, published to the connection, is not taken for it', async (ctx) => {
    skipWithoutReset(ctx);
    const client = await RawClient.connect((withDb as TestProxy).port);
    client.write(cmd('SUBSCRIBE', 'ch'));
    await client.readReplies(1);
    const publisher = await RawClient.connect((withDb as TestProxy).port);
    expect((await exchange((withDb as TestProxy).port, cmd('PUBLISH', 'ch', '+RESET\r\n'), 1)).toString()).toBe(':1\r\n');
    await publisher.close();
    client.write(Buffer.concat([cmd('RESET'), cmd('SET', 'after-reset:published', 'v')]));
    expect((await client.readReplies(3)).toString('latin1')).toBe(
      '*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$8\r\n+RESET\r\n\r\n+RESET\r\n+OK\r\n',
    );
    await client.close();
    await landedInUrlDb('after-reset:published');
  });

  it('lock blocks are fixed again after the RESET', async (ctx) => {
    skipWithoutReset(ctx);
    const key = taskLockKey(31n);
    const client = await RawClient.connect((withDb as TestProxy).port);
    client.write(
      Buffer.concat([cmd('SUBSCRIBE', 'ch'), cmd('RESET'), lockAttempt(key, 600), cmd('SELECT', '3'), cmd('PEXPIRE', key, '5000')]),
    );
    await client.readReplies(1 + 1 + 4 + 2);
    client.write(lockAttempt(key, 600));
    expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(2, 1));
    await expectLeaseKept(client, key);
    await client.close();
  });
});

describe('RESET once the connection is a plain pipe, with a URL without AUTH or SELECT', () => {
  for (const [name, pipe] of [
    ['SUBSCRIBE', cmd('SUBSCRIBE', 'ch')],
    ['CLIENT REPLY OFF', cmd('CLIENT', 'REPLY', 'OFF')],
  ] as const) {
    it(`after ${name}, lock blocks are fixed again, the rest of the chunk included`, async (ctx) => {
      skipWithoutReset(ctx);
      const key = taskLockKey(32n);
      await call('DEL', key);
      const client = await RawClient.connect(env.proxy.port);
      client.write(Buffer.concat([pipe, cmd('RESET'), lockAttempt(key, 600), cmd('PEXPIRE', key, '5000')]));
      const before = name === 'SUBSCRIBE' ? 1 : 0;
      const replies = (await client.readReplies(before + 1 + 4 + 1)).toString('latin1');
      expect(replies.endsWith('+RESET\r\n' + attemptReplies(1, 1) + ':1\r\n')).toBe(true);
      client.write(lockAttempt(key, 600));
      expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(2, 1));
      await expectLeaseKept(client, key);
      await client.close();
    });
  }
});

describe('RESET whose reply Redis may or may not send (CLIENT REPLY SKIP)', () => {
  it('right after CLIENT REPLY SKIP: not answered, but Redis runs it; the pipe ends, and lock blocks are fixed again', async (ctx) => {
    skipWithoutReset(ctx);
    const key = taskLockKey(33n);
    const skipThenReset = Buffer.concat([cmd('CLIENT', 'REPLY', 'SKIP'), cmd('RESET'), cmd('PING', 'after')]);
    expect(await exchange(env.redis.port, skipThenReset, 1)).toBe('$5\r\nafter\r\n');
    await call('DEL', key);
    const client = await RawClient.connect(env.proxy.port);
    client.write(Buffer.concat([skipThenReset, lockAttempt(key, 600), cmd('PEXPIRE', key, '5000')]));
    expect((await client.readReplies(1 + 4 + 1)).toString('latin1')).toBe('$5\r\nafter\r\n' + attemptReplies(1, 1) + ':1\r\n');
    client.write(lockAttempt(key, 600));
    expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(2, 1));
    await expectLeaseKept(client, key);
    await client.close();
  });

  it('where Redis may refuse RESET (6.2), after CLIENT REPLY OFF then SKIP: the bytes as directly, the connection stays a plain pipe, said once', async (ctx) => {
    skipWithoutReset(ctx);
    ctx.skip(!resetMayBeRefused(), `this server never refuses RESET: ${facts.server}`);
    const key = taskLockKey(37n);
    const bytes = Buffer.concat([
      cmd('CLIENT', 'REPLY', 'OFF'),
      cmd('CLIENT', 'REPLY', 'SKIP'),
      cmd('RESET'),
      cmd('PING', 'after'),
      lockAttempt(key, 600),
    ]);
    const { direct, proxied } = await bothWays(env.proxy.port, bytes, 2 + 4);
    expect(direct).toBe('+RESET\r\n$5\r\nafter\r\n' + attemptReplies(1, 1));
    expect(proxied).toBe(direct);
    expect(
      env.proxy
        .logs()
        .some(
          (l) =>
            typeof l.msg === 'string' && l.msg.startsWith('a RESET after CLIENT REPLY OFF and SKIP, on a server that may refuse RESET'),
        ),
    ).toBe(true);
  });

  // With --lock-method script the server's version is not asked, so RESET's outcome is judged
  // (reset-marker.ts) on every server line, and a command of the proxy's own goes before it after a
  // SKIP: only where the RESET's frame begins in the read that ends it.
  it('right after CLIENT REPLY SKIP, the RESET split across reads: the client bytes reach Redis as sent, and the pipe ends', async (ctx) => {
    skipWithoutReset(ctx);
    const proxy = await startTestProxy({ upstream: env.redis.url, lockMethod: 'script' });
    try {
      const key = taskLockKey(38n);
      await call('DEL', key);
      const reset = cmd('RESET');
      const client = await RawClient.connect(proxy.port);
      client.write(Buffer.concat([cmd('CLIENT', 'REPLY', 'SKIP'), reset.subarray(0, 9)]));
      await sleep(100);
      client.write(Buffer.concat([reset.subarray(9), cmd('PING', 'after'), lockAttempt(key, 600), cmd('PEXPIRE', key, '5000')]));
      expect((await client.readReplies(1 + 4 + 1)).toString('latin1')).toBe('$5\r\nafter\r\n' + attemptReplies(1, 1) + ':1\r\n');
      await client.close();
    } finally {
      await proxy.close();
    }
  });

  /** Sends `bytes` directly and through `port`, from the same empty state; both replies, up to `count`. */
  async function bothWays(port: number, bytes: Buffer, count: number): Promise<{ direct: string; proxied: string }> {
    await call('FLUSHALL');
    const direct = await exchange(env.redis.port, bytes, count);
    await call('FLUSHALL');
    const proxied = await exchange(port, bytes, count);
    return { direct, proxied };
  }

  it('a queued CLIENT REPLY SKIP (MULTI … EXEC), then RESET and a lock block: as directly, the block fixed', async (ctx) => {
    skipWithoutReset(ctx);
    // EXEC's array counts the queued CLIENT REPLY, which answers nothing: the next reply reads as its element.
    const key = taskLockKey(34n);
    const bytes = Buffer.concat([
      cmd('MULTI'),
      cmd('CLIENT', 'REPLY', 'SKIP'),
      cmd('EXEC'),
      cmd('RESET'),
      lockAttempt(key, 600),
      cmd('PEXPIRE', key, '5000'),
      lockAttempt(key, 600),
    ]);
    // Frames: +OK, +QUEUED, EXEC's *1 holding the block's +OK, the block's other three, :1, the second block.
    const { direct, proxied } = await bothWays(env.proxy.port, bytes, 2 + 1 + 3 + 1 + 4);
    expect(direct).toBe('+OK\r\n+QUEUED\r\n*1\r\n' + attemptReplies(1, 1) + ':1\r\n' + attemptReplies(2, 1));
    expect(proxied).toBe(direct);
    // The second attempt left the expiry alone.
    const pttl = Number(/^:(-?\d+)\r\n$/.exec(await call('PTTL', key))?.[1]);
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(5000);
  });

  it('a RESP3 script that answers +RESET while subscribed is not taken for RESET’s reply', async (ctx) => {
    skipWithoutReset(ctx);
    const key = taskLockKey(35n);
    const bytes = Buffer.concat([
      cmd('HELLO', '3'),
      cmd('SUBSCRIBE', 'c'),
      cmd('EVAL', "return {ok='RESET'}", '0'),
      cmd('RESET'),
      lockAttempt(key, 600),
      cmd('SET', 'after', '1'),
      cmd('GET', 'after'),
    ]);
    const { direct, proxied } = await bothWays(env.proxy.port, bytes, 1 + 1 + 1 + 1 + 4 + 2);
    expect(direct).toMatch(/>3\r\n\$9\r\nsubscribe\r\n\$1\r\nc\r\n:1\r\n\+RESET\r\n\+RESET\r\n/);
    expect(direct.endsWith(attemptReplies(1, 1) + '+OK\r\n$1\r\n1\r\n')).toBe(true);
    const clientId = (replies: string): string => replies.replace(/\$2\r\nid\r\n:\d+\r\n/, '$2\r\nid\r\n:ID\r\n');
    expect(clientId(proxied)).toBe(clientId(direct)); // HELLO names each connection's own id
  });
});

describe('RESET after a CLIENT REPLY SKIP that Redis did not honour: the URL’s AUTH and SELECT follow it', () => {
  let proxy: TestProxy | undefined;
  let denied: TestProxy | undefined;

  beforeAll(async () => {
    await setUser('app');
    // A user refused CLIENT: its CLIENT REPLY SKIP skips nothing.
    await setUser('noclient', '-client');
    proxy = await startTestProxy({ upstream: `redis://app:secret@127.0.0.1:${env.redis.port}/3` });
    denied = await startTestProxy({ upstream: `redis://noclient:secret@127.0.0.1:${env.redis.port}/3` });
  });

  afterAll(async () => {
    await Promise.all([proxy?.close(), denied?.close()]);
    await call('ACL', 'DELUSER', 'app', 'noclient');
  });

  async function landedInUrlDb(key: string): Promise<void> {
    expect(await call('SELECT', '3')).toBe('+OK\r\n');
    expect(await call('EXISTS', key)).toBe(':1\r\n');
    expect(await call('SELECT', '0')).toBe('+OK\r\n');
    expect(await call('EXISTS', key)).toBe(':0\r\n');
  }

  it('SKIP while replies are OFF (ignored): RESET is answered, AUTH and SELECT follow, lock blocks are fixed', async (ctx) => {
    skipWhereSkippedResetIsUnknown(ctx);
    const key = taskLockKey(36n);
    const client = await RawClient.connect((proxy as TestProxy).port);
    client.write(
      Buffer.concat([
        cmd('CLIENT', 'REPLY', 'OFF'),
        cmd('CLIENT', 'REPLY', 'SKIP'),
        cmd('RESET'),
        cmd('SET', 'kk', 'v'),
        lockAttempt(key, 600),
        cmd('CLIENT', 'INFO'),
      ]),
    );
    const replies = (await client.readReplies(1 + 1 + 4 + 1)).toString('latin1');
    expect(replies.startsWith('+RESET\r\n+OK\r\n' + attemptReplies(1, 1))).toBe(true);
    expect(replies).toMatch(/ db=3 .* user=app /);
    // Its expiry longer than the lease (600 s), so that a re-armed one would show.
    client.write(lockAttempt(key, 6000));
    expect((await client.readReplies(4)).toString('latin1')).toBe(attemptReplies(2, 1));
    await expectLeaseKept(client, key, 600_000);
    await client.close();
    await landedInUrlDb('kk');
  });

  it('SKIP refused (-NOPERM): RESET is answered, AUTH and SELECT follow', async (ctx) => {
    skipWithoutReset(ctx);
    const client = await RawClient.connect((denied as TestProxy).port);
    client.write(Buffer.concat([cmd('CLIENT', 'REPLY', 'SKIP'), cmd('RESET'), cmd('SET', 'kk2', 'v')]));
    const replies = (await client.readReplies(3)).toString('latin1');
    expect(replies).toMatch(/^-NOPERM [^\r]*\r\n\+RESET\r\n\+OK\r\n$/);
    await client.close();
    await landedInUrlDb('kk2');
  });
});

describe('EXEC that Redis refuses still ends the transaction', () => {
  it('-BUSY on EXEC (a script runs long): the next lock block is answered as directly', async () => {
    // lua-time-limit before 7.0 (and still, as an alias).
    const threshold = facts.has('busy-reply-threshold') ? 'busy-reply-threshold' : 'lua-time-limit';
    expect(await call('CONFIG', 'SET', threshold, '50')).toBe('+OK\r\n');
    try {
      const run = async (port: number): Promise<string> => {
        const key = taskLockKey(77n);
        await call('FLUSHALL');
        const client = await RawClient.connect(port);
        client.write(Buffer.concat([cmd('MULTI'), cmd('INCR', 'counter')]));
        expect((await client.readReplies(2)).toString()).toBe('+OK\r\n+QUEUED\r\n');
        // Another connection keeps the server busy in a script for about a second.
        const busy = await RawClient.connect(env.redis.port);
        busy.write(busyScript(2));
        const probe = await RawClient.connect(env.redis.port);
        for (;;) {
          probe.write(cmd('PING'));
          if ((await probe.readReplies(1)).toString().startsWith('-BUSY')) break;
          await sleep(20);
        }
        await probe.close();
        client.write(cmd('EXEC'));
        const exec = (await client.readReplies(1)).toString();
        expect(exec).toMatch(/^-EXECABORT .*BUSY/);
        await busy.readReplies(1, 10_000);
        await busy.close();
        client.write(lockAttempt(key, 600));
        const after = (await client.readReplies(4)).toString('latin1');
        await client.close();
        return exec + after;
      };
      const direct = await run(env.redis.port);
      expect(direct).toMatch(/\*2\r\n:1\r\n:1\r\n$/);
      expect(await run(env.proxy.port)).toBe(direct);
    } finally {
      expect(await call('CONFIG', 'SET', threshold, '5000')).toBe('+OK\r\n');
    }
  });

  it('EXEC with an argument aborts the transaction: the next block is fixed, as a new transaction', async () => {
    const key = taskLockKey(78n);
    const batch = Buffer.concat([
      cmd('MULTI'),
      cmd('EXEC', 'x'),
      lockAttempt(key, 600),
      cmd('PEXPIRE', key, '5000'),
      lockAttempt(key, 600),
    ]);
    const direct = await exchange(env.redis.port, batch, 2 + 4 + 1 + 4);
    await call('FLUSHALL');
    const proxied = await exchange(env.proxy.port, batch, 2 + 4 + 1 + 4);
    expect(proxied).toBe(direct);
    // The second attempt left the expiry alone.
    const pttl = Number(/^:(-?\d+)\r\n$/.exec(await call('PTTL', key))?.[1]);
    expect(pttl).toBeGreaterThan(0);
    expect(pttl).toBeLessThanOrEqual(5000);
  });
});

describe('a reply of the proxy’s own that does not come in time', () => {
  it('closes the connection, logged and counted, when Redis is stuck past --own-reply-timeout-ms', async () => {
    const proxy = await startTestProxy({ upstream: `${env.redis.url}/3`, admin: true, flags: ['--own-reply-timeout-ms', '300'] });
    const busy = await RawClient.connect(env.redis.port);
    try {
      // The server runs a script for 3 s: the proxy's SELECT at connect waits behind it.
      busy.write(busyScript(3));
      await sleep(200);
      const client = await RawClient.connect(proxy.port);
      client.write(cmd('PING'));
      expect((await client.readUntilClosed(10_000)).toString('latin1')).toBe('');
      expect(proxy.stats.ownRepliesTimedOut).toBe(1);
      expect(await proxy.metrics()).toMatch(/^redis_lock_proxy_own_replies_timed_out_total 1$/m);
      const line = proxy
        .logs()
        .find((entry) => entry.msg === "no reply from Redis to a command of the proxy's own in time; closing the connection");
      expect(line).toMatchObject({ waiting: 'a reply to a command of its own' });
      expect(line?.waitedMs).toBeGreaterThanOrEqual(300);
      await client.close();
    } finally {
      await busy.readReplies(1, 10_000);
      await busy.close();
      await proxy.close();
    }
  });
});
