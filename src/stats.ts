/**
 * Process-wide counters. Incremented on the hot path (plain integer
 * increments only); read by logs and the admin endpoints.
 */
export class Stats {
  connectionsOpen = 0;
  connectionsTotal = 0;
  upstreamConnectFailures = 0;
  /** Lock blocks that matched a rule, whatever happened to them next. */
  blocksSeen = 0;
  /** Blocks answered by the script. */
  blocksRewritten = 0;
  /** Blocks that matched a rule in observe mode and were forwarded unchanged. */
  blocksObserved = 0;
  /** Blocks whose script could not run, sent unchanged instead, by error prefix (NOPERM, BUSY, ...). */
  readonly fallbacks = new Map<string, number>();
  /** Held MULTI blocks released unchanged before they could match, by reason. */
  readonly releases = new Map<string, number>();
  /** Times the script was missing from the script cache and was sent in full. */
  scriptReloads = 0;

  countFallback(reason: string): void {
    this.fallbacks.set(reason, (this.fallbacks.get(reason) ?? 0) + 1);
  }

  countRelease(reason: string): void {
    this.releases.set(reason, (this.releases.get(reason) ?? 0) + 1);
  }
}
