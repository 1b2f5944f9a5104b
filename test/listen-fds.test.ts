/**
 * Taking the sockets systemd passes (sd_listen_fds semantics): which descriptors, for which
 * listener, when they are someone else's, and what is refused. (The proxy on them:
 * e2e/socket-activation.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../src/errors.js';
import { takeInheritedSockets } from '../src/listen-fds.js';

const PID = 4242;

describe('takeInheritedSockets', () => {
  it('takes descriptor 3 for clients, and removes the variables so that no later process takes them', () => {
    const env: NodeJS.ProcessEnv = { LISTEN_PID: String(PID), LISTEN_FDS: '1', LISTEN_FDNAMES: 'redis-lock-proxy.socket', HOME: '/x' };
    expect(takeInheritedSockets(env, PID)).toEqual({
      client: { fd: 3, name: 'redis-lock-proxy.socket' },
      admin: null,
      ignored: null,
    });
    expect(env).toEqual({ HOME: '/x' });
  });

  it('names a socket without LISTEN_FDNAMES "unknown", as sd_listen_fds_with_names does', () => {
    expect(takeInheritedSockets({ LISTEN_PID: String(PID), LISTEN_FDS: '1' }, PID).client).toEqual({ fd: 3, name: 'unknown' });
  });

  it('gives the socket named admin to the admin server, in any order', () => {
    expect(takeInheritedSockets({ LISTEN_PID: String(PID), LISTEN_FDS: '2', LISTEN_FDNAMES: 'admin:proxy' }, PID)).toEqual({
      client: { fd: 4, name: 'proxy' },
      admin: { fd: 3, name: 'admin' },
      ignored: null,
    });
    expect(takeInheritedSockets({ LISTEN_PID: String(PID), LISTEN_FDS: '1', LISTEN_FDNAMES: 'admin' }, PID)).toEqual({
      client: null,
      admin: { fd: 3, name: 'admin' },
      ignored: null,
    });
  });

  it('takes nothing without LISTEN_FDS', () => {
    expect(takeInheritedSockets({}, PID)).toEqual({ client: null, admin: null, ignored: null });
  });

  it('takes nothing passed to another process, says why, and still removes the variables', () => {
    const env: NodeJS.ProcessEnv = { LISTEN_PID: '17', LISTEN_FDS: '1' };
    expect(takeInheritedSockets(env, PID)).toEqual({
      client: null,
      admin: null,
      ignored: `LISTEN_PID 17 is not this process (${PID}): the sockets are another process's`,
    });
    expect(env).toEqual({});
    expect(takeInheritedSockets({ LISTEN_FDS: '1' }, PID).ignored).toBe(
      'LISTEN_FDS is set without LISTEN_PID: the sockets are for no process in particular',
    );
  });

  it('refuses malformed variables, naming them', () => {
    const take = (env: NodeJS.ProcessEnv) => () => takeInheritedSockets(env, PID);
    expect(take({ LISTEN_PID: 'self', LISTEN_FDS: '1' })).toThrow(new ConfigError('LISTEN_PID "self" is not a process ID'));
    expect(take({ LISTEN_PID: String(PID), LISTEN_FDS: '0' })).toThrow(
      new ConfigError('LISTEN_FDS "0" is not a positive number of sockets'),
    );
    expect(take({ LISTEN_PID: String(PID), LISTEN_FDS: '2', LISTEN_FDNAMES: 'proxy' })).toThrow(
      new ConfigError('LISTEN_FDNAMES "proxy" names 1 socket, but LISTEN_FDS passes 2'),
    );
  });

  it('refuses two sockets for the same listener: it could not tell which is meant', () => {
    expect(() => takeInheritedSockets({ LISTEN_PID: String(PID), LISTEN_FDS: '3', LISTEN_FDNAMES: 'a:admin:admin' }, PID)).toThrow(
      /^LISTEN_FDS passes 1 socket for clients and 2 for the admin server \(3: a, 4: admin, 5: admin\)/,
    );
  });
});
