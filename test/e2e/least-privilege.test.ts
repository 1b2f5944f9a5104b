/**
 * The least-privilege ACL line the README gives for this server's line, used as it is written:
 * through the proxy (its default way for this server), a held lock keeps its lease, the replies
 * are Redis's own, and nothing falls back; directly, the same user re-arms the lock.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { redisAndProxy } from '../support/redis-and-proxy.js';
import { cmd, exchange } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { lockAttempt, taskLockKey } from '../support/stalwart.js';

const env = redisAndProxy();
let facts: ServerFacts;
beforeAll(async () => {
  facts = await serverFacts(env.admin);
});

/** The README's `ACL SETUSER` line under the comment naming `line`. */
function readmeAclLine(line: string): string[] {
  const readme = readFileSync(path.resolve(import.meta.dirname, '../../README.md'), 'utf8');
  const match = new RegExp(`# ${line}\\n(ACL SETUSER [^\\n]+)`).exec(readme);
  if (match === null) throw new Error(`README.md has no ACL SETUSER line under "# ${line}"`);
  return match[1].replace('>PASSWORD', '>pw').split(' ');
}

describe("the README's least-privilege user", () => {
  it('has its lock blocks fixed through the proxy on this server', async () => {
    const words = readmeAclLine(facts.has('expire-nx') ? 'Redis 7.0 and later, Valkey' : 'Redis 6.0 and 6.2');
    expect(await env.admin.call(...words)).toBe('+OK\r\n');
    const user = words[2];
    const key = taskLockKey(0x5eed5n);
    const attempt = async (port: number) => {
      expect(await env.admin.call('SET', key, '1', 'PX', '1000000')).toBe('+OK\r\n');
      const replies = await exchange(port, Buffer.concat([cmd('AUTH', user, 'pw'), lockAttempt(key, 3600)]), 5);
      return { replies, ttl: await env.admin.pttl(key) };
    };
    const fallbacks = [...env.proxy.stats.fallbacks.values()].reduce((sum, n) => sum + n, 0);
    const direct = await attempt(env.redis.port);
    const proxied = await attempt(env.proxy.port);
    expect(direct.replies).toBe('+OK\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:2\r\n:1\r\n');
    expect(proxied.replies).toBe(direct.replies);
    expect(direct.ttl).toBeGreaterThan(3_000_000);
    expect(proxied.ttl).toBeLessThanOrEqual(1_000_000);
    expect([...env.proxy.stats.fallbacks.values()].reduce((sum, n) => sum + n, 0)).toBe(fallbacks);
  });
});
