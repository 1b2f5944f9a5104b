/**
 * The README's "See the fix at work" lines, run as a newcomer pastes them (with the test's ports
 * in place of 6380 and 6379): through the proxy the loser's attempt leaves the TTL where it was,
 * directly against Redis it re-arms it, and the output looks as the README shows it.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { codeBlocksUnder, docFile } from '../support/docs.js';
import { redisAndProxy } from '../support/redis-and-proxy.js';

const env = redisAndProxy();

/** The first two code blocks after the heading: the lines to paste, and the output shown. */
function demo(): { script: string; shown: string } {
  const blocks = codeBlocksUnder(docFile('README.md').text, '### See the fix at work').slice(0, 2);
  expect(blocks.map((b) => b.info)).toEqual(['sh', '']);
  return { script: blocks[0].code, shown: blocks[1].code };
}

const LINE = /^port (\d+): counter (\d+), ttl (\d+) ms$/;

describe('README: see the fix at work', () => {
  it('shows the TTL kept through the proxy and re-armed directly', async () => {
    const { script, shown } = demo();
    expect(
      shown
        .trim()
        .split('\n')
        .map((line) => LINE.exec(line)?.slice(1, 3)),
    ).toEqual([
      ['6380', '2'],
      ['6379', '2'],
    ]);
    const ports = script.replace(/\b6380\b/g, String(env.proxy.port)).replace(/\b6379\b/g, String(env.redis.port));
    for (const shell of ['sh', 'bash']) {
      const { stdout } = await promisify(execFile)(shell, ['-c', ports]);
      const [proxy, direct] = stdout
        .trim()
        .split('\n')
        .map((line) => LINE.exec(line)?.slice(1).map(Number));
      expect(proxy?.slice(0, 2), shell).toEqual([env.proxy.port, 2]);
      expect(proxy?.[2], shell).toBeLessThanOrEqual(30_000); // kept: the owner's lease, lowered to 30 s
      expect(proxy?.[2], shell).toBeGreaterThan(20_000);
      expect(direct?.slice(0, 2), shell).toEqual([env.redis.port, 2]);
      expect(direct?.[2], shell).toBeGreaterThan(50_000); // re-armed to a full 60 s by the loser
    }
  });
});
