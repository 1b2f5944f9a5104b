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

/** Which rules to load, and the proxy's --mode over them: what a reload may change. */
export interface RuleSource {
  readonly paths: readonly string[];
  readonly release: ReleaseFilter | undefined;
  /** 'observe' makes every rule observe-only. */
  readonly mode: RuleMode;
}

export class RuleStore {
  private rules: RuleSet;
  private source: RuleSource;
  private watching = false;
  private watchers: fs.FSWatcher[] = [];
  private settleTimer: NodeJS.Timeout | undefined;

  /** Loads the rules; throws (RuleFileError) when they are invalid, as at start-up nothing runs without rules. */
  constructor(
    source: RuleSource,
    private readonly log: Logger,
    private readonly stats: Stats,
  ) {
    this.rules = loadRules(source.paths, source.release);
    this.source = source;
  }

  get current(): RuleSet {
    return this.rules;
  }

  /** The proxy's --mode in force, which goes with the rules: 'observe' makes every rule observe-only. */
  get mode(): RuleMode {
    return this.source.mode;
  }

  /**
   * Re-reads the rule files, from `next` when the settings changed (paths, release, mode), else
   * from the same ones. All or nothing: the new rules and mode are in force together, or the
   * previous ones stay. Returns true when the new ones are in force.
   */
  reload(trigger: string, next: RuleSource = this.source): boolean {
    try {
      const rules = loadRules(next.paths, next.release);
      const pathsChanged = next.paths.join('\0') !== this.source.paths.join('\0');
      this.rules = rules;
      this.source = next;
      this.stats.ruleReloads++;
      this.log.info({ trigger, mode: next.mode, ...describeRules(rules, next.mode) }, 'rules reloaded');
      if (pathsChanged && this.watching) {
        this.unwatch();
        this.watch();
      }
      return true;
    } catch (err) {
      this.stats.ruleReloadFailures++;
      this.log.error({ trigger, err: (err as Error).message }, 'rule reload refused; the previous rules stay in force');
      return false;
    }
  }

  get watched(): boolean {
    return this.watching;
  }

  /**
   * Reloads whenever something changes in a rule directory, or in the
   * directory of a rule file: editors replace files rather than write them in
   * place, and Kubernetes swaps a ConfigMap's files by renaming a symlink, so
   * watching the file itself would miss changes.
   */
  watch(): void {
    this.watching = true;
    const dirs = new Set(this.source.paths.map((p) => (isDirectory(p) ? p : path.dirname(p))));
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

  /** Stops watching the rule paths. */
  unwatch(): void {
    this.watching = false;
    clearTimeout(this.settleTimer);
    for (const watcher of this.watchers) watcher.close();
    this.watchers = [];
  }

  close(): void {
    this.unwatch();
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
