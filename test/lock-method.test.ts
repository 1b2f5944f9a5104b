/**
 * Choosing how blocks are sent from the server's HELLO reply, and the NX added inside the
 * transaction, on their own (block-flow.test.ts and the end-to-end tests run them in the flow).
 */
import { describe, expect, it } from 'vitest';
import { expiryWithNx } from '../src/lock/expire-nx.js';
import { methodFromHello, ServerMethods, type ServerVersion } from '../src/lock/lock-method.js';
import { cmd } from './support/resp.js';

const hello = (server: string, version: string): Buffer =>
  Buffer.from(`*4\r\n$6\r\nserver\r\n$${server.length}\r\n${server}\r\n$7\r\nversion\r\n$${version.length}\r\n${version}\r\n`);

describe('methodFromHello', () => {
  it('Redis 7.0 and later, and Valkey, have EXPIRE NX: inside the transaction', () => {
    for (const [server, version] of [
      ['redis', '7.0.0'],
      ['redis', '7.2.4'],
      ['redis', '8.0.2'],
      ['redis', '10.0.0'],
      ['valkey', '8.1.1'],
    ]) {
      expect(methodFromHello(hello(server, version))).toEqual({ method: 'transaction', detail: `${server} ${version}`, hasReset: true });
    }
  });

  it('anything older, or a reply it cannot read, gets the expiry script inside the transaction (which works on every version)', () => {
    for (const reply of [
      hello('redis', '6.2.14'),
      hello('redis', '5.0.0'),
      hello('redis', 'unknown'),
      Buffer.from('+OK\r\n'),
      Buffer.from('*1\r\n'),
    ]) {
      expect(methodFromHello(reply).method, reply.toString()).toBe('transaction-script');
    }
    // HELLO without arguments is an error before 6.2, as RESET (of the same release) is unknown.
    expect(methodFromHello(Buffer.from("-ERR unknown command 'HELLO'\r\n"))).toEqual({
      method: 'transaction-script',
      detail: "ERR unknown command 'HELLO'",
      hasReset: false,
    });
    expect(methodFromHello(hello('redis', '6.2.14')).hasReset).toBe(true);
  });

  it('not authenticated yet: no answer, ask again', () => {
    expect(methodFromHello(Buffer.from('-NOAUTH HELLO must be called with the client already authenticated\r\n')).method).toBeNull();
  });
});

describe('expiryWithNx', () => {
  it('adds NX to a whole [P]EXPIRE frame, every other byte as sent', () => {
    expect(expiryWithNx(cmd('Expire', 'lock:a', '60')).toString('latin1')).toBe(cmd('Expire', 'lock:a', '60', 'NX').toString('latin1'));
    // The two bytes Redis skips after a count line's \r are kept out, whatever they are.
    const frame = Buffer.from('*3\r?$7\r\nPEXPIRE\r\n$6\r\nlock:b\r\n$4\r\n9000\r\n');
    expect(expiryWithNx(frame).toString('latin1')).toBe(cmd('PEXPIRE', 'lock:b', '9000', 'NX').toString('latin1'));
  });
});

describe('ServerMethods: the method per upstream address', () => {
  const seven: ServerVersion = { method: 'transaction', detail: 'redis 7.0.15' };
  const noauth: ServerVersion = { method: null, detail: 'NOAUTH HELLO must be called with the client already authenticated' };
  /** A question ahead that answers when told to. */
  const pending = () => {
    let answer: (version: ServerVersion | null) => void = () => {};
    let asked = 0;
    const ask = () => {
      asked++;
      return new Promise<ServerVersion | null>((resolve) => (answer = resolve));
    };
    return { ask, answer: (v: ServerVersion | null) => answer(v), asked: () => asked };
  };
  const settled = () => new Promise((resolve) => setImmediate(resolve));

  it('asks ahead once at a time, keeps the answer, and says who learnt it first', async () => {
    const methods = new ServerMethods();
    const question = pending();
    const found: string[] = [];
    methods.askAhead('a:1', question.ask, (v) => found.push(v.detail));
    methods.askAhead('a:1', question.ask, (v) => found.push(v.detail)); // in flight: not asked twice
    expect(question.asked()).toBe(1);
    question.answer(seven);
    await settled();
    expect(methods.get('a:1')).toBe('transaction');
    expect(found).toEqual(['redis 7.0.15']);
    expect(methods.learnt('a:1', 'transaction')).toBe(false); // a connection that learns it later is not the first
    methods.askAhead('a:1', question.ask, () => {});
    expect(question.asked()).toBe(1); // known: nothing asked
  });

  it('leaves a refused question to the client connections until the address is forgotten; asks an unanswered one again', async () => {
    const methods = new ServerMethods();
    const question = pending();
    methods.askAhead('a:1', question.ask, () => {});
    question.answer(noauth);
    await settled();
    methods.askAhead('a:1', question.ask, () => {});
    expect(question.asked()).toBe(1);
    expect(methods.get('a:1')).toBeNull();
    methods.forget('a:1');
    methods.askAhead('a:1', question.ask, () => {});
    expect(question.asked()).toBe(2);
    question.answer(null); // unreachable: the next connection made asks again
    await settled();
    methods.askAhead('a:1', question.ask, () => {});
    expect(question.asked()).toBe(3);
  });
});
