import { isMappedV4, parseCidr, parseIPv4, parseIPv6 } from '../cidr.js';

/**
 * What the `inCidrRange(ip, cidr)` and `inCidrRanges(ip, [cidrs])` macros match
 * (https://ngrok.com/docs/traffic-policy/macros/#incidrrangeipcidr---bool), on the shared address
 * parsers of `cidr.ts`:
 *
 * - A CIDR is an IPv4 or IPv6 address, `/` and a prefix length, as Go's `net.ParseCIDR` reads it:
 *   host bits may be set (ngrok's own example is `66.249.66.1/24`, the network 66.249.66.0/24),
 *   no zone, no spaces. An IPv4-mapped IPv6 range (`::ffff:10.0.0.0/104`) is the IPv4 range it
 *   maps (10.0.0.0/8), as Go matches it.
 * - The address is compared as `ip_restriction` and `restrict-ips` see a client: a zone suffix
 *   dropped (`fe80::1%eth0`), an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, in any spelling) as
 *   the IPv4 address, and each family only against ranges of its own (so `::/0` matches no IPv4
 *   address, and `0.0.0.0/0` no IPv6 one).
 * - As ngrok documents it, an invalid CIDR makes `inCidrRange` false and is skipped by
 *   `inCidrRanges`; an address that is not an IP address matches nothing. A literal invalid CIDR
 *   is refused when the policy is saved instead (`cel.ts`): it can only be a mistake.
 */

/** A range as matched: its network's bytes (4 or 16, host bits cleared) and prefix length. */
export interface MatchCidr {
  readonly bytes: readonly number[];
  readonly prefix: number;
}

/** The bytes an address is matched as (4 for IPv4 and IPv4-mapped IPv6, else 16), or null when it is not an IP address. */
export function matchAddress(ip: string): number[] | null {
  const pct = ip.indexOf('%');
  const a = pct >= 0 ? ip.slice(0, pct) : ip;
  const v4 = parseIPv4(a);
  if (v4) return v4;
  if (a.indexOf(':') < 0) return null;
  const v6 = parseIPv6(a);
  if (!v6) return null;
  return isMappedV4(v6) ? v6.slice(12) : v6;
}

const PREFIX_RE = /^(?:0|[1-9]\d{0,2})$/;

/** `cidr` as matched, or null when it is not a CIDR (see the file's comment). */
export function parseMatchCidr(cidr: string): MatchCidr | null {
  const slash = cidr.indexOf('/');
  if (slash < 0) return null;
  const len = cidr.slice(slash + 1);
  if (!PREFIX_RE.test(len)) return null;
  let prefix = Number(len);
  const addr = cidr.slice(0, slash);
  let bytes = parseIPv4(addr);
  if (bytes) {
    if (prefix > 32) return null;
  } else {
    if (addr.indexOf(':') < 0) return null;
    bytes = parseIPv6(addr);
    if (!bytes || prefix > 128) return null;
    if (prefix >= 96 && isMappedV4(bytes)) {
      bytes = bytes.slice(12);
      prefix -= 96;
    }
  }
  for (let i = 0; i < bytes.length; i++) {
    const keep = Math.max(0, Math.min(8, prefix - i * 8));
    bytes[i] = bytes[i]! & (0xff << (8 - keep)) & 0xff;
  }
  return { bytes, prefix };
}

/** Why a literal `cidr` is refused (for the 400 when a policy is saved). */
export function cidrProblem(cidr: string): string {
  const r = parseCidr(cidr);
  // parseCidr trims and refuses host bits; what it accepts here failed for its spaces.
  return r.ok ? `${JSON.stringify(cidr.slice(0, 64))} is not a CIDR (no spaces around it)` : r.message;
}

/** True when the address `ip` (bytes from `matchAddress`) is in `c`. */
export function inCidr(ip: readonly number[], c: MatchCidr): boolean {
  const net = c.bytes;
  if (ip.length !== net.length) return false;
  const whole = c.prefix >> 3;
  for (let i = 0; i < whole; i++) if (ip[i] !== net[i]) return false;
  const rest = c.prefix & 7;
  return rest === 0 || (ip[whole]! & ((0xff << (8 - rest)) & 0xff)) === net[whole];
}
