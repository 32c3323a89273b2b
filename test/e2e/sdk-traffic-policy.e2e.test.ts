import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import ngrok from '@ngrok/ngrok';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { callApi, cleanupTempDirs, startAgentProcess, startIngress, tempDir, waitFor, type IngressProcess } from '../support/cluster.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ensureLocalTls } from '../../services/ingress/src/tls.js';
import { listenEchoingUpgrades, upgradeEcho } from '../support/upgrade.js';
import { clientJa4 } from '../support/client-hello.js';
import { AGENT_ONLINE_MS, NODES_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * The official agent SDK's `traffic_policy` option (`@ngrok/ngrok` 1.7.0, unmodified; Bind
 * `Opts.TrafficPolicy`) against real Warren processes: a control plane and two ingress nodes. The
 * SDK binds endpoints on node A; requests arrive at A (the policy runs there, on the public path)
 * and at B (B hops them to A, where the policy runs, with the public client's address). Rate-limit
 * counts show that it runs once per request either way.
 */

const HOST = 'policy.sdk-tp.e2e.test';
const PLAIN_HOST = 'plain.sdk-tp.e2e.test';
const OTHER_HOST = 'other.sdk-tp.e2e.test';
const IPS_HOST = 'ips.sdk-tp.e2e.test';

let db: Awaited<ReturnType<typeof freshDatabase>>;
let cp: ControlPlaneProcess;
let a: IngressProcess;
let b: IngressProcess;
let keyA: string;
let keyB: string;
let tokenA: string;
let tokenB: string;
let upstream: http.Server;
let upstreamUrl: string;
let tls: Awaited<ReturnType<typeof ensureLocalTls>>;
const sessions: ngrok.Session[] = [];

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

function request(port: number, host: string, p: string, headers: Record<string, string> = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: p, method: 'GET', agent: false, headers: { host, ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }));
    });
    req.setTimeout(15_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end();
  });
}

/** An upgrade request; resolves with everything read until the server closes (a refusal) or a 101 head. */
function upgradeHead(port: number, host: string, path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => s.write(`GET ${path} HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n`));
    let buf = '';
    const timer = setTimeout(() => s.destroy(new Error(`no answer: ${JSON.stringify(buf)}`)), 10_000);
    s.on('data', (c: Buffer) => {
      buf += c.toString();
      if (buf.startsWith('HTTP/1.1 101') && buf.includes('\r\n\r\n')) s.destroy();
    });
    s.on('close', () => {
      clearTimeout(timer);
      resolve(buf);
    });
    s.on('error', reject);
  });
}

const session = async (port: number, authtoken: string): Promise<ngrok.Session> => {
  const s = await new ngrok.SessionBuilder().serverAddr(`localhost:${port}`).caCert(Buffer.from(tls.caPem!)).authtoken(authtoken).connect();
  sessions.push(s);
  return s;
};

const bindError = (p: Promise<unknown>): Promise<string> =>
  p.then(
    () => '',
    (e: Error) => e.message,
  );

/** The endpoint policy of most tests: YAML, ngrok's phase names. */
const POLICY = `
on_http_request:
  - name: no admin
    expressions:
      - "req.url.path.startsWith('/admin')"
    actions:
      - type: deny
        config:
          status_code: 403
  - name: limit
    expressions:
      - "req.url.path.startsWith('/limited')"
    actions:
      - type: rate-limit
        config:
          name: per-client
          algorithm: sliding_window
          capacity: 4
          rate: 60s
          bucket_key:
            - conn.client_ip
  - actions:
      - type: add-headers
        config:
          headers:
            x-client-ip: "\${conn.client_ip}"
on_http_response:
  - actions:
      - type: add-headers
        config:
          headers:
            x-endpoint-policy: "ran for \${req.host}"
            x-endpoint: "\${endpoint.id} \${endpoint.addr} \${endpoint.protocol}"
`;

beforeAll(async () => {
  db = await freshDatabase();
  const pool = createPool(db.url, 2);
  await migrate(pool);
  keyA = (await createAccountWithKey(createDb(pool), 'sdk-tp-a')).token;
  keyB = (await createAccountWithKey(createDb(pool), 'sdk-tp-b')).token;
  await pool.end();
  tls = await ensureLocalTls(tempDir('warren-sdk-tp-tls-'));
  const nodeToken = randomBytes(16).toString('hex');
  cp = await startControlPlane({ databaseUrl: db.url, env: { WARREN_NODE_TOKEN: nodeToken } });
  // Rate limits counted in memory per process: a hop's request counted on the wrong node, or twice, shows.
  const env = { TLS_CERT_FILE: tls.caFile.replace(/ca\.pem$/, 'cert.pem'), TLS_KEY_FILE: tls.caFile.replace(/ca\.pem$/, 'key.pem'), REDIS_URL: undefined, RATE_LIMIT_REDIS_URL: undefined };
  [a, b] = (await Promise.all(['sdk-tp-a', 'sdk-tp-b'].map((nodeId) => startIngress({ nodeId, controlPlane: [`127.0.0.1:${cp.grpcPort}`], nodeToken, env })))) as [IngressProcess, IngressProcess];
  tokenA = (await callApi(cp.baseUrl, keyA, 'POST', '/credentials', { description: 'sdk-tp a' })).body.token;
  tokenB = (await callApi(cp.baseUrl, keyB, 'POST', '/credentials', { description: 'sdk-tp b' })).body.token;

  upstream = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ path: req.url, host: req.headers.host, xff: req.headers['x-forwarded-for'], clientIp: req.headers['x-client-ip'] ?? null }));
    });
  });
  upstreamUrl = `http://127.0.0.1:${await listenEchoingUpgrades(upstream)}`;
}, NODES_HOOK_MS);

afterAll(async () => {
  for (const s of sessions) await s.close().catch(() => {});
  await Promise.allSettled([a?.stop({ timeoutMs: 10_000 }), b?.stop({ timeoutMs: 10_000 }), cp?.stop({ timeoutMs: 10_000 })]);
  upstream?.close();
  await db?.drop();
  cleanupTempDirs();
}, 60_000);

describe('the SDK traffic_policy option on Bind endpoints', () => {
  it('runs the policy on every request to the endpoint, on the holding node and over a hop', async () => {
    const s = await session(a.agent, tokenA);
    // ngrok.forward's option and the builder's are the same Bind field; the builder here.
    const listener = await s.httpEndpoint().domain(HOST).trafficPolicy(POLICY).listenAndForward(upstreamUrl);
    expect(listener.url()).toMatch(/^https:\/\/policy\.sdk-tp\.e2e\.test/);

    for (const n of [a, b]) {
      const ok = await waitFor(`${n.nodeId} serves the endpoint`, async () => {
        const x = await request(n.http, HOST, '/hello');
        return x.status === 200 ? x : null;
      });
      // Request and response add-headers; the client address is the public client's, also over the hop.
      expect(JSON.parse(ok.body)).toMatchObject({ path: '/hello', host: HOST, xff: '127.0.0.1', clientIp: '127.0.0.1' });
      expect(ok.headers['x-endpoint-policy']).toBe(`ran for ${HOST}`);
      // endpoint.*: the endpoint the SDK bound (its id), on either node.
      expect(ok.headers['x-endpoint']).toBe(`${listener.id()} ${HOST}:80 http`);

      // Deny by expression: the request never reaches the upstream. The response rules run on it too.
      const denied = await request(n.http, HOST, '/admin/users');
      expect(denied.status).toBe(403);
      expect(denied.body).not.toContain('"path"');
      expect(denied.headers['x-endpoint-policy']).toBe(`ran for ${HOST}`);
      // A path made to look otherwise is normalised before the policy sees it.
      expect((await request(n.http, HOST, '/x/../%61dmin')).status).toBe(403);
    }
  });

  it('rate-limits with 429 and retry-after, counting each request once whichever node it arrives at', async () => {
    // Capacity 4: two through A (local), two through B (hop to A). Were a hop counted twice, or on
    // B's own limiter, the counts would not add up to exactly 4.
    const statuses: number[] = [];
    for (const n of [a, a, b, b]) statuses.push((await request(n.http, HOST, '/limited')).status);
    expect(statuses).toEqual([200, 200, 200, 200]);
    for (const n of [b, a]) {
      const limited = await request(n.http, HOST, '/limited');
      expect(limited.status).toBe(429);
      expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
      expect(limited.headers['x-endpoint-policy']).toBe(`ran for ${HOST}`);
    }
    // Other paths of the endpoint are not limited.
    expect((await request(a.http, HOST, '/hello')).status).toBe(200);
  });

  it('runs on upgrades too (both nodes), each counted once, by the node the client reached', async () => {
    const upgrades = async (n: IngressProcess) => {
      const text = await (await fetch(`${n.internalUrl}/metrics`)).text();
      const value = (result: string) => Number(new RegExp(`warren_ingress_upgrades_total\\{[^}]*result="${result}"[^}]*\\} (\\d+)`).exec(text)?.[1] ?? 0);
      return { refused: value('refused'), forwarded: value('forwarded') };
    };
    const [a0, b0] = [await upgrades(a), await upgrades(b)];
    for (const n of [a, b]) {
      expect(await upgradeHead(n.http, HOST, '/admin/ws')).toMatch(/^HTTP\/1.1 403/);
      expect(await upgradeEcho(n.http, HOST, '/ws', 'marco')).toMatch(/^HTTP\/1.1 101/);
    }
    const [a1, b1] = [await upgrades(a), await upgrades(b)];
    // A refused one and forwarded one of its own; B forwarded both of its own (to A), and A did not count them again.
    expect([a1.refused - a0.refused, a1.forwarded - a0.forwarded]).toEqual([1, 1]);
    expect([b1.refused - b0.refused, b1.forwarded - b0.forwarded]).toEqual([0, 2]);
  });

  it('leaves other endpoints alone: one of the same account without a policy, and another account with the same policy (its own buckets)', async () => {
    const s = await session(a.agent, tokenA);
    await s.httpEndpoint().domain(PLAIN_HOST).listenAndForward(upstreamUrl);
    const other = await session(b.agent, tokenB);
    await other.httpEndpoint().domain(OTHER_HOST).trafficPolicy(POLICY).listenAndForward(upstreamUrl);
    for (const n of [a, b]) {
      const plain = await waitFor(`${n.nodeId} serves ${PLAIN_HOST}`, async () => {
        const x = await request(n.http, PLAIN_HOST, '/admin');
        return x.status === 200 ? x : null;
      });
      expect(plain.headers['x-endpoint-policy']).toBeUndefined();
      expect(JSON.parse(plain.body).clientIp).toBeNull();
      for (let i = 0; i < 5; i++) expect((await request(n.http, PLAIN_HOST, '/limited')).status).toBe(200);
      await waitFor(`${n.nodeId} serves ${OTHER_HOST}`, async () => (await request(n.http, OTHER_HOST, '/hello')).status === 200);
    }
    // The first endpoint's bucket is spent (previous test); this one's, the same name and key, is not.
    expect((await request(a.http, HOST, '/limited')).status).toBe(429);
    for (let i = 0; i < 4; i++) expect((await request(i % 2 ? a.http : b.http, OTHER_HOST, '/limited')).status).toBe(200);
    expect((await request(b.http, OTHER_HOST, '/limited')).status).toBe(429);
    expect((await request(a.http, OTHER_HOST, '/admin')).status).toBe(403);
  });

  it('refuses an invalid policy at Bind with the validator\'s message, and serves nothing for it', async () => {
    const s = await session(a.agent, tokenA);
    const syntax = await bindError(s.httpEndpoint().domain('bad.sdk-tp.e2e.test').trafficPolicy('on_http_request: [').listenAndForward(upstreamUrl));
    expect(syntax).toMatch(/invalid traffic policy \(Bind Opts\.TrafficPolicy\): not valid YAML or JSON.*ERR_WARREN_6900/);
    const action = await bindError(s.httpEndpoint().domain('bad.sdk-tp.e2e.test').trafficPolicy('on_http_request:\n  - actions:\n      - type: teleport\n').listenAndForward(upstreamUrl));
    expect(action).toMatch(/on_http_request\[0\]\.actions\[0\]\.type: .*teleport.*ERR_WARREN_6900/);
    const expr = await bindError(
      ngrok.forward({ addr: upstreamUrl, authtoken: tokenA, server_addr: `localhost:${a.agent}`, session_ca_cert: tls.caPem!, force_new_session: true, proto: 'http', domain: 'bad.sdk-tp.e2e.test', traffic_policy: JSON.stringify({ on_http_request: [{ expressions: ['req.nope =='], actions: [{ type: 'deny' }] }] }) }),
    );
    expect(expr).toMatch(/on_http_request\[0\]\.expressions\[0\].*ERR_WARREN_6900/);
    const big = await bindError(s.httpEndpoint().domain('bad.sdk-tp.e2e.test').trafficPolicy(`# ${'x'.repeat(70_000)}\non_http_request: []\n`).listenAndForward(upstreamUrl));
    expect(big).toMatch(/over the limit of 65536 bytes.*ERR_WARREN_5003/);
    // Far over it: the Bind request itself is not read whole, and says so.
    const huge = await bindError(s.httpEndpoint().domain('bad.sdk-tp.e2e.test').trafficPolicy(`# ${'x'.repeat(600_000)}\n`).listenAndForward(upstreamUrl));
    expect(huge).toMatch(/the Bind request is over \d+ bytes; a traffic policy may have at most 65536 bytes \(ERR_WARREN_5003\)/);
    // The session carries on.
    expect(await bindError(s.httpEndpoint().domain('fine.sdk-tp.e2e.test').trafficPolicy('').listenAndForward(upstreamUrl))).toBe('');
    expect((await request(a.http, 'bad.sdk-tp.e2e.test', '/')).status).toBe(404);
  });

  it("shows the client's own connection (conn.tls.*, conn.client_port, conn.server_ip), not the one between the nodes, when a hop carries the request", async () => {
    const host = 'conn.sdk-tp.e2e.test';
    const s = await session(a.agent, tokenA);
    const policy = 'on_http_response:\n  - actions:\n      - type: add-headers\n        config:\n          headers:\n            x-conn: "${conn.tls.version}|${conn.tls.cipher_suite}|${conn.tls.sni}|${conn.client_port}|${conn.server_ip}|${conn.tls.server.serial_number}"\n            x-conn-more: "${conn.server_region}|${conn.bytes_in}|${conn.bytes_out}|${conn.ts.start}|${conn.tls.ja4_fingerprint}"\n';
    await s.httpEndpoint().domain(host).trafficPolicy(policy).listenAndForward(upstreamUrl);
    const viaTls = (n: IngressProcess) =>
      new Promise<{ status: number; conn: string; more: string; local: { port: number; tls: string; cipher: string; serial: string } }>((resolve, reject) => {
        const req = https.request({ host: '127.0.0.1', port: n.https, servername: host, path: '/', agent: false, rejectUnauthorized: false, headers: { host } }, (res) => {
          res.resume();
          const sock = res.socket as import('node:tls').TLSSocket;
          const serial = sock.getPeerX509Certificate()?.serialNumber ?? '';
          resolve({ status: res.statusCode ?? 0, conn: String(res.headers['x-conn'] ?? ''), more: String(res.headers['x-conn-more'] ?? ''), local: { port: sock.localPort ?? 0, tls: sock.getProtocol() ?? '', cipher: sock.getCipher().standardName, serial } });
        });
        req.on('error', reject);
        req.end();
      });
    for (const n of [a, b]) {
      const r = await waitFor(`${n.nodeId} serves ${host} over TLS`, async () => {
        const x = await viaTls(n);
        return x.status === 200 ? x : null;
      });
      // The client's TLS version, cipher, SNI and source port, the address it connected to, and
      // the certificate it was served (the nodes share TLS_CERT_FILE: the holding node shows its own).
      const serial = r.conn.split('|')[5] ?? '';
      expect(r.conn, n.nodeId).toBe(`${r.local.tls.replace('TLSv', '')}|${r.local.cipher}|${host}|${r.local.port}|127.0.0.1|${serial}`);
      expect(serial.replace(/^0+/, '').toLowerCase(), n.nodeId).toBe(r.local.serial.replace(/^0+/, '').toLowerCase());
      expect(serial).not.toBe('');
      // The node the client reached, its connection's bytes on the wire (the TLS handshake
      // included: the certificate went out before any answer) and when it was accepted.
      const [region, bytesIn, bytesOut, start, ja4] = r.more.split('|');
      // The JA4 of the client's ClientHello, read by the node it reached (carried over the hop).
      expect(ja4, n.nodeId).toBe(await clientJa4({ servername: host, rejectUnauthorized: false }));
      expect(ja4).toMatch(/^t13d/);
      expect(region, n.nodeId).toBe(n.nodeId);
      expect(Number(bytesIn), r.more).toBeGreaterThan(300);
      expect(Number(bytesOut), r.more).toBeGreaterThan(500);
      expect(Math.abs(Date.parse(start!) - Date.now()), r.more).toBeLessThan(30_000);
    }
    // Over plain HTTP through the hop: no TLS, as on the holding node itself.
    expect((await request(b.http, host, '/')).headers['x-conn']).toMatch(/^\|\|\|\d+\|127\.0\.0\.1\|$/);
    expect((await request(b.http, host, '/')).headers['x-conn-more']).toMatch(/\|$/);
  });

  it('shows the request as the client sent it over a hop too: req.url.raw_path, req.version, req.content_length (an audit: a deny on raw_path applied on one node only)', async () => {
    const host = 'raw.sdk-tp.e2e.test';
    const s = await session(a.agent, tokenA);
    const policy = [
      'on_http_request:',
      '  - expressions: ["req.url.raw_path.contains(\'..\') || req.url.raw_path.contains(\'%\')"]',
      '    actions: [{type: custom-response, config: {status_code: 418, content: "raw"}}]',
      'on_http_response:',
      '  - actions: [{type: add-headers, config: {headers: {x-req: "${req.version}|${req.content_length}"}}}]',
      '',
    ].join('\n');
    await s.httpEndpoint().domain(host).trafficPolicy(policy).listenAndForward(upstreamUrl);
    const raw = (port: number, head: string) =>
      new Promise<string>((resolve, reject) => {
        // Written, not ended: the server closes (HTTP/1.0, Connection: close) once it answered.
        const c = net.connect(port, '127.0.0.1', () => c.write(head));
        let buf = '';
        c.on('data', (d: Buffer) => (buf += d.toString('latin1')));
        c.on('end', () => resolve(buf));
        c.on('error', reject);
      });
    for (const n of [a, b]) {
      await waitFor(`${n.nodeId} serves ${host}`, async () => (await request(n.http, host, '/')).status === 200);
      for (const target of ['/x/../admin', '/%61dmin', `http://${host}/x/../y`]) {
        expect(await raw(n.http, `GET ${target} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`), `${n.nodeId} ${target}`).toMatch(/^HTTP\/1\.1 418 /);
      }
      const old = await raw(n.http, `POST /v HTTP/1.0\r\nHost: ${host}\r\nContent-Length: 5\r\n\r\nhello`);
      expect(old, n.nodeId).toMatch(/\r\nx-req: HTTP\/1\.0\|5\r\n/i);
      const chunked = await raw(n.http, `POST /v HTTP/1.1\r\nHost: ${host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n`);
      expect(chunked, n.nodeId).toMatch(/\r\nx-req: HTTP\/1\.1\|-1\r\n/i);
    }
  });

  it("our own agent's --traffic-policy-file (as ngrok's CLI has it) sends the same Bind field", async () => {
    const dir = tempDir('warren-sdk-tp-cli-');
    const file = path.join(dir, 'policy.yml');
    writeFileSync(file, POLICY);
    const host = 'cli.sdk-tp.e2e.test';
    const agent = startAgentProcess(['http', upstreamUrl, '--domain', host, '--traffic-policy-file', file, '--authtoken', tokenA, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]);
    try {
      await agent.waitForOutput('online');
      for (const n of [a, b]) {
        const ok = await waitFor(`${n.nodeId} serves ${host}`, async () => {
          const x = await request(n.http, host, '/hello');
          return x.status === 200 ? x : null;
        });
        expect(ok.headers['x-endpoint-policy']).toBe(`ran for ${host}`);
        expect((await request(n.http, host, '/admin')).status).toBe(403);
      }
    } finally {
      await agent.stop({ timeoutMs: 10_000 });
    }
    // A policy the server refuses: the agent says why and exits 1; a file it cannot read: 2.
    writeFileSync(file, 'on_http_request:\n  - actions:\n      - type: teleport\n');
    const refused = startAgentProcess(['http', upstreamUrl, '--domain', host, '--traffic-policy-file', file, '--authtoken', tokenA, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]);
    expect((await refused.exited).code).toBe(1);
    expect(refused.output()).toMatch(/invalid traffic policy \(Bind Opts\.TrafficPolicy\): on_http_request\[0\]\.actions\[0\]\.type: .*teleport.*ERR_WARREN_6900/);
    const missing = startAgentProcess(['http', upstreamUrl, '--domain', host, '--traffic-policy-file', path.join(dir, 'nope.yml'), '--authtoken', tokenA, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]);
    expect((await missing.exited).code).toBe(2);
    expect(missing.output()).toMatch(/cannot read the traffic policy file .*nope\.yml: ENOENT/);
    writeFileSync(file, '\n  \n');
    const empty = startAgentProcess(['http', upstreamUrl, '--domain', host, '--traffic-policy-file', file, '--authtoken', tokenA, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]);
    expect((await empty.exited).code).toBe(2);
    expect(empty.output()).toMatch(/the traffic policy file .*policy\.yml is empty/);
  }, 4 * AGENT_ONLINE_MS + WORK_MS); // four agent processes, one after another

  it('close-connection closes the client connection whichever node it reached (over a hop the holding node tells the sending node; destroying the hop read there as a 502)', async () => {
    const dir = tempDir('warren-sdk-tp-cc-');
    const file = path.join(dir, 'policy.yml');
    writeFileSync(file, "on_http_request:\n  - expressions: [\"req.url.path.startsWith('/cc')\"]\n    actions: [{type: close-connection}]\n");
    const host = 'cc.sdk-tp.e2e.test';
    const agent = startAgentProcess(['http', upstreamUrl, '--domain', host, '--traffic-policy-file', file, '--authtoken', tokenA, '--server', `localhost:${a.agent}`, '--ca', tls.caFile]);
    /** Everything the node sent back on a new connection before it closed it. */
    const exchange = (port: number, raw: string) =>
      new Promise<string>((resolve, reject) => {
        const s = net.connect(port, '127.0.0.1', () => s.write(raw));
        const chunks: Buffer[] = [];
        const timer = setTimeout(() => s.destroy(new Error(`the connection stayed open: ${JSON.stringify(Buffer.concat(chunks).toString('latin1').slice(0, 200))}`)), 10_000);
        s.on('data', (c: Buffer) => chunks.push(c));
        s.on('error', (err: NodeJS.ErrnoException) => (err.code === 'ECONNRESET' ? undefined : reject(err)));
        s.on('close', () => {
          clearTimeout(timer);
          resolve(Buffer.concat(chunks).toString('latin1'));
        });
      });
    try {
      await agent.waitForOutput('online');
      for (const n of [a, b]) {
        await waitFor(`${n.nodeId} serves ${host}`, async () => (await request(n.http, host, '/ok')).status === 200);
        expect(await exchange(n.http, `GET /cc HTTP/1.1\r\nHost: ${host}\r\n\r\n`), `GET via ${n.nodeId}`).toBe('');
        expect(await exchange(n.http, `POST /cc HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 2\r\n\r\nhi`), `POST via ${n.nodeId}`).toBe('');
        expect(await exchange(n.http, `GET /cc/ws HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n`), `Upgrade via ${n.nodeId}`).toBe('');
        expect((await request(n.http, host, '/ok')).status).toBe(200);
      }
    } finally {
      await agent.stop({ timeoutMs: 10_000 });
    }
  }, AGENT_ONLINE_MS + WORK_MS);

  it('restrict-ips resolves ip_policies of the tunnel\'s own account only', async () => {
    const ours = (await callApi(cp.baseUrl, keyA, 'POST', '/ip_policies', { description: 'ours' })).body.id as string;
    const rule = (await callApi(cp.baseUrl, keyA, 'POST', '/ip_policy_rules', { ip_policy_id: ours, cidr: '127.0.0.0/8', action: 'deny' })).body.id as string;
    expect(rule).toMatch(/^ipr_/);
    const theirs = (await callApi(cp.baseUrl, keyB, 'POST', '/ip_policies', { description: 'theirs' })).body.id as string;
    const doc = (id: string) => `on_http_request:\n  - actions:\n      - type: restrict-ips\n        config:\n          ip_policies: [${id}]\n`;
    const s = await session(a.agent, tokenA);
    // Another account's policy is refused exactly like a missing one.
    const foreign = await bindError(s.httpEndpoint().domain(IPS_HOST).trafficPolicy(doc(theirs)).listenAndForward(upstreamUrl));
    expect(foreign).toMatch(new RegExp(`on_http_request\\[0\\]\\.actions\\[0\\]\\.config\\.ip_policies\\[0\\]: no IP policy with id "${theirs}" in this account \\(ERR_WARREN_3002\\)`));
    // Our own (once the config with it has reached node A): 127.0.0.0/8 is denied.
    let listener: ngrok.Listener | undefined;
    await waitFor('the IP policy reaches node A', async () => {
      listener = await s.httpEndpoint().domain(IPS_HOST).trafficPolicy(doc(ours)).listenAndForward(upstreamUrl).catch(() => undefined);
      return listener !== undefined;
    }, 10_000);
    const closed = listener!.join().then(() => null, (e: Error) => e);
    for (const n of [a, b]) {
      const r = await waitFor(`${n.nodeId} serves ${IPS_HOST}`, async () => {
        const x = await request(n.http, IPS_HOST, '/');
        return x.status !== 404 ? x : null;
      });
      expect(r.status).toBe(403);
    }
    // The endpoint follows the IP policy's changes: its rule deleted, 127.0.0.1 passes.
    expect((await callApi(cp.baseUrl, keyA, 'DELETE', `/ip_policy_rules/${rule}`)).status).toBe(204);
    await waitFor('the rule change reaches node A', async () => (await request(b.http, IPS_HOST, '/')).status === 200);
    // The IP policy itself deleted (nothing in the control plane knows an endpoint names it): the
    // endpoint never serves without its restrict-ips, and its tunnel is stopped (StopTunnel), so
    // the SDK's listener ends with the reason.
    expect((await callApi(cp.baseUrl, keyA, 'DELETE', `/ip_policies/${ours}`)).status).toBe(204);
    const err = await closed;
    expect(err?.message).toMatch(new RegExp(`traffic policy \\(Bind Opts.TrafficPolicy\\) cannot be applied any more: .*${ours}.*\\(ERR_WARREN_7010\\)`));
    expect(err?.message).toContain('ERR_WARREN_7010');
    for (const n of [a, b]) {
      const gone = await waitFor(`${n.nodeId} no longer has the endpoint`, async () => {
        const x = await request(n.http, IPS_HOST, '/');
        return x.status === 404 ? x : null;
      });
      expect(gone.body).toContain('ERR_WARREN_7000');
    }
  });
});
