import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Ingress defects a fuzz audit found, through real processes (a control plane, two ingress nodes,
 * our agent on the first, and an upstream that echoes the raw bytes of the headers it received):
 * - a Host set by a traffic policy to something that is not `host[:port]` (`[oops`, an
 *   interpolation of a client's `[`) leaves the client's Host, never a 502 with undici's
 *   assertion text;
 * - header bytes 0x80-0xff a client sent reach the upstream as the same bytes (a policy's or
 *   module's non-ASCII text as its UTF-8 bytes, and a policy's copy of the client's header byte
 *   for byte, though they are no UTF-8), on a plain route, a route with a pipeline and one with
 *   request_headers, with and without a body and on an upgrade, locally and over the hop. The
 *   upstream echoes them as hex of `rawHeaders` re-read as Latin-1: an echo of `req.headers` as
 *   JSON (UTF-8) shows `ff` as `c3 bf`, which is the echo's encoding, not the bytes received;
 * - a malformed request is answered 400 with `Connection: close` rather than a silent close.
 */

const HOST = 'fuzzfix.e2e.test';
let c: PolicyCluster;

/** Raw header bytes as the upstream got them: `rawHeaders` (Latin-1 strings) back to bytes, hex. */
interface Echo {
  url: string;
  raw: Array<[string, string]>;
}

/** Sends `head` (a request head as bytes) to `port` and reads the whole answer (the request asks to close). */
function rawExchange(port: number, head: Buffer, timeoutMs = 10_000): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`no end of answer within ${timeoutMs} ms: ${JSON.stringify(Buffer.concat(chunks).toString('latin1'))}`));
    }, timeoutMs);
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.on('error', () => {});
    sock.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks));
    });
    sock.write(head);
  });
}

function parseAnswer(raw: Buffer): { status: number; headers: Record<string, string>; body: string } {
  const text = raw.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  const lines = text.slice(0, end < 0 ? text.length : end).split('\r\n');
  const status = Number(lines[0]?.split(' ')[1] ?? 0);
  const headers: Record<string, string> = {};
  for (const l of lines.slice(1)) {
    const i = l.indexOf(':');
    if (i > 0) headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
  }
  let body = end < 0 ? '' : text.slice(end + 4);
  if (headers['transfer-encoding'] === 'chunked') {
    let out = '';
    let rest = body;
    for (;;) {
      const nl = rest.indexOf('\r\n');
      const n = parseInt(rest.slice(0, nl), 16);
      if (!n) break;
      out += rest.slice(nl + 2, nl + 2 + n);
      rest = rest.slice(nl + 2 + n + 2);
    }
    body = out;
  }
  return { status, headers, body: Buffer.from(body, 'latin1').toString('utf8') };
}

/** A GET with `extra` header lines (bytes) on a connection that closes after the answer. */
function rawGet(port: number, path: string, extra: Buffer[] = []): Promise<{ status: number; headers: Record<string, string>; body: string }> {
  const head = Buffer.concat([Buffer.from(`GET ${path} HTTP/1.1\r\nHost: ${HOST}\r\nConnection: close\r\n`, 'latin1'), ...extra.flatMap((l) => [l, Buffer.from('\r\n')]), Buffer.from('\r\n')]);
  return rawExchange(port, head).then(parseAnswer);
}

const rawHeader = (echo: Echo, name: string): string[] => echo.raw.filter(([n]) => n.toLowerCase() === name).map(([, v]) => v);

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'fuzzfix',
    host: HOST,
    nodes: 2,
    upstream: (req, res) => {
      req.resume();
      req.on('end', () => {
        const raw: Array<[string, string]> = [];
        for (let i = 0; i < req.rawHeaders.length; i += 2) raw.push([req.rawHeaders[i]!, Buffer.from(req.rawHeaders[i + 1]!, 'latin1').toString('hex')]);
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ url: req.url ?? '', raw } satisfies Echo));
      });
    },
    upgrade: (req, socket) => {
      const raw: Array<[string, string]> = [];
      for (let i = 0; i < req.rawHeaders.length; i += 2) raw.push([req.rawHeaders[i]!, Buffer.from(req.rawHeaders[i + 1]!, 'latin1').toString('hex')]);
      const body = JSON.stringify({ url: req.url ?? '', raw } satisfies Echo);
      socket.end(`HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    },
  });
  await c.route('/plain', {});
  await c.policyRoute('/pipe', {
    on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: { 'x-added': 'é', 'x-copy': "${req.headers['x-raw'][0]}" } } }] }],
  });
  await c.route('/module', { request_headers: { add: { 'X-Mod': 'caf\u00e9 \u00ff' } } });
  await c.policyRoute('/host-interp', {
    on_http_request: [{ actions: [{ type: 'add-headers', config: { headers: { host: "${req.headers['x-a'][0]}" } } }] }],
  });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
});

describe('header bytes 0x80-0xff reach the upstream as the same bytes', () => {
  const clientBytes = Buffer.from([0xff, 0xc3, 0x28, 0x80]);
  const line = Buffer.concat([Buffer.from('X-Raw: ', 'latin1'), clientBytes]);

  for (const [where, node] of [
    ['locally', 0],
    ['over the internal hop', 1],
  ] as const) {
    it(`a client's header on a plain route, ${where}`, async () => {
      const r = await rawGet(c.nodes[node]!.http, '/plain/x', [line]);
      expect(r.status, r.body).toBe(200);
      const echo = JSON.parse(r.body) as Echo;
      expect(rawHeader(echo, 'x-raw')).toEqual([clientBytes.toString('hex')]);
    });

    for (const [kind, extra, body] of [
      ['with a Content-Length body', [Buffer.from('Content-Length: 5')], 'hello'],
      ['with a chunked body', [Buffer.from('Transfer-Encoding: chunked')], '5\r\nhello\r\n0\r\n\r\n'],
      ['as an upgrade', [Buffer.from('Connection: upgrade'), Buffer.from('Upgrade: websocket')], ''],
    ] as const) {
      for (const path of ['/plain/x', '/pipe/x', '/module/x']) {
        it(`a client's header ${kind} on ${path}, ${where}`, async () => {
          const head = Buffer.concat([
            Buffer.from(`${body ? 'POST' : 'GET'} ${path} HTTP/1.1\r\nHost: ${HOST}\r\n${kind === 'as an upgrade' ? '' : 'Connection: close\r\n'}`, 'latin1'),
            ...[line, ...extra].flatMap((l) => [l, Buffer.from('\r\n')]),
            Buffer.from('\r\n' + body, 'latin1'),
          ]);
          const r = parseAnswer(await rawExchange(c.nodes[node]!.http, head));
          expect(r.status, r.body).toBe(200);
          const echo = JSON.parse(r.body) as Echo;
          expect(rawHeader(echo, 'x-raw')).toEqual([clientBytes.toString('hex')]);
          // é as UTF-8 (c3 a9), as ngrok sends it; ÿ c3 bf.
          if (path === '/pipe/x') expect(rawHeader(echo, 'x-added')).toEqual(['c3a9']);
          if (path === '/module/x') expect(rawHeader(echo, 'x-mod')).toEqual(['636166c3a920c3bf']);
        });
      }
    }

    it(`a client's header, a policy's U+00E9 and its copy of the client's header on a route with a pipeline, ${where}`, async () => {
      const r = await rawGet(c.nodes[node]!.http, '/pipe/x', [line]);
      expect(r.status, r.body).toBe(200);
      const echo = JSON.parse(r.body) as Echo;
      expect(rawHeader(echo, 'x-raw')).toEqual([clientBytes.toString('hex')]);
      expect(rawHeader(echo, 'x-added')).toEqual(['c3a9']);
      // ff c3 28 80 is no UTF-8: the copy still carries those bytes.
      expect(rawHeader(echo, 'x-copy')).toEqual([clientBytes.toString('hex')]);
    });
  }
});

describe('a policy Host that is not host[:port]', () => {
  for (const bad of ['[', '[::1', '[oops', 'a b', '']) {
    it(`an interpolated ${JSON.stringify(bad)} leaves the client's Host (no 502)`, async () => {
      for (const node of [0, 1]) {
        const r = await c.request('/host-interp/x', { port: c.nodes[node]!.http, headers: { 'x-a': bad } });
        expect(r.status, r.body).toBe(200);
        expect(r.body).not.toContain('assert');
        const echo = JSON.parse(r.body) as Echo;
        expect(rawHeader(echo, 'host')).toEqual([Buffer.from(HOST, 'latin1').toString('hex')]);
      }
    });
  }

  it('a valid interpolated Host replaces the client\'s', async () => {
    const r = await c.request('/host-interp/x', { headers: { 'x-a': '[::1]:8080' } });
    expect(r.status, r.body).toBe(200);
    expect(rawHeader(JSON.parse(r.body) as Echo, 'host')).toEqual([Buffer.from('[::1]:8080').toString('hex')]);
  });
});

describe('a malformed request is answered, not dropped', () => {
  const cases: Array<[string, Buffer]> = [
    ['a control character in a header value', Buffer.from(`GET / HTTP/1.1\r\nHost: ${HOST}\r\nX-A: a\x01b\r\n\r\n`, 'latin1')],
    ['a raw 0xff in the path', Buffer.concat([Buffer.from('GET /a'), Buffer.from([0xff]), Buffer.from(`b HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`)])],
  ];
  for (const [what, head] of cases) {
    it(`${what}: 400, Connection: close, a JSON error body`, async () => {
      const r = parseAnswer(await rawExchange(c.a.http, head));
      expect(r.status).toBe(400);
      expect(r.headers['connection']).toBe('close');
      expect(r.headers['warren-error-code']).toBeDefined();
      expect(JSON.parse(r.body)).toMatchObject({ status_code: 400 });
    });
  }

  it('a head too large: 431', async () => {
    const head = Buffer.from(`GET / HTTP/1.1\r\nHost: ${HOST}\r\nX-Big: ${'x'.repeat(100_000)}\r\n\r\n`, 'latin1');
    const r = parseAnswer(await rawExchange(c.a.http, head));
    expect(r.status).toBe(431);
    expect(r.headers['connection']).toBe('close');
  });
});
