/**
 * Every affected Stalwart release line's Redis keys, built byte by byte from the facts read in
 * Stalwart's source at each release tag, independently of the rule files (which they test):
 *
 * - the lock keys each line takes with MULTI / INCRBY 1 / EXPIRE N / EXEC, with N;
 * - the windowed counters with the same command shape, which the proxy must leave alone.
 *
 * Keys come as fast-check arbitraries (random, biased to edge values) and as fixed examples with
 * what `locks` should say of them.
 */
import fc from 'fast-check';

export interface LockKind {
  /** What the lock is for, as the facts name it. */
  readonly purpose: string;
  /** The shipped rule that should match it. */
  readonly rule: string;
  /** Stalwart's expiry for it, seconds. */
  readonly expiry: number;
  readonly keys: fc.Arbitrary<Buffer>;
  /** A key, and what `locks` says of it. */
  readonly example: { readonly key: Buffer; readonly what: string };
}

export interface WindowedKind {
  readonly purpose: string;
  /** A key, the INCRBY amount and the EXPIRE seconds, as the line sends them. */
  readonly attempts: fc.Arbitrary<{ key: Buffer; delta: bigint; expiry: number }>;
}

export interface ReleaseLine {
  /** The rule file for it, in rules/stalwart/. */
  readonly file: string;
  readonly first: string;
  readonly last: string;
  readonly locks: readonly LockKind[];
  readonly windowed: readonly WindowedKind[];
}

// ---------------------------------------------------------------------------------------------
// Byte builders
// ---------------------------------------------------------------------------------------------

function u32be(n: bigint | number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(Number(n));
  return b;
}

function u64be(n: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(n);
  return b;
}

/** Unsigned LEB128 as Stalwart's write_leb128 writes it: 7 bits a byte, low first, shortest form. */
export function leb128(n: bigint | number): Buffer {
  let value = BigInt(n);
  const out: number[] = [];
  for (;;) {
    const low = Number(value & 0x7fn);
    value >>= 7n;
    if (value === 0n) {
      out.push(low);
      return Buffer.from(out);
    }
    out.push(low | 0x80);
  }
}

function bytes(...parts: Array<Buffer | number[] | string>): Buffer {
  return Buffer.concat(parts.map((part) => (typeof part === 'string' ? Buffer.from(part, 'utf8') : Buffer.from(part))));
}

/** Unix seconds → a 0.15 TaskEpoch: seconds since 2021-09-22T03:06:40Z in the top 32 bits. */
export function taskEpoch(unixSeconds: number, attempt = 0, sequence = 0): bigint {
  return (BigInt(unixSeconds - 1_632_280_000) << 32n) | (BigInt(attempt) << 16n) | BigInt(sequence);
}

// ---------------------------------------------------------------------------------------------
// Arbitraries
// ---------------------------------------------------------------------------------------------

const U32 = fc.bigInt({ min: 0n, max: 2n ** 32n - 1n });
const U64 = fc.bigInt({ min: 0n, max: 2n ** 64n - 1n });
const LEB = U32.map(leb128);
/** Unix seconds from 2020 to 2100, as due times are. */
const UNIX_TIME = fc.integer({ min: 1_577_836_800, max: 4_102_444_800 });
const DUE_SECONDS = UNIX_TIME.map(BigInt);
const DUE_EPOCH = fc
  .tuple(fc.integer({ min: 1_632_280_001, max: 4_102_444_800 }), fc.integer({ min: 0, max: 0xffff }), fc.integer({ min: 0, max: 0xffff }))
  .map(([t, a, s]) => taskEpoch(t, a, s));

/** Domains as Stalwart holds them: lowercased ASCII names, A-labels, raw UTF-8 (SMTPUTF8). */
const DOMAIN = fc.oneof(
  fc.domain().map((d) => d.toLowerCase()),
  fc.constantFrom('example.com', 'xn--bcher-kva.example', 'bücher.example', 'почта.рф', 'a.b', 'mx_1.example.org'),
);

const QUEUE_NAME = fc
  .oneof(
    fc.constantFrom('default', 'local', 'remote', 'dsn', 'report', 'a', 'remote12'),
    fc.stringMatching(/^[a-z0-9-]{1,8}$/),
    fc.string({ unit: 'grapheme', minLength: 1, maxLength: 3 }).filter((s) => Buffer.byteLength(s) <= 8),
  )
  .map((name) => bytes(name, Array<number>(8 - Buffer.byteLength(name)).fill(0)));

const SEARCH_INDEX = fc.integer({ min: 0, max: 255 });
const DECIMAL_U32 = U32.map((n) => n.toString());

// ---------------------------------------------------------------------------------------------
// Lock kinds
// ---------------------------------------------------------------------------------------------

const purgeText: LockKind = {
  purpose: 'purge account (purge:<id>)',
  rule: 'stalwart-purge-account-text',
  expiry: 3600,
  keys: DECIMAL_U32.map((id) => bytes('purge:', id)),
  example: { key: bytes('purge:12'), what: 'purge of account 12' },
};

const purge: LockKind = {
  purpose: 'purge account',
  rule: 'stalwart-purge-account',
  expiry: 3600,
  keys: U32.map((id) => bytes([0x14], u32be(id))),
  example: { key: bytes([0x14], u32be(12)), what: 'purge of account 12' },
};

const queue011: LockKind = {
  purpose: 'SMTP queue message (queue id only)',
  rule: 'stalwart-queue-lock-0.11',
  expiry: 300,
  keys: U64.map((id) => bytes([0x15], u64be(id))),
  example: { key: bytes([0x15], u64be(42n)), what: 'queue message 42' },
};

function queueNamed(expiry: number): LockKind {
  return {
    purpose: 'SMTP queue message (queue id + name)',
    rule: 'stalwart-queue-lock',
    expiry,
    keys: fc.tuple(U64, QUEUE_NAME).map(([id, name]) => bytes([0x15], u64be(id), name)),
    example: { key: bytes([0x15], u64be(42n), 'local', [0, 0, 0]), what: 'queue message 42 in queue "local"' },
  };
}

const MAY_2026 = 1_777_629_600; // 2026-05-01T10:00:00Z

function tlsReport(expiry: number): LockKind {
  return {
    purpose: 'TLS report',
    rule: 'stalwart-tls-report-lock',
    expiry,
    keys: fc.tuple(DUE_SECONDS, DOMAIN).map(([due, domain]) => bytes([0x16, 0x00], u64be(due), domain)),
    example: {
      key: bytes([0x16, 0x00], u64be(BigInt(MAY_2026)), 'example.org'),
      what: 'TLS report for example.org due 2026-05-01T10:00:00Z',
    },
  };
}

function dmarcReport(expiry: number): LockKind {
  return {
    purpose: 'DMARC report',
    rule: 'stalwart-dmarc-report-lock',
    expiry,
    keys: fc.tuple(DUE_SECONDS, U64, DOMAIN).map(([due, hash, domain]) => bytes([0x16, 0x01], u64be(due), u64be(hash), domain)),
    example: {
      key: bytes([0x16, 0x01], u64be(BigInt(MAY_2026)), u64be(77n), 'bücher.example'),
      what: 'DMARC report for bücher.example due 2026-05-01T10:00:00Z (policy 77)',
    },
  };
}

const indexSeq: LockKind = {
  purpose: 'full-text index task (seq)',
  rule: 'stalwart-index-task-0.11',
  expiry: 300,
  keys: U64.map((seq) => bytes([0x17, 0x00], u64be(seq))),
  example: { key: bytes([0x17, 0x00], u64be(123456789n)), what: 'index task 123456789' },
};

const bayes: LockKind = {
  purpose: 'Bayes training task',
  rule: 'stalwart-bayes-task',
  expiry: 1800,
  keys: fc.tuple(LEB, LEB).map(([account, document]) => bytes([0x17, 0x01], account, document)),
  example: { key: bytes([0x17, 0x01], leb128(300), leb128(5)), what: 'Bayes training task (account 300, document 5)' },
};

/** A 0.12.5-0.15 task with a due time: sub-type, then due, account, document [, search index]. */
function dueTask(sub: number, purpose: string, rule: string, expiry: number, epoch: boolean, withIndex = false): LockKind {
  const due = epoch ? DUE_EPOCH : DUE_SECONDS;
  const tail = withIndex ? SEARCH_INDEX.map((i) => [i]) : fc.constant<number[]>([]);
  const exampleDue = epoch ? taskEpoch(MAY_2026, 1, 9) : BigInt(MAY_2026);
  const word = { 0: 'index task', 2: 'calendar alarm task', 3: 'iMIP task', 4: 'merge threads task' }[sub];
  return {
    purpose,
    rule,
    expiry,
    keys: fc.tuple(due, LEB, LEB, tail).map(([d, account, document, index]) => bytes([0x17, sub], u64be(d), account, document, index)),
    example: {
      key: bytes([0x17, sub], u64be(exampleDue), leb128(12), leb128(345), withIndex ? [1] : []),
      what: `${word} due 2026-05-01T10:00:00Z (account 12, document 345${withIndex ? ', search index 1' : ''})`,
    },
  };
}

const task016: LockKind = {
  purpose: 'task manager',
  rule: 'stalwart-task-lock',
  expiry: 3600,
  keys: U64.map((id) => bytes([0x17], u64be(id))),
  example: { key: bytes([0x17], u64be(1234n)), what: 'task 1234' },
};

const housekeeper: LockKind[] = [
  ['data', 0x00],
  ['blob', 0x01],
  ['in-memory', 0x02],
].map(([store, kind]) => ({
  purpose: `housekeeper purge (${store} store)`,
  rule: `stalwart-housekeeper-${store}`,
  expiry: 3600,
  keys: U32.map((index) => bytes([0x18, kind as number], u32be(index))),
  example: { key: bytes([0x18, kind as number], u32be(3)), what: `housekeeper purge of ${store} store 3` },
}));

const migrationCore: LockKind = {
  purpose: 'migration, core',
  rule: 'stalwart-migration-core-lock',
  expiry: 300,
  keys: fc.constant(bytes([0x18], 'migrate_core_lock')),
  example: { key: bytes([0x18], 'migrate_core_lock'), what: 'data migration (core)' },
};

const migrationAccount: LockKind = {
  purpose: 'migration, per account',
  rule: 'stalwart-migration-account-lock',
  expiry: 180,
  keys: DECIMAL_U32.map((id) => bytes([0x18], `migrate_${id}_lock`)),
  example: { key: bytes([0x18], 'migrate_7_lock'), what: 'data migration of account 7' },
};

// ---------------------------------------------------------------------------------------------
// Windowed counters (leave alone)
// ---------------------------------------------------------------------------------------------

/** A rate-limit window: now / period (u64 BE), with EXPIRE = seconds left in it (1..period). */
const WINDOW = fc
  .tuple(UNIX_TIME, fc.integer({ min: 1, max: 30 * 86_400 }))
  .chain(([now, period]) =>
    fc.integer({ min: 1, max: period }).map((left) => ({ window: u64be(BigInt(Math.floor(now / period))), expiry: left })),
  );

/** Printable bytes that a lock rule's text parts or a domain would accept. */
const DOMAIN_LIKE = fc.uint8Array({ minLength: 0, maxLength: 40 }).map((a) => Buffer.from(a.map((b) => 0x21 + (b % 94))));

/**
 * 0.8-0.10 SMTP throttles: a 32-byte BLAKE3 hash, then the window: 40 bytes whose first bytes
 * may be anything, also a lock prefix. The adversarial ones start like 0.11+ lock keys and go on
 * with printable bytes, so only the window's leading zero bytes keep them from a domain part.
 */
const THROTTLE_HASH = fc.oneof(
  fc.uint8Array({ minLength: 32, maxLength: 32 }).map(Buffer.from),
  fc
    .tuple(
      fc.constantFrom(0x14, 0x15, 0x16, 0x17, 0x18),
      fc.constantFrom(0x00, 0x01, 0x02, 0x03, 0x04),
      fc.uint8Array({ minLength: 8, maxLength: 8 }),
      DOMAIN_LIKE,
    )
    .map(([prefix, sub, due, rest]) =>
      Buffer.concat([Buffer.from([prefix, sub]), Buffer.from(due), rest, Buffer.alloc(32)]).subarray(0, 32),
    ),
  fc.constant(bytes('purge:', '1234567890123456789012345678'.padEnd(26, 'x'))),
);

function windowed(purpose: string, key: fc.Arbitrary<Buffer>): WindowedKind {
  return { purpose, attempts: fc.tuple(key, WINDOW).map(([k, w]) => ({ key: Buffer.concat([k, w.window]), delta: 1n, expiry: w.expiry })) };
}

const CALLER_TEXT = fc.oneof(fc.ipV4(), fc.ipV6(), fc.emailAddress(), fc.stringMatching(/^[a-z0-9]{1,12}$/), U32.map(String));

function textRateLimits(prefixes: readonly string[]): WindowedKind {
  return windowed(
    `rate limit (${prefixes.join(' ')})`,
    fc.tuple(fc.constantFrom(...prefixes), CALLER_TEXT).map(([prefix, who]) => bytes(prefix, who)),
  );
}

/** The caller keys of 0.8-0.10's is_rate_allowed (r:, h:, l: and contact: from 0.10 on). */
const RATE_TEXT = ['b:', 'ireq:', 'jreq:', 'jauth:', 'j:', 'r:', 'h:', 'l:', 'contact:'];
const smtpThrottle = windowed('SMTP throttle (hash + window)', THROTTLE_HASH);

/** 0.11+: 0x02-0x0A + the caller's key (text or hash bytes) + window. */
const prefixedRateLimits = windowed(
  'rate limits 0x02-0x0A',
  fc
    .tuple(
      fc.integer({ min: 0x02, max: 0x0a }),
      fc.oneof(
        CALLER_TEXT.map((t) => Buffer.from(t)),
        fc.uint8Array({ minLength: 0, maxLength: 48 }).map(Buffer.from),
      ),
    )
    .map(([prefix, rest]) => Buffer.concat([Buffer.from([prefix]), rest])),
);

/** 0.11.2-0.12.x: 0x0B + principal u32 BE, INCRBY 1 + EXPIRE 2592000 on every use. */
const tokenRevision: WindowedKind = {
  purpose: 'token revision 0x0B',
  attempts: U32.map((principal) => ({ key: bytes([0x0b], u32be(principal)), delta: 1n, expiry: 2_592_000 })),
};

/** 0.16: 0x0B + account u32 BE + window u64 BE, INCRBY (1 << 44 | bytes). */
const blobQuota: WindowedKind = {
  purpose: 'blob quota 0x0B',
  attempts: fc.tuple(U32, WINDOW, fc.integer({ min: 0, max: 2 ** 40 })).map(([account, w, size]) => ({
    key: bytes([0x0b], u32be(account), w.window),
    delta: (1n << 44n) | BigInt(size),
    expiry: w.expiry,
  })),
};

// ---------------------------------------------------------------------------------------------
// The lines
// ---------------------------------------------------------------------------------------------

const HOUSEKEEPING = [...housekeeper];
/** 0.12.5 to 0.14.1: the task locks with a due time in Unix seconds, and Bayes training. */
const TASKS_0_12_5 = [
  dueTask(0, 'full-text index task', 'stalwart-index-task-0.12.5', 300, false),
  bayes,
  dueTask(2, 'calendar alarm', 'stalwart-alarm-task', 120, false),
  dueTask(3, 'iMIP', 'stalwart-imip-task', 120, false),
];
const MIGRATION = [migrationCore, migrationAccount];

export const RELEASE_LINES: readonly ReleaseLine[] = [
  { file: '0.8.yaml', first: '0.8.1', last: '0.10.7', locks: [purgeText], windowed: [textRateLimits(RATE_TEXT), smtpThrottle] },
  {
    file: '0.11.yaml',
    first: '0.11.0',
    last: '0.11.8',
    locks: [purge, queue011, tlsReport(300), dmarcReport(300), indexSeq, bayes, ...HOUSEKEEPING],
    windowed: [prefixedRateLimits, tokenRevision],
  },
  {
    file: '0.12.yaml',
    first: '0.12.0',
    last: '0.12.4',
    locks: [purge, queue011, tlsReport(300), dmarcReport(300), indexSeq, bayes, ...HOUSEKEEPING, ...MIGRATION],
    windowed: [prefixedRateLimits, tokenRevision],
  },
  {
    file: '0.12.5.yaml',
    first: '0.12.5',
    last: '0.12.5',
    locks: [purge, queue011, tlsReport(300), dmarcReport(300), ...TASKS_0_12_5, ...HOUSEKEEPING, ...MIGRATION],
    windowed: [prefixedRateLimits, tokenRevision],
  },
  {
    file: '0.13.yaml',
    first: '0.13.0',
    last: '0.14.1',
    locks: [purge, queueNamed(600), tlsReport(600), dmarcReport(600), ...TASKS_0_12_5, ...HOUSEKEEPING, ...MIGRATION],
    windowed: [prefixedRateLimits],
  },
  {
    file: '0.15.yaml',
    first: '0.15.0',
    last: '0.15.5',
    locks: [
      purge,
      queueNamed(600),
      tlsReport(600),
      dmarcReport(600),
      dueTask(0, 'index task', 'stalwart-index-task-0.15', 300, true, true),
      dueTask(2, 'calendar alarm', 'stalwart-alarm-task', 120, true),
      dueTask(3, 'iMIP', 'stalwart-imip-task', 120, true),
      dueTask(4, 'merge threads', 'stalwart-merge-threads-task', 120, true),
      ...HOUSEKEEPING,
      ...MIGRATION,
    ],
    windowed: [prefixedRateLimits],
  },
  { file: '0.16.yaml', first: '0.16.0', last: '0.16.15', locks: [task016, queueNamed(600)], windowed: [prefixedRateLimits, blobQuota] },
];

/** Every windowed counter of every line, with the line it is from. */
export const ALL_WINDOWED = RELEASE_LINES.flatMap((line) => line.windowed.map((kind) => ({ line, kind })));
