import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../support/cluster.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * An outbound answer (custom-response, deny, redirect) replaces the upstream's response: the
 * upstream's request is then stopped, not drained. Before, its body was only read into nothing
 * (`body.resume()`), so an upstream that streams (SSE, a long poll, a large download) kept its
 * tunnel stream and kept sending through the agent into the ingress after the client had its
 * answer and had gone (found by an audit). Through real processes: a control plane, an ingress,
 * our agent and an upstream that streams server-sent events until its client goes.
 */
const HOST = 'outbound-replace.e2e.test';
let c: PolicyCluster;
/** Upstream event streams still open. */
let open = 0;

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'obreplace',
    host: HOST,
    upstream: (req, res) => {
      req.resume();
      if (!req.url?.includes('/sse')) return void res.end('ok');
      open++;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const t = setInterval(() => res.write(`data: ${'x'.repeat(1024)}\n\n`), 50);
      res.on('close', () => {
        clearInterval(t);
        open--;
      });
    },
  });
}, CLUSTER_HOOK_MS);
afterAll(() => c?.stop(), 60_000);

/** A GET on its own connection, read to its end. */
function get(path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const r = http.get({ host: '127.0.0.1', port: c.a.http, path, agent: false, headers: { host: HOST, connection: 'close' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    r.on('error', reject);
  });
}

describe('an outbound answer replacing a streaming upstream response', () => {
  it('stops the upstream request once the replacement is sent (custom-response and deny)', async () => {
    await c.policyRoute('/cr', { outbound: [{ actions: [{ type: 'custom-response', config: { status_code: 503, body: 'maintenance' } }] }] });
    await c.policyRoute('/deny', { outbound: [{ expressions: ["res.headers['content-type'][0] == 'text/event-stream'"], actions: [{ type: 'deny', config: { status_code: 502 } }] }] });
    open = 0;
    expect(await Promise.all([1, 2, 3].map(() => get('/cr/sse')))).toEqual([503, 503, 503]);
    expect(await Promise.all([1, 2].map(() => get('/deny/sse')))).toEqual([502, 502]);
    await waitFor('the upstream streams are closed', async () => open === 0, 10_000);
    // The route serves on.
    expect(await get('/cr/plain')).toBe(503);
  }, 40_000);

  it('a client leaving a response passed on through response stages ends the upstream stream too', async () => {
    await c.policyRoute('/passed', { outbound: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-a': 'b' } } }] }] });
    open = 0;
    await Promise.all(
      [1, 2, 3].map(
        () =>
          new Promise<void>((resolve) => {
            const r = http.get({ host: '127.0.0.1', port: c.a.http, path: '/passed/sse', agent: false, headers: { host: HOST } }, (res) => {
              expect(res.headers['x-a']).toBe('b');
              res.once('data', () => {
                r.destroy();
                resolve();
              });
            });
            r.on('error', () => {});
          }),
      ),
    );
    await waitFor('the upstream streams are closed', async () => open === 0, 10_000);
  }, 40_000);
});
