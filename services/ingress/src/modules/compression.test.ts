import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import zlib from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { addVary, compressionStage, negotiateEncoding } from './compression.js';
import { makeResponse, makeState, stageFor } from './testing.js';

const stage = () => stageFor(compressionStage, { compression: { enabled: true } })!;
const big = Buffer.from('{"items":[' + Array.from({ length: 500 }, (_, i) => `{"id":${i},"name":"item ${i}"}`).join(',') + ']}');

function transform(ae: string | null, headers: string[], opts: { status?: number; method?: string } = {}) {
  const s = makeState({ method: opts.method ?? 'GET', headers: ae === null ? ['Host', 'a.test'] : ['Host', 'a.test', 'Accept-Encoding', ae] });
  const r = makeResponse(opts.status ?? 200, headers);
  const t = stage().transformBody!(s, r);
  return { t, r };
}

describe('compression', () => {
  it('is absent when missing or disabled', () => {
    expect(stageFor(compressionStage, {})).toBeNull();
    expect(stageFor(compressionStage, { compression: { enabled: false } })).toBeNull();
  });

  it('negotiates by q-value, br on ties, * and q=0', () => {
    expect(negotiateEncoding(undefined)).toBeNull();
    expect(negotiateEncoding('identity')).toBeNull();
    expect(negotiateEncoding('gzip')).toBe('gzip');
    expect(negotiateEncoding('gzip, deflate, br')).toBe('br');
    expect(negotiateEncoding('br;q=0.5, gzip;q=0.8')).toBe('gzip');
    expect(negotiateEncoding('br;q=0, gzip;q=0')).toBeNull();
    expect(negotiateEncoding('*')).toBe('br');
    expect(negotiateEncoding('*;q=0.5, gzip')).toBe('gzip');
    expect(negotiateEncoding('br;q=0, *')).toBe('gzip');
    expect(negotiateEncoding('GZIP;Q=0.3, x-gzip;q=0.2')).toBe('gzip');
    expect(negotiateEncoding('deflate')).toBeNull();
  });

  it('gzip round trip with headers fixed up', async () => {
    const { t, r } = transform('gzip', ['Content-Type', 'application/json', 'Content-Length', String(big.length), 'ETag', '"abc"', 'Accept-Ranges', 'bytes', 'Vary', 'Origin']);
    expect(t).not.toBeNull();
    expect(r.headers).toEqual(['Content-Type', 'application/json', 'ETag', 'W/"abc"', 'Vary', 'Origin, Accept-Encoding', 'Content-Encoding', 'gzip']);
    const out = await buffer(Readable.from([big.subarray(0, 100), big.subarray(100)]).pipe(t!));
    expect(out.length).toBeLessThan(big.length / 3);
    expect(zlib.gunzipSync(out).equals(big)).toBe(true);
  });

  it('drops the digests of the body as it came, which the compressed bytes no longer match', () => {
    const digests = ['Content-MD5', 'Q2hlY2sgSW50ZWdyaXR5IQ==', 'Content-Digest', 'sha-256=:AAAA:', 'Repr-Digest', 'sha-256=:BBBB:'];
    const { t, r } = transform('gzip', ['Content-Type', 'application/json', ...digests]);
    expect(t).not.toBeNull();
    expect(r.headers).toEqual(['Content-Type', 'application/json', 'Vary', 'Accept-Encoding', 'Content-Encoding', 'gzip']);
    // Not compressed: kept as they are.
    expect(transform(null, ['Content-Type', 'application/json', ...digests]).r.headers).toEqual(['Content-Type', 'application/json', ...digests, 'Vary', 'Accept-Encoding']);
  });

  it('brotli round trip for unknown-length bodies', async () => {
    const { t, r } = transform('br, gzip', ['Content-Type', 'text/html']);
    expect(r.headers).toContain('br');
    expect(r.headers).toContain('Vary');
    const out = await buffer(Readable.from([big]).pipe(t!));
    expect(zlib.brotliDecompressSync(out).equals(big)).toBe(true);
  });

  it('leaves ineligible responses alone', () => {
    const len = ['Content-Length', String(big.length)];
    expect(transform('gzip', ['Content-Encoding', 'gzip', ...len]).t).toBeNull();
    expect(transform('gzip', len, { method: 'HEAD' }).t).toBeNull();
    expect(transform('gzip', [], { status: 204 }).t).toBeNull();
    // 205 Reset Content carries no content (RFC 9110 §15.3.6); gzip of nothing would be 20 bytes.
    expect(transform('gzip', ['Content-Type', 'text/plain'], { status: 205 }).t).toBeNull();
    expect(transform('gzip', [], { status: 304 }).t).toBeNull();
    expect(transform('gzip', ['Content-Range', 'bytes 0-9/100'], { status: 206 }).t).toBeNull();
    expect(transform('gzip', ['Content-Length', '100']).t).toBeNull();
    expect(transform('gzip', ['Content-Type', 'image/png', ...len]).t).toBeNull();
    expect(transform('gzip', ['Content-Type', 'text/event-stream']).t).toBeNull();
    expect(transform('gzip', ['Cache-Control', 'public, no-transform', ...len]).t).toBeNull();
    expect(transform('gzip', ['Content-Type', 'image/svg+xml', ...len]).t).not.toBeNull();
  });

  it('gives HEAD the head the same GET gets (Content-Encoding, Vary, weak ETag, no identity length), and no compressor', () => {
    const head = () => ['Content-Type', 'application/json', 'Content-Length', String(big.length), 'ETag', '"abc"', 'Accept-Ranges', 'bytes'];
    for (const ae of ['gzip', 'br, gzip', 'identity']) {
      const get = transform(ae, head());
      const h = transform(ae, head(), { method: 'HEAD' });
      expect(h.r.headers, ae).toEqual(get.r.headers);
      expect(h.t, ae).toBeNull();
    }
    expect(transform('gzip', head(), { method: 'HEAD' }).r.headers).toEqual(['Content-Type', 'application/json', 'ETag', 'W/"abc"', 'Vary', 'Accept-Encoding', 'Content-Encoding', 'gzip']);
    // What GET leaves alone, HEAD leaves alone too.
    expect(transform('gzip', ['Content-Length', '100'], { method: 'HEAD' }).r.headers).toEqual(['Content-Length', '100']);
  });

  it('adds Vary without compressing when the client accepts no coding', () => {
    const { t, r } = transform(null, ['Content-Type', 'text/plain', 'Content-Length', String(big.length)]);
    expect(t).toBeNull();
    expect(r.headers).toEqual(['Content-Type', 'text/plain', 'Content-Length', String(big.length), 'Vary', 'Accept-Encoding']);
    const star = transform('identity', ['Vary', '*']);
    expect(star.r.headers).toEqual(['Vary', '*']);
  });

  it('joins every Vary field, in order, before adding Accept-Encoding', () => {
    const vary = (...h: string[]) => {
      addVary(h);
      return h;
    };
    // Two fields: neither member is lost (a cache keyed on Origin only would mix users' responses).
    expect(vary('Vary', 'Origin', 'Content-Type', 'text/plain', 'vary', 'Cookie')).toEqual(['Vary', 'Origin, Cookie, Accept-Encoding', 'Content-Type', 'text/plain']);
    expect(vary('VARY', 'Origin,  Cookie', 'Vary', 'X-A ,', 'Vary', '')).toEqual(['VARY', 'Origin, Cookie, X-A, Accept-Encoding']);
    // Already there in any field, in any case: left as sent.
    expect(vary('Vary', 'Origin', 'Vary', 'accept-encoding, Cookie')).toEqual(['Vary', 'Origin', 'Vary', 'accept-encoding, Cookie']);
    expect(vary('Vary', 'ACCEPT-ENCODING')).toEqual(['Vary', 'ACCEPT-ENCODING']);
    // `*` in any field: the response varies on everything.
    expect(vary('Vary', 'Origin', 'Vary', '*')).toEqual(['Vary', '*']);
    expect(vary('Vary', '*')).toEqual(['Vary', '*']);
    expect(vary('Content-Type', 'text/plain')).toEqual(['Content-Type', 'text/plain', 'Vary', 'Accept-Encoding']);
    expect(vary('Vary', ' ')).toEqual(['Vary', 'Accept-Encoding']);
  });

  it('keeps every upstream Vary field when it compresses', () => {
    const { t, r } = transform('gzip', ['Content-Type', 'application/json', 'Vary', 'Origin', 'Vary', 'Cookie']);
    expect(t).not.toBeNull();
    expect(r.headers).toEqual(['Content-Type', 'application/json', 'Vary', 'Origin, Cookie, Accept-Encoding', 'Content-Encoding', 'gzip']);
  });
});
