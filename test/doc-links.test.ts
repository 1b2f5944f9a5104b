/**
 * The documentation's links hold: every relative link in README.md and docs/*.md names a file of
 * the checkout and, with an anchor, a heading of that file; the README links to every file of
 * docs/; and every file of the project that names README.md or a file of docs/ (a unit's
 * Documentation=, a comment, a help text) names one that exists, with a heading that exists.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from './support/cli.js';
import { docFile, docFiles, headingAnchors, withoutCodeBlocks } from './support/docs.js';

/** Where a link or a mention leads: its file (from the checkout's root) and anchor, or why it leads nowhere. */
function broken(from: string, target: string): string | undefined {
  const [file, anchor] = target.split('#', 2) as [string, string | undefined];
  const resolved = file === '' ? from : path.relative(ROOT, path.resolve(ROOT, path.dirname(from), file));
  if (resolved.startsWith('..') || !fs.existsSync(path.join(ROOT, resolved))) return `${target}: no file ${resolved}`;
  if (anchor === undefined) return undefined;
  if (!resolved.endsWith('.md')) return `${target}: an anchor in a file that is not Markdown`;
  if (!headingAnchors(docFile(resolved).text).has(anchor)) return `${target}: ${resolved} has no heading #${anchor}`;
  return undefined;
}

/** Relative links of a Markdown text, outside code: `[text](target)`. */
function relativeLinks(text: string): string[] {
  return [...withoutCodeBlocks(text).matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]).filter((target) => !/^[a-z]+:/.test(target));
}

describe('links in README.md and docs/', () => {
  it('every relative link names a file of the checkout, and every anchor a heading of that file', () => {
    const problems = docFiles().flatMap(({ file, text }) =>
      relativeLinks(text)
        .flatMap((target) => broken(file, target) ?? [])
        .map((problem) => `${file}: ${problem}`),
    );
    expect(problems).toEqual([]);
  });

  it('the README links to every file of docs/', () => {
    const linked = new Set(relativeLinks(docFile('README.md').text).map((target) => target.split('#')[0]));
    const docs = docFiles()
      .map((doc) => doc.file)
      .filter((file) => file.startsWith('docs/'));
    expect(docs.filter((file) => !linked.has(file))).toEqual([]);
  });

  it('every other file that names README.md or a file of docs/ names one that exists, and a heading it has', () => {
    const tracked = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' })
      .split('\n')
      .filter((file) => file && !file.endsWith('.md') && fs.existsSync(path.join(ROOT, file)));
    const problems: string[] = [];
    for (const file of tracked) {
      const text = fs.readFileSync(path.join(ROOT, file), 'utf8');
      // `docs/<name>.md`, `docs/<name>.md#<heading>`, `README.md#quick-start`, also inside a file:// URL.
      for (const [target] of text.matchAll(/(?<![\w.-])(?:docs\/[a-z0-9-]+\.md|README\.md)(?:#[a-z0-9-]+)?/g)) {
        const problem = broken('', target);
        if (problem) problems.push(`${file}: ${problem}`);
      }
    }
    expect(problems).toEqual([]);
  });
});
