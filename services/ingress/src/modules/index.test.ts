import { describe, expect, it } from 'vitest';
import { routeStageFactories } from './index.js';
import { makeConfig, makeEdge, makeRoute, testDeps } from './testing.js';

describe('routeStageFactories', () => {
  it('lists each module once, refusals before edits', () => {
    const names = routeStageFactories.map((f) => f.module);
    expect(new Set(names).size).toBe(names.length);
    expect(names.indexOf('ip_restriction')).toBe(0);
    expect(names.indexOf('circuit_breaker')).toBeGreaterThan(names.indexOf('webhook_verification'));
    expect(names.at(-1)).toBe('compression');
  });

  it('builds nothing for a route without modules, and stages named after their module', () => {
    const empty = makeRoute({});
    for (const { factory } of routeStageFactories) expect(factory(empty, makeEdge(), makeConfig(), testDeps())).toBeNull();
    const all = makeRoute({
      ip_restriction: { enabled: true, ip_policy_ids: [] },
      user_agent_filter: { enabled: true, allow: ['a'], deny: [] },
      oauth: { enabled: true, provider: { github: { client_id: 'c', client_secret: 's' } } },
      oidc: { enabled: true, issuer: 'https://id.example.test', client_id: 'c', client_secret: 's', scopes: [] },
      saml: { enabled: true, handoff_secret: 's', login_url: 'https://cp.example.test/saml/edghtsrt_test/login' },
      webhook_verification: { enabled: true, provider: 'github', secret: 's' },
      websocket_tcp_converter: { enabled: true },
      circuit_breaker: { enabled: true, tripped_duration: 1, rolling_window: 1, num_buckets: 1, volume_threshold: 1, error_threshold_percentage: 1 },
      request_headers: { enabled: true, add: { a: 'b' }, remove: [] },
      response_headers: { enabled: true, add: { a: 'b' }, remove: [] },
      compression: { enabled: true },
    });
    for (const { module, factory } of routeStageFactories) expect(factory(all, makeEdge(), makeConfig(), testDeps())?.name).toBe(module);
  });
});
