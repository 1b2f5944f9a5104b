/**
 * Throwaway certificates for TLS tests, made with the machine's openssl: a CA,
 * a server certificate for 127.0.0.1 / localhost, and a client certificate.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export interface TestCertificates {
  readonly dir: string;
  /** PEM file paths. */
  readonly caCert: string;
  readonly serverCert: string;
  readonly serverKey: string;
  readonly clientCert: string;
  readonly clientKey: string;
  /** A second CA that signed nothing here: verifying against it must fail. */
  readonly otherCaCert: string;
  read(file: string): Buffer;
  remove(): void;
}

function openssl(dir: string, ...args: string[]): void {
  execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
}

function makeCa(dir: string, name: string): void {
  openssl(
    dir,
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-days',
    '2',
    '-subj',
    `/CN=${name}`,
    '-keyout',
    `${name}.key`,
    '-out',
    `${name}.crt`,
  );
}

function makeSigned(dir: string, name: string, ca: string, extensions: string): void {
  fs.writeFileSync(path.join(dir, `${name}.ext`), extensions);
  openssl(dir, 'req', '-newkey', 'rsa:2048', '-nodes', '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.csr`);
  openssl(
    dir,
    'x509',
    '-req',
    '-in',
    `${name}.csr`,
    '-CA',
    `${ca}.crt`,
    '-CAkey',
    `${ca}.key`,
    '-CAcreateserial',
    '-days',
    '2',
    '-extfile',
    `${name}.ext`,
    '-out',
    `${name}.crt`,
  );
}

export function makeCertificates(): TestCertificates {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-tls-'));
  makeCa(dir, 'ca');
  makeCa(dir, 'other-ca');
  makeSigned(dir, 'server', 'ca', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n');
  makeSigned(dir, 'client', 'ca', 'extendedKeyUsage=clientAuth\n');
  const file = (name: string): string => path.join(dir, name);
  return {
    dir,
    caCert: file('ca.crt'),
    serverCert: file('server.crt'),
    serverKey: file('server.key'),
    clientCert: file('client.crt'),
    clientKey: file('client.key'),
    otherCaCert: file('other-ca.crt'),
    read: (f) => fs.readFileSync(f),
    remove: () => fs.rmSync(dir, { recursive: true, force: true }),
  };
}

/** redis-server arguments for a TLS-only Redis (`port 0` turns plain TCP off); `clientCerts` makes it require client certificates. */
export function redisTlsArgs(certs: TestCertificates, tlsPort: number, clientCerts: boolean): string[] {
  return [
    '--tls-port',
    String(tlsPort),
    '--tls-cert-file',
    certs.serverCert,
    '--tls-key-file',
    certs.serverKey,
    '--tls-ca-cert-file',
    certs.caCert,
    '--tls-auth-clients',
    clientCerts ? 'yes' : 'no',
  ];
}
