/**
 * The shipped Stalwart rules (rules/stalwart/, one file per release line) and the facts that
 * pick them for one release.
 *
 * Every Stalwart release from 0.8.1 to 0.16.15 takes its Redis locks with
 * MULTI / INCRBY / EXPIRE / EXEC; 0.16.16 and later use SET NX EX (upstream commit 4df2a667),
 * and releases before 0.8.1 take no such lock in Redis. Loading the whole directory covers every
 * affected release at once: no lock rule of any line matches a windowed counter of any line.
 * `--stalwart VERSION` narrows the loaded files to those whose `releases:` name VERSION.
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

/** The shipped per-line rule files, in load order. */
export function shippedStalwartFiles(): string[] {
  return readdirSync(STALWART_RULES_DIR)
    .filter((name) => name.endsWith('.yaml'))
    .sort()
    .map((name) => path.join(STALWART_RULES_DIR, name));
}
