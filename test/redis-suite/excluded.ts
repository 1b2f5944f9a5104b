/**
 * The tests of Redis's own suite whose failure through the proxy is not
 * counted: excluded.yaml, beside this file, one entry per test, each with a
 * reason that holds for every 1:1 hop (socat, HAProxy in TCP mode, this proxy),
 * never one about this proxy alone. An excluded test still runs: one that
 * passes is reported, so the list never hides a fix.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { parse } from 'yaml';

export interface Exclusion {
  /** Server lines it applies to, by version prefix (`7.0`, `6.0.16`), or every line when absent. */
  servers?: string[];
  unit: string;
  test: string;
  reason: string;
}

// From the checkout's root, so that it is found from the compiled runner (.suite/) too.
export const EXCLUDED_FILE = path.resolve(import.meta.dirname, '../../test/redis-suite/excluded.yaml');

/** The list, checked: a malformed entry is an error naming it. */
export function readExclusions(file = EXCLUDED_FILE): Exclusion[] {
  const doc = parse(readFileSync(file, 'utf8')) as { excluded?: unknown } | null;
  const entries = doc?.excluded ?? [];
  if (!Array.isArray(entries)) throw new Error(`${file}: "excluded" must be a list`);
  return entries.map((entry: unknown, i) => {
    const e = entry as Partial<Record<keyof Exclusion, unknown>>;
    const where = `${file}: excluded[${i}]`;
    for (const field of ['unit', 'test', 'reason'] as const)
      if (typeof e?.[field] !== 'string' || e[field] === '') throw new Error(`${where}: "${field}" must be a non-empty text`);
    if (e.servers !== undefined && !(Array.isArray(e.servers) && e.servers.every((s) => typeof s === 'string')))
      throw new Error(`${where}: "servers" must be a list of versions`);
    return e as Exclusion;
  });
}

/** The exclusion that covers `test` of `unit` on a server of `version`, if any. */
export function exclusionFor(list: Exclusion[], version: string, unit: string, test: string): Exclusion | undefined {
  return list.find(
    (e) =>
      e.unit === unit &&
      e.test === test &&
      (!e.servers || e.servers.some((prefix) => version === prefix || version.startsWith(`${prefix}.`))),
  );
}
