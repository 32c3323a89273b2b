import { BlockList, isIPv4, isIPv6 } from 'node:net';
import { matchableCidr, normalizeIp } from '@warren/shared';
import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule, moduleError } from './common.js';

/**
 * `ip_restriction`: the route's IP policies (`route.ipPolicyIds` → `config.ipPolicies`), ngrok
 * semantics over the rules of all of them together: a client matching any deny rule is refused;
 * when there is at least one allow rule, a client matching none is refused; otherwise it passes.
 * IPv4-mapped IPv6 clients (`::ffff:a.b.c.d`) are checked as the IPv4 address, and rules written as
 * IPv4-mapped networks (`::ffff:10.0.0.0/104`) as the IPv4 network they map. A policy id the
 * config does not hold (or of another account) contributes no rules. Refusals: 403, 7100.
 */

/**
 * Rules kept apart by address family: a BlockList checks an IPv4 address against its IPv6
 * subnets too (as `::ffff:a.b.c.d`), so one shared list would let `::/0` refuse every IPv4 client.
 */
interface Rules {
  deny: { ipv4: BlockList; ipv6: BlockList };
  allow: { ipv4: BlockList; ipv6: BlockList };
  hasAllow: boolean;
}

/** The BlockList family a rule's CIDR goes to (IPv4-mapped IPv6 networks are IPv4: see {@link matchableCidr}). */
export const familyOf = (cidr: string): 'ipv4' | 'ipv6' => matchableCidr(cidr)?.type ?? (cidr.includes(':') ? 'ipv6' : 'ipv4');

/**
 * Adds `cidr` (`a.b.c.d/n`, `x::y/n`, or a bare address) to `list`, the list of its
 * {@link familyOf}; throws on anything else. Also used by the traffic-policy `restrict-ips` action.
 */
export function addCidr(list: BlockList, cidr: string): void {
  const c = matchableCidr(cidr);
  if (!c) {
    const slash = cidr.indexOf('/');
    const addr = slash < 0 ? cidr : cidr.slice(0, slash);
    if (!isIPv4(addr) && !isIPv6(addr)) throw new Error(`ip_restriction: ${JSON.stringify(cidr)} is not an IPv4 or IPv6 CIDR`);
    throw new Error(`ip_restriction: ${JSON.stringify(cidr)} has a bad prefix length`);
  }
  list.addSubnet(c.addr, c.prefix, c.type);
}

/** The address family and canonical text to check a client address as, or null when it is not an IP. */
export const normalizeClientIp = normalizeIp;

/** True when the rules admit `ip`. */
export function ipAllowed(rules: Rules, ip: string): boolean {
  const n = normalizeClientIp(ip);
  if (!n) return false;
  if (rules.deny[n.type].check(n.addr, n.type)) return false;
  return !rules.hasAllow || rules.allow[n.type].check(n.addr, n.type);
}

export const ipRestrictionStage: StageFactory = (route, _edge, config, deps): RouteStage | null => {
  if (!enabledModule(route, 'ip_restriction')) return null;
  const rules: Rules = { deny: { ipv4: new BlockList(), ipv6: new BlockList() }, allow: { ipv4: new BlockList(), ipv6: new BlockList() }, hasAllow: false };
  for (const id of route.ipPolicyIds) {
    const policy = config.ipPolicies.get(id);
    if (!policy || policy.accountId !== route.accountId) {
      deps.log.warn({ routeId: route.id, ipPolicyId: id }, 'ip_restriction: IP policy not in the configuration; it adds no rules');
      continue;
    }
    for (const rule of policy.rules) {
      if (rule.action === 'allow') {
        addCidr(rules.allow[familyOf(rule.cidr)], rule.cidr);
        rules.hasAllow = true;
      } else addCidr(rules.deny[familyOf(rule.cidr)], rule.cidr);
    }
  }
  return {
    name: 'ip_restriction',
    onRequest: (s) => (ipAllowed(rules, s.clientIp) ? null : moduleError(s, 7100)),
  };
};
