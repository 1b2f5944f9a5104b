/**
 * A proxy for each way of sending lock blocks (inside the client's own transaction with NX, and
 * the script), in front of the same Redis, for the files that compare them with Redis itself.
 * Started once for the file (as vitest hooks), after the fixture that starts the Redis.
 */
import { afterAll, beforeAll } from 'vitest';
import { startTestProxy, startTransactionProxy, type TestProxy } from './proxy.js';

export type LockWay = 'transaction' | 'script';

/** `upstream`: the Redis URL, read once its fixture has started. */
export function proxyPerLockWay(upstream: () => string): Record<LockWay, () => TestProxy> {
  const proxies: Partial<Record<LockWay, TestProxy>> = {};
  beforeAll(async () => {
    // Where the server has no EXPIRE ... NX the start refuses this way, and its tests skip.
    proxies.transaction = await startTransactionProxy({ upstream: upstream() });
    proxies.script = await startTestProxy({ upstream: upstream(), lockMethod: 'script' });
  });
  afterAll(async () => {
    await Promise.all(Object.values(proxies).map((proxy) => proxy?.close()));
  });
  const started = (way: LockWay) => (): TestProxy => {
    const proxy = proxies[way];
    if (proxy === undefined) {
      throw new Error(`the ${way} proxy is not started: use it inside a test or a hook (on a server that has its way)`);
    }
    return proxy;
  };
  return { transaction: started('transaction'), script: started('script') };
}
