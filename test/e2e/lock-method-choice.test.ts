/**
 * The way lock blocks take, chosen from what the server says it is and said where an operator
 * looks: the start-up line, `check` and /rules. `--lock-method transaction` in front of a server
 * without `EXPIRE ... NX` (before Redis 7.0) is refused by a start and by `check`, naming the
 * server's version and the way that works there, since every lock block would come back
 * EXECABORT; a server found to lack it later (a failover to an older replica) gets the script way
 * and an error line, and its locks are still fixed.
 */
import net from 'node:net';
import { beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../support/cli.js';
import { freePort } from '../support/ports.js';
import { startTestProxy } from '../support/proxy.js';
import { redisWithAdmin } from '../support/redis-and-proxy.js';
import { RawClient } from '../support/resp.js';
import { serverFacts, type ServerFacts } from '../support/server-facts.js';
import { attemptCounter, taskLockKey } from '../support/stalwart.js';

const env = redisWithAdmin();
let facts: ServerFacts;
beforeAll(async () => {
  facts = await serverFacts(env.admin);
});

/** The version as the server says it in HELLO (`redis 7.0.15`), or its refusal of HELLO before 6.2. */
function serverWords(): RegExp {
  return facts.has('reset') ? new RegExp(`${facts.server.replace(/\./g, '\\.')}`) : /ERR/;
}

describe('check and the start say which way lock blocks take, and why', () => {
  it('auto: the way this server needs, named with what it said it is', async () => {
    const exit = await runCli(['check', '--listen', '127.0.0.1:1', '--upstream', env.redis.url]);
    expect(exit.code).toBe(0);
    const way = facts.has('expire-nx') ? 'transaction' : 'transaction-script';
    expect(exit.stdout).toMatch(new RegExp(`, lock method ${way} \\(auto: .*\\)\\n$`));
    expect(exit.stdout).toMatch(serverWords());

    const proxy = await startTestProxy({ upstream: env.redis.url, admin: true });
    try {
      expect(proxy.app.describe()).toMatchObject({ lockMethod: 'auto', lockWay: { way } });
      const view = (await (await fetch(`http://127.0.0.1:${proxy.app.adminAddress?.port}/rules`)).json()) as {
        lockMethod: { setting: string; atStart: { way: string }; upstreams: Record<string, { way: string; server: string | null }> };
      };
      expect(view.lockMethod.setting).toBe('auto');
      expect(view.lockMethod.atStart.way).toBe(way);
      expect(Object.values(view.lockMethod.upstreams)).toEqual([{ way, server: expect.stringMatching(serverWords()) }]);
    } finally {
      await proxy.close();
    }
  });

  it('--lock-method transaction: refused by check and the start where the server has no EXPIRE ... NX', async () => {
    const args = ['--listen', '127.0.0.1:1', '--admin-listen', 'off', '--upstream', env.redis.url, '--lock-method', 'transaction'];
    const checked = await runCli(['check', ...args]);
    if (facts.has('expire-nx')) {
      expect(checked.code).toBe(0);
      expect(checked.stdout).toMatch(/, lock method transaction \(--lock-method transaction: .* has EXPIRE \.\.\. NX\)\n$/);
      return;
    }
    const started = await runCli(args);
    for (const [exit, prefix] of [
      [checked, 'redis-lock-proxy check: '],
      [started, 'redis-lock-proxy: '],
    ] as const) {
      expect({ code: exit.code, stdout: exit.stdout.includes('listening') }).toEqual({ code: 2, stdout: false });
      const said = `${exit.stdout}${exit.stderr}`;
      expect(said).toContain(`${prefix === 'redis-lock-proxy: ' ? '' : prefix}--lock-method transaction needs EXPIRE ... NX`);
      expect(said).toMatch(serverWords());
      expect(said).toContain('Use --lock-method auto');
    }
  });

  it('--lock-method transaction, the server found to lack EXPIRE ... NX after the start: the script way, and an error line', async () => {
    // The upstream answers nothing at the start (nothing listens yet), then is this server.
    const port = await freePort();
    const proxy = await startTestProxy({ upstream: `redis://127.0.0.1:${port}`, lockMethod: 'transaction' });
    const relay = net.createServer((client) => {
      const upstream = net.connect(env.redis.port, env.redis.host);
      client.pipe(upstream).pipe(client);
      client.on('error', () => upstream.destroy());
      upstream.on('error', () => client.destroy());
    });
    await new Promise<void>((resolve) => relay.listen(port, '127.0.0.1', resolve));
    try {
      const key = taskLockKey(0x38n);
      expect(await env.admin.call('SET', key, '1', 'PX', '1000000')).toBe('+OK\r\n');
      // A held lock: a loser's attempt gets counter 2, and the lease stays the owner's either way.
      expect(await attemptCounter(proxy.port, key, 3600)).toBe(2);
      expect(await env.admin.pttl(key)).toBeLessThanOrEqual(1_000_000);
      const said = proxy.logs().filter((line) => String(line.msg).startsWith('--lock-method transaction: this server has no EXPIRE'));
      expect(said.length).toBe(facts.has('expire-nx') ? 0 : 1);
      const client = await RawClient.connect(proxy.port);
      expect(await client.call('PING')).toBe('+PONG\r\n');
      await client.close();
    } finally {
      await proxy.close();
      relay.close();
    }
  });
});
