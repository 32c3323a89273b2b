import { isIPv4, isIPv6 } from 'node:net';

/**
 * Header checks the control plane (route modules, traffic policy) and the ingress share, so that
 * what the API accepts is exactly what the ingress can send.
 */

/**
 * Field-value characters Node's HTTP stack (and undici, towards the agent) accept: HTAB, SP, VCHAR
 * and obs-text 0x80-0xff, sent as Latin-1 bytes. No CR, LF or NUL (no header injection), and
 * nothing beyond U+00FF ("€"): Node would throw when writing it.
 */
export const HEADER_VALUE_RE = /^[\t\x20-\x7e\x80-\xff]*$/;

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
