import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { rawExchange, statuses } from '../support/raw-exchange.js';
import { CLUSTER_HOOK_MS, WORK_MS } from '../support/timeouts.js';

/**
 * HTTP/1.1 keep-alive and pipelining on the public listeners (found by an audit with raw sockets),
 * through real processes: a control plane, an ingress, our agent, and an upstream that records
 * every request; `/…early…` answers at once without reading the body, `/…slow…` answers after
 * 1.5 s; an upgrade to `/…/ws101` is accepted (101) and then echoes raw bytes back.
 */

const HOST = 'pipelining.e2e.test';
let c: PolicyCluster;
const seen: string[] = [];

const upstream: http.RequestListener = (req, res) => {
  seen.push(`${req.method} ${req.url}`);
  if ((req.url ?? '').includes('early')) {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '5' });
    res.end('early');
    return;
  }
  req.resume();
  req.on('end', () => {
    const send = () => {
      const out = JSON.stringify({ url: req.url, method: req.method });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(out) });
      res.end(out);
    };
    if ((req.url ?? '').includes('slow')) setTimeout(send, 1500);
    else send();
  });
};

/** Writes `parts` (a number is a pause in ms) on a new connection; collects the answer until idle or close. */
const exchange = (parts: Array<string | Buffer | number>, idle = 2500, max = 20_000) => rawExchange(c.a.http, parts, idle, max);
const get = (path: string, extra = '', method = 'GET') => `${method} ${path} HTTP/1.1\r\nHost: ${HOST}\r\n${extra}\r\n`;
const upgrade = (path: string) => `GET ${path} HTTP/1.1\r\nHost: ${HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n`;

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'pipelining',
    host: HOST,
    upstream,
    upgrade: (req, socket) => {
      seen.push(`UPGRADE ${req.method} ${req.url}`);
      if ((req.url ?? '').includes('ws101')) {
        socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n');
        socket.pipe(socket);
        return;
      }
      socket.end('HTTP/1.1 400 Bad Request\r\ncontent-length: 3\r\nconnection: close\r\n\r\nno\n');
    },
  });
  await c.route('/plain', {});
  await c.policyRoute('/add', { on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-added': 'yes' } } }] }] });
  await c.policyRoute('/deny', { on_http_request: [{ actions: [{ type: 'deny', config: { status_code: 403 } }] }] });
  await c.policyRoute('/cr', { on_http_request: [{ actions: [{ type: 'custom-response', config: { status_code: 200, body: 'custom-body' } }] }] });
  await c.policyRoute('/fr', { on_http_request: [{ actions: [{ type: 'request-body-find-replace', config: { replacements: [{ from: 'foo', to: 'barbaz' }] } }] }] });
  await c.policyRoute('/close', { on_http_request: [{ expressions: ["'x-close' in req.headers"], actions: [{ type: 'close-connection' }] }] });
}, CLUSTER_HOOK_MS + WORK_MS);

afterAll(async () => {
  await c?.stop();
}, 60_000);

describe('a request body the upstream did not read', () => {
  // POST with a 1 MB body; the upstream answers at once (as an app refusing an upload does).
  // undici stops sending the body and destroys the request stream, so the rest is never read:
  // the next request on that keep-alive connection used to wait forever. Now that answer closes it.
  for (const route of ['/add', '/plain']) {
    it(`${route}: the answer closes the connection, so the client's next request goes on a new one`, async () => {
      const body = Buffer.alloc(1_000_000, 0x61);
      const r = await exchange([Buffer.concat([Buffer.from(`POST ${route}/early HTTP/1.1\r\nHost: ${HOST}\r\nContent-Length: ${body.length}\r\n\r\n`), body]), 1500, get('/add/after-early')], 5000);
      expect(statuses(r.out)[0]).toBe(200);
      expect(r.out.toLowerCase()).toContain('connection: close');
      expect(statuses(r.out).length === 2 || r.closed, `stuck: ${JSON.stringify(r.out.slice(0, 200))}`).toBe(true);
      expect(statuses((await exchange([get('/add/next', 'Connection: close\r\n')])).out)).toEqual([200]);
    });
  }
});

describe('an Upgrade pipelined behind another request', () => {
  // Node hands the socket to the upgrade handler while the earlier response still owns it: the
  // upgrade's answer used to go out first (read as the first request's answer; its real one lost).
  for (const [what, path] of [['a deny', '/deny/ws'], ['a custom-response', '/cr/ws'], ['an upstream refusal', '/add/ws']] as const) {
    it(`${what}: the first request's response comes first`, async () => {
      const r = await exchange([get('/add/slow-before-upgrade') + upgrade(path)], 3000);
      expect(r.out.startsWith('HTTP/1.1 200 OK'), r.out.slice(0, 120)).toBe(true);
      expect(r.out).toContain('"url":"/add/slow-before-upgrade"');
      expect(statuses(r.out).length).toBe(2);
    });
  }
  it('an accepted upgrade (101): the earlier response comes before it, not inside the upgraded stream', async () => {
    const r = await exchange([get('/add/slow-before-101') + upgrade('/add/ws101')], 3000);
    const at101 = r.out.indexOf('HTTP/1.1 101');
    const at200 = r.out.indexOf('HTTP/1.1 200');
    expect(at101, r.out).toBeGreaterThanOrEqual(0);
    expect(at200 >= 0 && at200 < at101, JSON.stringify(r.out)).toBe(true);
  });
});

describe('close-connection on a request pipelined behind another', () => {
  it('the earlier request gets its response, then the connection closes', async () => {
    const from = seen.length;
    const r = await exchange([get('/add/slow-before-close') + get('/close/x', 'X-Close: 1\r\n')], 3000);
    expect(statuses(r.out), `upstream saw: ${JSON.stringify(seen.slice(from))}`).toEqual([200]);
    expect(r.out).toContain('"url":"/add/slow-before-close"');
    expect(r.closed).toBe(true);
  });
});

describe('answers that leave a body unread close the connection', () => {
  it('a 413 known from the head (1 GiB declared): the connection closes after it', async () => {
    const r = await exchange([`POST /fr/x HTTP/1.1\r\nHost: ${HOST}\r\nExpect: 100-continue\r\nContent-Length: 1073741824\r\n\r\n`], 2000);
    expect(statuses(r.out)).toContain(413);
    expect(r.closed).toBe(true);
  });
});

describe('CONNECT', () => {
  it('is answered with a 400 naming it, not a silent close', async () => {
    const r = await exchange([`CONNECT ${HOST}:443 HTTP/1.1\r\nHost: ${HOST}:443\r\n\r\n`], 1500);
    expect(statuses(r.out)).toEqual([400]);
    expect(r.out).toContain('CONNECT is not supported');
  });
});

describe('a request without Host', () => {
  it("gets the ingress's own 400 page (ERR_WARREN_7007), not Node's bare one", async () => {
    const r = await exchange([`GET / HTTP/1.1\r\nConnection: close\r\n\r\n`], 1500);
    expect(statuses(r.out)).toEqual([400]);
    expect(r.out.toLowerCase()).toContain('warren-error-code: err_warren_7007');
  });
});
