import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * The bytes of request bodies an ingress holds for its route pipelines, in all
 * (MAX_BUFFERED_BODY_BYTES, here its least, 1 MiB), through real processes. An audit held 600 MB
 * with 600 clients each sending 1 MiB less one byte to a webhook_verification route and waiting;
 * now a body that does not fit is answered 503 ERR_WARREN_7013 (Retry-After: 1) at once, and the
 * bytes come back when the client goes away or its request is answered.
 */

const HOST = 'budget.e2e.test';
const LIMIT = 1024 * 1024;
let c: PolicyCluster;

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'bodybudget', host: HOST, ingressEnv: () => ({ MAX_BUFFERED_BODY_BYTES: String(LIMIT) }) });
  await c.route('/hook', { webhook_verification: { provider: 'stripe', secret: 'whsec_budget' } });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
}, 60_000);

/** A POST of `size` bytes to the verified route (unsigned, so a verdict is 403 ERR_WARREN_7102). */
const post = (size: number) => c.request('/hook/x', { method: 'POST', body: Buffer.alloc(size, 0x61), headers: { 'content-type': 'application/json' }, timeoutMs: 15_000 });

async function until<T>(what: string, f: () => Promise<T>, ok: (v: T) => boolean, ms = 15_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`${what}: still ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('the ingress bounds the request bodies it buffers, in all', () => {
  it('releases each body when its request is answered', async () => {
    // Three 600 KB bodies one after the other: two of them would not fit at once.
    for (let i = 0; i < 3; i++) {
      const r = await post(600 * 1024);
      expect([r.status, r.headers['warren-error-code']], r.body).toEqual([403, 'ERR_WARREN_7102']);
    }
  });

  it('answers 503 ERR_WARREN_7013 at once while a slow client holds the budget, and serves again once it leaves', async () => {
    // A client declares 1,000,000 bytes, sends 900,000 and waits. (The bodies of the test before
    // are released when their responses close, which on a loaded machine can come a little after
    // the client read them: one that is still held gets this client a 503, so it tries again.)
    const openSlow = async (): Promise<net.Socket | null> => {
      const s = net.connect(c.a.http, '127.0.0.1');
      await new Promise<void>((resolve, reject) => {
        s.once('connect', resolve);
        s.once('error', reject);
      });
      s.on('error', () => {});
      let answered = false;
      s.once('data', () => (answered = true));
      s.write(`POST /hook/slow HTTP/1.1\r\nHost: ${HOST}\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n`);
      s.write(Buffer.alloc(900_000, 0x62));
      await new Promise((r) => setTimeout(r, 300));
      if (!answered) return s;
      s.destroy();
      return null;
    };
    let slow: net.Socket | null = null;
    for (let i = 0; i < 20 && !slow; i++) slow = await openSlow();
    if (!slow) throw new Error('the slow client was answered at once 20 times');
    try {
      // Once the ingress holds those bytes, a 200,000-byte body does not fit beside them.
      const busy = await until('a body beyond the budget', () => post(200_000), (r) => r.status === 503);
      expect(busy.headers['warren-error-code']).toBe('ERR_WARREN_7013');
      expect(busy.headers['retry-after']).toBe('1');
      expect(busy.json().error_code).toBe('ERR_WARREN_7013');
      // One that fits beside them is verified as usual.
      const small = await post(100_000);
      expect([small.status, small.headers['warren-error-code']], small.body).toEqual([403, 'ERR_WARREN_7102']);
    } finally {
      slow.destroy();
    }
    // The slow client's bytes come back when it goes away.
    const after = await until('the budget after the slow client left', () => post(200_000), (r) => r.status === 403);
    expect(after.headers['warren-error-code']).toBe('ERR_WARREN_7102');
  }, 60_000);
});
