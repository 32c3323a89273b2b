import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { listenEchoingUpgrades, upgradeEcho } from '../support/upgrade.js';
import { collect, type Res } from '../support/http-answer.js';
import { CLUSTER_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * forward-internal through real processes: a control plane, two ingress nodes, our agent (one
 * process per endpoint, all on node a). Account A has a public endpoint whose policy forwards to
 * its internal endpoints (`svc.internal` with a policy of its own, `plain.internal` without,
 * `loop.internal` forwarding to itself); account B has `b-svc.internal`. Requests arrive at node a
 * (the internal endpoint's policy runs on a hop to a itself) and node b (a hop to a).
 */

const FRONT = 'front.fi.e2e.test';

let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let a: IngressProcess;
let b: IngressProcess;
let tls: Awaited<ReturnType<typeof ensureLocalTls>>;
const agents: ReturnType<typeof startAgentProcess>[] = [];
const servers: http.Server[] = [];

function request(port: number, host: string, p: string, method = 'GET'): Promise<Res> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, method, agent: false, headers: { host } }, (res) => collect(res, resolve));
    req.setTimeout(15_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

/** An upstream that answers who it is and what reached it. */
async function upstream(name: string): Promise<string> {
  const s = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ who: name, path: req.url, host: req.headers.host, xff: req.headers['x-forwarded-for'], internalIn: req.headers['x-internal-in'] ?? null, frontIn: req.headers['x-front-in'] ?? null, depth: req.headers['x-warren-forward-depth'] ?? null }));
    });
  });
  servers.push(s);
  // Upgrades are answered 101 and echoed.
  return `http://127.0.0.1:${await listenEchoingUpgrades(s)}`;
}

function bind(token: string, target: string, host: string, policy: string | null, internal: boolean): ReturnType<typeof startAgentProcess> {
  const args = ['http', target, '--domain', host, '--authtoken', token, '--server', `localhost:${a.agent}`, '--ca', tls.caFile];
  if (internal) args.push('--internal');
  if (policy) {
    const file = path.join(tempDir('warren-fi-policy-'), 'policy.yml');
    writeFileSync(file, policy);
    args.push('--traffic-policy-file', file);
  }
  const agent = startAgentProcess(args);
  agents.push(agent);
  return agent;
}

const FRONT_POLICY = `
on_http_request:
  - actions:
      - type: add-headers
        config: { headers: { x-front-in: "yes" } }
  - expressions: ["req.url.path.startsWith('/svc')"]
    actions:
      - type: forward-internal
        config: { url: "https://svc.internal" }
  - expressions: ["req.url.path.startsWith('/plain')"]
    actions:
      - type: forward-internal
        config: { url: "http://\${'plain'}.internal:8080" }
  - expressions: ["req.url.path.startsWith('/missing-halt')"]
    actions:
      - type: forward-internal
        config: { url: "https://nope.internal" }
  - expressions: ["req.url.path.startsWith('/missing-continue')"]
    actions:
      - type: forward-internal
        config: { url: "https://nope.internal", on_error: continue }
      - type: custom-response
        config: { status_code: 200, body: "fallback page" }
  - expressions: ["req.url.path.startsWith('/other-account')"]
    actions:
      - type: forward-internal
        config: { url: "https://b-svc.internal" }
  - expressions: ["req.url.path.startsWith('/loop')"]
    actions:
      - type: forward-internal
        config: { url: "https://loop.internal" }
on_http_response:
  - actions:
      - type: add-headers
        config: { headers: { x-front-out: "yes" } }
`;

const SVC_POLICY = `
on_http_request:
  - expressions: ["req.url.path.startsWith('/svc/admin')"]
    actions:
      - type: deny
        config: { status_code: 403 }
  - actions:
      - type: add-headers
        config: { headers: { x-internal-in: "\${conn.client_ip}" } }
on_http_response:
  - actions:
      - type: add-headers
        config: { headers: { x-internal-out: "yes" } }
`;

const LOOP_POLICY = `
on_http_request:
  - actions:
      - type: forward-internal
        config: { url: "https://loop.internal" }
`;

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  const keyA = (await createAccountWithKey(createDb(pool), 'fi-a')).token;
  const keyB = (await createAccountWithKey(createDb(pool), 'fi-b')).token;
  await pool.end();
  tls = await ensureLocalTls(tempDir('warren-fi-tls-'));
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  const env = { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem'), REDIS_URL: undefined, RATE_LIMIT_REDIS_URL: undefined };
  [a, b] = (await Promise.all(['fi-a', 'fi-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })))) as [IngressProcess, IngressProcess];
  const tokenA = (await callApi(cp.baseUrl, keyA, 'POST', '/credentials', { description: 'fi a' })).body.token as string;
  const tokenB = (await callApi(cp.baseUrl, keyB, 'POST', '/credentials', { description: 'fi b' })).body.token as string;

  const [front, svc, plain, other] = await Promise.all([upstream('front'), upstream('svc'), upstream('plain'), upstream('b-svc')]);
  const started = [
    bind(tokenA, front, FRONT, FRONT_POLICY, false),
    bind(tokenA, svc, 'svc.internal', SVC_POLICY, true),
    bind(tokenA, plain, 'plain.internal', null, true),
    bind(tokenA, svc, 'loop.internal', LOOP_POLICY, true),
    bind(tokenB, other, 'b-svc.internal', null, true),
  ];
  await Promise.all(started.map((x) => x.waitForOutput('online')));
  // Both nodes know every tunnel (node b learns them from the control plane, one by one).
  for (const n of [a, b]) {
    for (const [p, who] of [['/svc/ready', '"svc"'], ['/plain/ready', '"plain"'], ['/loop', 'forwarded 8 times']] as const) {
      await waitFor(`${n.nodeId} forwards ${p}`, async () => {
        const x = await request(n.http, FRONT, p);
        return x.text.includes(who) ? x : null;
      });
    }
  }
}, CLUSTER_HOOK_MS + WORK_MS); // and six waits of up to 10 s for the nodes to forward

afterAll(async () => {
  await Promise.allSettled(agents.map((x) => x.stop({ timeoutMs: 10_000 })));
  await Promise.allSettled([a?.stop({ timeoutMs: 10_000 }), b?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  for (const s of servers) s.close();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('forward-internal', () => {
  it("sends the request to the account's internal endpoint, whose own policy runs; the answer comes back through the public endpoint's outbound rules (both nodes)", async () => {
    for (const n of [a, b]) {
      const r = await request(n.http, FRONT, '/svc/items?x=1');
      expect(r.status, r.text).toBe(200);
      // The internal upstream got the request with its own path, the front policy's header and the internal policy's, with the public client's address.
      expect(JSON.parse(r.text)).toMatchObject({ who: 'svc', path: '/svc/items?x=1', host: FRONT, frontIn: 'yes', internalIn: '127.0.0.1', xff: '127.0.0.1', depth: null });
      expect([r.headers['x-internal-out'], r.headers['x-front-out']]).toEqual(['yes', 'yes']);
      // The internal endpoint's deny applies.
      const denied = await request(n.http, FRONT, '/svc/admin');
      expect([denied.status, denied.headers['x-front-out']]).toEqual([403, 'yes']);
      // An internal endpoint without a policy; the URL interpolated.
      const plain = await request(n.http, FRONT, '/plain/a');
      expect(JSON.parse(plain.text)).toMatchObject({ who: 'plain', path: '/plain/a', frontIn: 'yes' });
      // HEAD and POST go the same way.
      expect((await request(n.http, FRONT, '/svc/x', 'HEAD')).status).toBe(200);
      expect(JSON.parse((await request(n.http, FRONT, '/svc/x', 'POST')).text)).toMatchObject({ who: 'svc' });
      // Other paths reach the public endpoint's own upstream.
      expect(JSON.parse((await request(n.http, FRONT, '/home')).text)).toMatchObject({ who: 'front' });
    }
  });

  it('carries upgrades (WebSocket) to the internal endpoint as well, with and without its own policy', async () => {
    for (const n of [a, b]) {
      expect(await upgradeEcho(n.http, FRONT, '/svc/ws', 'marco')).toMatch(/^HTTP\/1.1 101[\s\S]*marco$/);
      expect(await upgradeEcho(n.http, FRONT, '/plain/ws', 'polo')).toMatch(/^HTTP\/1.1 101[\s\S]*polo$/);
    }
  });

  it('halts with 503 when no such internal endpoint is online, or goes on with on_error: continue', async () => {
    for (const n of [a, b]) {
      const halted = await request(n.http, FRONT, '/missing-halt');
      expect([halted.status, halted.headers['warren-error-code']]).toEqual([503, 'ERR_WARREN_7003']);
      expect(halted.text).toContain('nope.internal');
      const fallback = await request(n.http, FRONT, '/missing-continue');
      expect([fallback.status, fallback.text, fallback.headers['x-front-out']]).toEqual([200, 'fallback page', 'yes']);
    }
  });

  it("never reaches another account's internal endpoint, and internal endpoints are not public", async () => {
    for (const n of [a, b]) {
      const r = await request(n.http, FRONT, '/other-account');
      expect(r.status).toBe(503);
      expect(r.text).not.toContain('b-svc"');
      for (const host of ['svc.internal', 'b-svc.internal']) expect((await request(n.http, host, '/svc/x')).status).toBe(404);
    }
  });

  it('ends a loop between internal endpoints with 503 after a bounded number of forwards', async () => {
    for (const n of [a, b]) {
      const r = await request(n.http, FRONT, '/loop');
      expect(r.status, r.text).toBe(503);
      expect(r.text).toContain('forwarded 8 times');
    }
  });
});
