/**
 * Validation of the access-control actions `restrict-ips` and `basic-auth` (the ingress runs
 * them: `services/ingress/src/policy/access-actions.ts`). Semantics follow ngrok's:
 * - https://ngrok.com/docs/traffic-policy/actions/restrict-ips/
 * - https://ngrok.com/docs/traffic-policy/actions/basic-auth/
 *
 * Where Warren differs, the policy is refused with a 400 rather than run differently:
 * - both actions run on `inbound` rules only (the request phase);
 * - `restrict-ips` `ip_policies` is not supported: list the CIDRs, or attach the IP policies to
 *   the route with its `ip_restriction` module, which keeps them referenced (a referenced IP
 *   policy cannot be deleted);
 * - CEL interpolation (`${…}`) in CIDRs and credentials is not supported.
 *
 * Error messages never quote a credential: not its password, and not its username either (a
 * credential with no colon may be a bare password).
 */
import { parseCidr } from '../cidr.js';
import { at, expectList, expectObj, noUnknownKeys, TrafficPolicyError, typeName } from './parse.js';
import type { BasicAuthAction, PolicyDirection, RestrictIpsAction } from './types.js';

export const RESTRICT_IPS_LIMITS = {
  /** CIDRs in `allow` and `deny` together (an IP policy holds at most 1000 rules too). */
  maxCidrs: 1000,
} as const;

/**
 * What one run of `restrict-ips` costs (≈ ns, about twice what was measured: a BlockList check
 * goes through the family's rules one by one, ~7 ns each, after ~2-4 µs of set-up), charged to
 * the policy's total (`parse.ts` `checkCost`): a policy may repeat a long list in many actions.
 */
export function restrictIpsCost(c: RestrictIpsAction['config']): number {
  return 6_000 + 15 * (c.allow.length + c.deny.length);
}

export const BASIC_AUTH_LIMITS = {
  /** ngrok accepts up to 10 `username:password` pairs. */
  maxCredentials: 10,
  /** Characters (code points) of a username; ngrok documents no bound, this is ours. */
  usernameChars: 128,
  /** ngrok: a password has 8 to 128 characters. */
  passwordMinChars: 8,
  passwordMaxChars: 128,
  /** ngrok: a realm has at most 128 characters, ASCII only. */
  realmChars: 128,
} as const;

export const DEFAULT_BASIC_AUTH_REALM = 'ngrok';

/** RFC 7617 §2: no control characters in a user-id or password (C0 and DEL; C1 as well here). */
const CONTROL_RE = /[\u0000-\u001f\u007f-\u009f]/;
/** Printable ASCII: what a realm may hold (it is sent in a quoted-string, escaped there). */
const REALM_RE = /^[\x20-\x7e]+$/;

/** Canonical CIDRs inside `::ffff:0:0/96` (`parseCidr` prints them in hex groups). */
const MAPPED_V4_CIDR_RE = /^::ffff:[0-9a-f]{1,4}:[0-9a-f]{1,4}\/(9[6-9]|1[0-2]\d)$/;

/** The path of the action's `type`, from the path of its `config`. */
function typePath(configPath: string): string {
  return configPath.endsWith('.config') ? `${configPath.slice(0, -'.config'.length)}.type` : configPath;
}

function inboundOnly(type: string, configPath: string, direction: PolicyDirection): void {
  if (direction !== 'inbound') throw new TrafficPolicyError(typePath(configPath), `${type} can only be used in inbound rules (it runs on the request)`);
}

function parseEnforce(v: unknown, path: string): boolean {
  if (v === undefined || v === null) return true;
  if (typeof v !== 'boolean') throw new TrafficPolicyError(path, `must be true or false, got ${typeName(v)}`);
  return v;
}

/** `allow` / `deny`: absent is fine, present must be a non-empty list of distinct CIDRs. */
function parseCidrList(v: unknown, path: string): string[] {
  if (v === undefined || v === null) return [];
  const list = expectList(v, path, false);
  if (list.length === 0) throw new TrafficPolicyError(path, 'must have at least one CIDR (leave the field out instead of giving an empty list)');
  if (list.length > RESTRICT_IPS_LIMITS.maxCidrs) throw new TrafficPolicyError(path, `must have at most ${RESTRICT_IPS_LIMITS.maxCidrs} CIDRs, got ${list.length}`);
  const seen = new Map<string, number>();
  return list.map((e, i) => {
    const p = at(path, i);
    if (typeof e !== 'string') throw new TrafficPolicyError(p, `must be a CIDR string, got ${typeName(e)}`);
    if (e.includes('${')) throw new TrafficPolicyError(p, 'CEL interpolation (${…}) is not supported in restrict-ips CIDRs; write the CIDR itself');
    const r = parseCidr(e);
    if (!r.ok) throw new TrafficPolicyError(p, r.message);
    // IPv4-mapped clients (`::ffff:a.b.c.d`) are matched as IPv4, so such a range would never match.
    if (MAPPED_V4_CIDR_RE.test(r.canonical)) throw new TrafficPolicyError(p, `${r.canonical} is an IPv4-mapped IPv6 range; write it as an IPv4 CIDR (IPv4-mapped clients are matched as IPv4)`);
    const earlier = seen.get(r.canonical);
    if (earlier !== undefined) throw new TrafficPolicyError(p, `${r.canonical} is already listed at ${at(path, earlier)}`);
    seen.set(r.canonical, i);
    return r.canonical;
  });
}

/**
 * `restrict-ips` config: `enforce` (default true), `allow` and `deny` (CIDRs, IPv4 or IPv6, with
 * a prefix length and no host bits set, as for IP policy rules). At least one CIDR in all.
 */
export function parseRestrictIpsConfig(raw: unknown, path: string, direction: PolicyDirection): RestrictIpsAction['config'] {
  inboundOnly('restrict-ips', path, direction);
  const c = expectObj(raw, path, 'config');
  if ('ip_policies' in c)
    throw new TrafficPolicyError(
      at(path, 'ip_policies'),
      'is not supported by Warren; list the CIDRs in allow/deny instead, or attach the IP policies to the route with its ip_restriction module',
    );
  noUnknownKeys(c, path, ['enforce', 'allow', 'deny']);
  const enforce = parseEnforce(c.enforce, at(path, 'enforce'));
  const allow = parseCidrList(c.allow, at(path, 'allow'));
  const deny = parseCidrList(c.deny, at(path, 'deny'));
  if (allow.length === 0 && deny.length === 0) throw new TrafficPolicyError(path, 'needs at least one CIDR in allow or deny');
  if (allow.length + deny.length > RESTRICT_IPS_LIMITS.maxCidrs)
    throw new TrafficPolicyError(path, `allow and deny may hold at most ${RESTRICT_IPS_LIMITS.maxCidrs} CIDRs together, got ${allow.length + deny.length}`);
  const denied = new Map(deny.map((d, i) => [d, i]));
  allow.forEach((a, i) => {
    const j = denied.get(a);
    if (j !== undefined) throw new TrafficPolicyError(at(at(path, 'allow'), i), `${a} is also at ${at(at(path, 'deny'), j)}; a denied CIDR is never allowed, so list it in one of them only`);
  });
  return { enforce, allow, deny };
}

const chars = (s: string) => [...s].length;

function parseCredential(v: unknown, path: string): string {
  if (typeof v !== 'string') throw new TrafficPolicyError(path, `must be a "username:password" string, got ${typeName(v)}`);
  if (v.includes('${')) throw new TrafficPolicyError(path, 'CEL interpolation (${…}) is not supported in basic-auth credentials; write the credential itself');
  const colon = v.indexOf(':');
  if (colon < 0) throw new TrafficPolicyError(path, 'must be "username:password": it has no colon');
  const user = v.slice(0, colon);
  const password = v.slice(colon + 1);
  const L = BASIC_AUTH_LIMITS;
  if (user.length === 0) throw new TrafficPolicyError(path, 'the username (before the first colon) must not be empty');
  if (chars(user) > L.usernameChars) throw new TrafficPolicyError(path, `the username must have at most ${L.usernameChars} characters, got ${chars(user)}`);
  if (CONTROL_RE.test(user)) throw new TrafficPolicyError(path, 'the username must not contain control characters (RFC 7617)');
  const n = chars(password);
  if (n < L.passwordMinChars || n > L.passwordMaxChars) throw new TrafficPolicyError(path, `the password (after the first colon) must have ${L.passwordMinChars} to ${L.passwordMaxChars} characters, got ${n}`);
  if (CONTROL_RE.test(password)) throw new TrafficPolicyError(path, 'the password must not contain control characters (RFC 7617)');
  return v;
}

/**
 * `basic-auth` config: `credentials` (1–10 `username:password`, split at the first colon; a
 * non-empty username of at most 128 characters, a password of 8–128), `realm` (default `ngrok`,
 * 1–128 printable ASCII characters) and `enforce` (default true).
 */
export function parseBasicAuthConfig(raw: unknown, path: string, direction: PolicyDirection): BasicAuthAction['config'] {
  inboundOnly('basic-auth', path, direction);
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['credentials', 'realm', 'enforce']);
  const enforce = parseEnforce(c.enforce, at(path, 'enforce'));
  let realm = DEFAULT_BASIC_AUTH_REALM;
  if (c.realm !== undefined && c.realm !== null) {
    const p = at(path, 'realm');
    if (typeof c.realm !== 'string') throw new TrafficPolicyError(p, `must be a string, got ${typeName(c.realm)}`);
    if (c.realm.length === 0) throw new TrafficPolicyError(p, 'must not be empty (leave it out for the default, "ngrok")');
    if (c.realm.length > BASIC_AUTH_LIMITS.realmChars) throw new TrafficPolicyError(p, `must have at most ${BASIC_AUTH_LIMITS.realmChars} characters, got ${chars(c.realm)}`);
    if (!REALM_RE.test(c.realm)) throw new TrafficPolicyError(p, 'must hold printable ASCII characters only');
    realm = c.realm;
  }
  const list = expectList(c.credentials, at(path, 'credentials'), false);
  if (list.length === 0) throw new TrafficPolicyError(at(path, 'credentials'), 'must have at least one "username:password"');
  if (list.length > BASIC_AUTH_LIMITS.maxCredentials)
    throw new TrafficPolicyError(at(path, 'credentials'), `must have at most ${BASIC_AUTH_LIMITS.maxCredentials} credentials, got ${list.length}`);
  const credentials = list.map((e, i) => parseCredential(e, at(at(path, 'credentials'), i)));
  return { enforce, realm, credentials };
}
