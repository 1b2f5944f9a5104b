/**
 * The RESP3 frame walker of the integrity stress's tracking clients: every push taken out
 * wherever it is (top level, inside each aggregate type, inside another push), none counted as
 * an element of its parent, every other byte handed on in order, whatever the chunks; and bytes
 * that are not RESP3 reported where they are.
 */
import { describe, expect, it } from 'vitest';
import { InvalidationCheck, whose } from './invalidations.js';
import { PushWalker } from './resp3-walker.js';
import { clientTag, lockKeyFor } from './workload.js';

interface Walked {
  rest: string;
  pushes: Array<{ frame: string; offset: number; nested: boolean }>;
  malformed: Array<{ offset: number; why: string }>;
}

/** Walks `text` cut into chunks of `size` bytes (0: whole). */
function walk(text: string, size = 0): Walked {
  const walked: Walked = { rest: '', pushes: [], malformed: [] };
  const walker = new PushWalker({
    bytes: (bytes) => {
      expect(bytes.length).toBeGreaterThan(0);
      walked.rest += bytes.toString('latin1');
      return true;
    },
    push: (frame, offset, nested) => walked.pushes.push({ frame: frame.toString('latin1'), offset, nested }) > 0,
    malformed: (offset, why) => void walked.malformed.push({ offset, why }),
  });
  const bytes = Buffer.from(text, 'latin1');
  const step = size === 0 ? bytes.length : size;
  for (let at = 0; at < bytes.length; at += step) walker.take(bytes.subarray(at, at + step));
  return walked;
}

const PUSH = '>2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nkey\r\n';

/** One frame of every type that is not a push. */
const EVERY_TYPE = [
  '+OK\r\n',
  '-ERR wrong\r\n',
  ':-42\r\n',
  '$5\r\nh\r\nlo\r\n',
  '$0\r\n\r\n',
  '$-1\r\n',
  '*-1\r\n',
  '_\r\n',
  ',3.14\r\n',
  ',-inf\r\n',
  '#t\r\n',
  '(3492890328409238509324850943850943825024385\r\n',
  '!8\r\nSYNTAX x\r\n',
  '=15\r\ntxt:Some string\r\n',
  '*0\r\n',
  '%1\r\n+k\r\n:1\r\n',
  '~2\r\n+a\r\n+b\r\n',
  '|1\r\n+ttl\r\n:3600\r\n+annotated\r\n',
];

describe('the RESP3 walker of the stress', () => {
  it('hands on every type that is not a push, unchanged, whatever the chunks', () => {
    const text = EVERY_TYPE.join('');
    for (const size of [0, 1, 2, 3, 7]) expect(walk(text, size)).toEqual({ rest: text, pushes: [], malformed: [] });
  });

  it('takes pushes out at the top level and inside every aggregate, none counted as an element', () => {
    const cases: Array<[string, string, boolean[]]> = [
      [`${PUSH}+OK\r\n`, '+OK\r\n', [false]],
      [`*2\r\n${PUSH}:3\r\n${PUSH}:1\r\n+after\r\n`, '*2\r\n:3\r\n:1\r\n+after\r\n', [true, true]], // EXEC's array on Redis 6.x
      [`*2\r\n:3\r\n:1\r\n${PUSH}`, '*2\r\n:3\r\n:1\r\n', [false]], // on 7.x, after the reply
      [`%1\r\n${PUSH}+k\r\n${PUSH}:1\r\n+after\r\n`, '%1\r\n+k\r\n:1\r\n+after\r\n', [true, true]],
      [`~1\r\n${PUSH}+a\r\n+after\r\n`, '~1\r\n+a\r\n+after\r\n', [true]],
      [`|1\r\n+key\r\n${PUSH}+value\r\n${PUSH}+reply\r\n`, '|1\r\n+key\r\n+value\r\n+reply\r\n', [true, false]],
      [`*1\r\n*2\r\n:1\r\n${PUSH}$2\r\nab\r\n+after\r\n`, '*1\r\n*2\r\n:1\r\n$2\r\nab\r\n+after\r\n', [true]],
    ];
    for (const [text, rest, nested] of cases) {
      for (const size of [0, 1, 3]) {
        const walked = walk(text, size);
        expect(walked.rest, `${JSON.stringify(text)} in chunks of ${size}`).toBe(rest);
        expect(walked.malformed).toEqual([]);
        expect(walked.pushes.map((push) => push.frame)).toEqual(nested.map(() => PUSH));
        expect(walked.pushes.map((push) => push.nested)).toEqual(nested);
        for (const push of walked.pushes) expect(text.slice(push.offset, push.offset + PUSH.length)).toBe(PUSH);
      }
    }
  });

  it('takes a push nested in a push out on its own', () => {
    const inner = '>1\r\n+inner\r\n';
    const text = `*1\r\n>2\r\n+outer\r\n${inner}:7\r\n:1\r\n`;
    for (const size of [0, 1]) {
      const walked = walk(text, size);
      expect(walked.rest).toBe('*1\r\n:1\r\n');
      expect(walked.pushes.map((push) => [push.frame, push.offset, push.nested])).toEqual([
        [inner, text.indexOf(inner), true],
        ['>2\r\n+outer\r\n:7\r\n', 4, true],
      ]);
    }
  });

  it('reports bytes that are not RESP3 where they are', () => {
    for (const [text, offset] of [
      ['+OK\r\n@oops\r\n', 5],
      ['$3\r\nabcd\r\n', 7],
      ['*x\r\n', 0],
      ['*1\r\n>1\r\n$?\r\n', 8],
      [':1\r\r\n', 3],
    ] as const) {
      const walked = walk(text);
      expect(
        walked.malformed.map((m) => m.offset),
        text,
      ).toEqual([offset]);
    }
    // Outside a push the bytes go on first: the check against the model says how they differ.
    expect(walk('+OK\r\n@oops\r\n').rest).toBe('+OK\r\n@oops\r\n');
  });
});

describe('the check of invalidation pushes', () => {
  const own = new InvalidationCheck(3, [Buffer.from(`s:${clientTag(3)}:v1`), lockKeyFor(3)]);
  const invalidate = (...keys: Buffer[]): Buffer =>
    Buffer.concat([
      Buffer.from(`>2\r\n$10\r\ninvalidate\r\n*${keys.length}\r\n`),
      ...keys.map((key) => Buffer.concat([Buffer.from(`$${key.length}\r\n`), key, Buffer.from('\r\n')])),
    ]);

  it('passes invalidations of the client own keys, and of every key', () => {
    expect(own.problem(invalidate(Buffer.from(`s:${clientTag(3)}:v1`)))).toBeNull();
    expect(own.problem(invalidate(lockKeyFor(3), Buffer.from(`s:${clientTag(3)}:v1`)))).toBeNull();
    expect(own.problem(Buffer.from('>2\r\n$10\r\ninvalidate\r\n_\r\n'))).toBeNull();
  });

  it("reports another client's key, and whose it is", () => {
    expect(own.problem(invalidate(Buffer.from(`s:${clientTag(17)}:v1`)))).toMatch(/the key of client 17, not a key of client 3's own/);
    expect(own.problem(invalidate(lockKeyFor(5)))).toMatch(/the task lock key of client 5 /);
    expect(whose(Buffer.from('unrelated'))).toBe('no key of any stress client');
  });

  it('reports pushes that are no well-formed invalidation', () => {
    for (const text of [
      '>2\r\n$7\r\nmessage\r\n*0\r\n',
      '>2\r\n$10\r\ninvalidate\r\n*0\r\n',
      '>2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\na\r\n',
      '>2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nab\r\n',
      '>3\r\n$10\r\ninvalidate\r\n_\r\n',
    ])
      expect(own.problem(Buffer.from(text)), text).not.toBeNull();
  });
});
