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

/** A fenced code block, at the start of a line or indented in a list item: its indentation, info string and text. */
const CODE_BLOCK = /^( *)```(\S*)\n([\s\S]*?)^\1```$/gm;

/** Markdown text with its fenced code blocks blanked out (their lines kept, empty). */
export function withoutCodeBlocks(text: string): string {
  return text.replace(CODE_BLOCK, (block) => block.replace(/[^\n]/g, ''));
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
 * block's info string (`sh`, or empty) and its text (without the indentation of a block in a
 * list item).
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
  return [...section.matchAll(CODE_BLOCK)].map(([, indent, info, code]) => ({
    info,
    code: code.replace(new RegExp(`^${indent}`, 'gm'), ''),
  }));
}

export interface PodmanNotes {
  /** `--ulimit` values for one container: `nofile=20000:20000`, ... */
  ulimits: string[];
  /** `default_ulimits` for every container (containers.conf). */
  defaultUlimits: string[];
  /** The command that runs the Compose example's health check by hand. */
  healthCheck: string;
  /** The Compose build: its environment, its file (`-f`) and the rest of its arguments. */
  composeBuild: { env: Record<string, string>; file: string; args: string[] };
  /** Behind a TLS-inspecting proxy: the name `podman build` gives the image, Compose's name for it. */
  composeImage: string;
}

/** The commands of docs/running.md's notes for podman ("Under podman"), as the tests that check them read them. */
export function podmanNotes(): PodmanNotes {
  const blocks = codeBlocksUnder(docFile('docs/running.md').text, '### Under podman').map((block) => block.code.trim());
  const block = (start: string) => {
    const found = blocks.find((code) => code.startsWith(start));
    if (found === undefined) throw new Error(`docs/running.md, "Under podman": no code block starts with ${JSON.stringify(start)}`);
    return found;
  };
  const ulimits = [...block('podman run').matchAll(/--ulimit (\S+)/g)].map((m) => m[1]);
  const defaultUlimits = JSON.parse(/^default_ulimits = (\[.*\])$/m.exec(block('[containers]'))?.[1] ?? '[]') as string[];
  const words = block('DOCKER_BUILDKIT=').split(/\s+/);
  const env = Object.fromEntries(
    words.filter((word, i) => i < words.indexOf('docker') && word.includes('=')).map((word) => word.split('=')),
  );
  const rest = words.slice(words.indexOf('compose') + 1);
  const file = rest[rest.indexOf('-f') + 1];
  const args = rest.filter((_, i) => i !== rest.indexOf('-f') && i !== rest.indexOf('-f') + 1);
  const composeImage = /-t (\S+) \.$/.exec(block('podman build'))?.[1] ?? '';
  return { ulimits, defaultUlimits, healthCheck: block('until podman healthcheck run'), composeBuild: { env, file, args }, composeImage };
}
