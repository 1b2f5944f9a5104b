/**
 * examples/kubernetes/stalwart-with-proxy.yaml under `podman kube play`, with
 * the proxy's image built from this checkout and a Redis container as the
 * secret's upstream. Stalwart's image cannot be had here, so its container is
 * swapped for a client that sends Stalwart's exact lock pipeline to
 * 127.0.0.1:6380 inside the pod. The proxy's container is the manifest's:
 * its args, env (the upstream from the Secret), ports, probes, resources,
 * security context and rules volume (the ConfigMap made as the manifest's
 * comment says, with `kubectl create configmap --from-file=rules/stalwart/`).
 *
 * Where podman is not a kubelet, the test says so and does the kubelet's part:
 * - podman plays Pods, not StatefulSets: the StatefulSet's pod template is
 *   played as its first pod (`stalwart-0`);
 * - podman runs init containers to completion before the others, so a native
 *   sidecar (an init container with restartPolicy Always) would hold the pod
 *   forever: it runs under `containers:`, as the manifest says for clusters
 *   before 1.29. The start order a kubelet gives a native sidecar cannot be
 *   seen here; the test checks what it rests on: the manifest's sidecar is an
 *   init container with restartPolicy Always, and its startupProbe (which a
 *   kubelet waits for before it starts Stalwart) fails while Redis does not
 *   answer and passes once it does;
 * - podman schedules no probes without systemd (and turns an httpGet probe on
 *   a named port into a curl command the image does not have): the test sends
 *   each probe's request itself, to the pod's address and the named port, as a
 *   kubelet does;
 * - podman reads a secretKeyRef from a podman secret holding the Secret's
 *   data (JSON, values in base64), the form `kubectl create secret generic
 *   --from-literal` gives.
 * The Secret, the ConfigMap's volume and the pod have the manifest's fixed
 * names, which podman keeps machine-wide: runs on one machine take turns.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it, vi } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { ROOT } from '../support/cli.js';
import { cmd } from '../support/resp.js';
import { attemptReplies, lockAttempt, taskLockKey } from '../support/stalwart.js';
import { createNetwork, httpGet, runContainer, Container } from './support/containers.js';
import { engine, engineExec } from './support/engine.js';
import { SERVER_FOR_IMAGE_TESTS } from './support/global-setup.js';
import { proxyImage, serverImage, serverImageSpec } from './support/images.js';
import { clientCommand, exchangesIn, thenQuit, type Exchange } from './support/lock-client.js';
import { machineLock } from './support/machine-lock.js';

const setup = inject('containers');
const MANIFEST = path.join(ROOT, 'examples/kubernetes/stalwart-with-proxy.yaml');
const LOWERED_MS = 30_000;

interface K8sContainer {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  ports?: Array<{ name?: string; containerPort: number }>;
  env?: Array<{ name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string } } }>;
  restartPolicy?: string;
  volumeMounts?: Array<{ name: string; mountPath: string }>;
  [probe: string]: unknown;
}
interface Probe {
  httpGet: { path: string; port: string | number };
}
interface PodSpec {
  initContainers: K8sContainer[];
  containers: K8sContainer[];
  volumes: Array<{ name: string; configMap?: { name: string } }>;
}
interface StatefulSet {
  metadata: { name: string };
  spec: {
    template: { metadata: { labels: Record<string, string>; annotations: Record<string, string> }; spec: PodSpec };
  };
}

const manifest = parseYaml(readFileSync(MANIFEST, 'utf8')) as StatefulSet;
const template = manifest.spec.template;
const sidecar = template.spec.initContainers.find((c) => c.name === 'redis-lock-proxy') as K8sContainer;
const podName = `${manifest.metadata.name}-0`;

const podmanOnly = setup.skip === undefined && !(await engine()).podman ? '`kube play` is podman’s' : undefined;

describe.skipIf(setup.skip !== undefined || podmanOnly !== undefined)('the Kubernetes example under podman kube play', () => {
  let release: () => void;
  let network: { name: string; remove(): Promise<void> };
  let redis: Container;
  let proxyReference: string;
  let dir: string;
  const secretName = sidecar.env?.find((e) => e.name === 'REDIS_LOCK_PROXY_UPSTREAM')?.valueFrom?.secretKeyRef?.name ?? '';
  const configMapName = template.spec.volumes.find((v) => v.configMap)?.configMap?.name ?? '';

  /** The pod: the manifest's template, the sidecar as a regular container (with `change` applied), the client for Stalwart. */
  function podYaml(exchanges: Exchange[], change: (proxy: K8sContainer) => void = () => {}): string {
    const proxy: K8sContainer = structuredClone(sidecar);
    delete proxy.restartPolicy;
    proxy.image = proxyReference;
    change(proxy);
    const stalwart = template.spec.containers.find((c) => c.name === 'stalwart') as K8sContainer;
    const client: K8sContainer = { name: stalwart.name, image: proxyReference, command: clientCommand(exchanges) };
    const spec: Partial<PodSpec> = { ...structuredClone(template.spec), containers: [proxy, client] };
    delete spec.initContainers;
    const pod = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name: podName, labels: template.metadata.labels, annotations: template.metadata.annotations },
      spec,
    };
    const file = path.join(dir, 'pod.yaml');
    writeFileSync(file, JSON.stringify(pod, null, 2)); // JSON is YAML too
    return file;
  }

  /** Plays the pod (replacing the one before) and waits until the client has reported. */
  async function play(
    exchanges: Exchange[],
    change?: (proxy: K8sContainer) => void,
  ): Promise<{ replies: Map<string, string[]>; proxy: Container }> {
    const file = podYaml(exchanges, change);
    await engineExec(['kube', 'play', '--replace', '--network', network.name, '--configmap', path.join(dir, 'configmap.yaml'), file], {
      timeoutMs: 300_000,
    });
    const client = new Container(`${podName}-stalwart`);
    const logs = await vi.waitFor(
      async () => {
        const text = await client.logs();
        if (exchangesIn(text).size < exchanges.length) throw new Error(`the client has not reported yet:\n${text}`);
        return text;
      },
      { timeout: 120_000, interval: 500 },
    );
    return { replies: exchangesIn(logs), proxy: new Container(`${podName}-${sidecar.name}`) };
  }

  /**
   * Stalwart's lock attempt, PEXPIRE to 30 s, the attempt again and PTTL: through the proxy at
   * 127.0.0.1:6380 in the pod, and on a twin key straight to Redis for Redis's own replies.
   */
  function lockExchanges(id: bigint): Exchange[] {
    const script = (key: Buffer) =>
      thenQuit(Buffer.concat([lockAttempt(key, 60), cmd('PEXPIRE', key, String(LOWERED_MS)), lockAttempt(key, 60), cmd('PTTL', key)]));
    return [
      { name: 'proxy', host: '127.0.0.1', port: 6380, bytes: script(taskLockKey(id)) },
      { name: 'redis', host: redis.name, port: 6379, bytes: script(taskLockKey(id + 1n)) },
    ];
  }

  /** Frames: the attempt's 4 replies (0-3), PEXPIRE's (4), the attempt again (5-8), PTTL's (9), QUIT's (10). */
  const pttlOf = (replies: string[]) => Number(/^:(-?\d+)\r\n$/.exec(replies[9])?.[1]);

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'rlp-kube-'));
    release = await machineLock('redis-lock-proxy-kube-play');
    proxyReference = (await proxyImage()).reference;
    network = await createNetwork();
    redis = await runContainer({
      image: await serverImage(serverImageSpec(SERVER_FOR_IMAGE_TESTS)),
      name: `${network.name}-redis`,
      network: network.name,
    });
    // kubectl create configmap redis-lock-proxy-rules --from-file=rules/stalwart/
    const rules = path.join(ROOT, 'rules/stalwart');
    const data = Object.fromEntries(readdirSync(rules).map((file) => [file, readFileSync(path.join(rules, file), 'utf8')]));
    writeFileSync(
      path.join(dir, 'configmap.yaml'),
      JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: configMapName }, data }),
    );
    // kubectl create secret generic stalwart-redis --from-literal=url=redis://...
    await engineExec(['secret', 'rm', secretName]).catch(() => undefined);
    const secret = path.join(dir, 'secret.json');
    writeFileSync(secret, JSON.stringify({ url: Buffer.from(`redis://${redis.name}:6379`).toString('base64') }));
    await engineExec(['secret', 'create', secretName, secret]);
  });

  afterAll(async () => {
    try {
      const file = path.join(dir, 'pod.yaml');
      await engineExec(['kube', 'down', file], { timeoutMs: 300_000 }).catch(() => undefined);
      await engineExec(['volume', 'rm', '--force', configMapName]).catch(() => undefined);
      await engineExec(['secret', 'rm', secretName]).catch(() => undefined);
      await redis?.remove();
      await network?.remove();
      if (dir) rmSync(dir, { recursive: true, force: true });
    } finally {
      release?.();
    }
  });

  it('runs the proxy as shipped (observe, rollout step 1): probes pass, and the lock pipeline gets Redis’s own replies', async () => {
    const id = BigInt(Date.now()) * 10n;
    const { replies, proxy } = await play(lockExchanges(id));
    // Observe mode forwards the blocks unchanged: Redis's replies, the expiry re-armed.
    const [viaProxy, direct] = [replies.get('proxy') ?? [], replies.get('redis') ?? []];
    expect(viaProxy.slice(0, 9)).toEqual(direct.slice(0, 9));
    expect(viaProxy.slice(0, 4).join('')).toBe(attemptReplies(1, 1));
    expect(pttlOf(viaProxy)).toBeGreaterThan(LOWERED_MS);

    // The probes, sent as a kubelet sends them: to the pod's address and the container's named port.
    const address = await proxy.address(network.name);
    for (const kind of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
      const probe = (sidecar[kind] as Probe).httpGet;
      const port = typeof probe.port === 'number' ? probe.port : sidecar.ports?.find((p) => p.name === probe.port)?.containerPort;
      expect(await httpGet(`http://${address}:${port}${probe.path}`), kind).toMatchObject({ status: 200 });
    }
    // What Prometheus scrapes, by the pod's annotations.
    const scrape = `http://${address}:${template.metadata.annotations['prometheus.io/port']}${template.metadata.annotations['prometheus.io/path']}`;
    expect((await httpGet(scrape)).body).toMatch(/^redis_lock_proxy_blocks_total\{rule="stalwart-task-lock",outcome="observed"\} 2$/m);

    // Security context and resources, as the container runs.
    const status = (await proxy.exec(['cat', '/proc/1/status'])).stdout;
    expect(status).toMatch(/^Uid:\s+1000\s+1000\s+1000\s+1000$/m);
    expect(status).toMatch(/^CapEff:\s+0+$/m);
    expect(status).toMatch(/^NoNewPrivs:\s+1$/m);
    expect((await proxy.exec(['touch', '/app/written'])).stderr).toMatch(/Read-only file system/);
    expect((await proxy.inspect('{{.HostConfig.Memory}}')).trim()).toBe(String(256 * 1024 * 1024));
    // The rules are the ConfigMap's, and the upstream the Secret's.
    const started = (await proxy.logs()).split('\n').find((line) => line.includes('redis-lock-proxy listening')) ?? '';
    expect(JSON.parse(started)).toMatchObject({ mode: 'observe', upstream: `redis://${redis.name}:6379`, listen: '127.0.0.1:6380' });
    expect((JSON.parse(started) as { ruleFiles: string[] }).ruleFiles.map((f) => path.basename(f)).sort()).toEqual(
      readdirSync(path.join(ROOT, 'rules/stalwart')).sort(),
    );
  });

  it('holds Stalwart back while the proxy cannot serve: the sidecar’s startupProbe fails until Redis answers', async () => {
    // What a kubelet needs to start the sidecar before Stalwart, and Stalwart only once the probe passes.
    expect(sidecar.restartPolicy).toBe('Always');
    expect(template.spec.containers.map((c) => c.name)).toEqual(['stalwart']);
    const probeUrl = async (proxy: Container, kind: string) => {
      const probe = (sidecar[kind] as Probe).httpGet;
      const port = typeof probe.port === 'number' ? probe.port : sidecar.ports?.find((p) => p.name === probe.port)?.containerPort;
      return `http://${await proxy.address(network.name)}:${port}${probe.path}`;
    };
    // The Secret's upstream, but on a port where nothing listens: Redis does not answer.
    const { proxy } = await play([], (container) => {
      container.env = container.env?.map((e) =>
        e.name === 'REDIS_LOCK_PROXY_UPSTREAM' ? { name: e.name, value: `redis://${redis.name}:1` } : e,
      );
    });
    await proxy.waitForLog(/redis-lock-proxy listening/);
    expect(await httpGet(await probeUrl(proxy, 'livenessProbe'))).toMatchObject({ status: 200 });
    const startup = await httpGet(await probeUrl(proxy, 'startupProbe'));
    expect(startup.status, startup.body).toBe(503);
    // As shipped, with Redis answering, the same probe passes (the first test plays that pod too).
    const { proxy: answered } = await play([]);
    await vi.waitFor(async () => expect(await httpGet(await probeUrl(answered, 'startupProbe'))).toMatchObject({ status: 200 }), {
      timeout: 60_000,
      interval: 500,
    });
  });

  it('fixes the lock once its args are removed (rollout step 2, as the manifest’s comment says)', async () => {
    const id = BigInt(Date.now()) * 10n + 5n;
    const { replies } = await play(lockExchanges(id), (proxy) => delete proxy.args);
    const [viaProxy, direct] = [replies.get('proxy') ?? [], replies.get('redis') ?? []];
    // Counters as Redis counts them; the expiry left alone by the second attempt.
    expect(viaProxy.slice(0, 4).join('')).toBe(attemptReplies(1, 1));
    expect(viaProxy[8]).toMatch(/^\*2\r\n:2\r\n/);
    expect(pttlOf(viaProxy)).toBeLessThanOrEqual(LOWERED_MS);
    expect(pttlOf(direct)).toBeGreaterThan(LOWERED_MS);
  });
});
