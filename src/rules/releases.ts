/**
 * Release numbers, and the ranges of them that a rule file says it is for (its top-level
 * `releases:` field, e.g. `releases: Stalwart 0.15.0 - 0.15.5`).
 */

/** A release number, major.minor.patch. */
export type Version = readonly [number, number, number];

export interface ReleaseRange {
  readonly product: string;
  readonly first: Version;
  readonly last: Version;
}

const VERSION = /^v?(\d{1,4})\.(\d{1,4})\.(\d{1,4})$/;
const RANGE = /^([A-Za-z][A-Za-z0-9_-]*) +(\S+) *- *(\S+)$/;

/** "0.15.3" or "v0.15.3" → [0, 15, 3]; undefined for anything else (a bare "0.15" is ambiguous). */
export function parseVersion(text: string): Version | undefined {
  const match = VERSION.exec(text.trim());
  return match === null ? undefined : [Number(match[1]), Number(match[2]), Number(match[3])];
}

export function compareVersions(a: Version, b: Version): number {
  return a[0] - b[0] || a[1] - b[1] || a[2] - b[2];
}

export function formatVersion(version: Version): string {
  return version.join('.');
}

export function formatRange(range: ReleaseRange): string {
  const first = formatVersion(range.first);
  const last = formatVersion(range.last);
  return first === last ? `${range.product} ${first}` : `${range.product} ${first} - ${last}`;
}

export function rangeContains(range: ReleaseRange, product: string, version: Version): boolean {
  return (
    range.product.toLowerCase() === product.toLowerCase() &&
    compareVersions(range.first, version) <= 0 &&
    compareVersions(version, range.last) <= 0
  );
}

/** Parses "Stalwart 0.15.0 - 0.15.5" (or "Stalwart 0.12.5", one release); a message when it is not one. */
export function parseReleaseRange(text: string): ReleaseRange | string {
  const single = /^([A-Za-z][A-Za-z0-9_-]*) +(\S+)$/.exec(text.trim());
  const match = RANGE.exec(text.trim()) ?? (single === null ? null : [single[0], single[1], single[2], single[2]]);
  if (match === null) return `must read "PRODUCT FIRST - LAST", e.g. "Stalwart 0.15.0 - 0.15.5", got ${JSON.stringify(text)}`;
  const first = parseVersion(match[2]);
  const last = parseVersion(match[3]);
  if (first === undefined || last === undefined) {
    return `versions must be MAJOR.MINOR.PATCH, e.g. "Stalwart 0.15.0 - 0.15.5", got ${JSON.stringify(text)}`;
  }
  if (compareVersions(first, last) > 0) return `the first release comes after the last in ${JSON.stringify(text)}`;
  return Object.freeze({ product: match[1], first, last });
}
