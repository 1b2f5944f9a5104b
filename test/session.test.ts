/**
 * Session, over in-memory sockets: the connection pair's mechanics without a network. The test
 * plays the client on one side and writes Redis's replies on the other (exact RESP, as Redis
 * sends them), and checks what goes each way and when: bytes forwarded as they arrive, a lock
 * block's script call with the client's later bytes waiting for its reply, or the block inside
 * the transaction with nothing waiting, the server's version asked first, the URL's AUTH before
 * anything else (and again after RESET, also once the connection is a pipe), half-closes. The end-to-end tests
 * check the same behaviour against a real redis-server.
 */
import { ServerMethods } from '../src/lock/lock-method.js';
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { LOCK_SCRIPT_SHA } from '../src/lock/script.js';
import { createRuleSet, parseRuleFile } from '../src/rules/loader.js';
import type { ProxyContext } from '../src/session/context.js';
import { Session } from '../src/session/session.js';
import { Stats } from '../src/stats.js';
import { RefusalLog } from '../src/upstream/refusal-log.js';
import { VerifyRuns } from '../src/verify-connection.js';
import type { UpstreamConnector } from '../src/upstream/connect.js';
import { parseUpstreamUrl, setupCommands } from '../src/upstream/target.js';
import { memorySocketPair, Received, type MemorySocket } from './support/memory-socket.js';
import { cmd } from './support/resp.js';
import { attemptReplies, lockAttempt } from './support/stalwart.js';

const RULES = createRuleSet(parseRuleFile('rules:\n  - name: locks\n    prefix: "lock:"\n', 'x.yaml').rules, ['x.yaml']);
const open: MemorySocket[] = [];

afterEach(() => {
  for (const socket of open.splice(0)) socket.destroy();
});

/** A session between an in-memory client and an in-memory Redis; the test holds both far ends. */
function start(url = 'redis://127.0.0.1:6379', lockMethod: ProxyContext['lockMethod'] = 'script') {
  const [client, proxyFront] = memorySocketPair();
  const [redis, proxyBack] = memorySocketPair();
  open.push(client, redis);
  const target = parseUpstreamUrl(url);
  const upstream = {
    target,
    setup: setupCommands(target),
    describe: () => target.display,
    connect: () => {
      setImmediate(() => proxyBack.emit('connect'));
      return { socket: proxyBack.asSocket(), readyEvent: 'connect' as const, address: '127.0.0.1:6379' };
    },
  } as unknown as UpstreamConnector;
  const stats = new Stats();
  const log = pino({ level: 'silent' });
  const ctx: ProxyContext = {
    upstream,
    rules: () => RULES,
    census: createRuleSet([], []),
    mode: 'enforce',
    holdMs: 50,
    connectTimeoutMs: 1000,
    idleTimeoutMs: 0,
    ownReplyTimeoutMs: 60_000,
    upstreamTimeoutMs: 0,
    lockMethod,
    serverMethods: new AskedOnTheConnection(),
    cluster: null,
    log,
    stats,
    refusals: new RefusalLog(log),
    verifyRuns: new VerifyRuns(),
  };
  const session = new Session(proxyFront.asSocket(), ctx);
  return { session, stats, client, redis, atRedis: new Received(redis), atClient: new Received(client) };
}

/** The fake upstream has one connection: the version is never asked ahead on another, only on the session's. */
class AskedOnTheConnection extends ServerMethods {
  override askAhead(): void {}
}

const text = (bytes: Buffer) => bytes.toString('latin1');
const tick = () => new Promise((resolve) => setTimeout(resolve, 5));

describe('Session', () => {
  it('forwards bytes both ways unchanged, and in order', async () => {
    const { client, redis, atRedis, atClient } = start();
    const request = Buffer.concat([cmd('PING'), cmd('SET', 'k', 'v'), Buffer.from('GET k\r\n')]);
    client.write(request);
    expect(await atRedis.atLeast(request.length)).toBe(text(request));
    redis.write('+PONG\r\n+OK\r\n$1\r\nv\r\n');
    expect(await atClient.atLeast(17)).toBe('+PONG\r\n+OK\r\n$1\r\nv\r\n');
  });

  it('sends a lock block as one script call, and what follows it only once the script has answered', async () => {
    const { client, redis, atRedis, atClient, stats } = start();
    client.write(Buffer.concat([lockAttempt('lock:a', 60), cmd('PING')]));
    const call = text(cmd('EVALSHA', LOCK_SCRIPT_SHA, '1', 'lock:a', 'INCRBY', '1', 'EXPIRE', '60'));
    expect(await atRedis.atLeast(call.length)).toBe(call);
    await tick();
    expect(atRedis.all).toBe(call); // the PING waits: Redis must run the block first
    redis.write('*2\r\n:1\r\n:1\r\n');
    expect(await atRedis.atLeast(call.length + 14)).toBe(call + text(cmd('PING')));
    redis.write('+PONG\r\n');
    expect(await atClient.atLeast(48)).toBe(attemptReplies(1, 1) + '+PONG\r\n');
    expect(stats.blocksRewritten).toBe(1);
  });

  it('asks the server version right before the first MULTI, which waits for the answer; later blocks wait for nothing', async () => {
    const { client, redis, atRedis, atClient, stats } = start(undefined, 'auto');
    client.write(Buffer.concat([cmd('PING'), lockAttempt('lock:a', 60), cmd('PING')]));
    const ahead = text(Buffer.concat([cmd('PING'), cmd('HELLO')]));
    expect(await atRedis.atLeast(ahead.length)).toBe(ahead);
    await tick();
    expect(atRedis.take()).toBe(ahead); // the block, and what follows it, wait for the version
    redis.write('+PONG\r\n*4\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n');
    const rest = text(
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:a', '1'), cmd('EXPIRE', 'lock:a', '60', 'NX'), cmd('EXEC'), cmd('PING')]),
    );
    expect(await atRedis.atLeast(rest.length)).toBe(rest);
    atRedis.take();
    client.write(Buffer.concat([lockAttempt('lock:b', 60), cmd('PING')])); // no second HELLO, no waiting
    const second = text(
      Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:b', '1'), cmd('EXPIRE', 'lock:b', '60', 'NX'), cmd('EXEC'), cmd('PING')]),
    );
    expect(await atRedis.atLeast(second.length)).toBe(second);
    // EXPIRE NX answers 0 where it left a lock's expiry alone: the client gets Redis alone's 1.
    redis.write(attemptReplies(1, 1) + '+PONG\r\n' + attemptReplies(2, 0) + '+PONG\r\n');
    const replies = '+PONG\r\n' + attemptReplies(1, 1) + '+PONG\r\n' + attemptReplies(2, 1) + '+PONG\r\n';
    expect(await atClient.atLeast(replies.length)).toBe(replies);
    expect(stats.rewrittenBy.transaction).toBe(2);
  });

  it('forwards an unfinished frame at once, but keeps back the start of a MULTI that may open a block', async () => {
    const { client, atRedis } = start();
    client.write('*2\r\n$3\r\nGE');
    expect(await atRedis.atLeast(10)).toBe('*2\r\n$3\r\nGE');
    atRedis.take();
    client.write('T\r\n$1\r\nk\r\n*1\r\n$5\r\nMUL');
    expect(await atRedis.atLeast(10)).toBe('T\r\n$1\r\nk\r\n');
    await tick();
    expect(atRedis.all).toBe('T\r\n$1\r\nk\r\n');
    client.write('TI\r\n*1\r\n$4\r\nPING\r\n'); // a MULTI, but no lock block: released at the next frame
    expect(await atRedis.atLeast(40)).toBe('T\r\n$1\r\nk\r\n*1\r\n$5\r\nMULTI\r\n*1\r\n$4\r\nPING\r\n');
  });

  it('authenticates with the URL’s password before the client’s first bytes, and again after a RESET that ran', async () => {
    const { client, redis, atRedis, atClient } = start('redis://:s3cret@127.0.0.1:6379');
    client.write(cmd('PING'));
    const auth = text(cmd('AUTH', 's3cret'));
    expect(await atRedis.atLeast(auth.length)).toBe(auth);
    await tick();
    expect(atRedis.take()).toBe(auth); // the PING waits for AUTH's reply
    redis.write('+OK\r\n');
    expect(await atRedis.atLeast(14)).toBe(text(cmd('PING')));
    atRedis.take();
    redis.write('+PONG\r\n');
    client.write(Buffer.concat([cmd('RESET'), cmd('GET', 'k')]));
    // The AUTH follows a RESET that ran: once Redis has answered it (6.2 may refuse it).
    expect(await atRedis.atLeast(14)).toBe(text(cmd('RESET')));
    await tick();
    expect(atRedis.take()).toBe(text(cmd('RESET')));
    redis.write('+RESET\r\n');
    expect(await atRedis.atLeast(auth.length)).toBe(auth);
    await tick();
    expect(atRedis.take()).toBe(auth); // the GET waits for AUTH's reply
    redis.write('+OK\r\n'); // AUTH's +OK stays with the proxy
    expect(await atRedis.atLeast(22)).toBe(text(cmd('GET', 'k')));
    atRedis.take();
    redis.write('$-1\r\n');
    expect(await atClient.atLeast(20)).toBe('+PONG\r\n+RESET\r\n$-1\r\n');
    // A RESET Redis refuses (Redis 6.2 checks ACLs on it) changed nothing: no AUTH after it.
    client.write(Buffer.concat([cmd('RESET'), cmd('GET', 'k')]));
    expect(await atRedis.atLeast(14)).toBe(text(cmd('RESET')));
    atRedis.take();
    redis.write("-NOPERM this user has no permissions to run the 'reset' command\r\n");
    expect(await atRedis.atLeast(22)).toBe(text(cmd('GET', 'k')));
    redis.write('$-1\r\n');
    expect(await atClient.atLeast(20 + 64 + 5)).toBe(
      "+PONG\r\n+RESET\r\n$-1\r\n-NOPERM this user has no permissions to run the 'reset' command\r\n$-1\r\n",
    );
  });

  it('on a client’s half-close, sends what it held and ends the upstream side; Redis’s last bytes still reach it', async () => {
    const { client, redis, atRedis, atClient } = start();
    const unfinished = Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:a', '1')]);
    client.write(unfinished);
    await tick();
    expect(atRedis.all).toBe('');
    client.end();
    expect(await atRedis.atLeast(unfinished.length)).toBe(text(unfinished));
    await tick();
    expect(atRedis.ended).toBe(true);
    redis.end('+OK\r\n+QUEUED\r\n');
    expect(await atClient.atLeast(14)).toBe('+OK\r\n+QUEUED\r\n');
    await tick();
    expect(atClient.ended).toBe(true);
  });

  it('after a RESET that ends a pipe (SUBSCRIBE): finds the marker’s refusal, applies the URL’s AUTH, counts replies again', async () => {
    const { client, redis, atRedis, atClient } = start('redis://:s3cret@127.0.0.1:6379');
    const auth = text(cmd('AUTH', 's3cret'));
    expect(await atRedis.atLeast(auth.length)).toBe(auth);
    atRedis.take();
    redis.write('+OK\r\n');
    client.write(Buffer.concat([cmd('SUBSCRIBE', 'c'), cmd('RESET'), cmd('GET', 'k')]));
    const sent = text(Buffer.concat([cmd('SUBSCRIBE', 'c'), cmd('RESET')]));
    const marker = /^\*1\r\n\$\d+\r\n(redis-lock-proxy-after-reset-[0-9a-f]{24})\r\n$/;
    expect(await atRedis.atLeast(sent.length + 60)).toMatch(new RegExp(`^${escape(sent)}`));
    await tick();
    const name = marker.exec(atRedis.take().slice(sent.length))?.[1]; // the GET waits for the marker
    expect(name).toBeDefined();
    // A message that looks like RESET's reply inside a push, a script's +RESET, then RESET's own.
    const pushes = '*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$8\r\n+RESET\r\n\r\n+RESET\r\n';
    redis.write(`${pushes}+RESET\r\n-ERR unknown command '${name}', with args`);
    await tick();
    expect(atRedis.take()).toBe(''); // the refusal is not whole yet
    redis.write(' beginning with: \r\n');
    expect(await atRedis.atLeast(auth.length)).toBe(auth);
    atRedis.take();
    redis.write('+OK\r\n');
    expect(await atRedis.atLeast(22)).toBe(text(cmd('GET', 'k')));
    redis.write('$-1\r\n');
    // The marker's refusal and AUTH's +OK stay with the proxy.
    expect(await atClient.atLeast(pushes.length + 13)).toBe(pushes + '+RESET\r\n$-1\r\n');
  });

  it('stops counting after SUBSCRIBE: pushes and replies alike pass through', async () => {
    const { client, redis, atClient, session } = start();
    client.write(cmd('SUBSCRIBE', 'c'));
    await tick();
    const pushes = '*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n';
    redis.write(pushes);
    expect(await atClient.atLeast(pushes.length)).toBe(pushes);
    expect(session.upstreamAddress).toBe('127.0.0.1:6379');
  });
});

/** `text` as a regular expression that matches it literally. */
function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
