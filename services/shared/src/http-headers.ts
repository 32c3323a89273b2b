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

/** Where `wire` (one character per byte) is decoded by Node: a long value, or one that is not valid UTF-8. */
let scratch: Buffer | undefined;
function decodeNative(wire: string): string {
  if (wire.length > 4096) return Buffer.from(wire, 'latin1').toString('utf8');
  const b = (scratch ??= Buffer.allocUnsafe(4096));
  return b.toString('utf8', 0, b.write(wire, 0, 'latin1'));
}

/**
 * A header value as Node holds it (one character per byte) read as UTF-8 text; a byte sequence
 * that is not UTF-8 reads as U+FFFD (Node's decoder). ASCII (nearly every value) is returned as
 * it is. Short values are decoded here: going through a Buffer costs ~150 ns a value, which a
 * policy reading every header of a head of thousands would feel (`cost.ts` charges an entry
 * of the header map 150 ns).
 */
export function headerText(wire: string): string {
  const n = wire.length;
  let i = 0;
  while (i < n && wire.charCodeAt(i) < 0x80) i++;
  if (i === n) return wire;
  if (n > 64) return decodeNative(wire);
  let out = wire.slice(0, i);
  while (i < n) {
    const c = wire.charCodeAt(i);
    if (c < 0x80) {
      out += wire[i++];
      continue;
    }
    // A lead byte: how many continuation bytes follow, and its bits.
    const more = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0;
    if (more === 0 || i + more >= n) return decodeNative(wire);
    let cp = c & (0x3f >> more);
    for (let j = 1; j <= more; j++) {
      const d = wire.charCodeAt(i + j);
      if ((d & 0xc0) !== 0x80) return decodeNative(wire);
      cp = (cp << 6) | (d & 0x3f);
    }
    // Overlong forms, surrogates and beyond U+10FFFF are not UTF-8: Node's replacement rules.
    if ((more === 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (more === 3 && (cp < 0x10000 || cp > 0x10ffff))) return decodeNative(wire);
    out += String.fromCodePoint(cp);
    i += more + 1;
  }
  return out;
}

/** Text (valid per {@link HEADER_TEXT_RE}) as the value to hand Node or undici: its UTF-8 bytes, one character per byte. */
export function headerWire(text: string): string {
  return NON_ASCII.test(text) ? Buffer.from(text, 'utf8').toString('latin1') : text;
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
