import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRedis, type RedisServer } from './redis.js';
import { cmd, frameLength, RawClient, RespProtocolError, splitFrames } from './resp.js';

const b = (s: string) => Buffer.from(s, 'latin1');

describe('frameLength', () => {
  it('measures complete frames of every type', () => {
    const frames = [
      '+OK\r\n',
      '-ERR nope\r\n',
      ':-12\r\n',
      '$5\r\nhe\r\no\r\n', // CRLF inside a bulk payload is data
      '$0\r\n\r\n',
      '$-1\r\n',
      '*-1\r\n',
      '*0\r\n',
      '*2\r\n$1\r\na\r\n*1\r\n:1\r\n',
      '_\r\n',
      ',3.14\r\n',
      '#t\r\n',
      '(12345678901234567890\r\n',
      '!3\r\nerr\r\n',
      '=7\r\ntxt:abc\r\n',
      '%1\r\n+k\r\n:1\r\n',
      '~2\r\n+a\r\n+b\r\n',
      '>2\r\n+message\r\n+hi\r\n',
    ];
    for (const frame of frames) {
      expect(frameLength(b(frame + '+NEXT\r\n')), JSON.stringify(frame)).toBe(frame.length);
    }
  });

  it('includes an attribute with the reply it annotates', () => {
    const attributed = '|1\r\n+ttl\r\n:3\r\n*2\r\n:1\r\n|1\r\n+a\r\n+b\r\n:2\r\n';
    expect(frameLength(b(attributed))).toBe(attributed.length);
  });

  it('returns undefined for every strict prefix of a frame', () => {
    const frame = '*3\r\n$3\r\nfoo\r\n%1\r\n+k\r\n_\r\n|1\r\n+a\r\n+b\r\n#f\r\n';
    for (let cut = 0; cut < frame.length; cut++) {
      expect(frameLength(b(frame.slice(0, cut))), `cut at ${cut}`).toBeUndefined();
    }
    expect(frameLength(b(frame))).toBe(frame.length);
  });

  it('honours the offset', () => {
    expect(frameLength(b('+A\r\n:1\r\n'), 4)).toBe(4);
  });

  it('rejects bytes that are not RESP', () => {
    for (const bad of ['?x\r\n', '$3\r\nabcd\r\n', '%-1\r\n', '$?\r\n', '#x\r\n', ':1.5\r\n']) {
      expect(() => frameLength(b(bad)), JSON.stringify(bad)).toThrow(RespProtocolError);
    }
  });

  it('splitFrames keeps the unfinished tail', () => {
    const { frames, rest } = splitFrames(b('+A\r\n:1\r\n$3\r\nab'));
    expect(frames.map(String)).toEqual(['+A\r\n', ':1\r\n']);
    expect(rest.toString()).toBe('$3\r\nab');
  });
});

describe('cmd', () => {
  it('encodes a RESP2 multibulk, binary safe', () => {
    expect(cmd('SET', 'k', Buffer.from([0, 0xff])).toString('latin1')).toBe('*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\x00\xff\r\n');
  });
});

describe('RawClient against redis-server', () => {
  let redis: RedisServer;
  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await redis?.stop();
  });

  async function connect(): Promise<RawClient> {
    return RawClient.connect(redis.port, redis.host);
  }

  it('PING', async () => {
    const client = await connect();
    client.write(cmd('PING'));
    expect((await client.readReplies(1)).toString()).toBe('+PONG\r\n');
    await client.close();
  });

  it('reads a pipelined batch and keeps extra replies for the next read', async () => {
    const client = await connect();
    client.write(Buffer.concat([cmd('SET', 'pipe', 'v'), cmd('GET', 'pipe'), cmd('DEL', 'pipe'), cmd('GET', 'pipe')]));
    expect((await client.readReplies(2)).toString()).toBe('+OK\r\n$1\r\nv\r\n');
    expect((await client.readReplies(2)).toString()).toBe(':1\r\n$-1\r\n');
    await client.close();
  });

  it('writes commands in pieces (and bytewise) and reads a large bulk reply', async () => {
    const client = await connect();
    const value = 'x'.repeat(200_000); // several TCP reads on the way back
    await client.writeSplit(cmd('SET', 'big', value), [1, 2, 3, 10, 7]);
    await client.writeSplit(cmd('GET', 'big'), 'bytewise');
    expect((await client.readReplies(2)).toString()).toBe(`+OK\r\n$${value.length}\r\n${value}\r\n`);
    await client.close();
  });

  it('HELLO 3 answers with a map', async () => {
    const client = await connect();
    client.write(cmd('HELLO', '3'));
    const reply = await client.readReplies(1);
    expect(reply.toString('latin1', 0, 1)).toBe('%');
    expect(frameLength(reply)).toBe(reply.length);
    expect(reply.toString()).toContain('$5\r\nproto\r\n:3\r\n');
    await client.close();
  });

  it('counts RESP3 pushes as frames', async () => {
    const client = await connect();
    client.write(Buffer.concat([cmd('HELLO', '3'), cmd('SUBSCRIBE', 'ch')]));
    await client.readReplies(1);
    expect((await client.readReplies(1)).toString()).toBe('>3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n');
    await client.close();
  });

  it('readUntilClosed returns the last bytes before the server hangs up', async () => {
    const client = await connect();
    client.write(Buffer.concat([cmd('PING'), cmd('QUIT')]));
    expect((await client.readUntilClosed()).toString()).toBe('+PONG\r\n+OK\r\n');
    expect(client.isClosed).toBe(true);
  });

  it('times out with the buffered bytes in the message', async () => {
    const client = await connect();
    client.write(cmd('PING'));
    await expect(client.readReplies(2, 200)).rejects.toThrow(/timed out.*1 complete.*PONG/);
    client.destroy();
  });
});

describe('startRedis', () => {
  it('supports a password', async () => {
    const redis = await startRedis({ password: 's3cret', args: ['--maxmemory', '10mb'] });
    try {
      expect(redis.url).toBe(`redis://:s3cret@${redis.host}:${redis.port}`);
      const client = await RawClient.connect(redis.port, redis.host);
      client.write(Buffer.concat([cmd('PING'), cmd('AUTH', 's3cret'), cmd('CONFIG', 'GET', 'maxmemory')]));
      expect((await client.readReplies(3)).toString()).toBe(
        '-NOAUTH Authentication required.\r\n+OK\r\n*2\r\n$9\r\nmaxmemory\r\n$8\r\n10485760\r\n',
      );
      await client.close();
    } finally {
      await redis.stop();
    }
  });

  it('stop() is idempotent and frees the port', async () => {
    const redis = await startRedis();
    await Promise.all([redis.stop(), redis.stop()]);
    await expect(RawClient.connect(redis.port, redis.host)).rejects.toThrow(/ECONNREFUSED/);
  });
});
