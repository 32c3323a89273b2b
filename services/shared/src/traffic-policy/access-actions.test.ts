import { describe, expect, it } from 'vitest';
import { oneAction, refusal } from './testing.js';
import { BASIC_AUTH_LIMITS, IP_POLICY_MAX_RULES, RESTRICT_IPS_LIMITS, restrictIpsCost, restrictIpsPolicyRefs } from './access-actions.js';
import { compileExpression, parseTrafficPolicy, validateTrafficPolicy } from './index.js';
import { estimateCost, MAX_EXPRESSION_COST } from './cost.js';

const fails = (doc: unknown) => refusal(doc, true);
const one = oneAction;
const rip = (config: unknown) => one({ type: 'restrict-ips', config });
const ba = (config: unknown) => one({ type: 'basic-auth', config });
const P = 'inbound[0].actions[0].config';
const IPP_A = 'ipp_2qT9aaaaaaaaaaaaaaaaaaaaaaa';
const IPP_B = 'ipp_2qT9bbbbbbbbbbbbbbbbbbbbbbb';

describe('restrict-ips config', () => {
  it('parses YAML with IPv4 and IPv6 CIDRs, canonical, enforce defaulting to true', () => {
    const p = parseTrafficPolicy(`
inbound:
  - actions:
      - type: restrict-ips
        config:
          allow: [203.0.113.0/24, "2001:DB8::/32", 198.51.100.42/32]
          deny: ["2001:db8:0:0:0:0:0:1/128"]
      - type: restrict-ips
        config: {enforce: false, deny: [0.0.0.0/0, "::/0"]}
`);
    expect(p.inbound[0]!.actions).toEqual([
      { type: 'restrict-ips', config: { enforce: true, allow: ['203.0.113.0/24', '2001:db8::/32', '198.51.100.42/32'], deny: ['2001:db8::1/128'], ip_policies: [] } },
      { type: 'restrict-ips', config: { enforce: false, allow: [], deny: ['0.0.0.0/0', '::/0'], ip_policies: [] } },
    ]);
  });

  it.each([
    [rip({ allow: ['10.0.0.1/8'] }), `${P}.allow[0]`, 'has host bits set; did you mean 10.0.0.0/8?'],
    [rip({ allow: ['10.0.0.0/8', '2001:db8::1/32'] }), `${P}.allow[1]`, 'has host bits set; did you mean 2001:db8::/32?'],
    [rip({ deny: ['10.0.0.1'] }), `${P}.deny[0]`, 'has no prefix length; write it in CIDR notation'],
    [rip({ deny: ['10.0.0.0/33'] }), `${P}.deny[0]`, 'the prefix length of "10.0.0.0/33" is over 32'],
    [rip({ deny: ['::/129'] }), `${P}.deny[0]`, 'is over 128'],
    [rip({ deny: ['example.com/24'] }), `${P}.deny[0]`, 'is not an IPv4 or IPv6 CIDR'],
    [rip({ deny: ['010.0.0.0/8'] }), `${P}.deny[0]`, 'is not an IPv4 or IPv6 CIDR'],
    [rip({ deny: ['fe80::/10%eth0'] }), `${P}.deny[0]`, 'invalid prefix length'],
    [rip({ deny: ['::ffff:10.0.0.0/104'] }), `${P}.deny[0]`, '::ffff:a00:0/104 is an IPv4-mapped IPv6 range; write it as an IPv4 CIDR'],
    [rip({ deny: ['::ffff:0:0/96'] }), `${P}.deny[0]`, 'is an IPv4-mapped IPv6 range'],
    [rip({ deny: [7] }), `${P}.deny[0]`, 'must be a CIDR string, got number'],
    [rip({ deny: ['${conn.client_ip}/32'] }), `${P}.deny[0]`, 'CEL interpolation (${…}) is not supported'],
    [rip({ allow: [] }), `${P}.allow`, 'must have at least one CIDR'],
    [rip({ allow: '10.0.0.0/8' }), `${P}.allow`, 'must be a list, got string'],
    [rip({}), P, 'needs at least one CIDR in allow or deny, or an IP policy in ip_policies'],
    [rip({ enforce: true }), P, 'needs at least one CIDR in allow or deny'],
    [rip({ enforce: 'yes', allow: ['::/0'] }), `${P}.enforce`, 'must be true or false, got string'],
    [rip({ allow: ['10.0.0.0/8', '10.0.0.0/8'] }), `${P}.allow[1]`, '10.0.0.0/8 is already listed at inbound[0].actions[0].config.allow[0]'],
    [rip({ allow: ['2001:db8::/32', '2001:DB8:0::/32'] }), `${P}.allow[1]`, 'is already listed'],
    [rip({ allow: ['10.0.0.0/8'], deny: ['10.0.0.0/8'] }), `${P}.allow[0]`, 'is also at inbound[0].actions[0].config.deny[0]'],
    [rip({ ip_policies: ['ipp_1'] }), `${P}.ip_policies[0]`, '"ipp_1" is not an IP policy id (ipp_ followed by 27 letters and digits)'],
    [rip({ ip_policies: [IPP_A, IPP_A.replace('ipp_', 'ipr_')] }), `${P}.ip_policies[1]`, 'is not an IP policy id'],
    [rip({ ip_policies: [IPP_A, IPP_B, IPP_A] }), `${P}.ip_policies[2]`, `${IPP_A} is already listed at inbound[0].actions[0].config.ip_policies[0]`],
    [rip({ ip_policies: [] }), `${P}.ip_policies`, 'must have at least one IP policy id'],
    [rip({ ip_policies: IPP_A }), `${P}.ip_policies`, 'must be a list, got string'],
    [rip({ ip_policies: [{ id: IPP_A }] }), `${P}.ip_policies[0]`, 'must be an IP policy id string, got mapping'],
    [rip({ ip_policies: ['${vars.ipp}'] }), `${P}.ip_policies[0]`, 'CEL interpolation (${…}) is not supported'],
    [rip({ allow: ['::/0'], colour: 'red' }), `${P}.colour`, 'unknown field "colour"; supported: enforce, allow, deny, ip_policies'],
    [one({ type: 'restrict-ips' }), 'inbound[0].actions[0].config', 'is required'],
    [rip(['10.0.0.0/8']), P, 'config must be a mapping, got list'],
  ])('refuses %j at %s', (doc, path, msg) => {
    const e = fails(doc);
    expect(e.path).toBe(path);
    expect(e.message).toContain(msg);
  });

  it('takes ip_policies alone or with CIDRs, and finds every reference with its path', () => {
    const p = parseTrafficPolicy(`
inbound:
  - actions:
      - type: restrict-ips
        config: {ip_policies: [${IPP_A}]}
  - expressions: ["req.path == '/x'"]
    actions:
      - type: add-headers
        config: {headers: {x-a: b}}
      - type: restrict-ips
        config: {enforce: false, deny: [10.0.0.0/8], ip_policies: [${IPP_B}, ${IPP_A}]}
`);
    expect(p.inbound[0]!.actions[0]).toEqual({ type: 'restrict-ips', config: { enforce: true, allow: [], deny: [], ip_policies: [IPP_A] } });
    expect(p.inbound[1]!.actions[1]).toEqual({ type: 'restrict-ips', config: { enforce: false, allow: [], deny: ['10.0.0.0/8'], ip_policies: [IPP_B, IPP_A] } });
    expect(restrictIpsPolicyRefs(p)).toEqual([
      { path: 'inbound[0].actions[0].config.ip_policies[0]', id: IPP_A },
      { path: 'inbound[1].actions[1].config.ip_policies[0]', id: IPP_B },
      { path: 'inbound[1].actions[1].config.ip_policies[1]', id: IPP_A },
    ]);
    // Under ngrok's phase name, the paths name the key as written (the control plane's "no IP
    // policy" 400 quotes them).
    const ngrok = parseTrafficPolicy(`on_http_request:\n  - actions:\n      - type: restrict-ips\n        config: {ip_policies: [${IPP_A}]}\n`);
    expect(restrictIpsPolicyRefs(ngrok)).toEqual([{ path: 'on_http_request[0].actions[0].config.ip_policies[0]', id: IPP_A }]);
  });

  it('is allowed in the response phase too (ngrok: on_http_request, on_http_response), whose IP policies count as references', () => {
    const p = parseTrafficPolicy(`
on_http_request:
  - actions:
      - type: restrict-ips
        config: {ip_policies: [${IPP_A}]}
on_http_response:
  - actions:
      - type: restrict-ips
        config: {allow: [10.0.0.0/8], ip_policies: [${IPP_B}]}
`);
    expect(p.outbound[0]!.actions[0]).toEqual({ type: 'restrict-ips', config: { enforce: true, allow: ['10.0.0.0/8'], deny: [], ip_policies: [IPP_B] } });
    expect(restrictIpsPolicyRefs(p)).toEqual([
      { path: 'on_http_request[0].actions[0].config.ip_policies[0]', id: IPP_A },
      { path: 'on_http_response[0].actions[0].config.ip_policies[0]', id: IPP_B },
    ]);
    // basic-auth stays request-only, as in ngrok.
    expect(fails(one({ type: 'basic-auth', config: { credentials: ['user:password1'] } }, 'outbound')).message).toContain('basic-auth can only be used in inbound rules');
  });

  it('bounds the IP policies of an action, and charges each at its rule limit', () => {
    const ids = Array.from({ length: RESTRICT_IPS_LIMITS.maxIpPolicies + 1 }, (_, i) => `ipp_${String(i).padStart(27, '0')}`);
    const max = RESTRICT_IPS_LIMITS.maxIpPolicies;
    expect(validateTrafficPolicy(rip({ ip_policies: ids.slice(0, max) })).inbound[0]!.actions[0]).toMatchObject({ config: { ip_policies: ids.slice(0, max) } });
    expect(fails(rip({ ip_policies: ids })).message).toBe(`${P}.ip_policies: must have at most ${max} IP policies, got ${max + 1}`);
    const base = restrictIpsCost({ enforce: true, allow: ['10.0.0.0/8'], deny: [], ip_policies: [] });
    expect(restrictIpsCost({ enforce: true, allow: ['10.0.0.0/8'], deny: [], ip_policies: [IPP_A, IPP_B] }) - base).toBe(2 * (15 * IP_POLICY_MAX_RULES + 1_000));
    // Ten full policies in one action fit a policy; the same action repeated does not.
    const action = `{type: restrict-ips, config: {ip_policies: [${ids.slice(0, max).join(', ')}]}}`;
    expect(parseTrafficPolicy(`inbound:\n  - actions: [${Array(20).fill(action).join(', ')}]\n`).inbound[0]!.actions).toHaveLength(20);
    const e = fails(`inbound:\n  - actions: [${Array(40).fill(action).join(', ')}]\n`);
    expect(e.message).toMatch(/restrict-ips: checking the client address against up to 10000 CIDRs \(10 IP policies counted at their limit of 1000 rules\) is estimated at .* more than the 5\.00 ms allowed for a policy/);
  });

  it('bounds the number of CIDRs', () => {
    const many = (n: number, base = 10) => Array.from({ length: n }, (_, i) => `${base}.${i >> 8}.${i & 255}.0/24`);
    const max = RESTRICT_IPS_LIMITS.maxCidrs;
    expect(validateTrafficPolicy(rip({ allow: many(max) })).inbound[0]!.actions[0]).toMatchObject({ config: { allow: many(max) } });
    expect(fails(rip({ allow: many(max + 1) })).message).toBe(`${P}.allow: must have at most ${max} CIDRs, got ${max + 1}`);
    expect(fails(rip({ allow: many(max / 2 + 1), deny: many(max / 2, 11) })).message).toBe(`${P}: allow and deny may hold at most ${max} CIDRs together, got ${max + 1}`);
  });

  it("charges its checks to the policy's cost: a 1000-CIDR list aliased into hundreds of actions is refused (review)", () => {
    const cidrs = Array.from({ length: 1000 }, (_, i) => `10.${i >> 8}.${i & 255}.0/24`).join(', ');
    // Each anchor may be aliased up to 99 times (the YAML alias bound): 3 x 100 actions.
    const rule = (n: number) => `  - actions: [{type: restrict-ips, config: {enforce: false, deny: &c${n} [${cidrs}]}}${`, {type: restrict-ips, config: {enforce: false, deny: *c${n}}}`.repeat(99)}]\n`;
    // 100 actions of 1000 CIDRs through one anchor: 1.6 MB as the JSON sent to every node.
    expect(() => parseTrafficPolicy(`inbound:\n${rule(0)}`)).toThrow(/is over 262144 bytes once its aliases are expanded/);
    // Written with aliases, 300 actions of 1000 CIDRs are refused before they are expanded (over
    // 250,000 values, nesting.ts); the same policy as a value is refused by its cost.
    expect(fails(`inbound:\n${rule(0)}${rule(1)}${rule(2)}`).message).toBe('the document expands to more than 250000 values through its aliases');
    const list = cidrs.split(', ');
    const actions = Array.from({ length: 100 }, () => ({ type: 'restrict-ips', config: { enforce: false, deny: list } }));
    const e = refusal({ inbound: [{ actions }, { actions }, { actions }] }, true);
    expect(e.message).toMatch(/restrict-ips: checking the client address against 1000 CIDRs is estimated at .* more than the 5\.00 ms allowed for a policy/);
  });

  it('declares the result variables (and the deny-only example of the docs type-checks)', () => {
    for (const e of [
      "actions.ngrok.restrict_ips.action == 'deny'",
      "actions.service.restrict_ips.matched_cidr.startsWith('10.')",
      "actions.ngrok.restrict_ips.error.code == '' && actions.ngrok.restrict_ips.error.message == ''",
    ]) {
      const program = compileExpression('inbound', e);
      expect(estimateCost(program, { count: 0, bytes: 0 })).toBeLessThan(MAX_EXPRESSION_COST);
    }
    expect(() => compileExpression('inbound', 'actions.ngrok.restrict_ips.allowed')).toThrow();
  });
});

describe('basic-auth config', () => {
  it('parses credentials, realm and enforce, with ngrok defaults', () => {
    const p = parseTrafficPolicy(`
inbound:
  - actions:
      - type: basic-auth
        config:
          credentials: ["user:password1", "admin:pass:with:colons", "ünï:çødé-ok-8"]
      - type: basic-auth
        config: {realm: 'Admin "Login"', enforce: false, credentials: ["a:12345678"]}
`);
    expect(p.inbound[0]!.actions).toEqual([
      { type: 'basic-auth', config: { enforce: true, realm: 'ngrok', credentials: ['user:password1', 'admin:pass:with:colons', 'ünï:çødé-ok-8'] } },
      { type: 'basic-auth', config: { enforce: false, realm: 'Admin "Login"', credentials: ['a:12345678'] } },
    ]);
  });

  const SECRET = 'hunter2-very-secret';
  it.each([
    [ba({ credentials: [`${SECRET}`] }), `${P}.credentials[0]`, 'must be "username:password": it has no colon'],
    [ba({ credentials: ['ok:12345678', `:${SECRET}`] }), `${P}.credentials[1]`, 'the username (before the first colon) must not be empty'],
    [ba({ credentials: [`user:${SECRET.slice(0, 7)}`] }), `${P}.credentials[0]`, 'the password (after the first colon) must have 8 to 128 characters, got 7'],
    [ba({ credentials: [`user:${'p'.repeat(129)}`] }), `${P}.credentials[0]`, 'must have 8 to 128 characters, got 129'],
    [ba({ credentials: [`${'u'.repeat(129)}:${SECRET}`] }), `${P}.credentials[0]`, 'the username must have at most 128 characters, got 129'],
    [ba({ credentials: [`us\ter:${SECRET}`] }), `${P}.credentials[0]`, 'the username must not contain control characters'],
    [ba({ credentials: [`user:${SECRET}\n`] }), `${P}.credentials[0]`, 'the password must not contain control characters'],
    [ba({ credentials: [`user:\${req.headers['x-pw'][0]}`] }), `${P}.credentials[0]`, 'CEL interpolation (${…}) is not supported'],
    [ba({ credentials: [42] }), `${P}.credentials[0]`, 'must be a "username:password" string, got number'],
    [ba({ credentials: [] }), `${P}.credentials`, 'must have at least one'],
    [ba({ credentials: `user:${SECRET}` }), `${P}.credentials`, 'must be a list, got string'],
    [ba({ realm: 'x' }), `${P}.credentials`, 'is required'],
    [ba({ credentials: Array.from({ length: 11 }, (_, i) => `u${i}:${SECRET}`) }), `${P}.credentials`, 'must have at most 10 credentials, got 11'],
    [ba({ credentials: [`u:${SECRET}`], realm: '' }), `${P}.realm`, 'must not be empty'],
    [ba({ credentials: [`u:${SECRET}`], realm: 'r'.repeat(129) }), `${P}.realm`, 'must have at most 128 characters, got 129'],
    [ba({ credentials: [`u:${SECRET}`], realm: 'réalm' }), `${P}.realm`, 'printable ASCII'],
    [ba({ credentials: [`u:${SECRET}`], realm: 'a\r\nX-Injected: 1' }), `${P}.realm`, 'printable ASCII'],
    [ba({ credentials: [`u:${SECRET}`], realm: 7 }), `${P}.realm`, 'must be a string, got number'],
    [ba({ credentials: [`u:${SECRET}`], enforce: 'false' }), `${P}.enforce`, 'must be true or false'],
    [ba({ credentials: [`u:${SECRET}`], users: ['x'] }), `${P}.users`, 'unknown field "users"; supported: credentials, realm, enforce'],
    [one({ type: 'basic-auth', config: { credentials: [`u:${SECRET}`] } }, 'outbound'), 'outbound[0].actions[0].type', 'basic-auth can only be used in inbound rules'],
  ])('refuses %j at %s, never quoting a credential', (doc, path, msg) => {
    const e = fails(doc);
    expect(e.path).toBe(path);
    expect(e.message).toContain(msg);
    expect(e.message).not.toContain(SECRET.slice(0, 7));
    expect(e.message).not.toContain('us\ter');
  });

  it('counts characters, not bytes or UTF-16 units', () => {
    const L = BASIC_AUTH_LIMITS;
    const pw = '🔑'.repeat(L.passwordMinChars); // 8 code points, 16 UTF-16 units, 32 bytes
    expect(validateTrafficPolicy(ba({ credentials: [`${'é'.repeat(L.usernameChars)}:${pw}`] })).inbound[0]!.actions[0]).toMatchObject({ type: 'basic-auth' });
    expect(fails(ba({ credentials: [`u:${'🔑'.repeat(7)}`] })).message).toContain('got 7');
  });

  it('declares the result variables', () => {
    for (const e of [
      'actions.ngrok.basic_auth.credentials.presented && !actions.ngrok.basic_auth.credentials.authorized',
      "actions.service.basic_auth.credentials.username == 'admin'",
      "actions.ngrok.basic_auth.credentials.username.matches('^adm')",
    ]) {
      const program = compileExpression('inbound', e);
      expect(estimateCost(program, { count: 0, bytes: 0 })).toBeLessThan(MAX_EXPRESSION_COST);
    }
    expect(() => compileExpression('inbound', 'actions.ngrok.basic_auth.credentials.password')).toThrow();
    expect(() => compileExpression('inbound', 'actions.ngrok.basic_auth.authorized')).toThrow();
  });
});
