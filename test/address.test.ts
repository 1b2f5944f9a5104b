/**
 * The one address formatter: IPv6 literals in brackets, and every address it writes reads back
 * through parseAddress as the same host and port.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { formatAddress, parseAddress } from '../src/address.js';

describe('formatAddress', () => {
  it('writes host:port, an IPv6 literal in brackets', () => {
    expect(formatAddress('127.0.0.1', 6380)).toBe('127.0.0.1:6380');
    expect(formatAddress('redis-1.svc', 6379)).toBe('redis-1.svc:6379');
    expect(formatAddress('::1', 6380)).toBe('[::1]:6380');
    expect(formatAddress('fe80::1%eth0', 7000)).toBe('[fe80::1%eth0]:7000');
  });

  it('writes what parseAddress reads back', () => {
    const host = fc.oneof(fc.ipV4(), fc.ipV6(), fc.domain());
    fc.assert(
      fc.property(host, fc.integer({ min: 0, max: 65535 }), (h, port) => {
        expect(parseAddress(formatAddress(h, port))).toEqual({ host: h, port });
      }),
    );
  });
});
