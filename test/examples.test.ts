/**
 * The files in examples/ are checked as far as this machine can: they parse; every
 * REDIS_LOCK_PROXY_* variable, flag and config key they use is one the proxy has; their ports
 * and paths agree with the container image's defaults; the alert rules pass `promtool check
 * rules`; and every metric the alerts and the dashboard use is one a running proxy exports.
 * (The systemd units are checked with `systemd-analyze verify` against an installed command, in
 * e2e/install-from-tarball.test.ts.)
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml, parseAllDocuments } from 'yaml';
import { envName, OPTIONS, OTHER_VARIABLES } from '../src/settings.js';
import { PROGRAM_FLAGS } from './support/cli-flags.js';
import { ROOT } from './support/cli.js';
import { docsText } from './support/docs.js';
import { startTestProxy, type TestProxy } from './support/proxy.js';
import { startRedis, type RedisServer } from './support/redis.js';

const EXAMPLES = path.join(ROOT, 'examples');
const read = (file: string) => fs.readFileSync(path.join(EXAMPLES, file), 'utf8');
const yamlOf = (file: string) => parseYaml(read(file)) as Record<string, unknown>;

/** Every example file, for the checks that go over all of them. */
const FILES = [
  'compose/compose.yaml',
  'kubernetes/stalwart-with-proxy.yaml',
  'kubernetes/admin-network-policy.yaml',
  'systemd/redis-lock-proxy.service',
  'systemd/redis-lock-proxy.socket',
  'systemd/config.yaml',
  'systemd/stalwart-after-proxy.conf',
  'monitoring/alerts.yaml',
  'monitoring/prometheus.yaml',
  'monitoring/grafana-dashboard.json',
];

/** What the image sets (Dockerfile ENV and EXPOSE): the examples must agree with it. */
function imageDefaults(): { env: Map<string, string>; exposed: number[] } {
  const dockerfile = fs.readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8');
  const env = new Map([...dockerfile.matchAll(/(REDIS_LOCK_PROXY_[A-Z_]+)=(\S+)/g)].map((m) => [m[1], m[2]]));
  const exposed = [...dockerfile.matchAll(/^EXPOSE (.+)$/gm)].flatMap((m) => m[1].split(/\s+/).map(Number));
  return { env, exposed };
}

const port = (address: string) => Number(address.slice(address.lastIndexOf(':') + 1));

describe('examples/', () => {
  it('is what the documentation points to, and every file parses', () => {
    const docs = docsText();
    for (const file of FILES) {
      expect(docs, file).toContain(`examples/${file}`);
      if (file.endsWith('.json')) expect(() => JSON.parse(read(file))).not.toThrow();
      if (file.endsWith('.yaml')) {
        for (const doc of parseAllDocuments(read(file))) expect(doc.errors, file).toEqual([]);
      }
    }
  });

  it('uses only variables, flags and config keys the proxy has', () => {
    const variables = new Set([...Object.keys(OPTIONS).map(envName), ...Object.keys(OTHER_VARIABLES)]);
    for (const file of FILES) {
      for (const [name] of read(file).matchAll(/REDIS_LOCK_PROXY_[A-Z_]+/g)) expect(variables, `${file}: ${name}`).toContain(name);
      for (const [, flag] of read(file).matchAll(/"--([a-z][a-z0-9-]*)"/g)) expect(PROGRAM_FLAGS, `${file}: --${flag}`).toContain(flag);
    }
    const config = yamlOf('systemd/config.yaml');
    for (const key of Object.keys(config)) expect(Object.keys(OPTIONS), `config.yaml: ${key}`).toContain(key);
  });

  it('agrees with the image on ports and paths', () => {
    const image = imageDefaults();
    expect(image.exposed.sort()).toEqual(
      [port(image.env.get('REDIS_LOCK_PROXY_LISTEN') ?? ''), port(image.env.get('REDIS_LOCK_PROXY_ADMIN_LISTEN') ?? '')].sort(),
    );
    const adminPort = port(image.env.get('REDIS_LOCK_PROXY_ADMIN_LISTEN') ?? '');

    const compose = yamlOf('compose/compose.yaml') as {
      services: Record<string, { environment?: Record<string, string>; ports?: string[] }>;
    };
    const proxyEnv = compose.services['redis-lock-proxy'].environment ?? {};
    expect(port(proxyEnv.REDIS_LOCK_PROXY_ADMIN_LISTEN)).toBe(adminPort);
    // Stalwart joins the proxy's network namespace: the proxy's service publishes the ports.
    expect(compose.services['redis-lock-proxy'].ports).toContain(`127.0.0.1:${adminPort}:${adminPort}`);
    expect(port(proxyEnv.REDIS_LOCK_PROXY_LISTEN)).toBe(6380);

    const k8s = yamlOf('kubernetes/stalwart-with-proxy.yaml') as {
      spec: { template: { spec: { initContainers: Array<Record<string, unknown>>; volumes: Array<{ name: string }> } } };
    };
    const sidecar = k8s.spec.template.spec.initContainers[0] as {
      env: Array<{ name: string; value?: string }>;
      ports: Array<{ containerPort: number }>;
      volumeMounts: Array<{ name: string; mountPath: string }>;
    };
    const envOf = (name: string) => sidecar.env.find((e) => e.name === name)?.value ?? '';
    expect(sidecar.ports[0].containerPort).toBe(port(envOf('REDIS_LOCK_PROXY_ADMIN_LISTEN')));
    expect(port(envOf('REDIS_LOCK_PROXY_ADMIN_LISTEN'))).toBe(adminPort);
    expect(sidecar.volumeMounts[0].mountPath).toBe(image.env.get('REDIS_LOCK_PROXY_RULES'));
    expect(k8s.spec.template.spec.volumes.map((v) => v.name)).toContain(sidecar.volumeMounts[0].name);
    // The NetworkPolicy guards the sidecar's admin port on the pods of the StatefulSet, and lets
    // Stalwart's own ports in.
    const policy = yamlOf('kubernetes/admin-network-policy.yaml') as {
      spec: { podSelector: { matchLabels: Record<string, string> }; ingress: Array<{ from?: unknown[]; ports: Array<{ port: number }> }> };
    };
    const template = k8s.spec.template as unknown as {
      metadata: { labels: Record<string, string> };
      spec: { containers: Array<{ ports: Array<{ containerPort: number }> }> };
    };
    expect(policy.spec.podSelector.matchLabels).toEqual(template.metadata.labels);
    const guarded = policy.spec.ingress.filter((rule) => rule.from !== undefined).flatMap((rule) => rule.ports.map((p) => p.port));
    expect(guarded).toEqual([adminPort]);
    const open = policy.spec.ingress.filter((rule) => rule.from === undefined).flatMap((rule) => rule.ports.map((p) => p.port));
    expect(open.sort()).toEqual(template.spec.containers[0].ports.map((p) => p.containerPort).sort());

    const unit = read('systemd/redis-lock-proxy.service');
    const configPath = /REDIS_LOCK_PROXY_CONFIG=(\S+)/.exec(unit)?.[1];
    expect(configPath).toBe('/etc/redis-lock-proxy/config.yaml');
    expect(read('systemd/config.yaml').split('\n')[0]).toContain(configPath);
    const config = yamlOf('systemd/config.yaml');
    expect(port(String(config.listen))).toBe(6380);
    // The socket unit listens where the config file says: with it or without it, Stalwart's URL is the same.
    expect(/^ListenStream=(\S+)$/m.exec(read('systemd/redis-lock-proxy.socket'))?.[1]).toBe(String(config.listen));
    const prometheus = yamlOf('monitoring/prometheus.yaml') as { scrape_configs: Array<{ static_configs: Array<{ targets: string[] }> }> };
    expect(port(prometheus.scrape_configs[0].static_configs[0].targets[0])).toBe(port(String(config['admin-listen'])));
  });

  it('has alert rules that promtool accepts', async () => {
    const { stdout } = await promisify(execFile)('promtool', ['check', 'rules', path.join(EXAMPLES, 'monitoring/alerts.yaml')]);
    expect(stdout).toMatch(/SUCCESS: \d+ rules found/);
  });

  it('alerts on lock blocks sent unchanged, not on MULTIs typed by hand', async () => {
    await expectAlerts('RedisLockProxyLockBlocksUnfixed', {
      // Instance a: one lock block of a rule released at the script way's hold deadline.
      a: [
        {
          series: 'redis_lock_proxy_blocks_unfixed_total{instance="a",rule="stalwart-task-lock",reason="hold-timeout"}',
          values: '0 0 1 1 1',
        },
      ],
      // Instance b: many held MULTIs released at the deadline (someone typing in redis-cli), no lock block.
      b: [
        { series: 'redis_lock_proxy_block_releases_total{instance="b",reason="hold-timeout"}', values: '0 5 10 20 40' },
        {
          series: 'redis_lock_proxy_blocks_unfixed_total{instance="b",rule="stalwart-task-lock",reason="hold-timeout"}',
          values: '0 0 0 0 0',
        },
      ],
    });
  });

  it('alerts on re-armed locks, never on contended or abandoned ones', async () => {
    await expectAlerts('RedisLockProxyLocksRearmed', {
      // Instance a: a scan saw a lock re-armed (traffic that bypasses the proxy).
      a: [{ series: 'redis_lock_proxy_lock_keys_rearmed{instance="a",rule="stalwart-task-lock"}', values: '0 0 0 1 1' }],
      // Instance b: many contended locks and an abandoned one, nothing re-armed.
      b: [
        { series: 'redis_lock_proxy_lock_keys{instance="b",rule="stalwart-task-lock"}', values: '50 50 50 50 50' },
        { series: 'redis_lock_proxy_lock_keys_without_expiry{instance="b",rule="stalwart-task-lock"}', values: '1 1 1 1 1' },
        { series: 'redis_lock_proxy_lock_keys_rearmed{instance="b",rule="stalwart-task-lock"}', values: '0 0 0 0 0' },
      ],
    });
  });

  it('says the proxy can be removed only once the last node sends the new shape, and never for a period without lock traffic', async () => {
    // One proxy, three nodes, one sample an hour: each node's lock attempts an hour, as its
    // release sends them, counted by the rule whose keys they are (whatever rules the proxy
    // rewrites by). Hours 0-24: no lock traffic yet; then every 24 h one node moves from 0.15.3 to
    // 0.16.9 (old shape on 0.16's keys), then one by one to 0.16.16 (SET NX EX); all three on
    // 0.16.16 from hour 168 to 204; quiet from 204 to 228; traffic again after.
    type Release = '-' | '0.15.3' | '0.16.9' | '0.16.16';
    const fleetAt = (hour: number): Release[] => {
      const step = Math.floor(hour / 24);
      if (hour < 24) return ['-', '-', '-'];
      if (hour >= 204 && hour < 228) return ['-', '-', '-'];
      const upgraded = (to: Release, count: number): Release[] => [0, 1, 2].map((i) => (i < count ? to : '0.15.3'));
      if (step <= 1) return upgraded('0.16.9', 0);
      if (step <= 4) return upgraded('0.16.9', step - 1);
      return [0, 1, 2].map((i) => (i < step - 4 ? '0.16.16' : '0.16.9'));
    };
    const series = new Map<string, number[]>();
    const add = (rule: string, shape: string, hour: number, count: number) => {
      const key = `redis_lock_proxy_lock_attempts_total{instance="proxy",rule="${rule}",shape="${shape}"}`;
      const values = series.get(key) ?? new Array<number>(241).fill(0);
      for (let h = hour + 1; h < values.length; h++) values[h] += count;
      series.set(key, values);
    };
    for (let hour = 0; hour < 240; hour++) {
      for (const release of fleetAt(hour)) {
        if (release === '0.15.3') add('stalwart-index-task-0.15', 'incrby-expire', hour, 3);
        if (release === '0.16.9') add('stalwart-task-lock', 'incrby-expire', hour, 2);
        if (release === '0.16.16') add('stalwart-task-lock', 'set-nx', hour, 2);
        if (release !== '-') add('stalwart-queue-lock', release === '0.16.16' ? 'set-nx' : 'incrby-expire', hour, 10);
      }
    }
    // Hours at which it fires, and at which it does not.
    const firing = [200, 203, 240];
    const quiet = [12, 30, 100, 130, 160, 180, 190, 205, 215, 227];
    await promtoolTest({
      interval: '1h',
      input_series: [...series].map(([name, values]) => ({ series: name, values: values.join(' ') })),
      alert_rule_test: [
        ...firing.map((hour) => ({
          eval_time: `${hour}h`,
          alertname: 'RedisLockProxyCanBeRemoved',
          exp_alerts: [alertFor('RedisLockProxyCanBeRemoved', { instance: 'proxy' })],
        })),
        ...quiet.map((hour) => ({ eval_time: `${hour}h`, alertname: 'RedisLockProxyCanBeRemoved', exp_alerts: [] })),
      ],
    });
  });

  it('alerts on lock-shaped traffic no rule covers, but not on the windowed counters of that shape', async () => {
    const uncovered = (prefix: string, values: string) => ({
      series: `redis_lock_proxy_lock_shaped_unmatched_total{instance="proxy",prefix="${prefix}"}`,
      values,
    });
    await promtoolTest({
      interval: '1m',
      input_series: [
        uncovered('0x17', '0 0 0 5 10 15'), // 0.16 task locks behind a proxy narrowed to 0.15
        uncovered('0x02', '0 100 200 300 400 500'), // rate limits
        uncovered('0x0b', '0 100 200 300 400 500'), // the blob quota
        uncovered('ireq:', '0 100 200 300 400 500'), // 0.8-0.10's rate limits
      ],
      alert_rule_test: [
        {
          eval_time: '5m',
          alertname: 'RedisLockProxyUncoveredLockTraffic',
          exp_alerts: [alertFor('RedisLockProxyUncoveredLockTraffic', { instance: 'proxy', prefix: '0x17' })],
        },
        { eval_time: '2m', alertname: 'RedisLockProxyUncoveredLockTraffic', exp_alerts: [] },
      ],
    });
  });

  describe('metrics used by the alerts and the dashboard', () => {
    let redis: RedisServer;
    let proxy: TestProxy;
    beforeAll(async () => {
      redis = await startRedis();
      proxy = await startTestProxy({ upstream: redis.url, admin: true, flags: ['--lock-scan-interval-ms', '100000'] });
    });
    afterAll(async () => {
      await proxy?.close();
      await redis?.stop();
    });

    it('are all exported by a running proxy', async () => {
      const text = await proxy.metrics();
      // Exported with --sentinel only; e2e/sentinel-majority.test.ts reads it from a proxy behind Sentinel.
      const exported = new Set([...[...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]), 'redis_lock_proxy_sentinel_majority']);
      for (const file of ['monitoring/alerts.yaml', 'monitoring/grafana-dashboard.json']) {
        const used = new Set([...read(file).matchAll(/redis_lock_proxy_[a-z_]+/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, '')));
        expect(used.size, file).toBeGreaterThan(5);
        for (const name of used) expect(exported, `${file}: ${name}`).toContain(name);
      }
    });
  });
});

/**
 * `promtool test rules`: with these input series (1 minute apart), at 4 minutes `alert` fires for
 * instance a only (rule stalwart-task-lock), with its annotations as Prometheus renders them.
 */
async function expectAlerts(alert: string, inputs: { a: object[]; b: object[] }): Promise<void> {
  const alerts = yamlOf('monitoring/alerts.yaml') as {
    groups: Array<{ rules: Array<{ alert: string; labels: Record<string, string>; annotations: Record<string, string> }> }>;
  };
  const rule = alerts.groups[0].rules.find((r) => r.alert === alert);
  expect(rule, alert).toBeDefined();
  // The annotations as Prometheus renders them for instance "a", rule stalwart-task-lock, value 1.
  const render = (text: string) =>
    text
      .replace(/\{\{ \$labels\.instance \}\}/g, 'a')
      .replace(/\{\{ \$labels\.rule \}\}/g, 'stalwart-task-lock')
      .replace(/\{\{ \$value \}\}/g, '1');
  const test = {
    rule_files: [path.join(EXAMPLES, 'monitoring/alerts.yaml')],
    evaluation_interval: '1m',
    tests: [
      {
        interval: '1m',
        input_series: [...inputs.a, ...inputs.b],
        alert_rule_test: [
          {
            eval_time: '4m',
            alertname: alert,
            exp_alerts: [
              {
                exp_labels: { ...rule?.labels, instance: 'a', rule: 'stalwart-task-lock' },
                exp_annotations: Object.fromEntries(Object.entries(rule?.annotations ?? {}).map(([k, v]) => [k, render(v)])),
              },
            ],
          },
        ],
      },
    ],
  };
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-alerts-'));
  try {
    const file = path.join(dir, 'alert.test.yaml');
    fs.writeFileSync(file, JSON.stringify(test)); // JSON is YAML
    const { stdout } = await promisify(execFile)('promtool', ['test', 'rules', file]);
    expect(stdout).toContain('SUCCESS');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** An alert of alerts.yaml as it fires with these labels, its annotations rendered (none may use $value). */
function alertFor(
  alert: string,
  labels: Record<string, string>,
): { exp_labels: Record<string, string>; exp_annotations: Record<string, string> } {
  const alerts = yamlOf('monitoring/alerts.yaml') as {
    groups: Array<{ rules: Array<{ alert: string; labels: Record<string, string>; annotations: Record<string, string> }> }>;
  };
  const rule = alerts.groups[0].rules.find((r) => r.alert === alert);
  expect(rule, alert).toBeDefined();
  const render = (text: string) => text.replace(/\{\{ \$labels\.(\w+) \}\}/g, (_, name: string) => labels[name] ?? '');
  const annotations = rule?.annotations ?? {};
  for (const text of Object.values(annotations)) expect(text, alert).not.toContain('$value');
  return {
    exp_labels: { ...rule?.labels, ...labels },
    exp_annotations: Object.fromEntries(Object.entries(annotations).map(([k, v]) => [k, render(v)])),
  };
}

/** `promtool test rules` of alerts.yaml with one test group (evaluated as often as its samples come). */
async function promtoolTest(test: { interval: string; input_series: object[]; alert_rule_test: object[] }): Promise<void> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-alerts-'));
  try {
    const file = path.join(dir, 'alert.test.yaml');
    fs.writeFileSync(
      file,
      JSON.stringify({ rule_files: [path.join(EXAMPLES, 'monitoring/alerts.yaml')], evaluation_interval: test.interval, tests: [test] }),
    );
    const result = await promisify(execFile)('promtool', ['test', 'rules', file]).catch(
      (error: { stdout?: string; stderr?: string }) => error,
    );
    expect(`${result.stdout ?? ''}${result.stderr ?? ''}`).toContain('SUCCESS');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
