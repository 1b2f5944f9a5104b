/**
 * systemd socket activation (sd_listen_fds(3)): the listening sockets a socket unit holds,
 * passed to the proxy as descriptors 3, 4, ... with LISTEN_FDS (how many), LISTEN_PID (the
 * process they are for) and, optionally, LISTEN_FDNAMES (a name each, colon-separated; a
 * socket unit names them with FileDescriptorName=, by default its own unit name).
 *
 * Why: systemd keeps its copy of each socket while the proxy restarts, so a client that
 * connects between the old process closing its listener and the new one listening waits in the
 * kernel's accept queue instead of being refused, and the new process accepts it.
 *
 * The descriptor named `admin` is the admin server's; any other is the one clients connect to.
 */
import { ConfigError } from './errors.js';

/** The first descriptor passed (SD_LISTEN_FDS_START): 0-2 are standard input, output and error. */
export const FIRST_FD = 3;
/** The name (FileDescriptorName=) that makes a passed socket the admin server's. */
export const ADMIN_SOCKET_NAME = 'admin';

/** A listening socket systemd passed: its descriptor, and its name in LISTEN_FDNAMES ("unknown" without). */
export interface InheritedSocket {
  readonly fd: number;
  readonly name: string;
}

/** What the proxy listens on from systemd, or null where it binds its listen settings itself. */
export interface InheritedSockets {
  readonly client: InheritedSocket | null;
  readonly admin: InheritedSocket | null;
  /** Why variables that were set are not taken (they are for another process), for a log line; else null. */
  readonly ignored: string | null;
}

export const NO_INHERITED_SOCKETS: InheritedSockets = { client: null, admin: null, ignored: null };

/**
 * Takes the sockets passed to process `pid`, and removes LISTEN_PID, LISTEN_FDS and
 * LISTEN_FDNAMES from `env` whatever they say, as sd_listen_fds(1) does: a process started later
 * must not take them for its own. Variables that are malformed, or pass sockets the proxy cannot
 * tell apart, are a ConfigError naming the variable.
 */
export function takeInheritedSockets(env: NodeJS.ProcessEnv, pid: number): InheritedSockets {
  const { LISTEN_PID: forPid, LISTEN_FDS: count, LISTEN_FDNAMES: names } = env;
  delete env.LISTEN_PID;
  delete env.LISTEN_FDS;
  delete env.LISTEN_FDNAMES;
  if (count === undefined) return NO_INHERITED_SOCKETS;
  if (forPid === undefined) {
    return { ...NO_INHERITED_SOCKETS, ignored: 'LISTEN_FDS is set without LISTEN_PID: the sockets are for no process in particular' };
  }
  if (!/^[1-9]\d*$/.test(forPid)) throw new ConfigError(`LISTEN_PID "${forPid}" is not a process ID`);
  // A process that was passed sockets and started the proxy without exec: they are not the proxy's.
  if (Number(forPid) !== pid) {
    return { ...NO_INHERITED_SOCKETS, ignored: `LISTEN_PID ${forPid} is not this process (${pid}): the sockets are another process's` };
  }
  if (!/^[1-9]\d*$/.test(count)) throw new ConfigError(`LISTEN_FDS "${count}" is not a positive number of sockets`);
  const fds = Array.from({ length: Number(count) }, (_, i) => FIRST_FD + i);
  const fdNames = names === undefined ? fds.map(() => 'unknown') : names.split(':');
  if (fdNames.length !== fds.length) {
    throw new ConfigError(`LISTEN_FDNAMES "${names}" names ${counted(fdNames.length, 'socket')}, but LISTEN_FDS passes ${fds.length}`);
  }
  const sockets = fds.map((fd, i) => ({ fd, name: fdNames[i] }));
  const admin = sockets.filter((socket) => socket.name === ADMIN_SOCKET_NAME);
  const client = sockets.filter((socket) => socket.name !== ADMIN_SOCKET_NAME);
  if (client.length > 1 || admin.length > 1) {
    throw new ConfigError(
      `LISTEN_FDS passes ${counted(client.length, 'socket')} for clients and ${admin.length} for the admin server (${describe(sockets)}); ` +
        `the proxy takes one of each: one ListenStream= for clients, and the admin socket in a socket unit of its own ` +
        `with FileDescriptorName=${ADMIN_SOCKET_NAME}`,
    );
  }
  return { client: client[0] ?? null, admin: admin[0] ?? null, ignored: null };
}

/** `descriptor 3` with its name: how messages and log lines name a passed socket. */
export function describeInherited(socket: InheritedSocket): string {
  return `descriptor ${socket.fd} (${socket.name}) passed by systemd`;
}

function counted(n: number, noun: string): string {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

function describe(sockets: readonly InheritedSocket[]): string {
  return sockets.map((socket) => `${socket.fd}: ${socket.name}`).join(', ');
}
