/**
 * How the proxy's V8 heap grows, set before anything else is loaded (cli.ts imports this first).
 *
 * By V8's defaults a process that allocates fast grows its young generation to 32 MiB and lets
 * its old generation grow well past what is live before it collects it. A proxy allocates fast
 * only when connections come and go (a socket pair and a session each), and such churn then
 * costs tens of MiB of memory held by garbage: a sidecar under a memory limit pays for the
 * connections that closed in the last seconds, not only for those that are open. So the young
 * generation keeps its first size (1 MiB semi-spaces: V8 does not grow it, at a scavenge per
 * MiB allocated, which pass-through traffic hardly allocates) and the old generation grows only
 * 20% above what is live before the next full collection.
 *
 * Both are read by V8 whenever it sizes a space, so setting them at start-up takes effect
 * (v8.setFlagsFromString; the flags cannot be given on the shebang line portably). NODE_OPTIONS
 * or node's own flags on the command line come first and are overridden by these.
 */
import v8 from 'node:v8';

export const HEAP_GROWTH_FLAGS = ['--semi-space-growth-factor=1', '--heap-growing-percent=20'] as const;

for (const flag of HEAP_GROWTH_FLAGS) v8.setFlagsFromString(flag);
