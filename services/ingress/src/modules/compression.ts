import zlib from 'node:zlib';
import type { Transform } from 'node:stream';
import type { RequestState, ResponseState, RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule, rawHeader, removeRawHeaders, setRawHeader } from './common.js';

/**
 * `compression`: compresses upstream response bodies with brotli or gzip as the request's
 * `Accept-Encoding` allows (q-values respected, `*` understood; on equal q brotli is preferred,
 * `q=0` refuses). Left alone: statuses other than 2xx/3xx with a body (1xx, 204,
 * 205, 206, 304), bodies already encoded, `Cache-Control: no-transform`, ranges, declared lengths under
 * MIN_LENGTH bytes, `text/event-stream` (compressors buffer, events must flow) and media types
 * that are already compressed (images but SVG, audio, video, archives, fonts but SVG/TTF/OTF…).
 * Bodies of unknown length are compressed. When it compresses it sets `Content-Encoding`, drops
 * `Content-Length`, `Accept-Ranges` and the digests of the body as it came (`Content-MD5`,
 * `Content-Digest`, `Repr-Digest`: RFC 9530's digests cover the coded bytes), and weakens a strong
 * `ETag`. Every response it could
 * compress gets `Vary: Accept-Encoding`, compressed or not (its representation depends on it).
 * A HEAD gets the head the same GET would get (RFC 9110 §9.3.2: the same `Content-Encoding`,
 * `Vary` and weakened `ETag`, no `Content-Length` of the identity body), as nginx's gzip does,
 * and no compressor: it has no body.
 * Levels favour speed: gzip 5, brotli quality 4.
 *
 * The traffic policy's `compress-response` action (`../policy/body-actions.ts`) reuses these
 * rules with its own list of codings (deflate too); a response it compresses already carries its
 * `Content-Encoding` when this stage sees it, and `claimCompression` keeps the two from ever
 * compressing one response twice.
 */

export const MIN_LENGTH = 1024;

export type Coding = 'br' | 'gzip' | 'deflate';

/** Codings by preference when the client weighs them equally. */
const PREFERENCE: readonly Coding[] = ['br', 'gzip', 'deflate'];
const MODULE_CODINGS: readonly Coding[] = ['br', 'gzip'];

/**
 * The coding to use for an `Accept-Encoding` value, or null for none (identity): the one of
 * `allowed` with the highest q-value, brotli then gzip then deflate on equal q. The module offers
 * brotli and gzip; the traffic policy's compress-response action the codings it lists.
 */
export function negotiateEncoding(acceptEncoding: string | undefined, allowed: readonly Coding[] = MODULE_CODINGS): Coding | null {
  if (!acceptEncoding) return null;
  let br: number | undefined;
  let gzip: number | undefined;
  let deflate: number | undefined;
  let star: number | undefined;
  for (const item of acceptEncoding.split(',')) {
    const parts = item.split(';');
    const coding = parts[0]!.trim().toLowerCase();
    let q = 1;
    for (let i = 1; i < parts.length; i++) {
      const p = parts[i]!.trim();
      if (p.length > 2 && (p[0] === 'q' || p[0] === 'Q') && p[1] === '=') {
        const v = Number(p.slice(2));
        q = Number.isFinite(v) ? Math.min(1, Math.max(0, v)) : 0;
      }
    }
    if (coding === 'br') br = Math.max(br ?? 0, q);
    else if (coding === 'gzip' || coding === 'x-gzip') gzip = Math.max(gzip ?? 0, q);
    else if (coding === 'deflate') deflate = Math.max(deflate ?? 0, q);
    else if (coding === '*') star = q;
  }
  const qs: Record<Coding, number> = { br: br ?? star ?? 0, gzip: gzip ?? star ?? 0, deflate: deflate ?? star ?? 0 };
  let best: Coding | null = null;
  for (const c of PREFERENCE) if (allowed.includes(c) && qs[c] > 0 && (best === null || qs[c] > qs[best])) best = c;
  return best;
}

const INCOMPRESSIBLE_PREFIXES = ['image/', 'audio/', 'video/', 'font/woff'];
const INCOMPRESSIBLE = new Set([
  'application/zip',
  'application/gzip',
  'application/x-gzip',
  'application/x-bzip2',
  'application/x-xz',
  'application/x-7z-compressed',
  'application/x-rar-compressed',
  'application/vnd.rar',
  'application/zstd',
  'application/x-brotli',
  'application/pdf',
  'application/octet-stream',
  'application/wasm',
  'text/event-stream',
]);
const COMPRESSIBLE_EXCEPTIONS = new Set(['image/svg+xml', 'image/x-icon', 'image/vnd.microsoft.icon', 'image/bmp']);

export function compressibleType(contentType: string | undefined): boolean {
  if (!contentType) return true;
  const semi = contentType.indexOf(';');
  const t = (semi < 0 ? contentType : contentType.slice(0, semi)).trim().toLowerCase();
  if (COMPRESSIBLE_EXCEPTIONS.has(t)) return true;
  if (INCOMPRESSIBLE.has(t)) return false;
  return !INCOMPRESSIBLE_PREFIXES.some((p) => t.startsWith(p));
}

/**
 * True when the response head declares a content coding other than identity, in any of its
 * `Content-Encoding` fields: an upstream may send several (`identity`, then `gzip`), and reading
 * only the first would compress an already gzipped body again under a single `gzip`.
 */
export function contentEncoded(h: readonly string[]): boolean {
  for (let i = 0; i + 1 < h.length; i += 2) {
    if (h[i]!.toLowerCase() !== 'content-encoding') continue;
    for (const c of h[i + 1]!.split(',')) {
      const v = c.trim().toLowerCase();
      if (v !== '' && v !== 'identity') return true;
    }
  }
  return false;
}

/**
 * True when this response could be compressed for some client (its representation varies by
 * Accept-Encoding). A HEAD's head is decided as the GET's would be: only its body is not compressed.
 */
export function compressibleResponse(r: ResponseState): boolean {
  // 205 Reset Content: RFC 9110 §15.3.6, a server MUST NOT generate content (gzip of nothing is 20 bytes).
  if (r.status < 200 || r.status === 204 || r.status === 205 || r.status === 206 || r.status === 304) return false;
  const h = r.headers;
  if (contentEncoded(h)) return false;
  if (rawHeader(h, 'content-range') !== undefined) return false;
  if (NO_TRANSFORM_RE.test(rawHeader(h, 'cache-control') ?? '')) return false;
  const len = rawHeader(h, 'content-length');
  if (len !== undefined && Number(len) < MIN_LENGTH) return false;
  return compressibleType(rawHeader(h, 'content-type'));
}

const NO_TRANSFORM_RE = /(^|,)\s*no-transform\s*(,|$)/i;

/**
 * Adds `Accept-Encoding` to the response's `Vary`. An upstream may send several `Vary` fields
 * (`Vary: Origin` then `Vary: Cookie`): their members are joined, in order, into one field with
 * `Accept-Encoding` last, so none is lost (a cache keyed on fewer would serve one user's response
 * to another). Left alone when a member already is `Accept-Encoding` (case-insensitively); any `*`
 * member makes it `Vary: *` (varies on everything: nothing to add).
 */
export function addVary(h: string[]): void {
  const members: string[] = [];
  for (let i = 0; i + 1 < h.length; i += 2) {
    if (h[i]!.toLowerCase() !== 'vary') continue;
    for (const m of h[i + 1]!.split(',')) {
      const v = m.trim();
      if (v) members.push(v);
    }
  }
  if (members.some((m) => m.toLowerCase() === 'accept-encoding')) return;
  if (members.some((m) => m === '*')) {
    setRawHeader(h, 'Vary', '*');
    return;
  }
  members.push('Accept-Encoding');
  setRawHeader(h, 'Vary', members.join(', '));
}

/** Framing and the digests of the uncompressed bytes, which the compressed body no longer matches. */
const DROP = new Set(['content-length', 'accept-ranges', 'content-encoding', 'content-md5', 'content-digest', 'repr-digest']);

/**
 * Edits a response head for a body about to be compressed with `coding`: sets `Content-Encoding`,
 * drops `Content-Length`, `Accept-Ranges` and the body's digests, weakens a strong `ETag`. Returns what
 * `createCompressor` needs (the length it had, whether it is text).
 */
export function encodeHead(h: string[], coding: Coding): { contentLength: number | undefined; text: boolean } {
  const len = rawHeader(h, 'content-length');
  const type = (rawHeader(h, 'content-type') ?? '').toLowerCase();
  const etag = rawHeader(h, 'etag');
  removeRawHeaders(h, DROP);
  h.push('Content-Encoding', coding);
  if (etag && !etag.startsWith('W/')) setRawHeader(h, 'ETag', `W/${etag}`);
  return { contentLength: len === undefined ? undefined : Number(len), text: type.startsWith('text/') || type.includes('json') || type.includes('xml') || type.includes('javascript') };
}

/** Responses some stage already compresses: the module and the traffic policy never both do. */
const claimed = new WeakSet<RequestState>();

/** Claims the compression of `s`'s response for the caller: false when another stage already did. */
export function claimCompression(s: RequestState): boolean {
  if (claimed.has(s)) return false;
  claimed.add(s);
  return true;
}

export function createCompressor(coding: Coding, contentLength?: number, text = true): Transform {
  if (coding === 'gzip') return zlib.createGzip({ level: 5 });
  if (coding === 'deflate') return zlib.createDeflate({ level: 5 });
  const params: Record<number, number> = {
    [zlib.constants.BROTLI_PARAM_QUALITY]: 4,
    [zlib.constants.BROTLI_PARAM_MODE]: text ? zlib.constants.BROTLI_MODE_TEXT : zlib.constants.BROTLI_MODE_GENERIC,
  };
  if (contentLength !== undefined && Number.isFinite(contentLength)) params[zlib.constants.BROTLI_PARAM_SIZE_HINT] = contentLength;
  return zlib.createBrotliCompress({ params });
}

export const compressionStage: StageFactory = (route): RouteStage | null => {
  if (!enabledModule(route, 'compression')) return null;
  return {
    name: 'compression',
    transformBody(s, r) {
      if (!compressibleResponse(r)) return null;
      const h = r.headers;
      addVary(h);
      const ae = s.req.headers['accept-encoding'];
      const coding = negotiateEncoding(Array.isArray(ae) ? ae.join(',') : ae);
      if (!coding || !claimCompression(s)) return null;
      const { contentLength, text } = encodeHead(h, coding);
      // HEAD: the GET's head, and no body to compress.
      return s.req.method === 'HEAD' ? null : createCompressor(coding, contentLength, text);
    },
  };
};
