import { isUtf8 } from 'node:buffer';
import { isIPv4, isIPv6 } from 'node:net';

/**
 * Header checks the control plane (route modules, traffic policy) and the ingress share, so that
 * what the API accepts is exactly what the ingress can send.
 */

/**
 * Header values are UTF-8 text, as ngrok (Go) reads and writes them: what the APIs accept for a
 * header value (route modules' `add`, a traffic policy's header values), what traffic-policy CEL
 * reads (`req.headers`, `getReqHeader()`, cookies, bucket keys) and what is sent is the UTF-8
 * text. Node's HTTP stack and undici hold a header value one character per byte (Latin-1), so
 * text crosses that boundary through {@link headerText} (bytes read → text) and
 * {@link headerWire} (text → bytes to send).
 *
 * A header value may hold any character but control characters (C0 other than HTAB, and DEL: no
 * CR, LF or NUL, so no header injection) and lone surrogates (no UTF-8 for them); C1 and
 * everything beyond ASCII go out as their UTF-8 bytes (obs-text on the wire).
 */
export const HEADER_TEXT_RE = /^(?:[\t\x20-\x7e\x80-\ud7ff\ue000-\uffff]|[\ud800-\udbff][\udc00-\udfff])*$/;

/** The APIs' message for a value {@link HEADER_TEXT_RE} refuses. */
export const HEADER_TEXT_PROBLEM = 'header value has a character not allowed in a header (a control character or a lone surrogate)';

const NON_ASCII = /[^\x00-\x7f]/;
/** A lone low surrogate U+DC80-U+DCFF: a byte `headerText` found in no UTF-8 sequence (see there). */
const ESCAPED_BYTE = /(?<![\ud800-\udbff])[\udc80-\udcff]/;
const ESCAPED_BYTES = new RegExp(ESCAPED_BYTE.source, 'g');

/**
 * The bytes of policy text (CEL strings): its UTF-8, each byte `headerText` escaped as that
 * byte, as ngrok's Go strings hold them (the hash, base64 and URL macros work on these).
 */
export function textBytes(text: string): Buffer {
  return ESCAPED_BYTE.test(text) ? encodeEscaping(text) : Buffer.from(text, 'utf8');
}

/** Bytes as policy text: UTF-8, a byte in no UTF-8 sequence escaped as `headerText` escapes it. */
export function bytesText(b: Buffer): string {
  return isUtf8(b) ? b.toString('utf8') : decodeEscaping(b.toString('latin1'), 0);
}

/** `text` with each escaped byte read as U+FFFD, as Go's rune-wise mapping (`strings.ToUpper`, `ToLower`) reads and writes such a byte. */
export function escapesAsReplacement(text: string): string {
  return ESCAPED_BYTE.test(text) ? text.replace(ESCAPED_BYTES, '\ufffd') : text;
}

/**
 * A header value as Node holds it (one character per byte) read as UTF-8 text. ASCII (nearly
 * every value) is returned as it is. A byte that starts no valid UTF-8 sequence becomes the lone
 * surrogate U+DC00 + byte, as Python's `surrogateescape` does: text never equals it (a policy
 * cannot hold a lone surrogate), `size()` counts it as one character as Go counts such a byte,
 * and `headerWire` gives the byte back, so `${req.headers['x'][0]}` sends a header on byte for
 * byte whatever it holds, as ngrok (whose strings are bytes) does.
 */
export function headerText(wire: string): string {
  const n = wire.length;
  let i = 0;
  while (i < n && wire.charCodeAt(i) < 0x80) i++;
  if (i === n) return wire;
  // A long value that is UTF-8: Node's decoder.
  if (n > 64) {
    const b = Buffer.from(wire, 'latin1');
    if (isUtf8(b)) return b.toString('utf8');
  }
  return decodeEscaping(wire, i);
}

/** UTF-16 code units `decodeEscaping` writes: at most one per byte. Grown as needed, kept. */
let units = new Uint16Array(256);

/** `headerText` by hand, from `i`, the first non-ASCII character (~3 ns a byte; a short value ~50–80 ns). */
function decodeEscaping(wire: string, i: number): string {
  const n = wire.length;
  if (units.length < n) units = new Uint16Array(Math.max(n, 2 * units.length));
  const u = units;
  for (let j = 0; j < i; j++) u[j] = wire.charCodeAt(j);
  let k = i;
  while (i < n) {
    const c = wire.charCodeAt(i);
    if (c < 0x80) {
      u[k++] = c;
      i++;
      continue;
    }
    // A lead byte: how many continuation bytes follow, and its bits.
    const more = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0;
    let cp = more > 0 && i + more < n ? c & (0x3f >> more) : -1;
    for (let j = 1; cp >= 0 && j <= more; j++) {
      const d = wire.charCodeAt(i + j);
      cp = (d & 0xc0) === 0x80 ? (cp << 6) | (d & 0x3f) : -1;
    }
    // Overlong forms, surrogates and beyond U+10FFFF are no UTF-8 either.
    if (cp >= 0 && ((more === 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (more === 3 && (cp < 0x10000 || cp > 0x10ffff)))) cp = -1;
    if (cp < 0) {
      u[k++] = 0xdc00 | c;
      i++;
    } else {
      if (cp >= 0x10000) {
        u[k++] = 0xd800 | ((cp - 0x10000) >> 10);
        u[k++] = 0xdc00 | ((cp - 0x10000) & 0x3ff);
      } else u[k++] = cp;
      i += more + 1;
    }
  }
  // Read back as UTF-16 (Buffer's decoder keeps lone surrogates as they are); a short value
  // through a plain array, which is several times quicker at that size.
  if (k > 64) return Buffer.from(u.buffer, 0, 2 * k).toString('utf16le');
  const a = new Array<number>(k);
  for (let j = 0; j < k; j++) a[j] = u[j]!;
  return String.fromCharCode(...a);
}

/**
 * Text as the value to hand Node or undici: its UTF-8 bytes, one character per byte, and each
 * byte `headerText` escaped (a lone U+DC80-U+DCFF) as that byte. Any other lone surrogate goes
 * out as U+FFFD (the APIs refuse them in a value; a run-time value can only get one from a CEL
 * function's result).
 */
export function headerWire(text: string): string {
  if (!NON_ASCII.test(text)) return text;
  if (!ESCAPED_BYTE.test(text)) return Buffer.from(text, 'utf8').toString('latin1');
  return encodeEscaping(text).toString('latin1');
}

/** The UTF-8 of `text` with each escaped byte as that byte, in one pass (~5 ns a character). */
function encodeEscaping(text: string): Buffer {
  const out = Buffer.allocUnsafe(3 * text.length);
  let k = 0;
  for (let i = 0; i < text.length; i++) {
    let c = text.charCodeAt(i);
    if (c < 0x80) {
      out[k++] = c;
      continue;
    }
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        const cp = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        out[k++] = 0xf0 | (cp >> 18);
        out[k++] = 0x80 | ((cp >> 12) & 0x3f);
        out[k++] = 0x80 | ((cp >> 6) & 0x3f);
        out[k++] = 0x80 | (cp & 0x3f);
        i++;
        continue;
      }
    }
    if (c >= 0xdc80 && c <= 0xdcff) {
      out[k++] = c & 0xff;
      continue;
    }
    // Any other lone surrogate: U+FFFD, as Buffer.from(…, 'utf8') writes it.
    if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
    if (c < 0x800) {
      out[k++] = 0xc0 | (c >> 6);
      out[k++] = 0x80 | (c & 0x3f);
    } else {
      out[k++] = 0xe0 | (c >> 12);
      out[k++] = 0x80 | ((c >> 6) & 0x3f);
      out[k++] = 0x80 | (c & 0x3f);
    }
  }
  return out.subarray(0, k);
}

/** An RFC 9110 token: what Node accepts as a header name. */
export const HEADER_TOKEN_RE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** A DNS-style name: labels of letters, digits, `_` and inner `-`, an optional final dot. */
const HOST_NAME_RE = /^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$/;

/**
 * Why `value` cannot be a `Host` header (RFC 9110 §7.2: uri-host [":" port], no userinfo), or
 * undefined: a host name, an IPv4 address or a bracketed IPv6 address, then an optional port
 * 1-65535.
 */
export function hostHeaderProblem(value: string): string | undefined {
  const bad = 'must be host[:port]: a host name, an IPv4 address or a bracketed IPv6 address, with an optional port 1-65535 and no scheme, user info, path or spaces (e.g. localhost or internal.example:8080)';
  let host: string;
  let port: string | undefined;
  if (value.startsWith('[')) {
    const end = value.indexOf(']');
    if (end < 0) return bad;
    host = value.slice(1, end);
    const rest = value.slice(end + 1);
    if (rest !== '') {
      if (!rest.startsWith(':')) return bad;
      port = rest.slice(1);
    }
    if (host.includes('%') || !isIPv6(host)) return bad;
  } else {
    const colon = value.lastIndexOf(':');
    host = colon >= 0 ? value.slice(0, colon) : value;
    if (colon >= 0) port = value.slice(colon + 1);
    if (host.replace(/\.$/, '').length > 253 || !HOST_NAME_RE.test(host)) return bad;
    // A name whose last label is all digits is an IPv4 address (as a URL parser reads it).
    if (/(?:^|\.)\d+\.?$/.test(host) && !isIPv4(host.replace(/\.$/, ''))) return bad;
  }
  if (port !== undefined && !(/^\d{1,5}$/.test(port) && Number(port) >= 1 && Number(port) <= 65535)) return bad;
  return undefined;
}

/** RFC 3986 reg-name: unreserved / pct-encoded / sub-delims (an IPv4 address is one too), not empty. */
const REG_NAME_RE = /^(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+$/;
/** RFC 3986 IPvFuture: "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" ). */
const IPV_FUTURE_RE = /^[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+$/;

/**
 * Whether `v` is a Host header value by the grammar (RFC 9110 §7.2, RFC 3986 §3.2.2-3):
 * `uri-host [ ":" port ]`, where uri-host is an IP-literal (`[` IPv6 address or IPvFuture `]`, no
 * zone id), an IPv4 address or a reg-name (unreserved, pct-encoded and sub-delims characters), and
 * port is 1 to 5 digits, at most 65535. An empty host and an empty port (`host:`) are refused.
 *
 * Looser than {@link hostHeaderProblem} (which the APIs apply to a configured Host: a DNS-style
 * name), and what the ingress checks a Host set at run time against (a traffic policy's
 * `add-headers`, interpolated or not) before handing it to undici, whose parsing of the Host (for
 * the TLS server name) asserts on a `[` without a `]`.
 */
export function isValidHostValue(v: string): boolean {
  let host: string;
  let port: string | undefined;
  if (v.startsWith('[')) {
    const end = v.indexOf(']');
    if (end < 0) return false;
    const literal = v.slice(1, end);
    if (!(IPV_FUTURE_RE.test(literal) || (!literal.includes('%') && isIPv6(literal)))) return false;
    const rest = v.slice(end + 1);
    if (rest === '') return true;
    if (rest[0] !== ':') return false;
    port = rest.slice(1);
  } else {
    const colon = v.indexOf(':');
    host = colon < 0 ? v : v.slice(0, colon);
    if (colon >= 0) port = v.slice(colon + 1);
    if (!REG_NAME_RE.test(host)) return false;
  }
  return port === undefined || (/^\d{1,5}$/.test(port) && Number(port) <= 65535);
}
