/**
 * The project's documentation as the tests that check what it says read it: README.md, the front
 * door, and every docs/*.md, the manual behind it. A fact checked "in the documentation" may
 * stand in any of them.
 */
import fs from 'node:fs';
import path from 'node:path';
import { ROOT } from './cli.js';

export interface DocFile {
  /** The path from the checkout's root: `README.md`, `docs/<name>.md`. */
  file: string;
  text: string;
}

/** README.md, then every docs/*.md in name order. */
export function docFiles(): DocFile[] {
  const dir = path.join(ROOT, 'docs');
  const docs = fs.existsSync(dir)
    ? fs
        .readdirSync(dir)
        .filter((name) => name.endsWith('.md'))
        .sort()
        .map((name) => `docs/${name}`)
    : [];
  return ['README.md', ...docs].map((file) => ({ file, text: fs.readFileSync(path.join(ROOT, file), 'utf8') }));
}

/** One documentation file. */
export function docFile(file: string): DocFile {
  return { file, text: fs.readFileSync(path.join(ROOT, file), 'utf8') };
}

/** All of the documentation as one text. */
export function docsText(): string {
  return docFiles()
    .map((doc) => doc.text)
    .join('\n');
}

/** Markdown text with its fenced code blocks blanked out (their lines kept, empty). */
export function withoutCodeBlocks(text: string): string {
  return text.replace(/^```[^\n]*\n[\s\S]*?^```$/gm, (block) => block.replace(/[^\n]/g, ''));
}

/** The anchors of a Markdown file's headings, as GitHub makes them (`## Redis Sentinel` is `#redis-sentinel`). */
export function headingAnchors(text: string): Set<string> {
  const anchors = new Set<string>();
  for (const [, heading] of withoutCodeBlocks(text).matchAll(/^#{1,6} +(.+?) *#* *$/gm)) {
    const base = heading
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1') // a link's text
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
      .replace(/ /g, '-');
    let anchor = base;
    for (let n = 1; anchors.has(anchor); n++) anchor = `${base}-${n}`;
    anchors.add(anchor);
  }
  return anchors;
}

/**
 * The code blocks under a heading, up to the next heading of the same level or higher: each
 * block's info string (`sh`, or empty) and its text.
 */
export function codeBlocksUnder(text: string, heading: string): Array<{ info: string; code: string }> {
  const lines = text.split('\n');
  const start = lines.indexOf(heading);
  if (start < 0) throw new Error(`no heading ${JSON.stringify(heading)}`);
  const level = /^#+/.exec(heading)?.[0].length ?? 1;
  const fenced = withoutCodeBlocks(text).split('\n');
  let end = start + 1;
  while (end < lines.length && !(/^#+ /.test(fenced[end]) && (/^#+/.exec(fenced[end])?.[0].length ?? 7) <= level)) end++;
  const section = lines.slice(start, end).join('\n');
  return [...section.matchAll(/^```(\S*)\n([\s\S]*?)^```$/gm)].map((m) => ({ info: m[1], code: m[2] }));
}
