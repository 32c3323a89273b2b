import http from 'node:http';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { callApi, cleanupTempDirs, startIngress, tempDir, waitFor, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { NODES_HOOK_MS } from '../support/timeouts.js';

/**
 * One public client address may hold only its share (MAX_STREAMS_PER_CLIENT, 5 here) of an agent
 * session's stream slots: before, one client holding (or aborting) slow requests could take all
 * of them, and every other visitor of the tunnel got 503. Real processes: a control plane, two
 * ingress nodes, the official SDK (`@ngrok/ngrok`) holding an endpoint on node A, a slow local
 * upstream. The client 127.0.0.2 holds 5 slow requests (GETs, and POSTs whose bodies never end,
 * some through node B, i.e. over the internal hop, which carries the client's own address); its
 * sixth gets 429 ERR_WARREN_7014 with Retry-After: 1 through either node, while 127.0.0.1 is
 * served; once its requests end, it is served again.
 */

const HOST = 'share.e2e.test';
const SHARE = 5;
let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let a: IngressProcess;
let b: IngressProcess;
let apiKey: string;
let upstream: http.Server;
let upstreamUrl: string;
let session: ngrok.Session | undefined;
/** Requests to /slow the upstream holds, answered by `releaseSlow()`. */
const held: http.ServerResponse[] = [];
const openSockets = new Set<net.Socket>();

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

function request(port: number, p: string, localAddress: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, localAddress, path: p, agent: false, headers: { host: HOST, accept: 'application/json' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.setTimeout(15_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

/** A slow request that stays open: a GET to /slow, or a POST whose body never ends. Resolves once the upstream has it. */
function holdRequest(port: number, kind: 'get' | 'post', localAddress: string): { done: Promise<Answer | Error> } {
  let resolveDone!: (v: Answer | Error) => void;
  const done = new Promise<Answer | Error>((r) => (resolveDone = r));
  const req = http.request(
    { host: '127.0.0.1', port, localAddress, path: kind === 'get' ? '/slow' : '/slow-body', method: kind === 'get' ? 'GET' : 'POST', agent: false, headers: { host: HOST, ...(kind === 'post' ? { 'content-length': '1000' } : {}) } },
    (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolveDone({ status: res.statusCode ?? 0, headers: res.headers, body }));
    },
  );
  req.on('error', (err) => resolveDone(err));
  req.on('socket', (s) => openSockets.add(s));
  if (kind === 'post') {
    req.flushHeaders();
    req.write('x'.repeat(10));
  } else req.end();
  return { done };
}

function releaseSlow(): void {
  for (const res of held.splice(0)) res.end('slow done');
}

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  apiKey = (await createAccountWithKey(createDb(pool), 'share-e2e')).token;
  await pool.end();
  const tls = await ensureLocalTls(tempDir('warren-share-tls-'));
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  const env = { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem'), MAX_STREAMS_PER_CLIENT: String(SHARE) };
  [a, b] = (await Promise.all(['share-a', 'share-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })))) as [IngressProcess, IngressProcess];

  // /slow and /slow-body are answered only when the test says so; anything else at once. Every
  // answer closes its connection, so that no idle keep-alive stream is left for another request.
  upstream = http.createServer((req, res) => {
    res.setHeader('connection', 'close');
    if (req.url === '/slow' || req.url === '/slow-body') {
      req.resume();
      held.push(res);
      return;
    }
    req.resume();
    req.on('end', () => res.end(`fast ${req.url}`));
  });
  const port = await new Promise<number>((r) => upstream.listen(0, '127.0.0.1', () => r((upstream.address() as net.AddressInfo).port)));
  upstreamUrl = `http://127.0.0.1:${port}`;

  const authtoken = (await callApi(cp.baseUrl, apiKey, 'POST', '/credentials', { description: 'share' })).body.token;
  // The SDK does not retry a refused Auth: node A must have the credential first.
  const headPool = createPool(db.url, 1);
  const head = Number((await headPool.query<{ version: string }>('SELECT version FROM config_state')).rows[0]!.version);
  await headPool.end();
  await waitFor('node A has the credential', async () => (((await (await fetch(`${a.internalUrl}/status`)).json()) as { config_version: number | null }).config_version ?? 0) >= head, 10_000);
  session = await new ngrok.SessionBuilder().serverAddr(`localhost:${a.agent}`).caCert(Buffer.from(tls.caPem!)).authtoken(authtoken).connect();
  await session.httpEndpoint().domain(HOST).listenAndForward(upstreamUrl);
  for (const n of [a, b]) await waitFor(`${n.nodeId} serves the endpoint`, async () => (await request(n.http, '/ready', '127.0.0.1')).status === 200, 15_000);
}, NODES_HOOK_MS);

afterAll(async () => {
  releaseSlow();
  for (const s of openSockets) s.destroy();
  await session?.close().catch(() => {});
  await Promise.allSettled([a?.stop({ timeoutMs: 10_000 }), b?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  upstream?.close();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('a client address past its share of the agent session', () => {
  it('gets 429 ERR_WARREN_7014 (Retry-After: 1) on both nodes while another address is served; served again once its requests end', async () => {
    // 5 slow requests of 127.0.0.2: 3 GETs to node A, 2 POSTs with unfinished bodies through node B (the hop).
    const slow = [holdRequest(a.http, 'get', '127.0.0.2'), holdRequest(a.http, 'get', '127.0.0.2'), holdRequest(a.http, 'get', '127.0.0.2'), holdRequest(b.http, 'post', '127.0.0.2'), holdRequest(b.http, 'post', '127.0.0.2')];
    await waitFor('the upstream holds the 5 slow requests', () => held.length === SHARE, 10_000);

    for (const n of [a, b]) {
      const refused = await request(n.http, '/sixth', '127.0.0.2');
      expect(refused.status, `${n.nodeId}: ${refused.body}`).toBe(429);
      expect(refused.headers['retry-after']).toBe('1');
      expect(refused.headers['warren-error-code']).toBe('ERR_WARREN_7014');
      expect(JSON.parse(refused.body)).toMatchObject({ error_code: 'ERR_WARREN_7014', status_code: 429 });
      expect(JSON.parse(refused.body).msg).toMatch(/too many requests open to this tunnel/);
    }
    // Everyone else is served meanwhile, through either node.
    for (const n of [a, b]) {
      const other = await request(n.http, '/other', '127.0.0.1');
      expect(other).toMatchObject({ status: 200, body: 'fast /other' });
    }
    expect(held.length).toBe(SHARE);

    releaseSlow();
    const done = await Promise.all(slow.map((s) => s.done));
    expect(done.slice(0, 3).map((d) => (d instanceof Error ? d.message : d.status))).toEqual([200, 200, 200]);
    // The POSTs' bodies never ended (their answers came first): their connections go now.
    for (const s of openSockets) s.destroy();
    // Its slots are free again once the agent has let go of those streams.
    await waitFor('127.0.0.2 is served again', async () => (await request(a.http, '/again', '127.0.0.2')).status === 200, 10_000);
    expect((await request(b.http, '/again', '127.0.0.2')).status).toBe(200);
  }, 60_000);
});
