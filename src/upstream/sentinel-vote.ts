/**
 * Which master the sentinels name, as a vote: an address is believed only when a majority of
 * the sentinels configured (not of those that answered) name it. One sentinel alone (a
 * misconfigured one, one of another environment that monitors a master of the same name, or
 * one that lies) is never enough to move the proxy, and nothing a sentinel says about itself
 * (its configuration epoch) weighs more than another's word: each configured sentinel has one
 * vote.
 *
 * This is Sentinel's own rule for agreeing on a failover (a majority of the sentinels must
 * authorise the leader, `sentinelGetLeader` in sentinel.c), applied to what the proxy follows.
 */
import { formatAddress, type Address } from '../address.js';

/** One sentinel's answer to `SENTINEL get-master-addr-by-name`. */
export type Answer = { kind: 'master'; address: Address } | { kind: 'no-master' } | { kind: 'failed'; reason: string };

/** The number of votes that make a majority of `configured` sentinels. */
export function majorityOf(configured: number): number {
  return Math.floor(configured / 2) + 1;
}

export interface Tally {
  /** The address a majority names, if any. */
  readonly winner: Address | undefined;
  /** The votes of the address with the most. */
  readonly votes: number;
  /** How many sentinels answered that they know no such master. */
  readonly noMaster: number;
  /** How many answered at all (a master or none). */
  readonly answered: number;
}

/** Counts the answers so far (undefined: not in yet) of `configured` sentinels. */
export function tally(answers: ReadonlyArray<Answer | undefined>, configured: number): Tally {
  const votes = new Map<string, { address: Address; count: number }>();
  let noMaster = 0;
  let answered = 0;
  for (const answer of answers) {
    if (answer === undefined || answer.kind === 'failed') continue;
    answered++;
    if (answer.kind === 'no-master') {
      noMaster++;
      continue;
    }
    const id = formatAddress(answer.address.host, answer.address.port);
    const entry = votes.get(id) ?? { address: answer.address, count: 0 };
    entry.count++;
    votes.set(id, entry);
  }
  const best = [...votes.values()].sort((a, b) => b.count - a.count)[0];
  const winner = best !== undefined && best.count >= majorityOf(configured) ? best.address : undefined;
  return { winner, votes: best?.count ?? 0, noMaster, answered };
}

/** Each sentinel's answer, for logs and /readyz: `a:26379 names b:6379; c:26379: ECONNREFUSED`. */
export function describeAnswers(sentinels: readonly string[], answers: ReadonlyArray<Answer | undefined>): string {
  return sentinels
    .map((sentinel, i) => {
      const answer = answers[i];
      if (answer === undefined) return `${sentinel}: no answer yet`;
      if (answer.kind === 'master') return `${sentinel} names ${formatAddress(answer.address.host, answer.address.port)}`;
      if (answer.kind === 'no-master') return `${sentinel} knows no such master`;
      return `${sentinel}: ${answer.reason}`;
    })
    .join('; ');
}
