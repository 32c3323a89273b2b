import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * Where Warren's CEL follows cel-go (ngrok's engine) rather than the CEL library, on live
 * traffic through real processes (a control plane that validates and costs the policy, an
 * ingress, our agent): string indices in code points (`string-index.ts`), fixed-offset time
 * zones (`time-zones.ts`), and the query read as Go's `url.ParseQuery` reads it.
 */

const HOST = 'cel-compat.e2e.test';
let c: PolicyCluster;

beforeAll(async () => {
  c = await startPolicyCluster({ name: 'celcompat', host: HOST });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
}, 60_000);

const S = "getReqHeader('x-s')[0]";
const T = "timestamp('2024-01-01T05:00:00Z')";
const POLICY = {
  on_http_request: [
    {
      // `a=1;b=2` (a semicolon) and `c=%zz` (an invalid escape) are dropped; `+` is a space.
      expressions: ["req.url.path.startsWith('/cc/q')", "req.url.query_params == {'d': ['x y'], 'e': [''], 'f': ['A', '2'], 'g': ['€']}"],
      actions: [{ type: 'custom-response', config: { status_code: 200, body: 'go-query' } }],
    },
    {
      // 05:00 UTC is 10:30 at +05:30; a malformed zone is an evaluation error: the rule is skipped.
      expressions: [`${T}.getHours(getReqHeader('x-tz')[0]) == 10`],
      actions: [{ type: 'custom-response', config: { status_code: 200, body: 'zone-ok' } }],
    },
    {
      actions: [
        {
          type: 'custom-response',
          config: {
            status_code: 200,
            headers: { 'content-type': 'application/json' },
            body: `{"indexOf":\${${S}.indexOf('a')},"lastIndexOf":\${${S}.lastIndexOf('c')},"substring":\${json.encode(${S}.substring(1, 3))},"size":\${size(${S})},"dayOfWeek":\${${T}.getDayOfWeek('-08:00')},"year":\${${T}.getFullYear('-08:00')}}`,
          },
        },
      ],
    },
  ],
};

/** `text` as the UTF-8 bytes a client sends in a header (node:http writes a header string one byte per character). */
const utf8Header = (text: string) => Buffer.from(text, 'utf8').toString('latin1');

describe("cel-go's semantics on live traffic", () => {
  beforeAll(async () => {
    await c.policyRoute('/cc', POLICY);
  }, 60_000);

  it('indexOf(), lastIndexOf(), substring() count code points; fixed offsets as time zones', async () => {
    const r = await c.request('/cc/x', { headers: { 'x-s': utf8Header('😀abc'), 'x-tz': '+99:00' } });
    expect(r.status, r.body).toBe(200);
    // 21:00 on Sunday 31 December 2023 at -08:00.
    expect(r.json()).toEqual({ indexOf: 1, lastIndexOf: 3, substring: 'ab', size: 4, dayOfWeek: 0, year: 2023 });
  });

  it("req.url.query_params as Go's url.ParseQuery reads the query", async () => {
    const r = await c.request('/cc/q?a=1;b=2&c=%zz&d=x+y&e&f=%41&f=2&&g=%E2%82%AC');
    expect([r.status, r.body]).toEqual([200, 'go-query']);
  });

  it('a fixed offset or an IANA name as the zone; a malformed one skips the rule', async () => {
    for (const tz of ['+05:30', '5:30', 'Asia/Kolkata']) {
      const r = await c.request('/cc/z', { headers: { 'x-s': 'abc', 'x-tz': tz } });
      expect(r.body, tz).toBe('zone-ok');
    }
    for (const tz of ['+24:00', '+05:60', '+05:30:00', 'Mars/Base', '+06:00']) {
      const r = await c.request('/cc/z', { headers: { 'x-s': 'abc', 'x-tz': tz } });
      expect([r.status, r.body.startsWith('{')], tz).toEqual([200, true]);
    }
  });
});
