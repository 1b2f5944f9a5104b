/**
 * Choosing how blocks are sent from the server's HELLO reply, and the NX added inside the
 * transaction, on their own (block-flow.test.ts and the end-to-end tests run them in the flow).
 */
import { describe, expect, it } from 'vitest';
import { withExpireNx } from '../src/lock/expire-nx.js';
import { methodFromHello } from '../src/lock/lock-method.js';
import { cmd } from './support/resp.js';
import { lockAttempt } from './support/stalwart.js';

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
      expect(methodFromHello(hello(server, version))).toEqual({ method: 'transaction', detail: `${server} ${version}` });
    }
  });

  it('anything older, or a reply it cannot read, gets the script (which works on every version)', () => {
    for (const reply of [
      hello('redis', '6.2.14'),
      hello('redis', '5.0.0'),
      hello('redis', 'unknown'),
      Buffer.from('+OK\r\n'),
      Buffer.from('*1\r\n'),
    ]) {
      expect(methodFromHello(reply).method, reply.toString()).toBe('script');
    }
    expect(methodFromHello(Buffer.from("-ERR unknown command 'HELLO'\r\n"))).toEqual({
      method: 'script',
      detail: "ERR unknown command 'HELLO'",
    });
  });

  it('not authenticated yet: no answer, ask again', () => {
    expect(methodFromHello(Buffer.from('-NOAUTH HELLO must be called with the client already authenticated\r\n')).method).toBeNull();
  });
});

describe('withExpireNx', () => {
  it('adds NX to the third frame only, every other byte as sent', () => {
    const block = lockAttempt('lock:a', 60);
    const expected = Buffer.concat([cmd('MULTI'), cmd('INCRBY', 'lock:a', '1'), cmd('EXPIRE', 'lock:a', '60', 'NX'), cmd('EXEC')]);
    expect(withExpireNx(block)?.toString('latin1')).toBe(expected.toString('latin1'));
    // The same again: nothing carries over between blocks.
    expect(withExpireNx(block)?.toString('latin1')).toBe(expected.toString('latin1'));
  });

  it('changes nothing (null) for bytes that are not four whole frames', () => {
    const block = lockAttempt('lock:a', 60);
    for (const bytes of [
      block.subarray(0, block.length - 3),
      Buffer.concat([block, cmd('PING')]),
      cmd('PING'),
      Buffer.from('*1\r\n$x\r\n'),
    ]) {
      expect(withExpireNx(bytes), bytes.toString('latin1')).toBeNull();
    }
    expect(withExpireNx(block)).not.toBeNull(); // and a whole block after them still works
  });
});
