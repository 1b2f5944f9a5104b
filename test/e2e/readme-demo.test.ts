/**
 * The README's "See the fix at work" lines, run as a newcomer pastes them (with the test's ports
 * in place of 6380 and 6379): through the proxy the loser's attempt leaves the TTL where it was,
 * directly against Redis it re-arms it, and the output looks as the README shows it. And the
 * rules the README says the demo needs: with them (the default, `--stalwart` of a 0.16 release)
 * the proxy keeps the TTL; without them (`--stalwart` of an older release, `--mode observe`) it
 * passes the block on and the demo shows the TTL re-armed on both ports.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { codeBlocksUnder, docFile } from '../support/docs.js';
import { redisAndProxy, type RedisAndProxy, type RedisAndProxyOptions } from '../support/redis-and-proxy.js';

const HEADING = '### See the fix at work';

/** The first two code blocks after the heading: the lines to paste, and the output shown. */
function demo(): { script: string; shown: string } {
  const blocks = codeBlocksUnder(docFile('README.md').text, HEADING).slice(0, 2);
  expect(blocks.map((b) => b.info)).toEqual(['sh', '']);
  return { script: blocks[0].code, shown: blocks[1].code };
}

const LINE = /^port (\d+): counter (\d+), ttl (\d+) ms$/;

/** The demo run by `shell` with the test's ports: [port, counter, ttl] through the proxy, then directly. */
async function runDemo(env: RedisAndProxy, shell = 'sh'): Promise<Array<number[] | undefined>> {
  const ports = demo()
    .script.replace(/\b6380\b/g, String(env.proxy.port))
    .replace(/\b6379\b/g, String(env.redis.port));
  const { stdout } = await promisify(execFile)(shell, ['-c', ports]);
  return stdout
    .trim()
    .split('\n')
    .map((line) => LINE.exec(line)?.slice(1).map(Number));
}

describe('README: see the fix at work', () => {
  const env = redisAndProxy();

  it('shows the TTL kept through the proxy and re-armed directly', async () => {
    const { shown } = demo();
    expect(
      shown
        .trim()
        .split('\n')
        .map((line) => LINE.exec(line)?.slice(1, 3)),
    ).toEqual([
      ['6380', '2'],
      ['6379', '2'],
    ]);
    for (const shell of ['sh', 'bash']) {
      const [proxy, direct] = await runDemo(env, shell);
      expect(proxy?.slice(0, 2), shell).toEqual([env.proxy.port, 2]);
      expect(proxy?.[2], shell).toBeLessThanOrEqual(30_000); // kept: the owner's lease, lowered to 30 s
      expect(proxy?.[2], shell).toBeGreaterThan(20_000);
      expect(direct?.slice(0, 2), shell).toEqual([env.redis.port, 2]);
      expect(direct?.[2], shell).toBeGreaterThan(50_000); // re-armed to a full 60 s by the loser
    }
  });
});

describe('README: the rules the demo needs', () => {
  it('says which: stalwart-task-lock, in enforce mode', () => {
    const section = docFile('README.md').text.split(HEADING)[1].split('\n## ')[0];
    for (const words of ['`stalwart-task-lock`', '`rules/stalwart/0.16.yaml`', 'enforce', '`--stalwart`', '`--mode observe`'])
      expect(section).toContain(words);
  });

  /** A proxy started with `options`, and whether the demo through it keeps the owner's TTL. */
  const cases: Array<{ name: string; options: RedisAndProxyOptions['proxy']; kept: boolean }> = [
    { name: '--stalwart 0.16.9 (a release from 0.16.0 to 0.16.15)', options: { stalwart: '0.16.9' }, kept: true },
    { name: '--stalwart 0.15.3 (an older release)', options: { stalwart: '0.15.3' }, kept: false },
    { name: '--mode observe', options: { mode: 'observe' }, kept: false },
  ];
  for (const { name, options, kept } of cases) {
    describe(name, () => {
      const env = redisAndProxy({ proxy: options });
      it(kept ? 'keeps the TTL through the proxy' : 'passes the block on: the TTL is re-armed on both ports', async () => {
        const [proxy, direct] = await runDemo(env);
        expect(proxy?.slice(0, 2)).toEqual([env.proxy.port, 2]);
        if (kept) expect(proxy?.[2]).toBeLessThanOrEqual(30_000);
        else expect(proxy?.[2]).toBeGreaterThan(50_000);
        expect(direct?.[2]).toBeGreaterThan(50_000);
      });
    });
  }
});
