import { describe, expect, it } from 'vitest';
import pino from 'pino';
import type { DataPlaneConfig, DpIpPolicy } from '@warren/shared';
import { parseBindTrafficPolicy, type BindTrafficPolicy } from '../agents/requests.js';
import { compileEndpointPolicy, recompileEndpointPolicies, type EndpointPolicy } from './endpoint.js';
import { FakeLimiter, deps, request } from './testing.js';

const IPP_OURS = `ipp_${'a'.repeat(27)}`;
const IPP_THEIRS = `ipp_${'b'.repeat(27)}`;

function policy(text: string): BindTrafficPolicy {
  const r = parseBindTrafficPolicy({ TrafficPolicy: text });
  if (!r.ok || !r.value) throw new Error(r.ok ? 'no rules' : r.error);
  return r.value;
}

function config(ipPolicies: DpIpPolicy[] = []): DataPlaneConfig {
  return { ipPolicies: new Map(ipPolicies.map((p) => [p.id, p])) } as unknown as DataPlaneConfig;
}

const RATE_LIMIT = 'on_http_request:\n  - actions:\n      - type: rate-limit\n        config: { name: rl, algorithm: sliding_window, capacity: 1, rate: 60s, bucket_key: [conn.client_ip] }\n';
const restrict = (id: string) => `on_http_request:\n  - actions:\n      - type: restrict-ips\n        config: { ip_policies: [${id}] }\n`;

describe('endpoint traffic policies', () => {
  it('run under a synthetic edge and route of the tunnel: rate-limit buckets per endpoint', async () => {
    const limiter = new FakeLimiter();
    const d = deps(limiter);
    const one = compileEndpointPolicy({ tunnelId: 'tn_1', accountId: 'ac_1', hostname: 'one.test', policy: policy(RATE_LIMIT) }, config(), d);
    const two = compileEndpointPolicy({ tunnelId: 'tn_2', accountId: 'ac_2', hostname: 'two.test', policy: policy(RATE_LIMIT) }, config(), d);
    if (!one.ok || !two.ok) throw new Error('not compiled');
    expect(one.value.cr.edge).toMatchObject({ id: 'tn_1', accountId: 'ac_1', hostports: ['one.test:443'], mutualTls: null, tlsTermination: null });
    expect(one.value.cr.route).toMatchObject({ id: 'tn_1', accountId: 'ac_1', modules: {}, backendId: null });
    expect(one.value.cr.backend).toBeNull();
    const run = (ep: EndpointPolicy) => ep.cr.pipeline!.onRequest({ ...request({ host: ep.request.hostname }), edge: ep.cr.edge, route: ep.cr.route });
    expect(await run(one.value)).toBeNull();
    expect((await run(one.value))?.status).toBe(429);
    // Same rule, same client, another endpoint: its own bucket.
    expect(await run(two.value)).toBeNull();
    const keys = new Set(limiter.calls.map((c) => c.key));
    expect(keys.size).toBe(2);
    expect([...keys].every((k) => k.includes('tn_1') || k.includes('tn_2'))).toBe(true);
  });

  it("resolve restrict-ips ip_policies to the tunnel's account's only; refuse the Bind otherwise", async () => {
    const cfg = config([
      { id: IPP_OURS, accountId: 'ac_1', rules: [{ id: 'ipr_1', cidr: '203.0.113.0/24', action: 'deny' }] },
      { id: IPP_THEIRS, accountId: 'ac_2', rules: [] },
    ]);
    const ours = compileEndpointPolicy({ tunnelId: 'tn_1', accountId: 'ac_1', hostname: 'one.test', policy: policy(restrict(IPP_OURS)) }, cfg, deps());
    expect(ours.ok).toBe(true);
    if (ours.ok) expect((await ours.value.cr.pipeline!.onRequest(request()))?.status).toBe(403);
    for (const id of [IPP_THEIRS, `ipp_${'c'.repeat(27)}`]) {
      const r = compileEndpointPolicy({ tunnelId: 'tn_1', accountId: 'ac_1', hostname: 'one.test', policy: policy(restrict(id)) }, cfg, deps());
      expect(r).toEqual({ ok: false, error: `invalid traffic policy (Bind Opts.TrafficPolicy): on_http_request[0].actions[0].config.ip_policies[0]: no IP policy with id "${id}" in this account (ERR_WARREN_3002)` });
    }
    expect(compileEndpointPolicy({ tunnelId: 'tn_1', accountId: 'ac_1', hostname: 'one.test', policy: policy(RATE_LIMIT) }, null, deps())).toMatchObject({ ok: false, error: /ERR_WARREN_7008/ });
  });

  it('follow config changes when they name IP policies; fail closed when one is gone', async () => {
    const log = pino({ level: 'silent' });
    const cfg = (rules: DpIpPolicy['rules']) => config([{ id: IPP_OURS, accountId: 'ac_1', rules }]);
    const ips = compileEndpointPolicy({ tunnelId: 'tn_1', accountId: 'ac_1', hostname: 'one.test', policy: policy(restrict(IPP_OURS)) }, cfg([]), deps());
    const plain = compileEndpointPolicy({ tunnelId: 'tn_2', accountId: 'ac_1', hostname: 'two.test', policy: policy(RATE_LIMIT) }, cfg([]), deps());
    if (!ips.ok || !plain.ok) throw new Error('not compiled');
    expect(await ips.value.cr.pipeline!.onRequest(request())).toBeNull();
    const plainCr = plain.value.cr;
    expect(recompileEndpointPolicies([ips.value, plain.value], cfg([{ id: 'ipr_1', cidr: '203.0.113.0/24', action: 'deny' }]), deps(), log)).toEqual([]);
    expect((await ips.value.cr.pipeline!.onRequest(request()))?.status).toBe(403);
    expect(plain.value.cr).toBe(plainCr); // names nothing of the config: left as it was
    // A change that leaves its IP policies as they were (another account's, another policy) recompiles nothing.
    const ipsCr = ips.value.cr;
    recompileEndpointPolicies([ips.value], config([{ id: IPP_OURS, accountId: 'ac_1', rules: [{ id: 'ipr_1', cidr: '203.0.113.0/24', action: 'deny' }] }, { id: IPP_THEIRS, accountId: 'ac_2', rules: [] }]), deps(), log);
    expect(ips.value.cr).toBe(ipsCr);
    // Reported to the caller, which stops the tunnel (StopTunnel): the API removed what it depends on.
    expect(recompileEndpointPolicies([ips.value], config(), deps(), log)).toEqual([{ tunnelId: 'tn_1', message: expect.stringMatching(new RegExp(IPP_OURS)) }]);
    const gone = await ips.value.cr.pipeline!.onRequest(request());
    expect(gone?.status).toBe(503);
    expect(String(gone?.body)).toMatch(/traffic policy cannot be applied/);
  });
});
