/**
 * The setup most end-to-end files share, as vitest hooks: a real Redis
 * (startRedis), the proxy in front of it (startTestProxy), and an admin
 * connection straight to Redis that arranges and inspects keys behind the
 * proxy's back. Started once for the file (or the describe block it is
 * called in), stopped after it, and the data emptied before each test, so
 * every test starts from an empty Redis.
 *
 *     const env = redisAndProxy({ proxy: { holdMs: 250 } });
 *     it('...', async () => {
 *       await env.admin.call('SET', 'lock:x', '1');
 *       const client = await RawClient.connect(env.proxy.port);
 *
 * The fields are getters: they can be read in tests and hooks, not while the
 * file is being collected (that throws, naming the field).
 */
import { afterAll, beforeAll, beforeEach, expect } from 'vitest';
import { startTestProxy, type TestProxy, type TestProxyOptions } from './proxy.js';
import { startRedis, type RedisServer, type StartRedisOptions } from './redis.js';
import { RawClient } from './resp.js';

export interface RedisWithAdmin {
  readonly redis: RedisServer;
  /** A raw connection straight to Redis, open for the whole file. */
  readonly admin: RawClient;
}

export interface RedisAndProxy extends RedisWithAdmin {
  /** The proxy, upstream `redis.url`. */
  readonly proxy: TestProxy;
}

export interface RedisWithAdminOptions {
  redis?: StartRedisOptions;
  /** FLUSHALL (and expect +OK) before each test; default true. */
  flushBeforeEach?: boolean;
}

export interface RedisAndProxyOptions extends RedisWithAdminOptions {
  /** Everything but the upstream, which is the Redis started here. */
  proxy?: Omit<TestProxyOptions, 'upstream'>;
}

/** A Redis and an admin connection to it, for files whose tests each start their own proxy. */
export function redisWithAdmin(options: RedisWithAdminOptions = {}): RedisWithAdmin {
  let redis: RedisServer | undefined;
  let admin: RawClient | undefined;
  beforeAll(async () => {
    redis = await startRedis(options.redis);
    admin = await RawClient.connect(redis.port);
  });
  afterAll(async () => {
    await admin?.close();
    await redis?.stop();
  });
  if (options.flushBeforeEach ?? true) {
    beforeEach(async () => {
      expect(await started(admin, 'admin').call('FLUSHALL')).toBe('+OK\r\n');
    });
  }
  return {
    get redis() {
      return started(redis, 'redis');
    },
    get admin() {
      return started(admin, 'admin');
    },
  };
}

/** A Redis, the proxy in front of it, and an admin connection to the Redis. */
export function redisAndProxy(options: RedisAndProxyOptions = {}): RedisAndProxy {
  const base = redisWithAdmin(options);
  let proxy: TestProxy | undefined;
  // Runs after redisWithAdmin's beforeAll; vitest runs afterAll hooks in reverse, so the proxy closes first.
  beforeAll(async () => {
    proxy = await startTestProxy({ ...options.proxy, upstream: base.redis.url });
  });
  afterAll(async () => {
    await proxy?.close();
  });
  return {
    get redis() {
      return base.redis;
    },
    get admin() {
      return base.admin;
    },
    get proxy() {
      return started(proxy, 'proxy');
    },
  };
}

function started<T>(value: T | undefined, name: string): T {
  if (value === undefined) throw new Error(`${name} is not started: use it inside a test or a hook, after this fixture's beforeAll`);
  return value;
}
