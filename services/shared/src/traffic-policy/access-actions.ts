/**
 * Validation of the access-control actions `restrict-ips` and `basic-auth` (the ingress runs
 * them: `services/ingress/src/policy/access-actions.ts`). Semantics follow ngrok's:
 * - https://ngrok.com/docs/traffic-policy/actions/restrict-ips/
 * - https://ngrok.com/docs/traffic-policy/actions/basic-auth/
 *
 * Where Warren differs, the policy is refused with a 400 rather than run differently:
 * - both actions run on `inbound` rules only (the request phase);
 * - CEL interpolation (`${…}`) in CIDRs, IP policy ids and credentials is not supported.
 *
 * `restrict-ips` `ip_policies` (ngrok: "List of IP Policy identifiers to be checked if the
 * source IP is allowed access"; the allowed and denied CIDR sets are built from `allow`/`deny`
 * and the CIDRs of those policies): up to 10 distinct `ipp_…` ids. The syntax is checked here;
 * that each is an IP policy of the route's account is checked when the policy is saved (the
 * control plane, `restrictIpsPolicyRefs`), which also keeps a referenced IP policy from being
 * deleted (409), as for the `ip_restriction` module. The ingress reads the policies' rules from
 * its config, so a rule change applies to live traffic without saving the route again.
 *
 * Error messages never quote a credential: not its password, and not its username either (a
 * credential with no colon may be a bare password).
 */
import { parseCidr } from '../cidr.js';
import { isId } from '../ids.js';
import { at, expectList, expectObj, noUnknownKeys, parseEnforce, phaseKey, TrafficPolicyError, typeName } from './parse.js';
import type { BasicAuthAction, PolicyDirection, RestrictIpsAction, TrafficPolicy } from './types.js';

/** Rules one IP policy may hold (the API refuses the next one: 6701). */
export const IP_POLICY_MAX_RULES = 1000;

export const RESTRICT_IPS_LIMITS = {
  /** CIDRs in `allow` and `deny` together (an IP policy holds at most 1000 rules too). */
  maxCidrs: 1000,
  /**
   * IP policies in `ip_policies` (ngrok documents no bound; this is ours). Each may hold up to
   * `IP_POLICY_MAX_RULES` rules, so one action checks at most 1000 + 10 × 1000 CIDRs.
   */
  maxIpPolicies: 10,
} as const;

/**
 * What one run of `restrict-ips` costs (≈ ns, about twice what was measured: a BlockList check
 * goes through the family's rules one by one, ~7 ns each, after ~2-4 µs of set-up), charged to
 * the policy's total (`parse.ts` `checkCost`): a policy may repeat a long list in many actions.
 * Each IP policy is charged as full (`IP_POLICY_MAX_RULES`): its rules may grow after the
 * traffic policy is saved, without the policy being checked again; and for the up to two more
 * BlockList checks its own sets cost (~70-160 ns each measured, charged 500 ns).
 */
export function restrictIpsCost(c: RestrictIpsAction['config']): number {
  return 6_000 + 15 * restrictIpsMaxCidrs(c) + 1_000 * c.ip_policies.length;
}

/** The most CIDRs one run may check: `allow`, `deny`, and every IP policy at its rule limit. */
export function restrictIpsMaxCidrs(c: RestrictIpsAction['config']): number {
  return c.allow.length + c.deny.length + c.ip_policies.length * IP_POLICY_MAX_RULES;
}

/**
 * Every IP policy id the policy's `restrict-ips` actions name, with its path in the document
 * (`inbound[0].actions[1].config.ip_policies[0]`), in document order.
 */
export function restrictIpsPolicyRefs(policy: TrafficPolicy): { path: string; id: string }[] {
  const refs: { path: string; id: string }[] = [];
  for (const dir of ['inbound', 'outbound'] as const) {
    const phase = phaseKey(policy, dir);
    policy[dir].forEach((rule, i) =>
      rule.actions.forEach((a, j) => {
        if (a.type !== 'restrict-ips') return;
        a.config.ip_policies.forEach((id, k) => refs.push({ path: `${phase}[${i}].actions[${j}].config.ip_policies[${k}]`, id }));
      }),
    );
  }
  return refs;
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

/** `ip_policies`: absent is fine, present must be a non-empty list of distinct IP policy ids. */
function parseIpPolicyIds(v: unknown, path: string): string[] {
  if (v === undefined || v === null) return [];
  const list = expectList(v, path, false);
  if (list.length === 0) throw new TrafficPolicyError(path, 'must have at least one IP policy id (leave the field out instead of giving an empty list)');
  const max = RESTRICT_IPS_LIMITS.maxIpPolicies;
  if (list.length > max) throw new TrafficPolicyError(path, `must have at most ${max} IP policies, got ${list.length}`);
  const seen = new Map<string, number>();
  return list.map((e, i) => {
    const p = at(path, i);
    if (typeof e !== 'string') throw new TrafficPolicyError(p, `must be an IP policy id string, got ${typeName(e)}`);
    if (e.includes('${')) throw new TrafficPolicyError(p, 'CEL interpolation (${…}) is not supported in restrict-ips ip_policies; write the IP policy id itself');
    if (!isId('ipp', e)) throw new TrafficPolicyError(p, `${JSON.stringify(String(e).slice(0, 64))} is not an IP policy id (ipp_ followed by 27 letters and digits)`);
    const earlier = seen.get(e);
    if (earlier !== undefined) throw new TrafficPolicyError(p, `${e} is already listed at ${at(path, earlier)}`);
    seen.set(e, i);
    return e;
  });
}

/**
 * `restrict-ips` config: `enforce` (default true), `allow` and `deny` (CIDRs, IPv4 or IPv6, with
 * a prefix length and no host bits set, as for IP policy rules), `ip_policies` (IP policy ids,
 * whose allow and deny rules add to `allow` and `deny`). At least one CIDR or IP policy in all.
 */
export function parseRestrictIpsConfig(raw: unknown, path: string): RestrictIpsAction['config'] {
  const c = expectObj(raw, path, 'config');
  noUnknownKeys(c, path, ['enforce', 'allow', 'deny', 'ip_policies']);
  const enforce = parseEnforce(c.enforce, at(path, 'enforce'));
  const allow = parseCidrList(c.allow, at(path, 'allow'));
  const deny = parseCidrList(c.deny, at(path, 'deny'));
  const ip_policies = parseIpPolicyIds(c.ip_policies, at(path, 'ip_policies'));
  if (allow.length === 0 && deny.length === 0 && ip_policies.length === 0) throw new TrafficPolicyError(path, 'needs at least one CIDR in allow or deny, or an IP policy in ip_policies');
  if (allow.length + deny.length > RESTRICT_IPS_LIMITS.maxCidrs)
    throw new TrafficPolicyError(path, `allow and deny may hold at most ${RESTRICT_IPS_LIMITS.maxCidrs} CIDRs together, got ${allow.length + deny.length}`);
  const denied = new Map(deny.map((d, i) => [d, i]));
  allow.forEach((a, i) => {
    const j = denied.get(a);
    if (j !== undefined) throw new TrafficPolicyError(at(at(path, 'allow'), i), `${a} is also at ${at(at(path, 'deny'), j)}; a denied CIDR is never allowed, so list it in one of them only`);
  });
  return { enforce, allow, deny, ip_policies };
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
