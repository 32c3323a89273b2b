import * as crypto from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import type { Outcome, RequestState, RouteStage } from '../pipeline/types.js';
import { compileBasicAuth, compileRestrictIps } from './access-actions.js';
import { trafficPolicyStage } from './index.js';
import { CONFIG, deps, EDGE, request, route } from './testing.js';
import { makeConfig } from '../modules/testing.js';
import { headerText, type DataPlaneConfig, type DpIpPolicyRule } from '@warren/shared';

// Counts the constant-time comparisons (the real function still runs).
vi.mock('node:crypto', async (importOriginal) => {
  const m = await importOriginal<typeof import('node:crypto')>();
  return { ...m, timingSafeEqual: vi.fn(m.timingSafeEqual) };
});

function stage(policy: unknown, config: DataPlaneConfig = CONFIG): RouteStage {
  const s = trafficPolicyStage(route(policy), EDGE, config, deps());
  if (!s) throw new Error('no stage');
  return s;
}
const header = (pairs: string[], name: string) => pairs.filter((_, i) => i % 2 === 1 && pairs[i - 1]!.toLowerCase() === name.toLowerCase());
async function run(s: RouteStage, r: RequestState): Promise<Exclude<Outcome, null> | null> {
  return (await s.onRequest!(r)) as Exclude<Outcome, null> | null;
}
/** A rule that copies the restrict-ips results into request headers. */
const showIps = {
  actions: [
    {
      type: 'add-headers',
      config: { headers: { 'x-ip-action': '${actions.ngrok.restrict_ips.action}', 'x-ip-cidr': '${actions.service.restrict_ips.matched_cidr}', 'x-ip-error': '${actions.ngrok.restrict_ips.error.code}' } },
    },
  ],
};
const seen = (r: RequestState) => [header(r.headers, 'x-ip-action')[0], header(r.headers, 'x-ip-cidr')[0]];

describe('restrict-ips', () => {
  const allowOnly = stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: { allow: ['203.0.113.0/24', '2001:db8::/32'] } }] }, showIps] });

  it.each([
    ['203.0.113.7', 'allow', '203.0.113.0/24'],
    ['203.0.113.255', 'allow', '203.0.113.0/24'],
    ['::ffff:203.0.113.9', 'allow', '203.0.113.0/24'],
    ['2001:db8::1', 'allow', '2001:db8::/32'],
    ['2001:DB8:ffff::abcd', 'allow', '2001:db8::/32'],
    ['fe80::1%eth0', 'deny', ''],
    ['203.0.114.1', 'deny', ''],
    ['2001:db9::1', 'deny', ''],
    ['::1', 'deny', ''],
  ])('allow list: %s → %s (%s)', async (ip, action, cidr) => {
    const r = request({ ip });
    const out = await run(allowOnly, r);
    if (action === 'allow') {
      expect(out).toBeNull();
      expect(seen(r)).toEqual([action, cidr]);
    } else {
      expect(out).toMatchObject({ status: 403, headers: { 'warren-error-code': 'ERR_WARREN_7120' } });
      expect(JSON.parse(String(out!.body))).toMatchObject({ error_code: 'ERR_WARREN_7120', status_code: 403 });
      // No later rule ran.
      expect(header(r.headers, 'x-ip-action')).toEqual([]);
      expect((r.vars.actions as { ngrok: { restrict_ips: { action: string } } }).ngrok.restrict_ips.action).toBe('deny');
    }
  });

  it('deny list only: everything else passes; deny wins over an overlapping allow', async () => {
    const denyOnly = stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: { deny: ['198.51.100.0/24', '2001:db8:bad::/48'] } }] }, showIps] });
    expect(await run(denyOnly, request({ ip: '198.51.100.20' }))).toMatchObject({ status: 403 });
    expect(await run(denyOnly, request({ ip: '2001:db8:bad::5' }))).toMatchObject({ status: 403 });
    const ok = request({ ip: '2001:db8:600d::5' });
    expect(await run(denyOnly, ok)).toBeNull();
    expect(seen(ok)).toEqual(['allow', '']);

    const both = stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: { allow: ['10.0.0.0/8', '::/0'], deny: ['10.1.0.0/16', '2001:db8::/32'] } }] }, showIps] });
    expect(await run(both, request({ ip: '10.1.2.3' }))).toMatchObject({ status: 403 });
    expect(await run(both, request({ ip: '2001:db8::77' }))).toMatchObject({ status: 403 });
    expect(await run(both, request({ ip: '11.0.0.1' }))).toMatchObject({ status: 403 });
    const in10 = request({ ip: '10.2.0.1' });
    expect(await run(both, in10)).toBeNull();
    expect(seen(in10)).toEqual(['allow', '10.0.0.0/8']);
    const v6 = request({ ip: '2a00::1' });
    expect(await run(both, v6)).toBeNull();
    expect(seen(v6)).toEqual(['allow', '::/0']);
  });

  it('checks IPv4 clients against IPv4 CIDRs only, IPv6 against IPv6 (::/0 does not cover IPv4)', async () => {
    const noV6 = stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: { deny: ['::/0'] } }] }] });
    expect(await run(noV6, request({ ip: '203.0.113.1' }))).toBeNull();
    expect(await run(noV6, request({ ip: '::ffff:203.0.113.1' }))).toBeNull();
    expect(await run(noV6, request({ ip: '::1' }))).toMatchObject({ status: 403 });
    const noV4 = stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: { deny: ['0.0.0.0/0'] } }] }] });
    expect(await run(noV4, request({ ip: '::ffff:203.0.113.1' }))).toMatchObject({ status: 403 });
    expect(await run(noV4, request({ ip: '2001:db8::1' }))).toBeNull();
    expect(await run(noV4, request({ ip: '::a00:1' }))).toBeNull();
    const v6Only = stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: { allow: ['::/64'] } }] }] });
    expect(await run(v6Only, request({ ip: '10.0.0.1' }))).toMatchObject({ status: 403 });
    expect(await run(v6Only, request({ ip: '::1' }))).toBeNull();
  });

  it('enforce: false only records the result, which later rules read', async () => {
    const s = stage({
      inbound: [
        { actions: [{ type: 'restrict-ips', config: { enforce: false, allow: ['192.0.2.0/24'], deny: ['192.0.2.128/25', '192.0.2.64/26'] } }] },
        showIps,
        { expressions: ["actions.ngrok.restrict_ips.action == 'deny' && req.path == '/strict'"], actions: [{ type: 'deny', config: { status_code: 451 } }] },
      ],
    });
    const outside = request({ ip: '203.0.113.1' });
    expect(await run(s, outside)).toBeNull();
    expect(seen(outside)).toEqual(['deny', '']);
    const denied = request({ ip: '192.0.2.70' });
    expect(await run(s, denied)).toBeNull();
    expect(seen(denied)).toEqual(['deny', '192.0.2.64/26']);
    const allowed = request({ ip: '192.0.2.5' });
    expect(await run(s, allowed)).toBeNull();
    expect(seen(allowed)).toEqual(['allow', '192.0.2.0/24']);
    expect(await run(s, request({ ip: '203.0.113.1', url: '/strict' }))).toMatchObject({ status: 451 });
    expect(await run(s, request({ ip: '192.0.2.5', url: '/strict' }))).toBeNull();
  });

  it('refuses a client address it cannot read (fail closed) and says why', async () => {
    const s = stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: { enforce: false, deny: ['10.0.0.0/8'] } }] }, showIps] });
    const r = request({ ip: 'not-an-ip' });
    expect(await run(s, r)).toBeNull();
    expect(header(r.headers, 'x-ip-action')).toEqual(['deny']);
    expect(header(r.headers, 'x-ip-error')).toEqual(['invalid_client_ip']);
    expect(await run(allowOnly, request({ ip: '' }))).toMatchObject({ status: 403 });
  });

  it('answers browsers with an HTML page', async () => {
    const r = request({ ip: '198.51.100.1' });
    (r.req.headers as Record<string, string>).accept = 'text/html';
    const out = await run(allowOnly, r);
    expect(out).toMatchObject({ status: 403, headers: { 'content-type': 'text/html; charset=utf-8' } });
  });

  it('precompiles the CIDR sets', () => {
    const c = compileRestrictIps({ enforce: true, allow: ['10.0.0.0/8', '2001:db8::/32'], deny: [], ip_policies: [] });
    expect(c.deny).toEqual([]);
    expect(c.allow[0]!.each.map((e) => e.cidr)).toEqual(['10.0.0.0/8', '2001:db8::/32']);
    expect(c.allow[0]!.ipv6!.check('2001:db8::1', 'ipv6')).toBe(true);
    expect(c.allow[0]!.ipv4!.check('2001:db8::1', 'ipv6')).toBe(false);
  });

  it('builds a list repeated in many actions once, and no BlockList per CIDR until matched_cidr is read (review)', async () => {
    // YAML aliases let 20 KB of policy repeat a 1000-CIDR list in 100 actions: one BlockList per
    // CIDR and per action took ~1 s and ~120 MB to compile on every ingress node.
    const cidrs = Array.from({ length: 1000 }, (_, i) => `10.${i >> 8}.${i & 255}.0/24`);
    const a = compileRestrictIps({ enforce: true, allow: [], deny: cidrs, ip_policies: [] });
    const b = compileRestrictIps({ enforce: false, allow: [], deny: [...cidrs], ip_policies: [] });
    expect(b.deny[0]).toBe(a.deny[0]);
    expect(a.deny[0]!.each.every((e) => e.list === null)).toBe(true);
    const s = stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: { enforce: false, deny: cidrs } }] }, showIps] });
    const r = request({ ip: '10.3.231.9' });
    expect(await run(s, r)).toBeNull();
    expect(seen(r)).toEqual(['deny', '10.3.231.0/24']);
  });
});

describe('restrict-ips with ip_policies', () => {
  const OFFICE = 'ipp_2qT9aaaaaaaaaaaaaaaaaaaaaaa';
  const BLOCKED = 'ipp_2qT9bbbbbbbbbbbbbbbbbbbbbbb';
  const OTHER = 'ipp_2qT9ccccccccccccccccccccccc';
  const rule = (cidr: string, action: 'allow' | 'deny'): DpIpPolicyRule => ({ id: `ipr_${cidr}`, cidr, action });
  const config = (office = [rule('203.0.113.0/24', 'allow'), rule('2001:db8::/32', 'allow'), rule('203.0.113.128/25', 'deny')]) =>
    makeConfig({
      ipPolicies: [
        { id: OFFICE, accountId: 'ac_1', rules: office },
        { id: BLOCKED, accountId: 'ac_1', rules: [rule('198.51.100.0/24', 'deny')] },
        { id: OTHER, accountId: 'ac_2', rules: [rule('0.0.0.0/0', 'allow')] },
      ],
    });
  const withPolicies = (cfg: DataPlaneConfig, restrict: Record<string, unknown>) => stage({ inbound: [{ actions: [{ type: 'restrict-ips', config: restrict }] }] }, cfg);
  /** What the stage answered `ip` (200: it went on), and restrict-ips' action and matched_cidr. */
  async function decision(s: RouteStage, ip: string): Promise<[number, string, string]> {
    const r = request({ ip });
    const out = await run(s, r);
    const v = (r.vars.actions as { ngrok: { restrict_ips: { action: string; matched_cidr: string } } }).ngrok.restrict_ips;
    return [out?.status ?? 200, v.action, v.matched_cidr];
  }

  it("adds the policies' allow and deny rules to the inline CIDRs (deny wins)", async () => {
    const s = withPolicies(config(), { allow: ['192.0.2.0/24'], ip_policies: [OFFICE, BLOCKED] });
    expect(await decision(s, '203.0.113.7')).toEqual([200, 'allow', '203.0.113.0/24']);
    expect(await decision(s, '192.0.2.9')).toEqual([200, 'allow', '192.0.2.0/24']);
    expect(await decision(s, '2001:db8::5')).toEqual([200, 'allow', '2001:db8::/32']);
    expect(await decision(s, '203.0.113.200')).toEqual([403, 'deny', '203.0.113.128/25']);
    expect(await decision(s, '198.51.100.1')).toEqual([403, 'deny', '198.51.100.0/24']);
    expect(await decision(s, '10.0.0.1')).toEqual([403, 'deny', '']);
  });

  it('in the response phase: the policies resolve there too, and a refusal replaces the response', async () => {
    const s = stage({ outbound: [{ actions: [{ type: 'restrict-ips', config: { ip_policies: [BLOCKED] } }] }] }, config());
    const respond = async (ip: string) => {
      const r = request({ ip });
      const out = (await s.onResponse!(r, { status: 200, headers: ['content-type', 'text/plain'] })) as Exclude<Outcome, null> | null;
      return [out?.status ?? 200, (r.vars.actions as { ngrok: { restrict_ips: { action: string } } }).ngrok.restrict_ips.action];
    };
    expect(await respond('198.51.100.9')).toEqual([403, 'deny']);
    expect(await respond('203.0.113.7')).toEqual([200, 'allow']);
  });

  it('with only deny rules everyone else passes; a policy with no rules adds nothing', async () => {
    const denyOnly = withPolicies(config(), { ip_policies: [BLOCKED] });
    expect(await decision(denyOnly, '198.51.100.77')).toEqual([403, 'deny', '198.51.100.0/24']);
    expect(await decision(denyOnly, '203.0.113.7')).toEqual([200, 'allow', '']);
    expect(await decision(withPolicies(config([]), { ip_policies: [OFFICE] }), '203.0.113.7')).toEqual([200, 'allow', '']);
  });

  it('reads the rules of the config being compiled: a new version with a changed rule changes the decision', async () => {
    const before = withPolicies(config(), { ip_policies: [OFFICE] });
    const after = withPolicies(config([rule('10.0.0.0/8', 'allow')]), { ip_policies: [OFFICE] });
    expect((await decision(before, '10.1.2.3'))[0]).toBe(403);
    expect(await decision(after, '10.1.2.3')).toEqual([200, 'allow', '10.0.0.0/8']);
    expect((await decision(after, '203.0.113.7'))[0]).toBe(403);
  });

  it("refuses to compile (the route answers 503) a policy it does not hold, or another account's", () => {
    expect(() => withPolicies(config(), { ip_policies: [OTHER] })).toThrow(`restrict-ips: IP policy ${OTHER} is not in this ingress's configuration`);
    expect(() => withPolicies(config(), { ip_policies: ['ipp_2qT9ddddddddddddddddddddddd'] })).toThrow('is not in this ingress');
    expect(() => compileRestrictIps({ enforce: true, allow: [], deny: [], ip_policies: [OFFICE] })).toThrow('is not in this ingress');
  });

  it("builds an IP policy's sets once per change of its rules, however many actions and config versions use it", () => {
    const office = [rule('10.0.0.0/8', 'deny'), rule('2001:db8::/32', 'allow')];
    const lookup = (rules: DpIpPolicyRule[]) => (id: string) => (id === OFFICE ? rules : undefined);
    const a = compileRestrictIps({ enforce: true, allow: ['192.0.2.0/24'], deny: [], ip_policies: [OFFICE] }, lookup(office));
    expect(a.allow.map((set) => set.each.map((e) => e.cidr))).toEqual([['192.0.2.0/24'], ['2001:db8::/32']]);
    expect(a.deny.map((set) => set.each.map((e) => e.cidr))).toEqual([['10.0.0.0/8']]);
    // Another action, or the next version holding the same (unchanged) policy: the same sets.
    const b = compileRestrictIps({ enforce: false, allow: [], deny: ['198.51.100.0/24'], ip_policies: [OFFICE] }, lookup(office));
    expect(b.allow[0]).toBe(a.allow[1]);
    expect(b.deny[1]).toBe(a.deny[0]);
    // A changed rule: that policy's sets are new.
    const changed = compileRestrictIps({ enforce: true, allow: [], deny: [], ip_policies: [OFFICE] }, lookup([office[0]!, rule('2001:db9::/32', 'allow')]));
    expect(changed.deny[0]).toBe(a.deny[0]); // same CIDRs: found by content
    expect(changed.allow[0]).not.toBe(a.allow[1]);
    // Two policies with the same CIDRs share a set; it is checked once.
    const twice = compileRestrictIps({ enforce: true, allow: [], deny: [], ip_policies: [OFFICE, BLOCKED] }, (id) => (id === OFFICE || id === BLOCKED ? office.map((r) => ({ ...r })) : undefined));
    expect([twice.allow.length, twice.deny.length]).toEqual([1, 1]);
  });
});

const SECRET = 'correct horse battery';
const basic = (userPass: string, scheme = 'Basic') => `${scheme} ${Buffer.from(userPass, 'utf8').toString('base64')}`;
const withAuth = (...values: string[]) => request({ headers: ['Host', 'app.example.com', ...values.flatMap((v) => ['Authorization', v])] });
const showAuth = {
  actions: [
    {
      type: 'add-headers',
      config: {
        headers: {
          'x-auth': '${actions.ngrok.basic_auth.credentials.presented}/${actions.ngrok.basic_auth.credentials.authorized}',
          'x-auth-user': '${actions.service.basic_auth.credentials.username}',
        },
      },
    },
  ],
};
// Header values are sent as UTF-8 bytes, one character per byte: read back as text.
const authSeen = (r: RequestState) => [header(r.headers, 'x-auth')[0], headerText(header(r.headers, 'x-auth-user')[0] ?? '')];

describe('basic-auth', () => {
  const s = stage({ inbound: [{ actions: [{ type: 'basic-auth', config: { realm: 'Staff "only" \\ area', credentials: ['alice:' + SECRET, 'bob:pass:with:colons', 'zoë:pässwörd-ü'] } }] }, showAuth] });

  it('admits valid credentials and leaves the Authorization header for the upstream', async () => {
    for (const [cred, user] of [
      [`alice:${SECRET}`, 'alice'],
      ['bob:pass:with:colons', 'bob'],
      ['zoë:pässwörd-ü', 'zoë'],
    ] as const) {
      const r = withAuth(basic(cred));
      expect(await run(s, r)).toBeNull();
      expect(authSeen(r)).toEqual(['true/true', user]);
      expect(header(r.headers, 'authorization')).toEqual([basic(cred)]);
    }
    // The scheme is case-insensitive; padding may be left out; spaces around are fine.
    expect(await run(s, withAuth(basic(`alice:${SECRET}`, 'bAsIc')))).toBeNull();
    expect(await run(s, withAuth(`Basic   ${Buffer.from(`alice:${SECRET}`).toString('base64').replace(/=+$/, '')}  `))).toBeNull();
  });

  it.each([
    ['no header', [], 'false/false', ''],
    ['a wrong password', [basic('alice:wrong-password')], 'true/false', 'alice'],
    ['a wrong user', [basic(`mallory:${SECRET}`)], 'true/false', 'mallory'],
    ['a password that is a prefix', [basic(`alice:${SECRET.slice(0, -1)}`)], 'true/false', 'alice'],
    ['another pair’s password', [basic('alice:pass:with:colons')], 'true/false', 'alice'],
    ['the user only', [basic('alice')], 'false/false', ''],
    ['another scheme', [`Bearer ${Buffer.from(`alice:${SECRET}`).toString('base64')}`], 'false/false', ''],
    ['bad base64', ['Basic !!!!'], 'false/false', ''],
    ['two headers, one valid', [basic(`alice:${SECRET}`), basic('x:y')], 'false/false', ''],
    ['latin-1 instead of UTF-8', [`Basic ${Buffer.from('zoë:pässwörd-ü', 'latin1').toString('base64')}`], 'true/false', 'zo\ufffd'],
  ])('refuses %s with 401 and the challenge', async (_what, values, flags, user) => {
    const r = withAuth(...values);
    const out = await run(s, r);
    expect(out).toMatchObject({ status: 401, headers: { 'www-authenticate': 'Basic realm="Staff \\"only\\" \\\\ area"', 'warren-error-code': 'ERR_WARREN_7121', 'cache-control': 'no-store' } });
    expect(String(out!.body)).not.toContain(SECRET);
    expect(header(r.headers, 'x-auth')).toEqual([]);
    const vars = (r.vars.actions as { ngrok: { basic_auth: { credentials: { presented: boolean; authorized: boolean; username: string } } } }).ngrok.basic_auth.credentials;
    expect([`${vars.presented}/${vars.authorized}`, vars.username]).toEqual([flags, user]);
  });

  it('defaults the realm to ngrok', async () => {
    const d = stage({ inbound: [{ actions: [{ type: 'basic-auth', config: { credentials: ['u:12345678'] } }] }] });
    expect(await run(d, request())).toMatchObject({ status: 401, headers: { 'www-authenticate': 'Basic realm="ngrok"' } });
  });

  it('sees an Authorization header set by an earlier action', async () => {
    const d = stage({ inbound: [{ actions: [{ type: 'add-headers', config: { headers: { authorization: basic('u:12345678') } } }, { type: 'basic-auth', config: { credentials: ['u:12345678'] } }] }] });
    expect(await run(d, request())).toBeNull();
  });

  it('enforce: false lets every request through with the results set, for a later rule (IP or password)', async () => {
    const d = stage({
      inbound: [
        { actions: [{ type: 'restrict-ips', config: { enforce: false, allow: ['10.0.0.0/8'] } }, { type: 'basic-auth', config: { enforce: false, credentials: [`alice:${SECRET}`] } }] },
        showAuth,
        { expressions: ["actions.ngrok.restrict_ips.action == 'deny' && !actions.ngrok.basic_auth.credentials.authorized"], actions: [{ type: 'deny', config: { status_code: 403 } }] },
      ],
    });
    expect(await run(d, request({ ip: '10.9.9.9' }))).toBeNull();
    const pw = request({ ip: '203.0.113.1', headers: ['Host', 'app.example.com', 'Authorization', basic(`alice:${SECRET}`)] });
    expect(await run(d, pw)).toBeNull();
    expect(authSeen(pw)).toEqual(['true/true', 'alice']);
    const bad = request({ ip: '203.0.113.1', headers: ['Host', 'app.example.com', 'Authorization', basic('alice:nope-nope')] });
    expect(await run(d, bad)).toMatchObject({ status: 403 });
  });

  it('compares against every credential in constant time, and keeps only digests', async () => {
    const cmp = vi.mocked(crypto.timingSafeEqual);
    cmp.mockClear();
    expect(await run(s, withAuth(basic(`alice:${SECRET}`)))).toBeNull();
    // The first credential matched, and all three were still compared.
    expect(cmp).toHaveBeenCalledTimes(3);
    cmp.mockClear();
    await run(s, withAuth(basic('nobody:whatever-1')));
    expect(cmp).toHaveBeenCalledTimes(3);
    cmp.mockClear();
    await run(s, request());
    expect(cmp).not.toHaveBeenCalled();

    const c = compileBasicAuth({ enforce: true, realm: 'r', credentials: [`alice:${SECRET}`] });
    expect(c.digests).toEqual([crypto.createHash('sha256').update(`alice:${SECRET}`).digest()]);
    expect(JSON.stringify(c)).not.toContain('horse');
  });
});
