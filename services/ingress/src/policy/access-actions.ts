import { createHash, timingSafeEqual } from 'node:crypto';
import { BlockList, SocketAddress } from 'node:net';
import type { BasicAuthAction, DpIpPolicyRule, RestrictIpsAction } from '@warren/shared';
import { errorAnswer } from '../http/error-page.js';
import { addCidr, familyOf, normalizeClientIp } from '../modules/ip-restriction.js';
import type { Outcome, RequestState } from '../pipeline/types.js';
import { actionsOf } from './activation.js';

/**
 * The traffic-policy access actions at run time (validated by
 * `services/shared/src/traffic-policy/access-actions.ts`), compiled once per config version.
 *
 * `restrict-ips` (https://ngrok.com/docs/traffic-policy/actions/restrict-ips/): the layer-4
 * client address (never X-Forwarded-For) is refused when it is in a `deny` CIDR, or when `allow`
 * is given and it is in none of them, as the route's `ip_restriction` module does (whose CIDR
 * matching this reuses: Node's BlockList, IPv4-mapped IPv6 clients checked as IPv4; see
 * `CidrSet` for the one difference). Refused:
 * 403 `ERR_WARREN_7120`, and no later rule or action runs. `enforce: false` only records the
 * result in `actions.ngrok.restrict_ips.*`. The allow and deny rules of the IP policies in
 * `ip_policies` count as `allow` and `deny` CIDRs. They are read when the policy is compiled,
 * from the config being applied, so a rule change (a new config version) applies without the
 * route changing; an IP policy the config does not hold, or another account's, makes the route
 * unusable (503) rather than check less than configured. Each policy's sets are built once per
 * change of its rules (`ipPolicySets`) and checked after the inline ones, in order.
 *
 * `basic-auth` (https://ngrok.com/docs/traffic-policy/actions/basic-auth/): the request needs one
 * `Authorization: Basic <base64(username:password)>` header matching one of the credentials;
 * otherwise 401 `ERR_WARREN_7121` with `WWW-Authenticate: Basic realm="…"`. The header is sent
 * on to the upstream as ngrok does (a `remove-headers` action after this one can drop it). The
 * credentials are kept only as SHA-256 digests and a presented one is compared with every one of
 * them in constant time. `enforce: false` only records `actions.ngrok.basic_auth.credentials.*`.
 */

/**
 * A list of CIDRs: those of each address family in one BlockList to decide, and each alone to
 * tell which matched. The families are kept apart because a BlockList matches an IPv4 address
 * against IPv6 rules as `::ffff:a.b.c.d` (so `::/0` would cover every IPv4 client); as in ngrok, an
 * IPv4 client is checked against IPv4 CIDRs only, an IPv6 one against IPv6 CIDRs only.
 */
interface CidrSet {
  ipv4: BlockList | null;
  ipv6: BlockList | null;
  /** `list`: that CIDR alone, made on the first lookup of which matched (one BlockList per CIDR costs memory and time). */
  each: { cidr: string; family: 'ipv4' | 'ipv6'; list: BlockList | null }[];
}

export interface CompiledRestrictIps {
  kind: 'restrict-ips';
  enforce: boolean;
  /** The inline CIDRs' set, then each IP policy's; empty when there are none. */
  allow: CidrSet[];
  deny: CidrSet[];
}

export interface CompiledBasicAuth {
  kind: 'basic-auth';
  enforce: boolean;
  /** SHA-256 of each `username:password` (UTF-8). */
  digests: Buffer[];
  /** The `WWW-Authenticate` value of a 401. */
  challenge: string;
}

/**
 * Sets already built, by their CIDRs: a policy may repeat one list in many actions (YAML aliases
 * make 100 copies of a 1000-CIDR list cost 20 KB of text), built once. Bounded; the sets are
 * never changed once built (apart from `each[].list`, made on demand), so actions may share one.
 */
const builtSets = new Map<string, CidrSet>();
const BUILT_SETS_MAX = 256;

function cidrSet(cidrs: string[]): CidrSet | null {
  if (cidrs.length === 0) return null;
  const key = cidrs.join(',');
  const built = builtSets.get(key);
  if (built) return built;
  const set: CidrSet = { ipv4: null, ipv6: null, each: [] };
  for (const cidr of cidrs) {
    const family = familyOf(cidr);
    addCidr((set[family] ??= new BlockList()), cidr);
    set.each.push({ cidr, family, list: null });
  }
  if (builtSets.size >= BUILT_SETS_MAX) builtSets.delete(builtSets.keys().next().value!);
  builtSets.set(key, set);
  return set;
}

/** The first of `sets` with a CIDR holding `addr` (of `family`). */
function find(sets: CidrSet[], addr: SocketAddress, family: 'ipv4' | 'ipv6'): CidrSet | undefined {
  for (const set of sets) if (set[family]?.check(addr) === true) return set;
  return undefined;
}

/**
 * An IP policy's allow and deny sets, by its rules array. Every config version compiles every
 * route again, and a version shares the policies it did not change with the one before, so these
 * are built again only for a policy whose rules changed (not once per action and version: ten
 * policies of 1000 rules in each of 30 actions would take seconds). Kept while the config holds
 * the rules.
 */
const policySets = new WeakMap<readonly DpIpPolicyRule[], { allow: CidrSet | null; deny: CidrSet | null }>();

function ipPolicySets(rules: readonly DpIpPolicyRule[]): { allow: CidrSet | null; deny: CidrSet | null } {
  let sets = policySets.get(rules);
  if (!sets) {
    const allow: string[] = [];
    const deny: string[] = [];
    for (const r of rules) (r.action === 'allow' ? allow : deny).push(r.cidr);
    sets = { allow: cidrSet(allow), deny: cidrSet(deny) };
    policySets.set(rules, sets);
  }
  return sets;
}

/** The rules of an IP policy of the route's account, or undefined when the config has no such policy. */
export type IpPolicyRules = (id: string) => readonly DpIpPolicyRule[] | undefined;

/** `ipPolicyRules` resolves `ip_policies`; without it (or for an unknown id) a policy naming one throws. */
export function compileRestrictIps(c: RestrictIpsAction['config'], ipPolicyRules?: IpPolicyRules): CompiledRestrictIps {
  const allow: CidrSet[] = [];
  const deny: CidrSet[] = [];
  const add = (list: CidrSet[], set: CidrSet | null) => {
    if (set && !list.includes(set)) list.push(set);
  };
  add(allow, cidrSet(c.allow));
  add(deny, cidrSet(c.deny));
  for (const id of c.ip_policies) {
    const rules = ipPolicyRules?.(id);
    if (!rules) throw new Error(`restrict-ips: IP policy ${id} is not in this ingress's configuration`);
    const sets = ipPolicySets(rules);
    add(allow, sets.allow);
    add(deny, sets.deny);
  }
  return { kind: 'restrict-ips', enforce: c.enforce, allow, deny };
}

/** The first CIDR of `set` holding `addr` (`''` if none: cannot happen after `find` chose the set). */
function firstMatch(set: CidrSet, addr: SocketAddress, family: 'ipv4' | 'ipv6'): string {
  for (const e of set.each) {
    if (e.family !== family) continue;
    if (!e.list) addCidr((e.list = new BlockList()), e.cidr);
    if (e.list.check(addr)) return e.cidr;
  }
  return '';
}

/** The CIDR that matched, or a lookup of it run only if an expression reads `matched_cidr`. */
function matched(set: CidrSet, addr: SocketAddress, family: 'ipv4' | 'ipv6'): string | (() => string) {
  return set.each.length === 1 ? set.each[0]!.cidr : () => firstMatch(set, addr, family);
}

function refusedIp(s: RequestState): Outcome {
  return errorAnswer(s.req.headers.accept, 7120);
}

/** Runs `restrict-ips`: null to go on, or the 403. */
export function restrictIps(a: CompiledRestrictIps, s: RequestState): Outcome {
  const vars = actionsOf(s).ngrok.restrict_ips;
  const n = normalizeClientIp(s.clientIp);
  if (!n) {
    vars.record('deny', '', 'invalid_client_ip', 'the client address is not an IP address');
    return a.enforce ? refusedIp(s) : null;
  }
  // One parse of the address for every check below.
  const addr = new SocketAddress({ address: n.addr, family: n.type });
  const denied = find(a.deny, addr, n.type);
  if (denied) {
    vars.record('deny', matched(denied, addr, n.type));
    return a.enforce ? refusedIp(s) : null;
  }
  if (a.allow.length === 0) {
    vars.record('allow', '');
    return null;
  }
  const allowed = find(a.allow, addr, n.type);
  if (allowed) {
    vars.record('allow', matched(allowed, addr, n.type));
    return null;
  }
  vars.record('deny', '');
  return a.enforce ? refusedIp(s) : null;
}

/** `"` and `\` escaped for an RFC 9110 quoted-string (the realm is printable ASCII: validated). */
const quoted = (s: string) => `"${s.replace(/["\\]/g, '\\$&')}"`;

export function compileBasicAuth(c: BasicAuthAction['config']): CompiledBasicAuth {
  return {
    kind: 'basic-auth',
    enforce: c.enforce,
    digests: c.credentials.map((cred) => createHash('sha256').update(cred, 'utf8').digest()),
    challenge: `Basic realm=${quoted(c.realm)}`,
  };
}

/** `Basic <token68>`; the scheme is case-insensitive (RFC 9110 §11.1). Padding may be left out. */
const BASIC_RE = /^[Bb][Aa][Ss][Ii][Cc] +([A-Za-z0-9+/]+={0,2}) *$/;

/**
 * The decoded `username:password` bytes of the request's Basic credentials, or null when there
 * are none: no Authorization header, more than one, another scheme, bad base64, or no colon.
 * Reads the headers as they are now (an earlier action may have edited them).
 */
function presentedCredentials(headers: readonly string[]): Buffer | null {
  let value: string | undefined;
  for (let i = 0; i + 1 < headers.length; i += 2) {
    const name = headers[i]!;
    if (name.length !== 13 || name.toLowerCase() !== 'authorization') continue;
    if (value !== undefined) return null;
    value = headers[i + 1]!;
  }
  if (value === undefined) return null;
  const m = BASIC_RE.exec(value.trim());
  if (!m) return null;
  const decoded = Buffer.from(m[1]!, 'base64');
  return decoded.includes(0x3a) ? decoded : null;
}

/** Runs `basic-auth`: null to go on, or the 401. */
export function basicAuth(a: CompiledBasicAuth, s: RequestState): Outcome {
  const vars = actionsOf(s).ngrok.basic_auth.credentials;
  vars.presented = false;
  vars.username = '';
  vars.authorized = false;
  const presented = presentedCredentials(s.headers);
  if (presented) {
    vars.presented = true;
    vars.username = presented.toString('utf8', 0, presented.indexOf(0x3a));
    const digest = createHash('sha256').update(presented).digest();
    presented.fill(0);
    // Every credential is compared, whichever matches: the time taken does not tell which.
    let ok = false;
    for (const d of a.digests) ok = timingSafeEqual(digest, d) || ok;
    vars.authorized = ok;
  }
  if (vars.authorized || !a.enforce) return null;
  return errorAnswer(s.req.headers.accept, 7121, undefined, { 'www-authenticate': a.challenge });
}
