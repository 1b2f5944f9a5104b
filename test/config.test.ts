/**
 * Settings: flags, REDIS_LOCK_PROXY_* environment variables, listen
 * addresses, upstream URLs, and the AUTH/SELECT the proxy sends upstream.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseAddress } from '../src/address.js';
import { DEFAULT_RULES_DIR, resolveConfig, type Config } from '../src/config.js';
import { OPTIONS } from '../src/settings.js';
import { ConfigError, ConfigProblems } from '../src/errors.js';
import { parseUpstreamUrl, setupCommands } from '../src/upstream/target.js';

/** resolveConfig, expecting a runnable configuration. */
function run(argv: string[], env: NodeJS.ProcessEnv = {}): Config {
  const request = resolveConfig(argv, env);
  if (request.kind !== 'run') throw new Error(`expected a run request, got ${request.kind}`);
  return request.config;
}

/** The ConfigError a call throws (fails the test if it throws nothing or something else). */
function configError(call: () => unknown): ConfigError {
  try {
    call();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).code).toBe('ECONFIG');
    return err as ConfigError;
  }
  throw new Error('expected a ConfigError, nothing was thrown');
}

describe('resolveConfig', () => {
  it('has defaults for everything', () => {
    const config = run([]);
    expect(config).toEqual({
      listen: { host: '127.0.0.1', port: 6380 },
      upstream: expect.objectContaining({ host: '127.0.0.1', port: 6379, db: 0, tls: false }),
      rulePaths: [DEFAULT_RULES_DIR],
      release: undefined,
      holdMs: 10,
      connectTimeoutMs: 5000,
      logLevel: 'info',
      logTime: 'epoch',
      mode: 'enforce',
      adminListen: { host: '127.0.0.1', port: 9180 },
      watchRules: false,
      shutdownTimeoutMs: 10_000,
      maxConnections: 10_000,
      warnings: [],
      idleTimeoutMs: 0,
      ownReplyTimeoutMs: 30_000,
      upstreamTimeoutMs: 0,
      lockMethod: 'auto',
      lockAttemptReportMs: 3_600_000,
      lockScanIntervalMs: 0,
      lockScanMaxKeys: 100_000,
      lockScanBudgetMs: 30_000,
      upstreamTls: null,
      listenerTls: null,
      sentinel: null,
      cluster: null,
      given: expect.objectContaining({ listen: '127.0.0.1:6380', 'hold-ms': 10, mode: 'enforce' }),
    });
    expect(config.upstream.password).toBeUndefined();
    expect(config.upstream.username).toBeUndefined();
    expect(OPTIONS.listen.default).toBe('127.0.0.1:6380');
    expect(DEFAULT_RULES_DIR).toMatch(/[/\\]rules[/\\]stalwart$/);
  });

  it('reads every flag', () => {
    const config = run([
      '--listen',
      '0.0.0.0:7000',
      '--upstream',
      'redis://:pw@10.0.0.5:6390/4',
      '--rules',
      '/etc/rlp/a.yaml',
      '--hold-ms',
      '25',
      '--connect-timeout-ms',
      '1500',
      '--log-level',
      'debug',
      '--log-time',
      'iso',
    ]);
    expect(config.listen).toEqual({ host: '0.0.0.0', port: 7000 });
    expect(config.upstream).toMatchObject({ host: '10.0.0.5', port: 6390, password: 'pw', db: 4 });
    expect(config.rulePaths).toEqual(['/etc/rlp/a.yaml']);
    expect(config.holdMs).toBe(25);
    expect(config.connectTimeoutMs).toBe(1500);
    expect(config.logLevel).toBe('debug');
    expect(config.logTime).toBe('iso');
  });

  it('accepts --flag=value', () => {
    expect(run(['--listen=127.0.0.1:7001', '--hold-ms=3']).listen.port).toBe(7001);
    expect(run(['--hold-ms=3']).holdMs).toBe(3);
  });

  const env = {
    REDIS_LOCK_PROXY_LISTEN: '[::1]:7100',
    REDIS_LOCK_PROXY_UPSTREAM: 'redis://envhost:6400/2',
    REDIS_LOCK_PROXY_RULES: '/r/one.yaml,/r/two',
    REDIS_LOCK_PROXY_HOLD_MS: '40',
    REDIS_LOCK_PROXY_CONNECT_TIMEOUT_MS: '900',
    REDIS_LOCK_PROXY_LOG_LEVEL: 'warn',
  };

  it('reads REDIS_LOCK_PROXY_* environment variables', () => {
    const config = run([], env);
    expect(config.listen).toEqual({ host: '::1', port: 7100 });
    expect(config.upstream).toMatchObject({ host: 'envhost', port: 6400, db: 2 });
    expect(config.rulePaths).toEqual(['/r/one.yaml', '/r/two']);
    expect(config.holdMs).toBe(40);
    expect(config.connectTimeoutMs).toBe(900);
    expect(config.logLevel).toBe('warn');
  });

  it('lets flags win over environment variables, one setting at a time', () => {
    const config = run(['--listen', '127.0.0.1:7200', '--rules', '/flag.yaml', '--log-level', 'error'], env);
    expect(config.listen).toEqual({ host: '127.0.0.1', port: 7200 });
    expect(config.rulePaths).toEqual(['/flag.yaml']);
    expect(config.logLevel).toBe('error');
    // Not given as flags: from the environment.
    expect(config.upstream).toMatchObject({ host: 'envhost', port: 6400 });
    expect(config.holdMs).toBe(40);
    expect(config.connectTimeoutMs).toBe(900);
    expect(run(['--upstream', 'redis://flaghost', '--hold-ms', '7', '--connect-timeout-ms', '8'], env)).toMatchObject({
      upstream: { host: 'flaghost', port: 6379, db: 0 },
      holdMs: 7,
      connectTimeoutMs: 8,
    });
  });

  it('takes --rules more than once, in order', () => {
    expect(run(['--rules', 'b.yaml', '--rules', 'a', '--rules', 'c.yml']).rulePaths).toEqual(['b.yaml', 'a', 'c.yml']);
  });

  it('splits REDIS_LOCK_PROXY_RULES on commas, trimming blanks; an empty list means the default', () => {
    expect(run([], { REDIS_LOCK_PROXY_RULES: ' a.yaml , ,b ,' }).rulePaths).toEqual(['a.yaml', 'b']);
    expect(run([], { REDIS_LOCK_PROXY_RULES: 'single' }).rulePaths).toEqual(['single']);
    expect(run([], { REDIS_LOCK_PROXY_RULES: '' }).rulePaths).toEqual([DEFAULT_RULES_DIR]);
    expect(run([], { REDIS_LOCK_PROXY_RULES: ' , ' }).rulePaths).toEqual([DEFAULT_RULES_DIR]);
  });

  it('takes the Stalwart releases of a fleet from a repeated --stalwart, a comma-separated one, or the variable', () => {
    const versions = (config: Config) => config.release?.versions;
    const mixed = [
      [0, 15, 3],
      [0, 16, 9],
    ];
    expect(run(['--stalwart', '0.15.3', '--stalwart', '0.16.9']).release).toEqual({ product: 'Stalwart', versions: mixed });
    expect(versions(run(['--stalwart', '0.15.3, 0.16.9']))).toEqual(mixed);
    expect(versions(run(['--stalwart', '0.15.3,0.16.16', '--stalwart', '0.16.9']))).toEqual(mixed);
    expect(versions(run([], { REDIS_LOCK_PROXY_STALWART: '0.15.3,0.16.9' }))).toEqual(mixed);
    expect(run([], { REDIS_LOCK_PROXY_STALWART: ' , ' }).release).toBeUndefined();
    // The flag wins over the variable as a whole, as for --rules.
    expect(versions(run(['--stalwart', '0.16.9'], { REDIS_LOCK_PROXY_STALWART: '0.15.3' }))).toEqual([[0, 16, 9]]);
  });

  it('refuses every wrong --stalwart entry at once, naming each and where it came from', () => {
    const err = configError(() => run([], { REDIS_LOCK_PROXY_STALWART: '0.15.3,0.15,0.15.3' }));
    expect(err.message.split('\n')).toEqual([
      'REDIS_LOCK_PROXY_STALWART: stalwart: "0.15" is not a Stalwart release number: give all three parts, e.g. 0.15.3',
      'REDIS_LOCK_PROXY_STALWART: stalwart: Stalwart 0.15.3 is listed twice: list each release once',
    ]);
    expect(configError(() => run(['--stalwart', '0.16.16'])).message).toMatch(
      /^stalwart: Stalwart 0\.16\.16 is not affected: .*list every affected release still running \(e\.g\. --stalwart 0\.15\.3,0\.16\.9/,
    );
  });

  it('reads stalwart from the config file as a list or a comma-separated text, and says what is wrong there', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlp-config-'));
    try {
      const write = (text: string) => {
        const file = path.join(dir, 'proxy.yaml');
        fs.writeFileSync(file, text);
        return file;
      };
      const mixed = [
        [0, 15, 3],
        [0, 16, 9],
      ];
      expect(run(['--config', write('stalwart:\n  - 0.15.3\n  - 0.16.9\n')]).release?.versions).toEqual(mixed);
      expect(run(['--config', write('stalwart: 0.15.3, 0.16.9\n')]).release?.versions).toEqual(mixed);
      expect(run(['--config', write('stalwart: [0.15.3]\n')]).release?.versions).toEqual([[0, 15, 3]]);
      // YAML reads 0.16 as a number: it is kept as written, for the release check to name.
      const file = write('# fleet\nstalwart: 0.16\n');
      expect(configError(() => run(['--config', file])).message).toBe(
        `config file ${file}, line 2, setting "stalwart": stalwart: "0.16" is not a Stalwart release number: give all three parts, e.g. 0.15.3`,
      );
      const mapping = write('stalwart: {release: 0.15.3}\n');
      expect(configError(() => run(['--config', mapping])).message).toMatch(/line 1, setting "stalwart": must be a list of strings/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('ignores unrelated environment variables', () => {
    expect(run([], { REDIS_URL: 'redis://elsewhere:1', PORT: '9' })).toEqual(run([]));
  });

  it('answers --help / -h and --version / -v without validating anything else', () => {
    expect(resolveConfig(['--help'], {})).toEqual({ kind: 'help' });
    expect(resolveConfig(['-h'], {})).toEqual({ kind: 'help' });
    expect(resolveConfig(['--version'], {})).toEqual({ kind: 'version' });
    expect(resolveConfig(['-v'], {})).toEqual({ kind: 'version' });
    expect(resolveConfig(['--listen', 'nonsense', '--help'], { REDIS_LOCK_PROXY_UPSTREAM: 'garbage' })).toEqual({ kind: 'help' });
    expect(resolveConfig(['--hold-ms', 'x', '-v'], {})).toEqual({ kind: 'version' });
    expect(resolveConfig(['--help', '--version'], {})).toEqual({ kind: 'help' });
  });

  it('refuses unknown flags, positional arguments and missing values, pointing at --help', () => {
    for (const argv of [['--nope'], ['-x'], ['extra'], ['--listen'], ['--upstream'], ['--help=yes']]) {
      const err = configError(() => resolveConfig(argv, {}));
      expect(err.message).toContain('--help');
    }
    expect(configError(() => resolveConfig(['--lsten', '1'], {})).message).toContain('--lsten');
  });

  it('names the known flag nearest to an unknown one', () => {
    expect(configError(() => resolveConfig(['--upsteam', 'redis://h'], {})).message).toBe(
      'unknown flag --upsteam (did you mean --upstream?) (see --help)',
    );
    expect(configError(() => resolveConfig(['--holdms=5'], {})).message).toBe(
      'unknown flag --holdms (did you mean --hold-ms?) (see --help)',
    );
  });

  it('refuses an unknown REDIS_LOCK_PROXY_* variable, as an unknown flag, naming the nearest known one', () => {
    expect(configError(() => run([], { REDIS_LOCK_PROXY_HOLDMS: '50' })).message).toBe(
      'REDIS_LOCK_PROXY_HOLDMS is not a variable of redis-lock-proxy (did you mean REDIS_LOCK_PROXY_HOLD_MS?)',
    );
    // Every one of them, each on its own line.
    const both = configError(() => run([], { REDIS_LOCK_PROXY_UPSTREM: 'redis://h', REDIS_LOCK_PROXY_VERIFY_PASWORD: 'x' }));
    expect(both).toBeInstanceOf(ConfigProblems);
    expect(both.message.split('\n')).toEqual([
      'REDIS_LOCK_PROXY_UPSTREM is not a variable of redis-lock-proxy (did you mean REDIS_LOCK_PROXY_UPSTREAM?)',
      'REDIS_LOCK_PROXY_VERIFY_PASWORD is not a variable of redis-lock-proxy (did you mean REDIS_LOCK_PROXY_VERIFY_PASSWORD?)',
    ]);
    // The variables verify reads and the config file's are known; other programs' are none of its business.
    expect(run([], { REDIS_LOCK_PROXY_VERIFY_USER: 'u', REDIS_LOCK_PROXY_VERIFY_PASSWORD: 'p', REDIS_PROXY_X: '1' }).holdMs).toBe(10);
  });

  it('names every setting that is wrong on its own at once', () => {
    const err = configError(() =>
      run(['--hold-ms', 'soon', '--mode', 'enforcing', '--listen', 'localhost'], { REDIS_LOCK_PROXY_LOG_TIME: 'local' }),
    );
    expect(err).toBeInstanceOf(ConfigProblems);
    expect(err.message.split('\n')).toEqual([
      'hold-ms must be an integer from 1 to 60000, got "soon"',
      'REDIS_LOCK_PROXY_LOG_TIME: log-time must be one of epoch, iso, got "local"',
      'mode must be enforce or observe, got "enforcing"',
      expect.stringContaining('listen address "localhost" is not HOST:PORT'),
    ]);
  });

  it('refuses a bad listen port or address, from a flag or the environment', () => {
    for (const listen of ['127.0.0.1:70000', '127.0.0.1:', 'localhost', 'host:port', '1:2:3', '', '127.0.0.1:-1']) {
      const err = configError(() => run(['--listen', listen]));
      expect(err.message).toContain('HOST:PORT');
      expect(err.message).toContain(`"${listen}"`);
    }
    expect(configError(() => run([], { REDIS_LOCK_PROXY_LISTEN: '127.0.0.1:99999' })).message).toContain('99999');
  });

  it('refuses hold-ms and connect-timeout-ms that are not integers in range', () => {
    for (const value of ['0', '-1', 'abc', '1.5', '60001', '', ' 5', '1e3']) {
      const err = configError(() => run([`--hold-ms=${value}`]));
      expect(err.message).toBe(`hold-ms must be an integer from 1 to 60000, got "${value}"`);
    }
    expect(run(['--hold-ms', '1']).holdMs).toBe(1);
    expect(run(['--hold-ms', '60000']).holdMs).toBe(60000);
    expect(configError(() => run([], { REDIS_LOCK_PROXY_HOLD_MS: 'soon' })).message).toContain('hold-ms');
    expect(configError(() => run(['--connect-timeout-ms', '0'])).message).toContain('connect-timeout-ms');
    expect(configError(() => run(['--connect-timeout-ms', '600001'])).message).toContain('connect-timeout-ms');
    expect(run(['--connect-timeout-ms', '600000']).connectTimeoutMs).toBe(600000);
  });

  it('refuses an unknown log level, listing the valid ones', () => {
    const err = configError(() => run(['--log-level', 'verbose']));
    expect(err.message).toContain('"verbose"');
    for (const level of ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']) {
      expect(err.message).toContain(level);
      expect(run(['--log-level', level]).logLevel).toBe(level);
    }
    expect(configError(() => run([], { REDIS_LOCK_PROXY_LOG_LEVEL: 'INFO' })).message).toContain('"INFO"');
  });

  it('refuses a bad upstream URL from the environment too', () => {
    expect(configError(() => run([], { REDIS_LOCK_PROXY_UPSTREAM: 'http://h:6379' })).message).toContain('unsupported scheme');
  });
});

describe('parseAddress', () => {
  it('reads host:port', () => {
    expect(parseAddress('127.0.0.1:6380')).toEqual({ host: '127.0.0.1', port: 6380 });
    expect(parseAddress('0.0.0.0:1')).toEqual({ host: '0.0.0.0', port: 1 });
    expect(parseAddress('localhost:65535')).toEqual({ host: 'localhost', port: 65535 });
    expect(parseAddress('proxy.internal:0')).toEqual({ host: 'proxy.internal', port: 0 });
  });

  it('reads a bracketed IPv6 address', () => {
    expect(parseAddress('[::1]:6380')).toEqual({ host: '::1', port: 6380 });
    expect(parseAddress('[::]:6380')).toEqual({ host: '::', port: 6380 });
    expect(parseAddress('[fe80::1%eth0]:7000')).toEqual({ host: 'fe80::1%eth0', port: 7000 });
  });

  it('reads a bare port (and an empty host) as 127.0.0.1', () => {
    expect(parseAddress('6380')).toEqual({ host: '127.0.0.1', port: 6380 });
    expect(parseAddress(':6381')).toEqual({ host: '127.0.0.1', port: 6381 });
  });

  it('refuses anything else', () => {
    for (const text of ['', ':', 'host', 'host:', 'host:abc', '::1:6380', '[::1]', '[::1]6380', '65536', 'h:65536', 'h:6380 ', ' 6380']) {
      expect(() => parseAddress(text), text).toThrow(ConfigError);
    }
  });
});

describe('parseUpstreamUrl', () => {
  it('redis:// without a port defaults to 6379', () => {
    expect(parseUpstreamUrl('redis://127.0.0.1')).toEqual({
      display: 'redis://127.0.0.1',
      host: '127.0.0.1',
      port: 6379,
      username: undefined,
      password: undefined,
      db: 0,
      tls: false,
    });
    expect(parseUpstreamUrl('redis://cache.internal/')).toMatchObject({ host: 'cache.internal', port: 6379, db: 0 });
  });

  it('redis:// with a port and a db', () => {
    expect(parseUpstreamUrl('redis://localhost:6390')).toMatchObject({ host: 'localhost', port: 6390, db: 0 });
    expect(parseUpstreamUrl('redis://localhost:6390/0')).toMatchObject({ db: 0 });
    expect(parseUpstreamUrl('redis://localhost:6390/15')).toMatchObject({ host: 'localhost', port: 6390, db: 15 });
    expect(parseUpstreamUrl('REDIS://h:6390/1')).toMatchObject({ host: 'h', db: 1 });
  });

  it('refuses a db that is not a non-negative integer', () => {
    for (const url of ['redis://h/abc', 'redis://h/-1', 'redis://h/1/2', 'redis://h/1.5', 'redis://h/1234567890']) {
      expect(configError(() => parseUpstreamUrl(url)).message, url).toContain('database');
    }
  });

  it('user:password and :password', () => {
    expect(parseUpstreamUrl('redis://alice:s3cret@h:1/2')).toMatchObject({
      username: 'alice',
      password: 's3cret',
      host: 'h',
      port: 1,
      db: 2,
    });
    const passwordOnly = parseUpstreamUrl('redis://:s3cret@h');
    expect(passwordOnly.username).toBeUndefined();
    expect(passwordOnly.password).toBe('s3cret');
  });

  it('refuses a user without a password', () => {
    const err = configError(() => parseUpstreamUrl('redis://alice@h:6379'));
    expect(err.message).toContain('needs a password');
    expect(configError(() => parseUpstreamUrl('redis://alice:@h')).message).toContain('needs a password');
  });

  // A user without a password would be dropped silently (no AUTH is sent); redis:// refuses it too.
  it('unix:// refuses a user without a password too', () => {
    expect(configError(() => parseUpstreamUrl('unix:///tmp/r.sock?user=alice')).message).toContain('needs a password');
  });

  it('decodes percent-encoded credentials', () => {
    const target = parseUpstreamUrl('redis://us%40er:p%40ss%3Aw%2Frd%20%C3%A9@h');
    expect(target.username).toBe('us@er');
    expect(target.password).toBe('p@ss:w/rd é');
    expect(parseUpstreamUrl(`redis://:${encodeURIComponent('#?/%@:')}@h`).password).toBe('#?/%@:');
  });

  it('IPv6 hosts lose their brackets', () => {
    expect(parseUpstreamUrl('redis://[::1]:6390/3')).toMatchObject({ host: '::1', port: 6390, db: 3 });
    expect(parseUpstreamUrl('redis://[2001:db8::7]')).toMatchObject({ host: '2001:db8::7', port: 6379 });
  });

  it('unix:// with an optional ?db=', () => {
    expect(parseUpstreamUrl('unix:///var/run/redis/redis.sock')).toEqual({
      display: 'unix:///var/run/redis/redis.sock',
      path: '/var/run/redis/redis.sock',
      username: undefined,
      password: undefined,
      db: 0,
      tls: false,
    });
    expect(parseUpstreamUrl('unix:///tmp/r.sock?db=4')).toMatchObject({ path: '/tmp/r.sock', db: 4 });
    expect(parseUpstreamUrl('redis+unix:///tmp/r.sock?db=2')).toMatchObject({ path: '/tmp/r.sock', db: 2 });
    expect(parseUpstreamUrl('unix:///tmp/my%20dir/r.sock')).toMatchObject({ path: '/tmp/my dir/r.sock' });
    expect(parseUpstreamUrl('unix:///tmp/r.sock?db=1&user=u&password=p')).toMatchObject({ username: 'u', password: 'p', db: 1 });
    expect(configError(() => parseUpstreamUrl('unix:///tmp/r.sock?db=x')).message).toContain('database');
    expect(configError(() => parseUpstreamUrl('unix:///tmp/r.sock?db=')).message).toContain('database');
  });

  it('reads rediss:// as TLS, with the password masked', () => {
    const target = parseUpstreamUrl('rediss://:pw@h:6380/1');
    expect(target).toMatchObject({ host: 'h', port: 6380, password: 'pw', db: 1, tls: true });
    expect(target.display).toBe('rediss://:***@h:6380/1');
  });

  it('refuses garbage, other schemes, and a missing host', () => {
    expect(configError(() => parseUpstreamUrl('garbage')).message).toContain('not a valid URL');
    // host:port without a scheme is the likeliest slip: the message shows the expected form.
    expect(configError(() => parseUpstreamUrl('127.0.0.1:6379')).message).toContain('expected redis://host:port');
    expect(configError(() => parseUpstreamUrl('http://h:6379')).message).toContain('unsupported scheme "http:"');
    expect(configError(() => parseUpstreamUrl('redis://')).message).toContain('missing host');
    expect(configError(() => parseUpstreamUrl('redis://h:99999')).message).toContain('not a valid URL');
    expect(configError(() => parseUpstreamUrl('')).message).toContain('not a valid URL');
  });

  // decodeURIComponent throws a bare URIError ("URI malformed") on a stray "%": it must become a
  // ConfigError that says which setting is wrong (and the CLI's exit code 2).
  it('refuses a malformed percent-encoding with a ConfigError', () => {
    expect(configError(() => parseUpstreamUrl('redis://:100%@h')).message).toContain('upstream URL');
    expect(configError(() => parseUpstreamUrl('redis://us%zz:pw@h')).message).toContain('upstream URL');
  });

  it('masks the password in the display form', () => {
    for (const [url, display] of [
      ['redis://alice:s3cret@h:1/2', 'redis://alice:***@h:1/2'],
      ['redis://:s3cret@h', 'redis://:***@h'],
      ['redis://:s%40cret@[::1]:7', 'redis://:***@[::1]:7'],
      ['redis://h:6379/1', 'redis://h:6379/1'],
    ]) {
      expect(parseUpstreamUrl(url).display).toBe(display);
    }
  });

  // The display form goes into logs and into error replies sent to clients; the unix:// form
  // carries its password in the query string.
  it('never shows the password in the display form, whatever the URL form', () => {
    for (const [url, password] of [
      ['redis://alice:s3cret@h', 's3cret'],
      ['redis://:p%40ss@h', 'p@ss'],
      ['unix:///tmp/r.sock?db=1&user=u&password=s3cret', 's3cret'],
      ['redis+unix:///tmp/r.sock?password=s3cret', 's3cret'],
    ]) {
      const { display } = parseUpstreamUrl(url);
      expect(display, url).not.toContain(password);
      expect(display, url).not.toContain(encodeURIComponent(password));
    }
  });

  // A URL the URL parser rejects is quoted in the error, which the CLI prints on stderr.
  it('never echoes the password in an error message', () => {
    for (const url of ['redis://:s3cret@h:notaport', 'redis://alice:s3cret@h/x', 'http://:s3cret@h']) {
      expect(configError(() => parseUpstreamUrl(url)).message, url).not.toContain('s3cret');
    }
  });
});

describe('setupCommands', () => {
  const bytes = (url: string) => setupCommands(parseUpstreamUrl(url)).map((b) => b.toString('latin1'));

  it('nothing when there are no credentials and db 0', () => {
    expect(bytes('redis://h')).toEqual([]);
    expect(bytes('redis://h/0')).toEqual([]);
    expect(bytes('unix:///tmp/r.sock')).toEqual([]);
  });

  it('AUTH password', () => {
    expect(bytes('redis://:secret@h')).toEqual(['*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n']);
  });

  it('AUTH user password, then SELECT', () => {
    expect(bytes('redis://alice:pw@h/3')).toEqual(['*3\r\n$4\r\nAUTH\r\n$5\r\nalice\r\n$2\r\npw\r\n', '*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n']);
  });

  it('SELECT alone', () => {
    expect(bytes('redis://h/12')).toEqual(['*2\r\n$6\r\nSELECT\r\n$2\r\n12\r\n']);
    expect(bytes('unix:///tmp/r.sock?db=5')).toEqual(['*2\r\n$6\r\nSELECT\r\n$1\r\n5\r\n']);
  });

  it('lengths are in bytes, and arguments are binary-safe', () => {
    const [auth] = setupCommands(parseUpstreamUrl(`redis://:${encodeURIComponent('pé\r\n x')}@h`));
    expect(auth.equals(Buffer.from('*2\r\n$4\r\nAUTH\r\n$7\r\npé\r\n x\r\n', 'utf8'))).toBe(true);
  });
});

describe('production settings', () => {
  it('reads the admin address, mode, limits and reload settings', () => {
    const config = run([
      '--admin-listen',
      'off',
      '--mode',
      'observe',
      '--max-connections',
      '5',
      '--idle-timeout-ms',
      '300',
      '--watch-rules',
      '--shutdown-timeout-ms',
      '0',
    ]);
    expect(config).toMatchObject({
      adminListen: null,
      mode: 'observe',
      maxConnections: 5,
      idleTimeoutMs: 300,
      watchRules: true,
      shutdownTimeoutMs: 0,
    });
    expect(run([], { REDIS_LOCK_PROXY_ADMIN_LISTEN: '0.0.0.0:9999', REDIS_LOCK_PROXY_WATCH_RULES: 'true' })).toMatchObject({
      adminListen: { host: '0.0.0.0', port: 9999 },
      watchRules: true,
    });
    expect(configError(() => run(['--mode', 'enforcing'])).message).toBe('mode must be enforce or observe, got "enforcing"');
    // Accepted so that existing configurations start, and said to do nothing.
    expect(run(['--max-frame-bytes', '10']).warnings).toEqual([
      expect.stringMatching(/^max-frame-bytes no longer applies: requests stream to Redis/),
    ]);
    expect(run(['--lock-pipelining']).warnings).toEqual([expect.stringMatching(/^lock-pipelining no longer applies: /)]);
    expect(run(['--lock-method', 'script'], { REDIS_LOCK_PROXY_LOCK_METHOD: 'transaction' }).lockMethod).toBe('script');
    expect(run([], { REDIS_LOCK_PROXY_LOCK_METHOD: 'transaction' }).lockMethod).toBe('transaction');
    expect(configError(() => run(['--lock-method', 'lua'])).message).toBe(
      'lock-method must be one of auto, transaction, script, got "lua"',
    );
    expect(configError(() => run([], { REDIS_LOCK_PROXY_LOCK_METHOD: 'lua' })).message).toBe(
      'REDIS_LOCK_PROXY_LOCK_METHOD: lock-method must be one of auto, transaction, script, got "lua"',
    );
  });

  it('pairs the TLS and sentinel settings, naming what is missing', () => {
    expect(configError(() => run(['--upstream-ca', '/x.pem'])).message).toBe('--upstream-ca needs a rediss:// upstream URL');
    expect(configError(() => run(['--upstream', 'rediss://h', '--upstream-cert', '/c.pem'])).message).toBe(
      'upstream-cert and upstream-key go together',
    );
    expect(configError(() => run(['--tls-cert', '/c.pem'])).message).toBe('tls-cert and tls-key go together');
    expect(configError(() => run(['--tls-client-ca', '/ca.pem'])).message).toBe('tls-client-ca needs tls-cert and tls-key');
    expect(configError(() => run(['--upstream', 'rediss://h', '--upstream-ca', '/nonexistent/ca.pem'])).message).toMatch(
      /^upstream-ca \/nonexistent\/ca\.pem: cannot read/,
    );
    expect(configError(() => run(['--sentinel', '127.0.0.1:26379'])).message).toBe('sentinel and sentinel-master go together');
    expect(run(['--sentinel', 's1:26379,s2:26380', '--sentinel', '[::1]:26381', '--sentinel-master', 'mymaster']).sentinel).toEqual({
      sentinels: [
        { host: 's1', port: 26379 },
        { host: 's2', port: 26380 },
        { host: '::1', port: 26381 },
      ],
      masterName: 'mymaster',
      username: undefined,
      password: undefined,
    });
    // Each sentinel has one vote: one listed twice would count twice.
    expect(configError(() => run(['--sentinel', 's1:26379,s2:26379,s1:26379', '--sentinel-master', 'm'])).message).toBe(
      'sentinel s1:26379 is listed twice: list each sentinel once (each has one vote)',
    );
    expect(configError(() => run(['--sentinel-master', 'm'], { REDIS_LOCK_PROXY_SENTINEL: 's1:26379,s1:26379' })).message).toBe(
      'REDIS_LOCK_PROXY_SENTINEL: sentinel s1:26379 is listed twice: list each sentinel once (each has one vote)',
    );
  });

  it('prints the effective configuration with secrets masked', () => {
    const request = resolveConfig(
      [
        '--print-config',
        '--upstream',
        'redis://:hunter2@h:1',
        '--sentinel',
        'h:2',
        '--sentinel-master',
        'm',
        '--sentinel-password',
        'swordfish',
      ],
      {},
    );
    expect(request.kind).toBe('print-config');
    const text = request.kind === 'print-config' ? request.text : '';
    expect(text).toContain('upstream: redis://:***@h:1');
    expect(text).toContain('sentinel-password: "***"');
    expect(text).not.toMatch(/hunter2|swordfish/);
    expect(text).toContain('listen: 127.0.0.1:6380');
  });
});
