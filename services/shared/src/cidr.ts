import { isIPv4, isIPv6 } from 'node:net';

/**
 * CIDR parsing for IP policy rules (wire-conventions.md §13) and the traffic-policy
 * `restrict-ips` action: an IPv4 or IPv6 address with an explicit prefix length and no host bits
 * set. The canonical form (what Postgres `cidr` prints too) is returned; the error text suggests
 * the network address when host bits were set.
 */
export type CidrResult = { ok: true; canonical: string; family: 4 | 6 } | { ok: false; message: string };

/** 4 bytes of a dotted-quad IPv4 address (no leading zeros), or null. */
export function parseIPv4(s: string): number[] | null {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(s);
  if (!m) return null;
  const out: number[] = [];
  for (const part of m.slice(1)) {
    if (part.length > 1 && part.startsWith('0')) return null; // 010 could mean octal
    const n = Number(part);
    if (n > 255) return null;
    out.push(n);
  }
  return out;
}

/** 16 bytes of an IPv6 address, or null. Zone ids (`%eth0`) are refused. */
export function parseIPv6(s: string): number[] | null {
  if (s.includes('%') || !isIPv6(s)) return null;
  let text = s;
  const tail: number[] = [];
  if (text.includes('.')) {
    const at = text.lastIndexOf(':');
    const v4 = parseIPv4(text.slice(at + 1));
    if (!v4) return null;
    tail.push(...v4);
    // Keep a "::" that ends right before the IPv4 part; drop a single separating ":".
    text = text[at - 1] === ':' ? text.slice(0, at + 1) : text.slice(0, at);
  }
  const groupsWanted = 8 - tail.length / 2;
  const halves = text.split('::');
  if (halves.length > 2) return null;
  const split = (h: string) => (h === '' ? [] : h.split(':'));
  const head = split(halves[0]!);
  const rest = halves.length === 2 ? split(halves[1]!) : [];
  let groups: string[];
  if (halves.length === 2) {
    const fill = groupsWanted - head.length - rest.length;
    if (fill < 1) return null;
    groups = [...head, ...Array<string>(fill).fill('0'), ...rest];
  } else groups = head;
  if (groups.length !== groupsWanted) return null;
  const bytes: number[] = [];
  for (const g of groups) {
    if (!/^[0-9A-Fa-f]{1,4}$/.test(g)) return null;
    const n = parseInt(g, 16);
    bytes.push(n >> 8, n & 0xff);
  }
  return [...bytes, ...tail];
}

function formatIPv6(bytes: number[]): string {
  const groups: number[] = [];
  for (let i = 0; i < 16; i += 2) groups.push((bytes[i]! << 8) | bytes[i + 1]!);
  // RFC 5952: compress the longest run (≥ 2) of zero groups, the first one on a tie.
  let bestStart = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (bestStart < 0) return hex.join(':');
  return `${hex.slice(0, bestStart).join(':')}::${hex.slice(bestStart + bestLen).join(':')}`;
}

function maskHostBits(bytes: number[], prefix: number): number[] {
  return bytes.map((b, i) => {
    const keep = Math.max(0, Math.min(8, prefix - i * 8));
    return b & ((0xff << (8 - keep)) & 0xff);
  });
}

export function parseCidr(input: string): CidrResult {
  const s = input.trim();
  const slash = s.indexOf('/');
  if (slash < 0) return { ok: false, message: `${JSON.stringify(input.slice(0, 64))} has no prefix length; write it in CIDR notation, e.g. 203.0.113.7/32 or 2001:db8::/32` };
  const addr = s.slice(0, slash);
  const len = s.slice(slash + 1);
  if (!/^(0|[1-9]\d{0,2})$/.test(len)) return { ok: false, message: `${JSON.stringify(input.slice(0, 64))} has an invalid prefix length` };
  const prefix = Number(len);
  const v4 = parseIPv4(addr);
  const v6 = v4 ? null : parseIPv6(addr);
  if (!v4 && !v6) return { ok: false, message: `${JSON.stringify(input.slice(0, 64))} is not an IPv4 or IPv6 CIDR` };
  const bytes = (v4 ?? v6)!;
  const max = v4 ? 32 : 128;
  if (prefix > max) return { ok: false, message: `the prefix length of ${JSON.stringify(input.slice(0, 64))} is over ${max}` };
  const net = maskHostBits(bytes, prefix);
  const format = (b: number[]) => (v4 ? b.join('.') : formatIPv6(b));
  const canonical = `${format(net)}/${prefix}`;
  if (net.some((b, i) => b !== bytes[i])) return { ok: false, message: `${JSON.stringify(input.slice(0, 64))} has host bits set; did you mean ${canonical}?` };
  return { ok: true, canonical, family: v4 ? 4 : 6 };
}

const MAPPED_V4 = /^::ffff:(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})$/i;

/**
 * A client address as rules and lookups should see it: a zone suffix dropped (`fe80::1%eth0`),
 * an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as the IPv4 address; null when not an IP
 * address. Used by `ip_restriction`, `restrict-ips`, the GeoIP lookup and the JWKS address check.
 */
export function normalizeIp(ip: string): { addr: string; type: 'ipv4' | 'ipv6' } | null {
  const pct = ip.indexOf('%');
  const a = pct >= 0 ? ip.slice(0, pct) : ip;
  if (isIPv4(a)) return { addr: a, type: 'ipv4' };
  if (!isIPv6(a)) return null;
  const m = MAPPED_V4.exec(a);
  return m ? { addr: m[1]!, type: 'ipv4' } : { addr: a, type: 'ipv6' };
}

/** True when the 16 bytes `b` are an IPv4-mapped IPv6 address (`::ffff:0:0/96`). */
export function isMappedV4(b: readonly number[]): boolean {
  for (let i = 0; i < 10; i++) if (b[i] !== 0) return false;
  return b[10] === 0xff && b[11] === 0xff;
}

/**
 * A CIDR (or bare address) as rules match it against {@link normalizeIp}'s client addresses:
 * `{ type, addr, prefix }` for node:net's BlockList, or null when it is not one. An IPv4-mapped
 * IPv6 network of prefix 96 or more (`::ffff:10.0.0.0/104`, hex groups too) is the IPv4 network it
 * maps (`10.0.0.0/8`), as Go's `net.IPNet.Contains` (ngrok) and the `inCidrRange` macro match it:
 * mapped clients are checked as IPv4, so kept as IPv6 such a rule would never match anything.
 */
export function matchableCidr(cidr: string): { type: 'ipv4' | 'ipv6'; addr: string; prefix: number } | null {
  const slash = cidr.indexOf('/');
  const addr = slash < 0 ? cidr : cidr.slice(0, slash);
  const text = slash < 0 ? '' : cidr.slice(slash + 1);
  if (slash >= 0 && !/^\d{1,3}$/.test(text)) return null;
  if (isIPv4(addr)) {
    const prefix = slash < 0 ? 32 : Number(text);
    return prefix <= 32 ? { type: 'ipv4', addr, prefix } : null;
  }
  if (!isIPv6(addr)) return null;
  const prefix = slash < 0 ? 128 : Number(text);
  if (prefix > 128) return null;
  const b = prefix >= 96 ? parseIPv6(addr) : null;
  if (b && isMappedV4(b)) return { type: 'ipv4', addr: b.slice(12).join('.'), prefix: prefix - 96 };
  return { type: 'ipv6', addr, prefix };
}
