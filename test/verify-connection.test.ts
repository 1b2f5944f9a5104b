/**
 * verify's own connection, recognised from the frames the client sends (CLIENT SETNAME), the runs
 * it remembers, and the counters its lock blocks go to. (End to end, with the Kubernetes example's probe:
 * e2e/lock-attempts-and-scan.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import { Stats } from '../src/stats.js';
import {
  countedApart,
  isVerifyNonce,
  newVerifyNonce,
  REMEMBERED_RUNS,
  verifyClientName,
  VERIFY_CLIENT_NAME,
  VerifyRuns,
} from '../src/verify-connection.js';
import { cmd } from './support/resp.js';
import { frameHeads } from './support/scan.js';

const namedIn = (runs: VerifyRuns, bytes: Buffer) => [...frameHeads(bytes)].map(({ scanner }) => runs.named(scanner));
const named = (bytes: Buffer) => namedIn(new VerifyRuns(), bytes);

describe('VerifyRuns.named', () => {
  it('says true for verify’s name, false for another name, and nothing for other frames', () => {
    expect(named(cmd('CLIENT', 'SETNAME', VERIFY_CLIENT_NAME))).toEqual([true]);
    expect(named(cmd('client', 'setname', VERIFY_CLIENT_NAME))).toEqual([true]);
    expect(named(cmd('CLIENT', 'SETNAME', 'stalwart'))).toEqual([false]);
    expect(named(cmd('CLIENT', 'SETNAME', `${VERIFY_CLIENT_NAME}-not`))).toEqual([false]);
    expect(named(cmd('CLIENT', 'SETNAME', `${VERIFY_CLIENT_NAME}xabcd1234`))).toEqual([false]);
    expect(named(cmd('CLIENT', 'SETNAME', `${VERIFY_CLIENT_NAME}-ABCD1234`))).toEqual([false]);
    expect(named(cmd('CLIENT', 'SETNAME', 'x'.repeat(100)))).toEqual([false]);
    expect(named(cmd('CLIENT', 'GETNAME'))).toEqual([undefined]);
    expect(named(cmd('CLIENT', 'SETINFO', VERIFY_CLIENT_NAME))).toEqual([undefined]);
    expect(named(cmd('SET', 'SETNAME', VERIFY_CLIENT_NAME))).toEqual([undefined]);
    expect(named(Buffer.from(`CLIENT SETNAME ${VERIFY_CLIENT_NAME}\r\n`))).toEqual([undefined]); // inline: a plain pipe anyway
  });

  it('remembers the nonce of a run’s name, the last REMEMBERED_RUNS of them', () => {
    const runs = new VerifyRuns();
    const nonces = Array.from({ length: REMEMBERED_RUNS + 1 }, () => newVerifyNonce());
    expect(new Set(nonces).size).toBe(nonces.length);
    for (const nonce of nonces) {
      expect(isVerifyNonce(nonce)).toBe(true);
      expect(verifyClientName(nonce)).toHaveLength(32); // what the scanner captures of a name
      expect(runs.saw(nonce)).toBe(false);
      expect(namedIn(runs, cmd('CLIENT', 'SETNAME', verifyClientName(nonce)))).toEqual([true]);
      expect(runs.saw(nonce)).toBe(true);
    }
    expect(runs.saw(nonces[0])).toBe(false); // the oldest made room
    expect(runs.saw(nonces[1])).toBe(true);
    // Seen again, a nonce is the newest: it stays while another makes room.
    namedIn(runs, cmd('CLIENT', 'SETNAME', verifyClientName(nonces[1])));
    namedIn(runs, cmd('CLIENT', 'SETNAME', verifyClientName(newVerifyNonce())));
    expect([runs.saw(nonces[1]), runs.saw(nonces[2])]).toEqual([true, false]);
    // Another process's runs: an instance id of its own.
    expect(new VerifyRuns().instance).not.toBe(runs.instance);
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
