import zlib from 'node:zlib';
import type { Transform } from 'node:stream';
import type { RequestState, ResponseState, RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule, rawHeader, removeRawHeaders, setRawHeader } from './common.js';

/**
 * `compression`: compresses upstream response bodies with brotli or gzip as the request's
 * `Accept-Encoding` allows (q-values respected, `*` understood; on equal q brotli is preferred,
 * `q=0` refuses). Left alone: HEAD requests, statuses other than 2xx/3xx with a body (1xx, 204,
 * 206, 304), bodies already encoded, `Cache-Control: no-transform`, ranges, declared lengths under
 * MIN_LENGTH bytes, `text/event-stream` (compressors buffer, events must flow) and media types
 * that are already compressed (images but SVG, audio, video, archives, fonts but SVG/TTF/OTF…).
 * Bodies of unknown length are compressed. When it compresses it sets `Content-Encoding`, drops
 * `Content-Length` and `Accept-Ranges` and weakens a strong `ETag`. Every response it could
 * compress gets `Vary: Accept-Encoding`, compressed or not (its representation depends on it).
 * Levels favour speed: gzip 5, brotli quality 4.
 */

export const MIN_LENGTH = 1024;

export type Coding = 'br' | 'gzip';

/** The coding to use for an `Accept-Encoding` value, or null for none (identity). */
export function negotiateEncoding(acceptEncoding: string | undefined): Coding | null {
  if (!acceptEncoding) return null;
  let br: number | undefined;
  let gzip: number | undefined;
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
    else if (coding === '*') star = q;
  }
  const qbr = br ?? star ?? 0;
  const qgz = gzip ?? star ?? 0;
  if (qbr <= 0 && qgz <= 0) return null;
  return qbr >= qgz ? 'br' : 'gzip';
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

/** True when this response could be compressed for some client (its representation varies by Accept-Encoding). */
export function compressibleResponse(s: RequestState, r: ResponseState): boolean {
  if (s.req.method === 'HEAD') return false;
  if (r.status < 200 || r.status === 204 || r.status === 206 || r.status === 304) return false;
  const h = r.headers;
  const ce = rawHeader(h, 'content-encoding');
  if (ce && ce.trim().toLowerCase() !== 'identity') return false;
  if (rawHeader(h, 'content-range') !== undefined) return false;
  if (NO_TRANSFORM_RE.test(rawHeader(h, 'cache-control') ?? '')) return false;
  const len = rawHeader(h, 'content-length');
  if (len !== undefined && Number(len) < MIN_LENGTH) return false;
  return compressibleType(rawHeader(h, 'content-type'));
}

const NO_TRANSFORM_RE = /(^|,)\s*no-transform\s*(,|$)/i;

function addVary(h: string[]): void {
  const vary = rawHeader(h, 'vary');
  if (!vary) {
    h.push('Vary', 'Accept-Encoding');
    return;
  }
  const names = vary.split(',').map((v) => v.trim().toLowerCase());
  if (names.includes('*') || names.includes('accept-encoding')) return;
  setRawHeader(h, 'Vary', `${vary}, Accept-Encoding`);
}

const DROP = new Set(['content-length', 'accept-ranges', 'content-encoding']);

export function createCompressor(coding: Coding, contentLength?: number, text = true): Transform {
  if (coding === 'gzip') return zlib.createGzip({ level: 5 });
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
      if (!compressibleResponse(s, r)) return null;
      const h = r.headers;
      addVary(h);
      const ae = s.req.headers['accept-encoding'];
      const coding = negotiateEncoding(Array.isArray(ae) ? ae.join(',') : ae);
      if (!coding) return null;
      const len = rawHeader(h, 'content-length');
      const type = (rawHeader(h, 'content-type') ?? '').toLowerCase();
      const etag = rawHeader(h, 'etag');
      removeRawHeaders(h, DROP);
      h.push('Content-Encoding', coding);
      if (etag && !etag.startsWith('W/')) setRawHeader(h, 'ETag', `W/${etag}`);
      return createCompressor(coding, len === undefined ? undefined : Number(len), type.startsWith('text/') || type.includes('json') || type.includes('xml') || type.includes('javascript'));
    },
  };
};
