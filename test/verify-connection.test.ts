/**
 * verify's own connection, recognised from the frames the client sends (CLIENT SETNAME), and the
 * counters its lock blocks go to. (End to end, with the Kubernetes example's probe:
 * e2e/lock-attempts-and-scan.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import { Stats } from '../src/stats.js';
import { countedApart, namesVerifyConnection, VERIFY_CLIENT_NAME } from '../src/verify-connection.js';
import { cmd } from './support/resp.js';
import { frameHeads } from './support/scan.js';

const named = (bytes: Buffer) => [...frameHeads(bytes)].map(({ scanner }) => namesVerifyConnection(scanner));

describe('namesVerifyConnection', () => {
  it('says true for verify’s name, false for another name, and nothing for other frames', () => {
    expect(named(cmd('CLIENT', 'SETNAME', VERIFY_CLIENT_NAME))).toEqual([true]);
    expect(named(cmd('client', 'setname', VERIFY_CLIENT_NAME))).toEqual([true]);
    expect(named(cmd('CLIENT', 'SETNAME', 'stalwart'))).toEqual([false]);
    expect(named(cmd('CLIENT', 'SETNAME', `${VERIFY_CLIENT_NAME}-not`))).toEqual([false]);
    expect(named(cmd('CLIENT', 'SETNAME', 'x'.repeat(100)))).toEqual([false]);
    expect(named(cmd('CLIENT', 'GETNAME'))).toEqual([undefined]);
    expect(named(cmd('CLIENT', 'SETINFO', VERIFY_CLIENT_NAME))).toEqual([undefined]);
    expect(named(cmd('SET', 'SETNAME', VERIFY_CLIENT_NAME))).toEqual([undefined]);
    expect(named(Buffer.from(`CLIENT SETNAME ${VERIFY_CLIENT_NAME}\r\n`))).toEqual([undefined]); // inline: a plain pipe anyway
  });
});

describe('countedApart', () => {
  it('reads the settings through, and counts in Stats.verify while the connection is verify’s', () => {
    const stats = new Stats();
    const settings = { holdMs: 10, stats };
    let verify = false;
    const view = countedApart(settings, () => verify);
    expect(view.stats).toBe(stats);
    settings.holdMs = 25; // a reload
    expect(view.holdMs).toBe(25);
    verify = true;
    view.stats.blockSeen('task');
    expect(stats.verify.rule('task').seen).toBe(1);
    expect(stats.rule('task').seen).toBe(0);
  });
});
