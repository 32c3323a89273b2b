import net from 'node:net';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { startRedisServer, type RedisServer } from '../../../../test/support/redis-server.js';
import { RedisSlidingWindowLimiter } from './redis.js';
import { command, parseReply, redisEndpoint, ScriptPipe, type ScriptReply } from './script-pipe.js';
import { handshakeStaller } from './testing.js';

const SCRIPT = `return {tonumber(ARGV[1]) + 1, #KEYS[1], ARGV[2] == '' and 1 or 0}`;

function call(pipe: ScriptPipe, key: string, args: string[]): Promise<ScriptReply> {
  return new Promise((resolve, reject) => pipe.call(key, args, (err, r) => (err ? reject(err) : resolve(r!))));
}

describe('parseReply', () => {
  it('parses each RESP2 kind, nested arrays, and reports an incomplete reply at every split point', () => {
    const wire = Buffer.from('*5\r\n:1\r\n:-42\r\n$3\r\nabc\r\n+OK\r\n*2\r\n$-1\r\n-ERR bad\r\n');
    const r = parseReply(wire, 0);
    expect(r).not.toBe(undefined);
    const { value, end } = r as { value: unknown[]; end: number };
    expect(end).toBe(wire.length);
    expect(value.slice(0, 4)).toEqual([1, -42, 'abc', 'OK']);
    const nested = value[4] as unknown[];
    expect(nested[0]).toBeNull();
    expect((nested[1] as Error).message).toBe('ERR bad');
    for (let cut = 0; cut < wire.length; cut++) expect(typeof parseReply(wire.subarray(0, cut), 0)).toBe('symbol');
  });

  it('encodes commands with byte lengths (multi-byte characters)', () => {
    expect(command('SET', 'k', 'é')).toBe('*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\né\r\n');
  });
});

describe('ScriptPipe against Redis', () => {
  let admin: Redis;
  const pipes: ScriptPipe[] = [];
  beforeAll(() => {
    admin = new Redis(inject('redisUrl'));
  });
  afterAll(async () => {
    for (const p of pipes) p.close();
    await admin.quit();
  });

  async function open(timeoutMs = 2000): Promise<ScriptPipe> {
    const p = new ScriptPipe({ url: inject('redisUrl'), script: SCRIPT, argCount: 2, timeoutMs });
    pipes.push(p);
    await new Promise<void>((r) => p.once('ready', () => r()));
    return p;
  }

  it('answers many pipelined calls in order, each with its own reply', async () => {
    const p = await open();
    const replies = await Promise.all(Array.from({ length: 5000 }, (_, i) => call(p, `key-${'x'.repeat(i % 7)}`, [String(i), i % 2 ? '' : 'y'])));
    replies.forEach((r, i) => expect(r).toEqual([i + 1, 4 + (i % 7), i % 2 ? 1 : 0]));
    expect(p.inFlight).toBe(0);
  });

  it('delivers an integer reply as a number, in order among array replies (the limiter script answers an admission with 1)', async () => {
    const p = new ScriptPipe({ url: inject('redisUrl'), script: `if ARGV[1] == 'n' then return tonumber(ARGV[2]) end return {tonumber(ARGV[2]), -1}`, argCount: 2, timeoutMs: 2000 });
    pipes.push(p);
    await new Promise<void>((r) => p.once('ready', () => r()));
    const replies = await Promise.all(Array.from({ length: 200 }, (_, i) => call(p, 'k', [i % 3 ? 'n' : 'a', String(i - 100)])));
    replies.forEach((r, i) => expect(r).toEqual(i % 3 ? i - 100 : [i - 100, -1]));
  });

  it('reloads the script after NOSCRIPT (a flushed script cache) and sends the call that met it again, once', async () => {
    // A scripted server, since SCRIPT FLUSH on the shared Redis would disturb concurrent test runs.
    let loads = 0;
    let evals = 0;
    const server = net.createServer((sock) => {
      let buf = '';
      sock.on('data', (d) => {
        buf += d.toString();
        // Every command here is an array of bulk strings; answer each complete one.
        for (;;) {
          const m = /^\*(\d+)\r\n/.exec(buf);
          if (!m) return;
          let pos = m[0].length;
          const args: string[] = [];
          for (let i = 0; i < Number(m[1]); i++) {
            const h = /^\$(\d+)\r\n/.exec(buf.slice(pos));
            if (!h || buf.length < pos + h[0].length + Number(h[1]) + 2) return;
            args.push(buf.slice(pos + h[0].length, pos + h[0].length + Number(h[1])));
            pos += h[0].length + Number(h[1]) + 2;
          }
          buf = buf.slice(pos);
          if (args[0] === 'SCRIPT') {
            loads++;
            sock.write('$40\r\n' + 'a'.repeat(40) + '\r\n');
          } else sock.write(++evals === 2 ? '-NOSCRIPT No matching script.\r\n' : `*3\r\n:${Number(args[4]) + 1}\r\n:1\r\n:1\r\n`);
        }
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const p = new ScriptPipe({ url: `redis://127.0.0.1:${(server.address() as net.AddressInfo).port}`, script: SCRIPT, argCount: 2, timeoutMs: 2000 });
    pipes.push(p);
    await new Promise<void>((r) => p.once('ready', () => r()));
    expect(await call(p, 'k', ['1', ''])).toEqual([2, 1, 1]);
    // The second EVALSHA meets NOSCRIPT: the script is loaded again and the call sent again (third EVALSHA).
    expect(await call(p, 'k', ['5', ''])).toEqual([6, 1, 1]);
    expect(await call(p, 'k', ['2', ''])).toEqual([3, 1, 1]);
    expect([loads, evals]).toEqual([2, 4]);
    p.close();
    server.close();
  });

  it('a call made while a script reload waits on a stalled Redis still times out', async () => {
    // SCRIPT LOAD at connect is answered; the first EVALSHA meets NOSCRIPT; then nothing more is
    // answered, so the reload's SCRIPT LOAD (no deadline of its own) stays ahead of later calls.
    let evals = 0;
    const server = net.createServer((sock) => {
      sock.on('data', (d) => {
        const text = d.toString();
        if (text.includes('SCRIPT') && evals === 0) return void sock.write('$40\r\n' + 'a'.repeat(40) + '\r\n');
        if (text.includes('EVALSHA') && evals++ === 0) sock.write('-NOSCRIPT No matching script.\r\n');
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const p = new ScriptPipe({ url: `redis://127.0.0.1:${(server.address() as net.AddressInfo).port}`, script: SCRIPT, argCount: 2, timeoutMs: 50 });
    pipes.push(p);
    await new Promise<void>((r) => p.once('ready', () => r()));
    // The call that met NOSCRIPT is sent again behind the reload, which is never answered: it times out.
    await expect(call(p, 'k', ['1', ''])).rejects.toThrow(/did not answer within 50 ms/);
    const t = performance.now();
    await expect(call(p, 'k', ['1', ''])).rejects.toThrow(/did not answer within 50 ms/);
    // Loose for a loaded machine; without a deadline it would wait until the connection drops.
    expect(performance.now() - t).toBeLessThan(1000);
    p.close();
    server.close();
  });

  it('leaves a Redis that accepts but stalls in the handshake, and connects again (here to the real Redis)', async () => {
    // The first connection is accepted and read, never answered (a blackholed peer, a server
    // stopped mid-handshake); later ones are spliced to the test Redis. Before the handshake had
    // a deadline, the pipe stayed `connecting` on the first until TCP keepalive gave up (minutes).
    const staller = await handshakeStaller(inject('redisUrl'));
    const t = performance.now();
    const p = new ScriptPipe({ url: staller.url, script: SCRIPT, argCount: 2, timeoutMs: 2000, connectTimeoutMs: 300 });
    pipes.push(p);
    // Calls made meanwhile are answered at once (the caller's fallback decides), not held.
    await new Promise((r) => setTimeout(r, 100));
    expect(p.status).toBe('connecting');
    await expect(call(p, 'k', ['1', ''])).rejects.toThrow(/not connected/);
    await new Promise<void>((r) => p.once('ready', () => r()));
    const took = performance.now() - t;
    expect(staller.connections()).toBe(2);
    expect(took).toBeGreaterThanOrEqual(290);
    expect(took).toBeLessThan(3000);
    expect(await call(p, 'k', ['41', ''])).toEqual([42, 1, 1]);
    p.close();
    await staller.close();
  });

  it('parses integer-array replies with negative and large values, through the fast path and the general parser, in any split', async () => {
    // The limiter's replies are non-negative, but the pipe must not depend on it.
    const replies = [
      '*5\r\n:1\r\n:0\r\n:59999\r\n:0\r\n:0\r\n',
      '*5\r\n:0\r\n:-42\r\n:-1\r\n:1795601847123\r\n:-9007199254740991\r\n',
      '*0\r\n',
      // Not all integers: the fast path gives up and the general parser delivers the array as sent.
      '*2\r\n:-7\r\n$2\r\n12\r\n',
    ];
    const expected: unknown[] = [[1, 0, 59999, 0, 0], [0, -42, -1, 1795601847123, -9007199254740991], [], [-7, '12']];
    for (const chunk of [1, 3, 1000]) {
      let evals = 0;
      const server = net.createServer((sock) => {
        sock.on('data', async (d) => {
          // SCRIPT LOAD, then one EVALSHA per data event (the calls are made one at a time).
          const text = d.toString();
          if (text.includes('SCRIPT')) return void sock.write('$40\r\n' + 'a'.repeat(40) + '\r\n');
          const wire = Buffer.from(replies[evals++ % replies.length]!);
          for (let i = 0; i < wire.length; i += chunk) {
            sock.write(wire.subarray(i, i + chunk));
            await new Promise((r) => setImmediate(r));
          }
        });
      });
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      const p = new ScriptPipe({ url: `redis://127.0.0.1:${(server.address() as net.AddressInfo).port}`, script: SCRIPT, argCount: 2, timeoutMs: 2000 });
      pipes.push(p);
      await new Promise<void>((r) => p.once('ready', () => r()));
      for (const want of expected) expect(await call(p, 'k', ['1', ''])).toEqual(want);
      p.close();
      server.close();
    }
  });

  it('negative integers from real Redis come back intact', async () => {
    const p = new ScriptPipe({ url: inject('redisUrl'), script: SCRIPT, argCount: 2, timeoutMs: 2000 });
    pipes.push(p);
    await new Promise<void>((r) => p.once('ready', () => r()));
    expect(await call(p, 'k', ['-5', 'x'])).toEqual([-4, 1, 0]);
    expect(await call(p, 'k', ['-1', ''])).toEqual([0, 1, 1]);
  });

  it('refuses calls while not connected, and beyond maxInFlight', async () => {
    const p = new ScriptPipe({ url: 'redis://127.0.0.1:1', script: SCRIPT, argCount: 2, timeoutMs: 50 });
    pipes.push(p);
    p.on('error', () => {});
    await expect(call(p, 'k', ['1', ''])).rejects.toThrow(/not connected/);
    const q = new ScriptPipe({ url: inject('redisUrl'), script: SCRIPT, argCount: 2, timeoutMs: 2000, maxInFlight: 2 });
    pipes.push(q);
    await new Promise<void>((r) => q.once('ready', () => r()));
    const results = await Promise.allSettled([call(q, 'a', ['1', '']), call(q, 'b', ['1', '']), call(q, 'c', ['1', ''])]);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'rejected']);
  });
});

describe('Redis URLs and Unix sockets', () => {
  it('parses redis://, rediss:// and unix:// URLs, and refuses others with a clear message', () => {
    expect(redisEndpoint('redis://u:p%40ss@10.0.0.5:6380/2')).toEqual({ host: '10.0.0.5', port: 6380, tls: false, path: undefined, user: 'u', password: 'p@ss', db: '2' });
    expect(redisEndpoint('rediss://[::1]')).toMatchObject({ host: '::1', port: 6379, tls: true });
    expect(redisEndpoint('unix:///run/redis/redis.sock?db=3')).toEqual({ host: '', port: 0, tls: false, path: '/run/redis/redis.sock', user: '', password: '', db: '3' });
    expect(redisEndpoint('unix:///tmp/r.sock?username=u&password=s%26cret')).toMatchObject({ path: '/tmp/r.sock', user: 'u', password: 's&cret', db: '' });
    expect(() => redisEndpoint('http://x')).toThrow(/unsupported Redis URL scheme http:/);
    expect(() => redisEndpoint('unix:///')).toThrow(/needs a socket path/);
    expect(() => redisEndpoint('localhost:6379')).toThrow(/unsupported Redis URL scheme|not a Redis URL/);
  });

  let server: RedisServer;
  beforeAll(async () => {
    server = await startRedisServer({ unixSocket: true });
  }, 20_000);
  afterAll(async () => {
    await server?.dispose();
  });

  it('the pipe and the limiter (both transports) decide over a unix:// socket, database chosen by ?db=', async () => {
    const p = new ScriptPipe({ url: `${server.unixUrl!}?db=2`, script: SCRIPT, argCount: 2, timeoutMs: 2000 });
    await new Promise<void>((r) => p.once('ready', () => r()));
    expect(await call(p, 'k', ['41', ''])).toEqual([42, 1, 1]);
    p.close();
    for (const transport of ['pipe', 'ioredis'] as const) {
      const limiter = new RedisSlidingWindowLimiter({ redis: `${server.unixUrl!}?db=2`, serverId: `unix-${transport}`, transport, timeoutMs: 2000 });
      await limiter.ready();
      expect(await limiter.hit('k', 2, 60)).toEqual({ limited: false, retryAfterSeconds: 0 });
      expect(await limiter.hit('k', 2, 60)).toEqual({ limited: false, retryAfterSeconds: 0 });
      const third = await limiter.hit('k', 2, 60);
      expect(third.limited).toBe(true);
      expect(third.error).toBeUndefined();
      await limiter.close();
    }
    const admin = new Redis({ path: server.unixUrl!.slice('unix://'.length), db: 2 });
    expect((await admin.keys('warren:rl:unix-*')).length).toBe(2);
    await admin.quit();
  });
});
