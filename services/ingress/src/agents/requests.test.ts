import { describe, expect, it } from 'vitest';
import { aclAllowsHostname, aclAllowsLabels } from './acl.js';
import { MAX_TRAFFIC_POLICY_BYTES } from '@warren/shared';
import { parseAuth, parseBind, parseBindTrafficPolicy, parseLabelTunnel, unsupportedOpts } from './requests.js';

/** Bind Opts exactly as @ngrok/ngrok 1.7.0 sends them for httpEndpoint().domain('app.test'). */
const SDK_OPTS = {
  Domain: 'app.test', Hostname: '', Auth: '', Subdomain: '', HostHeaderRewrite: false, LocalUrlScheme: null, ProxyProto: 0,
  Compression: null, CircuitBreaker: null, IPRestriction: null, BasicAuth: null, OAuth: null, OIDC: null, WebhookVerification: null,
  MutualTLSCA: null, RequestHeaders: null, ResponseHeaders: null, WebsocketTCPConverter: null, UserAgentFilter: null, TrafficPolicy: null,
};
const bind = (over: Record<string, unknown> = {}, opts: Record<string, unknown> = {}, extra: Record<string, unknown> = {}) => ({
  Id: '', Proto: 'https', ForwardsTo: 'http://localhost:8080/', ForwardsProto: '', Opts: { ...SDK_OPTS, ...opts }, Extra: { Token: '', IPPolicyRef: '', Metadata: '', Bindings: [], PoolingEnabled: false, ...extra }, ...over,
});

describe('parseBind', () => {
  it("accepts the SDK's default options and echoes them", () => {
    const r = parseBind(bind(), 'warren.localhost');
    expect(r).toEqual({ ok: true, value: { id: '', proto: 'https', hostname: 'app.test', forwardsTo: 'http://localhost:8080/', metadata: '', token: '', bindings: [], poolingEnabled: false, trafficPolicy: null, opts: SDK_OPTS } });
  });

  it.each([
    ['OAuth', { Provider: 'google' }],
    ['IPRestriction', { allow_cidrs: ['10.0.0.0/8'] }],
    ['BasicAuth', { credentials: [{ username: 'u', cleartext_password: 'p' }] }],
    ['Compression', {}],
    ['Auth', 'user:pass'],
    ['HostHeaderRewrite', true],
    ['ProxyProto', 2],
    ['SomethingNew', 'x'],
  ])('refuses the %s module rather than ignoring it', (field, value) => {
    const r = parseBind(bind({}, { [field]: value }), 'warren.localhost');
    expect(r).toEqual({ ok: false, error: `endpoint option ${field} is not supported by this server; remove it (ERR_WARREN_2104)` });
  });

  it('refuses an IP policy reference, tcp/tls, wildcard and malformed domains, unknown bindings', () => {
    expect(parseBind(bind({}, {}, { IPPolicyRef: 'ipp_1' }), 'd').ok).toBe(false);
    expect(parseBind(bind({ Proto: 'tcp' }), 'd')).toMatchObject({ ok: false, error: /tcp endpoints are not supported/ });
    expect(parseBind(bind({}, { Domain: '*.app.test' }), 'd')).toMatchObject({ ok: false, error: /wildcard/ });
    expect(parseBind(bind({}, { Domain: 'app.test:8443' }), 'd')).toMatchObject({ ok: false, error: /invalid domain/ });
    expect(parseBind(bind({}, {}, { Bindings: ['public', 'internal'] }), 'd')).toMatchObject({ ok: false });
    expect(parseBind('nope', 'd').ok).toBe(false);
  });

  it('derives the hostname: Domain, else Hostname, else Subdomain or a random name under the default domain', () => {
    const host = (opts: Record<string, unknown>) => (parseBind(bind({}, opts), 'warren.localhost') as { value: { hostname: string } }).value.hostname;
    expect(host({ Domain: 'App.Test.' })).toBe('app.test');
    expect(host({ Domain: '', Hostname: 'h.test' })).toBe('h.test');
    expect(host({ Domain: '', Subdomain: 'blue' })).toBe('blue.warren.localhost');
    expect(host({ Domain: '' })).toMatch(/^[0-9a-f]{12}\.warren\.localhost$/);
  });

  it('reads Bindings, pooling, the resume token and metadata', () => {
    const r = parseBind(bind({ Id: 'tn_x' }, {}, { Bindings: ['Internal'], PoolingEnabled: true, Token: 't', Metadata: 'm' }), 'd');
    expect(r).toMatchObject({ ok: true, value: { id: 'tn_x', bindings: ['internal'], poolingEnabled: true, token: 't', metadata: 'm' } });
  });

  it('lists unsupported options sorted', () => {
    expect(unsupportedOpts({ OIDC: {}, BasicAuth: {}, Domain: 'x', LocalUrlScheme: 'http', CircuitBreaker: null })).toEqual(['BasicAuth', 'OIDC']);
  });
});

describe('Bind Opts.TrafficPolicy (the SDK traffic_policy option)', () => {
  const YAML = `on_http_request:
  - expressions: ["req.url.path.startsWith('/admin')"]
    actions:
      - type: deny
        config: { status_code: 403 }
on_http_response:
  - actions:
      - type: add-headers
        config: { headers: { x-policy: endpoint } }
`;

  it('accepts a YAML or JSON document, validated as a route policy, and echoes the Opts as sent', () => {
    const r = parseBind(bind({}, { TrafficPolicy: YAML }), 'd');
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.value.opts.TrafficPolicy).toBe(YAML);
    expect(r.value.trafficPolicy?.document).toMatchObject({ on_http_request: [{ actions: [{ type: 'deny', config: { status_code: 403 } }] }] });
    expect(r.value.trafficPolicy?.ipPolicyRefs).toEqual([]);
    const json = JSON.stringify({ inbound: [{ actions: [{ type: 'rate-limit', config: { name: 'r', algorithm: 'sliding_window', capacity: 2, rate: '60s', bucket_key: ['conn.client_ip'] } }] }] });
    expect(parseBind(bind({}, { TrafficPolicy: json }), 'd')).toMatchObject({ ok: true, value: { trafficPolicy: { document: { inbound: [{ actions: [{ type: 'rate-limit' }] }] } } } });
  });

  it('empty, null or rule-less means no policy', () => {
    for (const v of ['', null, undefined, '{}', 'on_http_request: []']) {
      expect(parseBind(bind({}, { TrafficPolicy: v }), 'd')).toMatchObject({ ok: true, value: { trafficPolicy: null } });
    }
  });

  it('lists the IP policies restrict-ips names, with their places', () => {
    const [a, b] = ['ipp_' + 'a'.repeat(27), 'ipp_' + 'b'.repeat(27)];
    const doc = `on_http_request:\n  - actions:\n      - type: restrict-ips\n        config: { ip_policies: [${a}, ${b}] }\n`;
    const r = parseBindTrafficPolicy({ TrafficPolicy: doc });
    expect(r).toMatchObject({ ok: true, value: { ipPolicyRefs: [{ path: 'on_http_request[0].actions[0].config.ip_policies[0]', id: a }, { path: 'on_http_request[0].actions[0].config.ip_policies[1]', id: b }] } });
  });

  it.each([
    ['a syntax error', 'on_http_request: [', /^invalid traffic policy \(Bind Opts\.TrafficPolicy\): not valid YAML or JSON: .* \(ERR_WARREN_6900\)$/],
    ['an unknown action', 'on_http_request:\n  - actions:\n      - type: teleport\n', /^invalid traffic policy \(Bind Opts\.TrafficPolicy\): on_http_request\[0\]\.actions\[0\]\.type: .*teleport.* \(ERR_WARREN_6900\)$/],
    ['an expression that does not compile', 'on_http_request:\n  - expressions: ["req.nope ==="]\n    actions:\n      - type: deny\n', /on_http_request\[0\]\.expressions\[0\].*\(ERR_WARREN_6900\)$/],
    ['an unknown phase', 'on_tcp_connect: []', /on_tcp_connect.*not supported.*\(ERR_WARREN_6900\)$/],
    ['a non-string', 42, /must be a string holding a YAML or JSON document \(ERR_WARREN_2102\)$/],
  ])('refuses %s with the validator\'s message', (_what, value, message) => {
    const r = parseBind(bind({}, { TrafficPolicy: value }), 'd');
    expect(r.ok).toBe(false);
    expect(r.ok ? '' : r.error).toMatch(message);
  });

  it('refuses a document over the API limit (64 KiB), naming the limit', () => {
    const big = `# ${'x'.repeat(MAX_TRAFFIC_POLICY_BYTES)}\non_http_request: []\n`;
    const r = parseBind(bind({}, { TrafficPolicy: big }), 'd');
    expect(r).toEqual({ ok: false, error: `the traffic policy (Bind Opts.TrafficPolicy) is ${Buffer.byteLength(big)} bytes, over the limit of ${MAX_TRAFFIC_POLICY_BYTES} bytes; send at most ${MAX_TRAFFIC_POLICY_BYTES} (ERR_WARREN_5003)` });
  });

  it('refuses the deprecated structured policy option, pointing to traffic_policy', () => {
    const structured = { Inbound: [{ Name: 'r', Expressions: [], Actions: [{ Type: 'deny', Config: '{}' }] }], Outbound: [] };
    for (const opts of [{ TrafficPolicy: structured }, { Policy: structured }]) {
      const r = parseBind(bind({}, opts), 'd');
      expect(r).toMatchObject({ ok: false, error: /deprecated policy option .* use the traffic_policy option .*\(ERR_WARREN_2104\)$/ });
    }
  });

  it('other module options are still refused next to a policy', () => {
    expect(parseBind(bind({}, { TrafficPolicy: YAML, OAuth: { Provider: 'google' } }), 'd')).toMatchObject({ ok: false, error: /endpoint option OAuth is not supported/ });
  });
});

describe('parseLabelTunnel', () => {
  it('accepts 1-10 labels within the wire limits', () => {
    expect(parseLabelTunnel({ Labels: { edge: 'edghts_1' }, ForwardsTo: 'x', Metadata: '' })).toMatchObject({ ok: true, value: { labels: { edge: 'edghts_1' }, id: '', token: '' } });
  });
  it.each([
    [{}, /needs labels/],
    [{ Labels: {} }, /1 to 10/],
    [{ Labels: Object.fromEntries(Array.from({ length: 11 }, (_, i) => [`k${i}`, 'v'])) }, /1 to 10/],
    [{ Labels: { 'a:b': 'v' } }, /invalid label name/],
    [{ Labels: { ['k'.repeat(65)]: 'v' } }, /invalid label name/],
    [{ Labels: { k: '' } }, /invalid value/],
    [{ Labels: { k: 'a=b' } }, /invalid value/],
    [{ Labels: { k: 1 } }, /string value/],
  ])('refuses %j', (body, error) => {
    expect(parseLabelTunnel(body)).toMatchObject({ ok: false, error });
  });
});

describe('parseAuth', () => {
  it('reads the SDK Auth (heartbeats in ns)', () => {
    const r = parseAuth({ Version: ['3', '2'], ClientId: 'ts_1', Extra: { OS: 'linux', AuthToken: 't', Version: '1.7.0', Metadata: 'm', Cookie: 'c', HeartbeatInterval: 10_000_000_000, HeartbeatTolerance: 15_000_000_000 } });
    expect(r).toEqual({ ok: true, value: { clientId: 'ts_1', token: 't', cookie: 'c', os: 'linux', agentVersion: '1.7.0', metadata: 'm', heartbeatIntervalMs: 10_000, heartbeatToleranceMs: 15_000 } });
  });
  it('tolerates missing fields, refuses non-objects', () => {
    expect(parseAuth({})).toMatchObject({ ok: true, value: { token: '', heartbeatIntervalMs: 0 } });
    expect(parseAuth([]).ok).toBe(false);
  });
});

describe('oversized fields are refused, not cut', () => {
  const bytes = (n: number) => 'x'.repeat(n);
  /** Two bytes a character: a limit falls between characters, which cutting would have hidden. */
  const twoByte = (n: number) => 'é'.repeat(n / 2);

  it.each([
    ['Extra.Metadata', { Metadata: bytes(4097) }, /^session metadata \(Auth Extra\.Metadata\) is 4097 bytes, over the limit of 4096 bytes; send at most 4096 \(ERR_WARREN_5001\)$/],
    ['Extra.Metadata (UTF-8 bytes)', { Metadata: twoByte(4098) }, /is 4098 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/],
    ['Extra.OS', { OS: bytes(65) }, /^the agent OS \(Auth Extra\.OS\) is 65 bytes, over the limit of 64 bytes.*ERR_WARREN_5003/],
    ['Extra.Version', { Version: bytes(65) }, /^the agent version \(Auth Extra\.Version\) is 65 bytes, over the limit of 64 bytes.*ERR_WARREN_5003/],
  ])('Auth %s', (_, extra, error) => {
    expect(parseAuth({ ClientId: '', Extra: { AuthToken: 't', ...extra } })).toEqual({ ok: false, error: expect.stringMatching(error) });
  });

  it('Auth fields at their limits are kept whole', () => {
    const r = parseAuth({ Extra: { Metadata: twoByte(4096), OS: bytes(64), Version: twoByte(64) } });
    expect(r).toMatchObject({ ok: true, value: { metadata: twoByte(4096), os: bytes(64), agentVersion: twoByte(64) } });
  });

  it('Bind metadata and ForwardsTo', () => {
    expect(parseBind(bind({}, {}, { Metadata: twoByte(4098) }), 'warren.localhost')).toEqual({ ok: false, error: expect.stringMatching(/^tunnel metadata \(Bind Extra\.Metadata\) is 4098 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/) });
    expect(parseBind(bind({ ForwardsTo: bytes(1025) }), 'warren.localhost')).toEqual({ ok: false, error: expect.stringMatching(/^forwards_to \(Bind ForwardsTo\) is 1025 bytes, over the limit of 1024 bytes.*ERR_WARREN_5003/) });
    expect(parseBind(bind({ ForwardsTo: bytes(1024) }, {}, { Metadata: twoByte(4096) }), 'warren.localhost')).toMatchObject({ ok: true, value: { forwardsTo: bytes(1024), metadata: twoByte(4096) } });
  });

  it('StartTunnelWithLabel metadata and ForwardsTo', () => {
    expect(parseLabelTunnel({ Labels: { a: 'b' }, Metadata: bytes(4097) })).toEqual({ ok: false, error: expect.stringMatching(/^tunnel metadata \(StartTunnelWithLabel Metadata\) is 4097 bytes, over the limit of 4096 bytes.*ERR_WARREN_5001/) });
    expect(parseLabelTunnel({ Labels: { a: 'b' }, ForwardsTo: twoByte(1026) })).toEqual({ ok: false, error: expect.stringMatching(/^forwards_to \(StartTunnelWithLabel ForwardsTo\) is 1026 bytes, over the limit of 1024 bytes.*ERR_WARREN_5003/) });
    expect(parseLabelTunnel({ Labels: { a: 'b' }, ForwardsTo: bytes(1024), Metadata: bytes(4096) })).toMatchObject({ ok: true, value: { forwardsTo: bytes(1024), metadata: bytes(4096) } });
  });
});

describe('ACL', () => {
  it('hostnames', () => {
    expect(aclAllowsHostname([], 'any.test')).toBe(true);
    expect(aclAllowsHostname(['*'], 'any.test')).toBe(true); // no bind: rules
    expect(aclAllowsHostname(['bind:*'], 'any.test')).toBe(true);
    expect(aclAllowsHostname(['bind:App.Test'], 'app.test')).toBe(true);
    expect(aclAllowsHostname(['bind:app.test:443'], 'app.test')).toBe(true);
    expect(aclAllowsHostname(['bind:*.example.com'], 'a.b.example.com')).toBe(true);
    expect(aclAllowsHostname(['bind:*.example.com'], 'example.com')).toBe(false);
    expect(aclAllowsHostname(['bind:*.example.com'], 'badexample.com')).toBe(false);
    expect(aclAllowsHostname(['bind:edge=edghts_1'], 'app.test')).toBe(false);
  });
  it('labels', () => {
    expect(aclAllowsLabels([], { a: 'b' })).toBe(true);
    expect(aclAllowsLabels(['bind:*'], { a: 'b' })).toBe(true);
    expect(aclAllowsLabels(['bind:edge=edghts_1', 'bind:env=*'], { edge: 'edghts_1', env: 'prod' })).toBe(true);
    expect(aclAllowsLabels(['bind:edge=edghts_1'], { edge: 'edghts_1', env: 'prod' })).toBe(false);
    expect(aclAllowsLabels(['bind:edge=EDGHTS_1'], { edge: 'edghts_1' })).toBe(false);
  });
});
