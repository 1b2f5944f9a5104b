/**
 * A connection's socket handlers, guarded: an exception in one ends that connection (`fault`),
 * never the process, so that a reply or request the proxy cannot handle fails one connection, as
 * in Envoy a fault fails one stream.
 */
import type net from 'node:net';

/** Listens to `event` on `emitter`; an exception in `handle` goes to `fault`. */
export function listenGuarded<A extends unknown[]>(
  emitter: net.Socket,
  event: string,
  handle: (...args: A) => void,
  fault: (error: unknown) => void,
): void {
  emitter.on(event, (...args: A) => {
    try {
      handle(...args);
    } catch (error) {
      fault(error);
    }
  });
}
