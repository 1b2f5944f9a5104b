/**
 * A proxy for each way of sending lock blocks, in front of the same Redis, for the files that
 * compare them with Redis itself: inside the client's own transaction (`transaction`: with NX
 * where the server has EXPIRE ... NX, else auto's expiry script, the transaction-script way), and
 * the whole block as one script. Started once for the file (as vitest hooks), after the fixture
 * that starts the Redis.
 */
import { afterAll, beforeAll } from 'vitest';
import { startTestProxy, startTransactionProxy, type TestProxy } from './proxy.js';

export type LockWay = 'transaction' | 'script';

/** `upstream`: the Redis URL, read once its fixture has started. */
export function proxyPerLockWay(upstream: () => string): Record<LockWay, () => TestProxy> {
  const proxies: Partial<Record<LockWay, TestProxy>> = {};
  beforeAll(async () => {
    // Where the server has no EXPIRE ... NX the start refuses that way: auto takes the expiry script inside the transaction.
    proxies.transaction = (await startTransactionProxy({ upstream: upstream() })) ?? (await startTestProxy({ upstream: upstream() }));
    proxies.script = await startTestProxy({ upstream: upstream(), lockMethod: 'script' });
  });
  afterAll(async () => {
    await Promise.all(Object.values(proxies).map((proxy) => proxy?.close()));
  });
  const started = (way: LockWay) => (): TestProxy => {
    const proxy = proxies[way];
    if (proxy === undefined) {
      throw new Error(`the ${way} proxy is not started: use it inside a test or a hook`);
    }
    return proxy;
  };
  return { transaction: started('transaction'), script: started('script') };
}
