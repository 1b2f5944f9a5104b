/**
 * After start-up: does the upstream answer? Said once, as a warning naming the upstream and the
 * error when it does not: the proxy runs anyway (each client gets an error that names the
 * upstream, and /readyz says not ready), since Redis may well come up after it. Under systemd
 * (Type=notify), READY=1 is sent once the proxy listens and its upstream has answered, so that
 * Stalwart starts only then; until that, the upstream is asked again every second, and the
 * service's status line says why it waits.
 */
import type { App } from './app.js';
import type { Logger } from './log.js';
import type { ServiceNotifier } from './service-notify.js';

const RETRY_MS = 1000;

/** Starts the check; returns what stops it (at shutdown). */
export function announceReadiness(app: App, log: Logger, notifier: ServiceNotifier | null): () => void {
  const { upstream, listen } = app.describe();
  let stopped = false;
  let warned = false;
  let timer: NodeJS.Timeout | undefined;
  const attempt = async (): Promise<void> => {
    const probe = await app.probeUpstream();
    if (stopped) return;
    if (probe.ok) {
      if (warned) log.info({ upstream }, 'upstream answers');
      notifier?.send(`READY=1\nSTATUS=listening on ${String(listen)}; ${probe.detail}`);
      return;
    }
    if (!warned) {
      warned = true;
      log.warn({ upstream, err: probe.detail }, 'upstream does not answer; running anyway (clients get an error naming it until it does)');
    }
    if (notifier === null) return; // nobody waits for the upstream: the one warning is enough
    notifier.send(`STATUS=waiting for the upstream to answer: ${probe.detail}`);
    timer = setTimeout(() => void attempt(), RETRY_MS);
  };
  void attempt();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
