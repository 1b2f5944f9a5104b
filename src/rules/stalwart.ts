/**
 * The shipped Stalwart rules (rules/stalwart/, one file per release line) and the facts that
 * pick them for one release.
 *
 * Every Stalwart release from 0.8.1 to 0.16.15 takes its Redis locks with
 * MULTI / INCRBY / EXPIRE / EXEC; 0.16.16 and later use SET NX EX (upstream commit 4df2a667),
 * and releases before 0.8.1 take no such lock in Redis. Loading the whole directory covers every
 * affected release at once: no lock rule of any line matches a windowed counter of any line.
 * `--stalwart VERSION[,VERSION...]` narrows the loaded files to those whose `releases:` name one
 * of the releases listed: the releases a fleet runs, several during a rolling upgrade.
 */
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { compareVersions, formatVersion, parseVersion, type Version } from './releases.js';

/** rules/stalwart/ next to src/ and dist/: the default rules. */
export const STALWART_RULES_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'rules', 'stalwart');

/** The first Stalwart release that takes a lock with INCRBY + EXPIRE (the purge-account lock). */
const FIRST_AFFECTED: Version = [0, 8, 1];
/** The first Stalwart release that takes its locks with SET NX EX instead. */
const FIXED_IN: Version = [0, 16, 16];

/** What `--stalwart VERSION` means: the release to load the rules of, or why there is none. */
export type StalwartRelease =
  | { readonly kind: 'affected'; readonly version: Version }
  | { readonly kind: 'not-affected'; readonly reason: string }
  | { readonly kind: 'invalid'; readonly reason: string };

/** Reads a Stalwart release number ("0.15.3" or "v0.15.3") and says whether it has the bug. */
export function stalwartRelease(text: string): StalwartRelease {
  const version = parseVersion(text);
  if (version === undefined) {
    return { kind: 'invalid', reason: `"${text}" is not a Stalwart release number: give all three parts, e.g. 0.15.3` };
  }
  const shown = formatVersion(version);
  if (compareVersions(version, FIXED_IN) >= 0) {
    return {
      kind: 'not-affected',
      reason:
        `Stalwart ${shown} is not affected: from ${formatVersion(FIXED_IN)} on it takes its locks with SET NX EX, ` +
        'whose expiry a failed attempt does not push forward',
    };
  }
  if (compareVersions(version, FIRST_AFFECTED) < 0) {
    return {
      kind: 'not-affected',
      reason: `Stalwart ${shown} is not affected: releases before ${formatVersion(FIRST_AFFECTED)} take no lock with INCRBY + EXPIRE in Redis`,
    };
  }
  return { kind: 'affected', version };
}

/** What a `--stalwart` list says: the affected releases to load the rules of, and every problem with it. */
export interface StalwartFleet {
  readonly versions: readonly Version[];
  readonly problems: readonly string[];
}

/**
 * Reads the releases a fleet runs (`0.15.3`, `0.16.9`, ...), each listed once. A release without
 * the bug may be listed with affected ones (nodes already upgraded) and adds no rules; listed
 * without any affected one, there is nothing to load, and the reason says what a fleet that
 * still runs older nodes should give instead.
 */
export function stalwartFleet(entries: readonly string[]): StalwartFleet {
  const problems: string[] = [];
  const versions: Version[] = [];
  const unaffected: string[] = [];
  const seen = new Set<string>();
  for (const entry of entries) {
    const release = stalwartRelease(entry);
    if (release.kind === 'invalid') {
      problems.push(release.reason);
      continue;
    }
    const shown = formatVersion(parseVersion(entry) as Version);
    if (seen.has(shown)) {
      problems.push(`Stalwart ${shown} is listed twice: list each release once`);
      continue;
    }
    seen.add(shown);
    if (release.kind === 'affected') versions.push(release.version);
    else unaffected.push(release.reason);
  }
  if (problems.length === 0 && versions.length === 0 && unaffected.length > 0) {
    problems.push(
      `${unaffected.join('; ')}; there are no lock rules to load for ${unaffected.length === 1 ? 'it' : 'them'}. ` +
        'While nodes of affected releases still run, list every affected release still running ' +
        `(e.g. --stalwart 0.15.3,0.16.9; ${formatVersion(FIXED_IN)} may be listed with them), ` +
        'or give no --stalwart at all, which loads the rules of every affected release',
    );
  }
  return { versions, problems };
}

/** The shipped per-line rule files, in load order. */
export function shippedStalwartFiles(): string[] {
  return readdirSync(STALWART_RULES_DIR)
    .filter((name) => name.endsWith('.yaml'))
    .sort()
    .map((name) => path.join(STALWART_RULES_DIR, name));
}
