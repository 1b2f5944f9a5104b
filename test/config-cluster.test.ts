/**
 * Cluster mode settings: --cluster with seed URLs in --upstream, the node
 * listener ports, the announce host, and what cluster mode cannot be
 * combined with.
 */
import { describe, expect, it } from 'vitest';
import { resolveConfig, type ClusterConfig, type Config } from '../src/config.js';
import { ConfigError } from '../src/errors.js';

/** The configuration resolveConfig gives for a run. */
function configOf(argv: string[], env: NodeJS.ProcessEnv = {}): Config {
  const request = resolveConfig(argv, env);
  if (request.kind !== 'run') throw new Error(`expected a run request, got ${request.kind}`);
  return request.config;
}

/** The cluster settings of `--cluster` plus `argv`. */
function clusterOf(argv: string[], env: NodeJS.ProcessEnv = {}): ClusterConfig {
  const cluster = configOf(['--cluster', ...argv], env).cluster;
  if (cluster === null) throw new Error('expected cluster settings');
  return cluster;
}

/** The message of the ConfigError these settings are refused with. */
function refusal(argv: string[], env: NodeJS.ProcessEnv = {}): string {
  let caught: unknown = null;
  try {
    resolveConfig(argv, env);
  } catch (err) {
    caught = err;
  }
  expect(caught).toBeInstanceOf(ConfigError);
  return (caught as ConfigError).message;
}

const PORT_MAP_SYNTAX = 'is not NODEHOST:NODEPORT=PORT (for example 10.0.0.5:6379=7001)';

describe('--cluster seeds', () => {
  it('reads comma-separated seed URLs from --upstream, the first also being the upstream', () => {
    const config = configOf(['--cluster', '--upstream', 'redis://10.0.0.1:7000, redis://user:pw@node-2.svc:7001,redis://[::1]:7002']);
    expect(config.cluster?.seeds).toEqual([
      expect.objectContaining({ host: '10.0.0.1', port: 7000, tls: false }),
      expect.objectContaining({ host: 'node-2.svc', port: 7001, username: 'user', password: 'pw' }),
      expect.objectContaining({ host: '::1', port: 7002 }),
    ]);
    expect(config.upstream).toBe(config.cluster?.seeds[0]);
    expect(config.sentinel).toBeNull();
  });

  it('takes a single seed, and the default upstream when none is given', () => {
    expect(clusterOf(['--upstream', 'redis://h:7000']).seeds).toEqual([expect.objectContaining({ host: 'h', port: 7000 })]);
    expect(clusterOf([]).seeds).toEqual([expect.objectContaining({ host: '127.0.0.1', port: 6379 })]);
  });

  it('has defaults for the other cluster settings', () => {
    expect(clusterOf([])).toEqual({
      seeds: [expect.anything()],
      basePort: 6381,
      portMap: new Map(),
      announceHost: null,
      refreshMs: 10_000,
    });
  });

  it('reads the cluster settings from REDIS_LOCK_PROXY_* variables', () => {
    const config = configOf([], {
      REDIS_LOCK_PROXY_CLUSTER: 'true',
      REDIS_LOCK_PROXY_UPSTREAM: 'rediss://:pw@a:7000,rediss://:pw@b:7000',
      REDIS_LOCK_PROXY_CLUSTER_BASE_PORT: '8000',
      REDIS_LOCK_PROXY_CLUSTER_PORT_MAP: 'a:7000=7101, b:7000=7102',
      REDIS_LOCK_PROXY_CLUSTER_ANNOUNCE_HOST: 'proxy.example.com',
      REDIS_LOCK_PROXY_CLUSTER_REFRESH_MS: '2500',
    });
    expect(config.cluster).toEqual({
      seeds: [expect.objectContaining({ host: 'a', tls: true }), expect.objectContaining({ host: 'b', tls: true })],
      basePort: 8000,
      portMap: new Map([
        ['a:7000', 7101],
        ['b:7000', 7102],
      ]),
      announceHost: 'proxy.example.com',
      refreshMs: 2500,
    });
    expect(config.upstreamTls).toMatchObject({ insecure: false });
  });

  it('splits on commas only in cluster mode: a password with a comma is written %2C there', () => {
    expect(configOf(['--upstream', 'redis://:pa,ss@h:1']).upstream.password).toBe('pa,ss');
    expect(clusterOf(['--upstream', 'redis://:pa%2Css@h:1,redis://h:2']).seeds.map((seed) => seed.password)).toEqual(['pa,ss', undefined]);
    expect(refusal(['--upstream', 'redis://a:7000,redis://b:7001'])).toMatch(/is not a valid URL/);
  });

  it('refuses an upstream with no URL in it', () => {
    expect(refusal(['--cluster', '--upstream', ' , '])).toBe('upstream: no URL given');
  });

  it('refuses a unix:// seed', () => {
    expect(refusal(['--cluster', '--upstream', 'redis://a:7000,unix:///run/redis.sock'])).toBe(
      'cluster: seed unix:///run/redis.sock must be redis:// or rediss:// (cluster nodes are reached over TCP)',
    );
  });

  it('refuses a seed that selects a database other than 0, but accepts /0', () => {
    expect(refusal(['--cluster', '--upstream', 'redis://a:7000/0,redis://b:7000/3'])).toBe(
      'cluster: seed redis://b:7000/3 selects database 3; Redis Cluster has database 0 only',
    );
    expect(clusterOf(['--upstream', 'redis://a:7000/0']).seeds[0].db).toBe(0);
  });

  it('refuses redis:// and rediss:// seeds mixed, in either order', () => {
    const message = 'cluster: seed URLs must all be redis:// or all rediss://';
    expect(refusal(['--cluster', '--upstream', 'redis://a:7000,rediss://b:7000'])).toBe(message);
    expect(refusal(['--cluster', '--upstream', 'rediss://a:7000,redis://b:7000'])).toBe(message);
  });

  it('refuses cluster and sentinel together', () => {
    expect(refusal(['--cluster', '--sentinel', 's:26379', '--sentinel-master', 'm'])).toBe(
      'cluster and sentinel cannot be combined (a cluster finds its own masters)',
    );
  });

  it('never echoes a seed password in an error message', () => {
    expect(refusal(['--cluster', '--upstream', 'redis://a:7000,redis://:hunter2@b:7000/2'])).not.toContain('hunter2');
    expect(refusal(['--cluster', '--upstream', 'redis://:hunter2@a:7000,rediss://b:7000'])).not.toContain('hunter2');
  });
});

describe('--cluster-base-port', () => {
  it('defaults to the --listen port + 1', () => {
    expect(clusterOf(['--listen', '0.0.0.0:7000']).basePort).toBe(7001);
    expect(clusterOf(['--listen', '0.0.0.0:7000', '--cluster-base-port', '0']).basePort).toBe(7001);
  });

  it('takes a port of its own', () => {
    expect(clusterOf(['--cluster-base-port', '30000']).basePort).toBe(30000);
    expect(clusterOf(['--listen', '127.0.0.1:0', '--cluster-base-port', '30000']).basePort).toBe(30000);
  });

  it('must be given with --listen port 0, or 65535', () => {
    expect(refusal(['--cluster', '--listen', '127.0.0.1:0'])).toBe('cluster: with --listen port 0, set --cluster-base-port');
    expect(refusal(['--cluster', '--listen', '127.0.0.1:65535'])).toBe(
      'cluster: --listen port 65535 leaves no port above it; set --cluster-base-port',
    );
  });

  it('refuses a port out of range', () => {
    expect(refusal(['--cluster', '--cluster-base-port', '65536'])).toBe(
      'cluster-base-port must be an integer from 0 to 65535, got "65536"',
    );
    expect(refusal(['--cluster', '--cluster-base-port=-1'])).toMatch(/^cluster-base-port must be an integer/);
  });
});

describe('--cluster-port-map', () => {
  it('reads NODEHOST:NODEPORT=PORT entries, repeated or comma-separated', () => {
    const { portMap } = clusterOf([
      '--cluster-port-map',
      '10.0.0.5:6379=7001,redis-1.svc:6379=7002',
      '--cluster-port-map',
      '[::1]:6379=7003',
    ]);
    expect([...portMap]).toEqual([
      ['10.0.0.5:6379', 7001],
      ['redis-1.svc:6379', 7002],
      ['[::1]:6379', 7003],
    ]);
  });

  it.each([
    '10.0.0.5:6379',
    '10.0.0.5=7001',
    '10.0.0.5:6379=',
    '=7001',
    '10.0.0.5:6379=0',
    '10.0.0.5:6379=65536',
    '10.0.0.5:6379=70x',
    ':=7001',
  ])('refuses the entry %j', (entry) => {
    expect(refusal(['--cluster', '--cluster-port-map', entry])).toBe(`cluster-port-map entry "${entry}" ${PORT_MAP_SYNTAX}`);
  });

  it('refuses a node port out of range', () => {
    expect(refusal(['--cluster', '--cluster-port-map', 'h:70000=7001'])).toMatch(
      /^cluster-port-map node address "h:70000" is not HOST:PORT/,
    );
  });

  it('refuses a listener port given twice, or the --listen port', () => {
    const message = 'cluster-port-map: port 7001 is given twice (or is the --listen port)';
    expect(refusal(['--cluster', '--cluster-port-map', 'a:6379=7001,b:6379=7001'])).toBe(message);
    expect(refusal(['--cluster', '--listen', '0.0.0.0:7001', '--cluster-port-map', 'a:6379=7001'])).toBe(message);
  });
});

describe('--cluster-announce-host', () => {
  it.each(['proxy.example.com', 'proxy', '10.1.2.3', '::1', '2001:db8::7'])('accepts %j', (host) => {
    expect(clusterOf(['--cluster-announce-host', host]).announceHost).toBe(host);
  });

  it.each(['', 'two words', 'a,b', 'host:port', 'proxy.example.com:7000', '[::1]', '\t', '10.0.0.1:6380', 'a:1', 'dead:beef'])(
    'refuses %j',
    (host) => {
      expect(refusal(['--cluster', '--cluster-announce-host', host])).toBe(
        `cluster-announce-host "${host}" is not a host name or IP address (no port: the ports are the listeners')`,
      );
    },
  );
});

describe('cluster settings without --cluster', () => {
  it.each([
    ['cluster-base-port', '7000'],
    ['cluster-port-map', 'a:6379=7001'],
    ['cluster-announce-host', 'proxy'],
    ['cluster-refresh-ms', '500'],
  ])('refuses --%s', (name, value) => {
    expect(refusal([`--${name}`, value])).toBe(`${name} needs --cluster`);
    expect(refusal([], { [`REDIS_LOCK_PROXY_${name.toUpperCase().replace(/-/g, '_')}`]: value })).toBe(`${name} needs --cluster`);
  });

  it('accepts --cluster-base-port 0, the default', () => {
    expect(configOf(['--cluster-base-port', '0']).cluster).toBeNull();
  });

  it('does not split the upstream, and leaves cluster null', () => {
    const config = configOf(['--upstream', 'redis://h:7000/2']);
    expect(config.cluster).toBeNull();
    expect(config.upstream.db).toBe(2);
  });
});

describe('--print-config in cluster mode', () => {
  it('shows every seed with its password masked, and the cluster settings', () => {
    const request = resolveConfig(
      [
        '--print-config',
        '--cluster',
        '--upstream',
        'redis://:hunter2@a:7000, redis://admin:swordfish@b:7001,redis://c:7002',
        '--cluster-port-map',
        'a:7000=7101',
        '--cluster-announce-host',
        'proxy.example.com',
      ],
      {},
    );
    expect(request.kind).toBe('print-config');
    const text = request.kind === 'print-config' ? request.text : '';
    expect(text).toContain('upstream: redis://:***@a:7000,redis://admin:***@b:7001,redis://c:7002\n');
    expect(text).not.toMatch(/hunter2|swordfish/);
    expect(text).toContain('cluster: true\n');
    expect(text).toContain('cluster-port-map:\n  - a:7000=7101\n');
    expect(text).toContain('cluster-announce-host: proxy.example.com\n');
  });
});
