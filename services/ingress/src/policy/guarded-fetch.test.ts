import https from 'node:https';
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { ensureLocalTls } from '../tls.js';
import { guardedFetch, PRIVATE_HOST_REFUSED } from './guarded-fetch.js';
import { resolveToLoopback } from './dns-testing.js';

/**
 * The connect-time guard of requests to tenant-supplied hosts, with real undici requests to a
 * local HTTPS server: literal loopback hosts, and a name that resolves to 127.0.0.1 (the
 * resolver is stubbed for `idp.example.test` only, so the test runs offline).
 */

/** A name the stubbed resolver answers 127.0.0.1 for, as a tenant's DNS could. */
const REBOUND = 'idp.example.test';

let dir: string;
let ca: string;
let server: https.Server;
let port: number;
const seen: string[] = [];
const sockets = new Set<{ destroy(): void; on(e: 'close', f: () => void): unknown }>();

beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'warren-guard-'));
  const tls = await ensureLocalTls(dir, [REBOUND]);
  ca = tls.caPem!;
  server = https.createServer({ cert: tls.cert, key: tls.key }, (req, res) => {
    seen.push(`${req.method} ${req.url}`);
    if (req.url === '/redirect') return res.writeHead(302, { location: `https://127.0.0.1:${port}/secret` }).end();
    if (req.url === '/big') return res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ pad: 'x'.repeat(4096) }));
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ok: true }));
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  port = await new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as net.AddressInfo).port)));
});

afterAll(() => {
  for (const s of sockets) s.destroy();
  server.close();
  rmSync(dir, { recursive: true, force: true });
});

afterEach(() => {
  vi.restoreAllMocks();
  seen.length = 0;
});

const stubResolver = (): void => resolveToLoopback(REBOUND);

const fetcher = (allow: boolean, maxBytes = 64 * 1024) => guardedFetch({ allowPrivate: () => allow, envName: 'WARREN_OIDC_ALLOW_PRIVATE', maxBytes, ca });

async function refusal(p: Promise<unknown>): Promise<{ code?: string; message: string }> {
  const err = (await p.then(
    () => null,
    (e: unknown) => e,
  )) as (TypeError & { cause?: { code?: string; message: string } }) | null;
  expect(err, 'the request was not refused').toBeInstanceOf(TypeError);
  return { code: err!.cause?.code, message: err!.cause?.message ?? '' };
}

describe('guardedFetch (SSRF guard of requests to tenant-supplied hosts)', () => {
  it('refuses literal loopback / private hosts before connecting, unless allowed', async () => {
    const f = fetcher(false);
    for (const host of ['127.0.0.1', 'localhost', '[::1]']) {
      const r = await refusal(f(`https://${host}:${port}/x`, { method: 'GET' }));
      expect(r.code, host).toBe(PRIVATE_HOST_REFUSED);
      expect(r.message, host).toMatch(/(not a public address|loopback host name) \(set WARREN_OIDC_ALLOW_PRIVATE=1 to allow it\)$/);
    }
    expect(seen).toEqual([]);
    const ok = await fetcher(true)(`https://127.0.0.1:${port}/x`, { method: 'GET' });
    expect([ok.status, await ok.json()]).toEqual([200, { ok: true }]);
    expect(seen).toEqual(['GET /x']);
  });

  it('refuses a name that resolves to 127.0.0.1 when connecting (the resolved address is checked), unless allowed', async () => {
    stubResolver();
    const r = await refusal(fetcher(false)(`https://${REBOUND}:${port}/.well-known/openid-configuration`, { method: 'GET' }));
    expect(r.code).toBe(PRIVATE_HOST_REFUSED);
    expect(r.message).toBe(`${REBOUND} resolves to 127.0.0.1, not a public address (set WARREN_OIDC_ALLOW_PRIVATE=1 to allow it)`);
    expect(seen).toEqual([]);
    // The same name when the operator allows private hosts: connected, by name (TLS checks the name).
    const ok = await fetcher(true)(`https://${REBOUND}:${port}/.well-known/openid-configuration`, { method: 'GET' });
    expect(ok.status).toBe(200);
    expect(seen).toEqual(['GET /.well-known/openid-configuration']);
  });

  it('never follows a redirect, and bounds the body it reads', async () => {
    const f = fetcher(true, 1024);
    const r = await f(`https://127.0.0.1:${port}/redirect`, { method: 'GET', redirect: 'follow' });
    expect(r.status).toBe(302);
    expect(seen).toEqual(['GET /redirect']);
    const big = await refusal(f(`https://127.0.0.1:${port}/big`, { method: 'GET' }));
    expect(big.message).toMatch(/is over 1024 bytes/);
  });

  it('is a fetch openid-client can use: headers, a form body and the abort signal pass through', async () => {
    const f = fetcher(true);
    const r = await f(`https://127.0.0.1:${port}/token`, { method: 'POST', headers: new Headers({ 'content-type': 'application/x-www-form-urlencoded' }), body: new URLSearchParams({ a: '1' }), signal: AbortSignal.timeout(5000) });
    expect(r).toBeInstanceOf(Response);
    expect(r.headers.get('content-type')).toBe('application/json');
    expect(seen).toEqual(['POST /token']);
    const aborted = await f(`https://127.0.0.1:${port}/x`, { method: 'GET', signal: AbortSignal.abort() }).then(
      () => null,
      (e: Error) => e.name,
    );
    expect(aborted).toBe('AbortError');
  });
});
