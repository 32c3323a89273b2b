import { describe, expect, it } from 'vitest';
import type { DpIpPolicy } from '@warren/shared';
import { ipRestrictionStage } from './ip-restriction.js';
import { ACCOUNT, makeConfig, makeRoute, makeState, testDeps, makeEdge } from './testing.js';

function policy(id: string, rules: Array<[string, 'allow' | 'deny']>, accountId = ACCOUNT): DpIpPolicy {
  return { id, accountId, rules: rules.map(([cidr, action], i) => ({ id: `ipr_${id}_${i}`, cidr, action })) };
}

function stage(ids: string[], policies: DpIpPolicy[], enabled = true) {
  const route = makeRoute({ ip_restriction: { enabled, ip_policy_ids: ids } });
  return ipRestrictionStage(route, makeEdge(), makeConfig({ ipPolicies: policies }), testDeps());
}

async function status(ids: string[], policies: DpIpPolicy[], clientIp: string): Promise<number> {
  const s = stage(ids, policies)!;
  const out = await s.onRequest!(makeState({ clientIp }));
  return out ? out.status : 200;
}

describe('ip_restriction', () => {
  it('is absent when the module is missing or disabled', () => {
    expect(ipRestrictionStage(makeRoute({}), makeEdge(), makeConfig(), testDeps())).toBeNull();
    expect(stage(['ipp_a'], [policy('ipp_a', [['10.0.0.0/8', 'allow']])], false)).toBeNull();
  });

  it('admits only allowed IPv4 clients when there are allow rules', async () => {
    const p = [policy('ipp_a', [['10.0.0.0/8', 'allow'], ['192.0.2.1/32', 'allow']])];
    expect(await status(['ipp_a'], p, '10.1.2.3')).toBe(200);
    expect(await status(['ipp_a'], p, '192.0.2.1')).toBe(200);
    expect(await status(['ipp_a'], p, '192.0.2.2')).toBe(403);
    expect(await status(['ipp_a'], p, '2001:db8::1')).toBe(403);
  });

  it('deny wins over allow, across policies', async () => {
    const p = [policy('ipp_a', [['10.0.0.0/8', 'allow']]), policy('ipp_b', [['10.9.0.0/16', 'deny']])];
    expect(await status(['ipp_a', 'ipp_b'], p, '10.1.0.1')).toBe(200);
    expect(await status(['ipp_a', 'ipp_b'], p, '10.9.0.1')).toBe(403);
  });

  it('with only deny rules, everything else passes', async () => {
    const p = [policy('ipp_a', [['203.0.113.0/24', 'deny'], ['2001:db8::/32', 'deny']])];
    expect(await status(['ipp_a'], p, '203.0.113.9')).toBe(403);
    expect(await status(['ipp_a'], p, '198.51.100.1')).toBe(200);
    expect(await status(['ipp_a'], p, '2001:db8:1::5')).toBe(403);
    expect(await status(['ipp_a'], p, '2001:db9::5')).toBe(200);
  });

  it('keeps address families apart: IPv6 rules never match an IPv4 client (a BlockList alone would)', async () => {
    const denyAll6 = [policy('ipp_a', [['::/0', 'deny']])];
    expect(await status(['ipp_a'], denyAll6, '10.0.0.1')).toBe(200);
    expect(await status(['ipp_a'], denyAll6, '::ffff:10.0.0.1')).toBe(200);
    expect(await status(['ipp_a'], denyAll6, '2001:db8::1')).toBe(403);
    const deny6 = [policy('ipp_a', [['::/64', 'deny']])];
    expect(await status(['ipp_a'], deny6, '::ffff:10.0.0.1')).toBe(200);
  });

  it('matches rules written as IPv4-mapped IPv6 networks as the IPv4 networks they map (as Go and inCidrRange do)', async () => {
    // Mapped clients are checked as IPv4, so such a rule kept as IPv6 would silently match nothing.
    const allowMapped = [policy('ipp_a', [['::ffff:0:0/96', 'allow']])];
    expect(await status(['ipp_a'], allowMapped, '10.0.0.1')).toBe(200);
    expect(await status(['ipp_a'], allowMapped, '::ffff:10.0.0.1')).toBe(200);
    expect(await status(['ipp_a'], allowMapped, '2001:db8::1')).toBe(403);
    const denyOne = [policy('ipp_a', [['::ffff:127.0.0.1/128', 'deny']])];
    expect(await status(['ipp_a'], denyOne, '127.0.0.1')).toBe(403);
    expect(await status(['ipp_a'], denyOne, '::ffff:127.0.0.1')).toBe(403);
    expect(await status(['ipp_a'], denyOne, '127.0.0.2')).toBe(200);
    const denyHex = [policy('ipp_a', [['::ffff:a00:0/104', 'deny']])]; // 10.0.0.0/8 in hex groups
    expect(await status(['ipp_a'], denyHex, '10.9.8.7')).toBe(403);
    expect(await status(['ipp_a'], denyHex, '11.0.0.1')).toBe(200);
  });

  it('matches IPv6 allow rules', async () => {
    const p = [policy('ipp_a', [['2001:db8:abcd::/48', 'allow']])];
    expect(await status(['ipp_a'], p, '2001:db8:abcd:12::1')).toBe(200);
    expect(await status(['ipp_a'], p, '2001:db8:abce::1')).toBe(403);
    expect(await status(['ipp_a'], p, '10.0.0.1')).toBe(403);
  });

  it('checks IPv4-mapped IPv6 clients against IPv4 rules', async () => {
    const allow = [policy('ipp_a', [['10.0.0.0/8', 'allow']])];
    expect(await status(['ipp_a'], allow, '::ffff:10.2.3.4')).toBe(200);
    expect(await status(['ipp_a'], allow, '::FFFF:11.2.3.4')).toBe(403);
    const deny = [policy('ipp_a', [['10.0.0.0/8', 'deny']])];
    expect(await status(['ipp_a'], deny, '::ffff:10.2.3.4')).toBe(403);
  });

  it('answers 403 with a JSON error body', async () => {
    const s = stage(['ipp_a'], [policy('ipp_a', [['10.0.0.0/8', 'allow']])])!;
    const out = (await s.onRequest!(makeState({ clientIp: '1.2.3.4' })))!;
    expect(out.status).toBe(403);
    expect(out.headers!['warren-error-code']).toBe('ERR_WARREN_7100');
    expect(JSON.parse(String(out.body))).toMatchObject({ error_code: 'ERR_WARREN_7100', status_code: 403 });
  });

  it('ignores missing policies and policies of other accounts', async () => {
    const p = [policy('ipp_b', [['0.0.0.0/0', 'deny']], 'acc_other')];
    expect(await status(['ipp_a', 'ipp_b'], p, '1.2.3.4')).toBe(200);
  });

  it('refuses a malformed CIDR at build time', () => {
    expect(() => stage(['ipp_a'], [policy('ipp_a', [['nonsense/8', 'allow']])])).toThrow(/CIDR/);
  });
});
