/**
 * What every session of a listener shares: the upstream, the rules in force, the settings that
 * shape a connection's behaviour, the logger and the counters.
 */
import type { ClusterReplies } from '../cluster/node-replies.js';
import type { LockMethodSetting, ServerMethods } from '../lock/lock-method.js';
import type { Logger } from '../log.js';
import type { RuleMode, RuleSet } from '../rules/types.js';
import type { Stats } from '../stats.js';
import type { UpstreamConnector } from '../upstream/connect.js';
import type { RefusalLog } from '../upstream/refusal-log.js';
import type { VerifyRuns } from '../verify-connection.js';

export interface ProxyContext {
  readonly upstream: UpstreamConnector;
  /** The rules in force; read for every new block, so a reload applies to open connections. */
  rules(): RuleSet;
  /** Every shipped release line's lock keys, whatever rules are in force: what lock attempts are counted by. */
  readonly census: RuleSet;
  /** 'observe' makes every rule observe-only. */
  readonly mode: RuleMode;
  /** How long a held MULTI (the script way) waits for the rest of its block after the client's last byte. */
  readonly holdMs: number;
  readonly connectTimeoutMs: number;
  /** Close a client connection idle this long (0: never). */
  readonly idleTimeoutMs: number;
  /** How long a reply to a command of the proxy's own may take once it is due (session/reply-stream.ts). */
  readonly ownReplyTimeoutMs: number;
  /** Close a client connection when Redis has sent nothing for this long while a reply is due (0: never). */
  readonly upstreamTimeoutMs: number;
  /** How lock blocks are fixed (lock/lock-method.ts). */
  readonly lockMethod: LockMethodSetting;
  /** With --lock-method auto: what each upstream address was found to need. */
  readonly serverMethods: ServerMethods;
  /** Set with --cluster. */
  readonly cluster?: ClusterReplies | null;
  readonly log: Logger;
  readonly stats: Stats;
  /** Where refused client connections are logged: the first at once, the rest counted per period. */
  readonly refusals: RefusalLog;
  /** The verify runs whose connections came through, for the admin endpoint (one for the process). */
  readonly verifyRuns: VerifyRuns;
}
