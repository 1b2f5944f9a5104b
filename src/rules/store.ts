/**
 * The rules in force, and their reload: on SIGHUP, and on file changes with
 * --watch-rules. A reload that fails keeps the rules that were in force, so a
 * typo in production never leaves the proxy without rules.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Logger } from '../log.js';
import type { Stats } from '../stats.js';
import { loadRules, type ReleaseFilter } from './loader.js';
import { compareVersions, formatRange } from './releases.js';
import { effectiveMode, type RuleMode, type RuleSet } from './types.js';

/** Several editors write a file in more than one step: wait for the writes to settle. */
const WATCH_SETTLE_MS = 100;

export class RuleStore {
  private rules: RuleSet;
  private watchers: fs.FSWatcher[] = [];
  private settleTimer: NodeJS.Timeout | undefined;

  /** Loads the rules; throws (RuleFileError) when they are invalid, as at start-up nothing runs without rules. */
  constructor(
    private readonly paths: readonly string[],
    private readonly log: Logger,
    private readonly stats: Stats,
    private readonly release?: ReleaseFilter,
  ) {
    this.rules = loadRules(paths, release);
  }

  get current(): RuleSet {
    return this.rules;
  }

  /** Re-reads the rule files. Returns true when the new rules are in force. */
  reload(trigger: string): boolean {
    try {
      const next = loadRules(this.paths, this.release);
      this.rules = next;
      this.stats.ruleReloads++;
      this.log.info({ trigger, ...describeRules(next) }, 'rules reloaded');
      return true;
    } catch (err) {
      this.stats.ruleReloadFailures++;
      this.log.error({ trigger, err: (err as Error).message }, 'rule reload refused; the previous rules stay in force');
      return false;
    }
  }

  /**
   * Reloads whenever something changes in a rule directory, or in the
   * directory of a rule file: editors replace files rather than write them in
   * place, and Kubernetes swaps a ConfigMap's files by renaming a symlink, so
   * watching the file itself would miss changes.
   */
  watch(): void {
    const dirs = new Set(this.paths.map((p) => (isDirectory(p) ? p : path.dirname(p))));
    for (const dir of dirs) {
      try {
        const watcher = fs.watch(dir, () => this.scheduleReload());
        watcher.on('error', (err) => this.log.warn({ path: dir, err: err.message }, 'cannot watch rule path'));
        this.watchers.push(watcher);
      } catch (err) {
        this.log.warn({ path: dir, err: (err as Error).message }, 'cannot watch rule path');
      }
    }
  }

  private scheduleReload(): void {
    clearTimeout(this.settleTimer);
    this.settleTimer = setTimeout(() => this.reload('file change'), WATCH_SETTLE_MS);
  }

  close(): void {
    clearTimeout(this.settleTimer);
    for (const watcher of this.watchers) watcher.close();
    this.watchers = [];
  }
}

/** What a log line says of the rules in force: files, the releases they are for, and each rule. */
export function describeRules(rules: RuleSet, globalMode: RuleMode = 'enforce'): Record<string, unknown> {
  return {
    ruleFiles: rules.files,
    releases: releasesText(rules),
    rules: rules.rules.map((r) => `${r.name} (${effectiveMode(r, globalMode)})`),
  };
}

/** The releases the rule files name, oldest first, e.g. "Stalwart 0.8.1 - 0.10.7, ..."; "" for none. */
export function releasesText(rules: RuleSet): string {
  return [...rules.releases]
    .sort((a, b) => a.product.localeCompare(b.product) || compareVersions(a.first, b.first))
    .map(formatRange)
    .join(', ');
}

function isDirectory(p: string): boolean {
  try {
    return fs.statSync(p).isDirectory();
  } catch {
    return false;
  }
}
