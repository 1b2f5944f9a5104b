/**
 * The in-process proxy as production runs it, each against real
 * redis-server processes: TLS on both sides, observe mode for the whole
 * proxy, rule reload, graceful shutdown, the connection limit and the idle
 * timeout, closing after the last reply, and backpressure. (The built
 * command line's signals and reloads: cli-admin-signals-reload.test.ts.)
 */
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { run as locks } from '../../src/ops/locks.js';
import { startTestProxy, TEST_RULES } from '../support/proxy.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { startRedis, type RedisServer } from '../support/redis.js';
import { freePort } from '../support/ports.js';
import { cmd, RawClient } from '../support/resp.js';
import { attemptReplies, lockAttempt } from '../support/stalwart.js';
import { makeCertificates, redisTlsArgs, type TestCertificates } from '../support/tls.js';
import { runOp } from '../support/ops.js';

/** Each test starts the proxy it needs, in front of this Redis. */
const env = redisWithAdmin();

const adminCall = (...args: (string | Buffer)[]): Promise<string> => env.admin.call(...args);

const pttl = (key: Buffer | string): Promise<number> => env.admin.pttl(key);

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Reads from a TLS or TCP socket until `n` bytes arrived (or the socket closes). */
function readBytes(socket: net.Socket, until: (text: string) => boolean, timeoutMs = 5000): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    const timer = setTimeout(() => reject(new Error(`timed out; got ${JSON.stringify(text)}`)), timeoutMs);
    const done = (): void => {
      clearTimeout(timer);
      socket.off('data', onData);
      resolve(text);
    };
    const onData = (chunk: Buffer): void => {
      text += chunk.toString('latin1');
      if (until(text)) done();
    };
    socket.on('data', onData);
    socket.once('close', done);
  });
}

describe('TLS', () => {
  let certs: TestCertificates;
  let tlsRedis: RedisServer;
  let mtlsRedis: RedisServer;
  let tlsPort: number;
  let mtlsPort: number;

  beforeAll(async () => {
    certs = makeCertificates();
    tlsPort = await freePort();
    mtlsPort = await freePort();
    tlsRedis = await startRedis({ args: redisTlsArgs(certs, tlsPort, false) });
    mtlsRedis = await startRedis({ args: redisTlsArgs(certs, mtlsPort, true) });
  });

  afterAll(async () => {
    await tlsRedis?.stop();
    await mtlsRedis?.stop();
    certs?.remove();
  });

  async function throughTlsUpstream(port: number, upstreamTls: Parameters<typeof startTestProxy>[0]['upstreamTls']): Promise<string> {
    const proxy = await startTestProxy({ upstream: `rediss://127.0.0.1:${port}`, upstreamTls });
    try {
      const client = await RawClient.connect(proxy.port);
      // The second expiry longer than the first, so that a re-armed lease would show in the PTTL.
      client.write(
        Buffer.concat([lockAttempt('lock:tls', 60), lockAttempt('lock:tls', 600), cmd('PTTL', 'lock:tls'), cmd('DEL', 'lock:tls')]),
      );
      const replies = (await client.readReplies(10).catch(async () => client.readUntilClosed())).toString('latin1');
      await client.close();
      return replies;
    } finally {
      await proxy.close();
    }
  }

  /** Both attempts answered as Redis alone answers them, the second leaving the first's 60 s lease; then the key deleted. */
  function expectFixed(replies: string): void {
    const attempts = attemptReplies(1, 1) + attemptReplies(2, 1);
    expect(replies.slice(0, attempts.length)).toBe(attempts);
    const after = /^:(\d+)\r\n:1\r\n$/.exec(replies.slice(attempts.length));
    expect(after, replies).not.toBeNull();
    expect(Number(after?.[1])).toBeLessThanOrEqual(60_000);
  }

  it('rewrites lock blocks over a rediss:// upstream verified with its CA', async () => {
    expectFixed(await throughTlsUpstream(tlsPort, { ca: certs.read(certs.caCert), insecure: false }));
  });

  it('refuses an upstream whose certificate the CA did not sign, and says why', async () => {
    const replies = await throughTlsUpstream(tlsPort, { ca: certs.read(certs.otherCaCert), insecure: false });
    expect(replies).toMatch(/^-ERR redis-lock-proxy: upstream rediss:\/\/127\.0\.0\.1:\d+ is unreachable: .*certificate/);
  });

  it('verifies the name given with servername (SNI) instead of the URL host', async () => {
    const ca = certs.read(certs.caCert);
    expectFixed(await throughTlsUpstream(tlsPort, { ca, servername: 'localhost', insecure: false }));
    expect(await throughTlsUpstream(tlsPort, { ca, servername: 'redis.example', insecure: false })).toMatch(
      /is unreachable: .*redis\.example/,
    );
  });

  it('connects anyway with the insecure option', async () => {
    expectFixed(await throughTlsUpstream(tlsPort, { insecure: true }));
  });

  it('presents a client certificate to a Redis that requires one', async () => {
    const withCert = await throughTlsUpstream(mtlsPort, {
      ca: certs.read(certs.caCert),
      cert: certs.read(certs.clientCert),
      key: certs.read(certs.clientKey),
      insecure: false,
    });
    expectFixed(withCert);
    const without = await throughTlsUpstream(mtlsPort, { ca: certs.read(certs.caCert), insecure: false });
    expect(without).not.toContain('+QUEUED');
  });

  it('locks reads a TLS Redis with the proxy’s TLS options: CA, client certificate, server name', async () => {
    const key = Buffer.concat([Buffer.from([0x17]), Buffer.alloc(8, 7)]);
    const proxy = await startTestProxy({
      upstream: `rediss://127.0.0.1:${mtlsPort}`,
      upstreamTls: { ca: certs.read(certs.caCert), cert: certs.read(certs.clientCert), key: certs.read(certs.clientKey), insecure: false },
    });
    try {
      const client = await RawClient.connect(proxy.port);
      client.write(lockAttempt(key, 60));
      expect((await client.readReplies(4)).toString()).toBe(attemptReplies(1, 1));
      await client.close();
    } finally {
      await proxy.close();
    }
    const run = (args: string[], variables: NodeJS.ProcessEnv = {}) =>
      runOp(locks, ['--upstream', `rediss://127.0.0.1:${mtlsPort}`, '--json', ...args], variables);
    const tlsFlags = ['--upstream-ca', certs.caCert, '--upstream-cert', certs.clientCert, '--upstream-key', certs.clientKey];
    const listed = await run([...tlsFlags, '--upstream-servername', 'localhost']);
    expect(listed.stderr).toBe('');
    expect(listed.stdout).toContain(`"key_hex":"${key.toString('hex')}"`);
    // The same from the proxy's variables.
    const fromEnv = await run([], {
      REDIS_LOCK_PROXY_UPSTREAM_CA: certs.caCert,
      REDIS_LOCK_PROXY_UPSTREAM_CERT: certs.clientCert,
      REDIS_LOCK_PROXY_UPSTREAM_KEY: certs.clientKey,
    });
    expect(fromEnv.stdout).toContain(key.toString('hex'));
    // Without the client certificate, or verifying another name: refused, saying why.
    expect(await run(['--upstream-ca', certs.caCert])).toMatchObject({ code: 1 });
    const wrongName = await run([...tlsFlags, '--upstream-servername', 'redis.example']);
    expect(wrongName.code).toBe(1);
    expect(wrongName.stderr).toMatch(/redis\.example/);
    expect(await run(['--upstream-cert', certs.clientCert])).toMatchObject({
      code: 2,
      stderr: expect.stringMatching(/upstream-cert and upstream-key go together/),
    });
    await adminCall('DEL', key);
  });

  it('serves clients over TLS, and can require their certificates', async () => {
    const listenerTls = { cert: certs.read(certs.serverCert), key: certs.read(certs.serverKey), clientCa: certs.read(certs.caCert) };
    const proxy = await startTestProxy({ upstream: env.redis.url, listenerTls });
    try {
      const options = { host: '127.0.0.1', port: proxy.port, ca: certs.read(certs.caCert) };
      const good = tls.connect({ ...options, cert: certs.read(certs.clientCert), key: certs.read(certs.clientKey) });
      await new Promise((r) => good.once('secureConnect', r));
      good.write(lockAttempt('lock:tls-client', 60));
      expect(await readBytes(good, (t) => t.endsWith(':1\r\n:1\r\n'))).toBe(attemptReplies(1, 1));
      good.end();

      const anonymous = tls.connect(options);
      anonymous.on('error', () => {});
      anonymous.write(cmd('PING'));
      expect(await readBytes(anonymous, (t) => t.includes('PONG'))).not.toContain('PONG');
      anonymous.destroy();
    } finally {
      await proxy.close();
    }
  });
});

describe('observe mode for the whole proxy', () => {
  it('counts and logs what would be rewritten, and forwards it unchanged', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url, mode: 'observe' });
    try {
      await adminCall('SET', 'lock:obs', '1', 'EX', '5');
      const client = await RawClient.connect(proxy.port);
      client.write(lockAttempt('lock:obs', 60));
      expect((await client.readReplies(4)).toString()).toBe(attemptReplies(2, 1));
      await client.close();
      expect(await pttl('lock:obs')).toBeGreaterThan(55_000);
      expect(proxy.stats.blocksObserved).toBe(1);
      expect(proxy.stats.byRule.get('test-lock')?.observed).toBe(1);
      expect(proxy.logs().find((l) => l.msg === 'observe: lock block would be rewritten')).toMatchObject({
        rule: 'test-lock',
        key: 'lock:obs',
      });
    } finally {
      await proxy.close();
    }
  });
});

describe('rule reload', () => {
  it('applies new rules to new blocks on open connections, and keeps the old ones when the new file is invalid', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url });
    try {
      const client = await RawClient.connect(proxy.port);
      await adminCall('SET', 'lock:r', '1', 'EX', '5');
      client.write(lockAttempt('lock:r', 60));
      expect((await client.readReplies(4)).toString()).toBe(attemptReplies(2, 1)); // Redis's own answer: the lease stays
      expect(await pttl('lock:r')).toBeLessThanOrEqual(5000);

      fs.writeFileSync(proxy.ruleFiles[0], TEST_RULES.replace('prefix: "lock:"', 'prefix: "lock:"\n    mode: observe'));
      expect(proxy.rules.reload('test')).toBe(true);
      client.write(lockAttempt('lock:r', 60));
      expect((await client.readReplies(4)).toString()).toBe(attemptReplies(3, 1));
      expect(await pttl('lock:r')).toBeGreaterThan(55_000); // observed: re-armed as without the proxy

      fs.writeFileSync(proxy.ruleFiles[0], 'rules:\n  - name: broken\n    prefx: "x"\n');
      expect(proxy.rules.reload('test')).toBe(false);
      expect(proxy.rules.current.rules.find((r) => r.name === 'test-lock')?.mode).toBe('observe');
      expect(
        proxy.logs().some((l) => l.msg === 'rule reload refused; the previous rules stay in force' && String(l.err).includes('prefx')),
      ).toBe(true);
      expect(proxy.stats.ruleReloadFailures).toBe(1);
      client.write(cmd('PING'));
      expect((await client.readReplies(1)).toString()).toBe('+PONG\r\n'); // the connection survived
      await client.close();
    } finally {
      await proxy.close();
    }
  });
});

describe('graceful shutdown', () => {
  it('closes idle connections at once, lets a pending reply arrive, then closes', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url });
    const idle = await RawClient.connect(proxy.port);
    const blocked = await RawClient.connect(proxy.port);
    idle.write(cmd('PING'));
    await idle.readReplies(1);
    blocked.write(cmd('BLPOP', 'shutdown:list', '0'));
    await sleep(50);
    const shutdown = proxy.app.shutdown(5000);
    expect((await idle.readUntilClosed(2000)).length).toBe(0);
    expect(blocked.isClosed).toBe(false);
    await adminCall('RPUSH', 'shutdown:list', 'x');
    expect((await blocked.readReplies(1)).toString()).toBe('*2\r\n$13\r\nshutdown:list\r\n$1\r\nx\r\n');
    await blocked.readUntilClosed(2000);
    await shutdown;
    expect(
      await RawClient.connect(proxy.port).then(
        () => 'accepted',
        () => 'refused',
      ),
    ).toBe('refused');
    await proxy.close();
  });

  it('closes connections still busy at the deadline', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url });
    const blocked = await RawClient.connect(proxy.port);
    blocked.write(cmd('BLPOP', 'shutdown:never', '0'));
    await sleep(50);
    const started = Date.now();
    await proxy.app.shutdown(300);
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    await blocked.readUntilClosed(1000);
    await proxy.close();
  });
});

describe('limits', () => {
  it('refuses connections over max-connections with Redis’s own error', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url, maxConnections: 2 });
    try {
      const a = await RawClient.connect(proxy.port);
      const b = await RawClient.connect(proxy.port);
      await sleep(20);
      const c = await RawClient.connect(proxy.port);
      expect((await c.readUntilClosed()).toString()).toBe('-ERR max number of clients reached\r\n');
      expect(proxy.stats.connectionsRejected).toBe(1);
      a.write(cmd('PING'));
      expect((await a.readReplies(1)).toString()).toBe('+PONG\r\n');
      await a.close();
      await b.close();
    } finally {
      await proxy.close();
    }
  });

  it('closes idle connections after idle-timeout-ms, but not one waiting on a blocking command', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url, idleTimeoutMs: 200 });
    try {
      const idle = await RawClient.connect(proxy.port);
      const blocked = await RawClient.connect(proxy.port);
      blocked.write(cmd('BLPOP', 'idle:list', '0'));
      await idle.readUntilClosed(2000);
      expect(blocked.isClosed).toBe(false);
      await adminCall('RPUSH', 'idle:list', 'x');
      expect((await blocked.readReplies(1)).toString()).toContain('idle:list');
      await blocked.readUntilClosed(2000); // idle again after its reply
    } finally {
      await proxy.close();
    }
  });
});

describe('closing after the last reply', () => {
  it('delivers a large reply before QUIT in full to a client that reads late, then closes', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url });
    try {
      const value = Buffer.alloc(8 * 1024 * 1024, 'q');
      await adminCall('SET', 'quit:big', value);
      const socket = net.connect(proxy.port, '127.0.0.1');
      await new Promise((r) => socket.once('connect', r));
      socket.pause();
      socket.write(Buffer.concat([cmd('GET', 'quit:big'), cmd('QUIT')]));
      await sleep(500); // Redis has answered and closed by now; the proxy still holds the reply
      const chunks: Buffer[] = [];
      await new Promise<void>((resolve) => {
        socket.on('data', (chunk: Buffer) => chunks.push(chunk));
        socket.on('close', () => resolve());
        socket.resume();
      });
      const received = Buffer.concat(chunks);
      const header = `$${value.length}\r\n`;
      expect(received.length).toBe(header.length + value.length + 2 + '+OK\r\n'.length);
      expect(received.subarray(received.length - 5).toString()).toBe('+OK\r\n');
    } finally {
      await proxy.close();
    }
  });
});

describe('backpressure', () => {
  it('pauses the upstream while a client does not read a large reply, and loses nothing', async () => {
    const proxy = await startTestProxy({ upstream: env.redis.url });
    try {
      const value = Buffer.alloc(32 * 1024 * 1024, 'v');
      await adminCall('SET', 'bp:big', value);
      const socket = net.connect(proxy.port, '127.0.0.1');
      await new Promise((r) => socket.once('connect', r));
      socket.pause(); // a client that stops reading
      const gets = 8; // 256 MiB of replies
      socket.write(Buffer.concat(Array.from({ length: gets }, () => cmd('GET', 'bp:big'))));
      await sleep(1000);
      // The proxy read only what the client's socket buffers could take, not the whole 256 MiB.
      expect(proxy.stats.bytesFromUpstream).toBeLessThan(64 * 1024 * 1024);
      let received = 0;
      const expected = gets * (value.length + `$${value.length}\r\n\r\n`.length);
      await new Promise<void>((resolve) => {
        socket.on('data', (chunk: Buffer) => {
          received += chunk.length;
          if (received >= expected) resolve();
        });
        socket.resume();
      });
      expect(received).toBe(expected);
      socket.destroy();
    } finally {
      await proxy.close();
    }
  }, 30_000);
});
