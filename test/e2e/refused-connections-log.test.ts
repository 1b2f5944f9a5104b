/**
 * A proxy whose upstream is down refuses every client connection with an error naming the
 * upstream; its log says so once, then counts (a failover must not flood the journal with a
 * line per client connection).
 */
import { describe, expect, it } from 'vitest';
import { REFUSAL_SUMMARY_MS } from '../../src/upstream/refusal-log.js';
import { closedPort } from '../support/ports.js';
import { startTestProxy } from '../support/proxy.js';
import { cmd, RawClient } from '../support/resp.js';

describe('client connections refused while the upstream is down', () => {
  it('are logged once, then counted in one line per period', async () => {
    const dead = await closedPort();
    const proxy = await startTestProxy({ upstream: `redis://127.0.0.1:${dead}` });
    const CONNECTIONS = 200;
    try {
      for (let i = 0; i < CONNECTIONS; i++) {
        const client = await RawClient.connect(proxy.port);
        client.write(cmd('PING'));
        expect((await client.readUntilClosed()).toString('latin1')).toMatch(
          /^-ERR redis-lock-proxy: upstream redis:\/\/127\.0\.0\.1:\d+ is unreachable: /,
        );
      }
      const warnings = () => proxy.logs().filter((l) => typeof l.msg === 'string' && l.msg.startsWith('upstream unreachable'));
      expect(warnings().map((l) => l.msg)).toEqual(['upstream unreachable']);
      await expect.poll(() => warnings().length, { timeout: REFUSAL_SUMMARY_MS + 10_000, interval: 200 }).toBeGreaterThan(1);
      const summaries = warnings().slice(1);
      expect(summaries.every((l) => l.msg === 'upstream unreachable: more client connections refused')).toBe(true);
      expect(summaries.reduce((sum, l) => sum + Number(l.refused), 0)).toBe(CONNECTIONS - 1);
      expect(Object.keys(summaries[0].errors as object)).toEqual([`connect ECONNREFUSED 127.0.0.1:${dead}`]);
    } finally {
      await proxy.close();
    }
  }, 40_000);
});
