/**
 * The normalisation of a request target's path, on its own (it imports nothing), for the public
 * handler (a client's target) and the traffic policy's url-rewrite (a rewritten one), which
 * cannot import `public.ts` (that imports the route modules, which import the policy).
 */

/** A path that may need `normalizeTarget`'s work: a `%`, a backslash, `/.` or `//`. */
const MAY_NEED_NORMALISING = /[%\\]|\/\.|\/\//;
const isUnreserved = (c: number) => (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || (c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2e || c === 0x5f || c === 0x7e;

/**
 * An origin-form request target with its path normalised, so that routing, the route's checks
 * (`req.url.path` in expressions, modules) and the upstream all see one path: percent-encoded
 * unreserved characters decoded (`/%61dmin` is `/admin`, RFC 3986 §6.2.2.2), dot segments
 * removed (`/x/../admin`, `/%2e/admin`; §5.2.4) and repeated slashes merged (`//admin`, as nginx
 * does by default). Otherwise a client could reach a protected route's resource under a path its
 * checks do not match, through an upstream that normalises (most do). The query is kept as sent,
 * and so are other escapes (`%2F` stays an escaped slash). A path with a backslash, raw or `%5C`,
 * which some upstreams take for a slash, is refused: null. Returns `url` itself when nothing
 * changes (the common case costs one regular-expression test).
 */
export function normalizeTarget(url: string): string | null {
  const q = url.indexOf('?');
  const path = q === -1 ? url : url.slice(0, q);
  if (!MAY_NEED_NORMALISING.test(path)) return url;
  if (path.includes('\\') || /%5c/i.test(path)) return null;
  const decoded = path.replace(/%([0-9A-Fa-f]{2})/g, (m, h: string) => {
    const c = parseInt(h, 16);
    return isUnreserved(c) ? String.fromCharCode(c) : m;
  });
  const segments = decoded.split('/');
  const out: string[] = [];
  const last = segments.length - 1;
  for (let i = 1; i <= last; i++) {
    const seg = segments[i]!;
    if (seg === '..') out.pop();
    else if (seg !== '.' && (seg !== '' || i === last)) {
      out.push(seg);
      continue;
    }
    // A path ending in a dot segment ends in a slash.
    if (i === last) out.push('');
  }
  const normal = `/${out.join('/')}`;
  return normal === path ? url : q === -1 ? normal : normal + url.slice(q);
}
