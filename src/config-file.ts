/**
 * A config file as the settings read it: a YAML mapping of setting: value, each entry with the
 * line it is on, so that an error can name the file, the line and the key. What the keys and
 * values mean is the settings' business (settings.ts).
 */
import fs from 'node:fs';
import { isMap, isScalar, LineCounter, parseDocument } from 'yaml';
import { ConfigError } from './errors.js';

export interface FileEntry {
  readonly key: string;
  readonly value: unknown;
  /** 1-based. */
  readonly line: number;
}

/** The file's entries in file order; a ConfigError naming the file (and the line) when it cannot be read as such. */
export function readConfigFile(file: string): FileEntry[] {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`config file ${file}: cannot read: ${(err as Error).message}`, { cause: err });
  }
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, uniqueKeys: true, prettyErrors: true });
  const problem = doc.errors[0];
  if (problem !== undefined) {
    // yaml's message names the line and column, then quotes the line: the first line says it all.
    throw new ConfigError(`config file ${file}: not valid YAML: ${problem.message.split('\n')[0]}`, { cause: problem });
  }
  if (doc.contents === null || (isScalar(doc.contents) && doc.contents.value === null)) return [];
  if (!isMap(doc.contents)) throw new ConfigError(`config file ${file}: must be a mapping of setting: value`);
  const values = doc.toJS() as Record<string, unknown>;
  return doc.contents.items.map((pair) => {
    const key = isScalar(pair.key) ? String(pair.key.value) : String(pair.key);
    const offset = isScalar(pair.key) ? (pair.key.range?.[0] ?? 0) : 0;
    return { key, value: values[key], line: lines.linePos(offset).line };
  });
}
