/**
 * systemd's readiness protocol (sd_notify(3)). With `Type=notify` systemd passes the path of a
 * unix datagram socket in NOTIFY_SOCKET and starts the units ordered after the service (Stalwart)
 * only once the service sends READY=1. The proxy sends it when it listens and its upstream has
 * answered, STATUS= lines while it waits, and STOPPING=1 when it shuts down.
 *
 * Node has no unix datagram sockets of its own; unix-dgram (a small native module) provides
 * them. It is loaded only when NOTIFY_SOCKET is set.
 */
import type { Logger } from './log.js';

export interface ServiceNotifier {
  /** Sends one notification, such as `READY=1\nSTATUS=...`. */
  send(state: string): void;
}

/** The notifier for NOTIFY_SOCKET, or null when the proxy does not run under Type=notify. */
export async function serviceNotifier(env: NodeJS.ProcessEnv, log: Logger): Promise<ServiceNotifier | null> {
  const path = env.NOTIFY_SOCKET;
  if (path === undefined || path === '') return null;
  if (!path.startsWith('/')) {
    log.error(
      { socket: path },
      'NOTIFY_SOCKET is not a file system path (abstract sockets are not supported): systemd will not hear that the proxy is ready',
    );
    return null;
  }
  let dgram: typeof import('unix-dgram');
  try {
    dgram = await import('unix-dgram');
  } catch (err) {
    log.error(
      { socket: path, err: (err as Error).message },
      'NOTIFY_SOCKET is set but unix-dgram cannot be loaded (was it built? npm rebuild unix-dgram): systemd will not hear that the proxy is ready',
    );
    return null;
  }
  const socket = dgram.createSocket('unix_dgram');
  socket.on('error', (err: Error) => log.warn({ socket: path, err: err.message }, 'cannot notify systemd'));
  return {
    send(state: string): void {
      const message = Buffer.from(state);
      socket.send(message, 0, message.length, path);
    },
  };
}
