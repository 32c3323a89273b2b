import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Redis } from 'ioredis';
import { deleteServerKeys } from '../../services/ingress/src/ratelimit/testing.js';
import { startPolicyCluster, type PolicyCluster, type PolicyResponse } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS } from '../support/timeouts.js';

/**
 * performance.md §3, "three proxies, one key" and "clock skew", through real processes: three
 * ingress processes of ONE rate-limit server (one RATE_LIMIT_SERVER_ID, so one set of Redis keys),
 * the third with its wall clock 5 s ahead (test/support/clock-skew.mjs, faketime's '+5s' for
 * Node). Requests to all three at once on one bucket: together they admit exactly the capacity
 * (one atomic script per request, no over-admission), and the skewed process counts and answers
 * Retry-After as the others do, since the window runs on Redis' clock (TIME), not the ingress's.
 */

const HOST = 'shared-rl.e2e.test';
const SKEW_MS = 5_000;
const redisUrl = inject('redisUrl');
const serverId = `e2e-shared-${randomBytes(4).toString('hex')}`;
let c: PolicyCluster;

beforeAll(async () => {
  c = await startPolicyCluster({
    name: 'shrl',
    host: HOST,
    nodes: 3,
    ingressEnv: (nodeId) => ({
      REDIS_URL: redisUrl,
      RATE_LIMIT_SERVER_ID: serverId,
      ...(nodeId.endsWith('-c') ? { NODE_OPTIONS: `--import ${fileURLToPath(new URL('../support/clock-skew.mjs', import.meta.url))}`, WARREN_TEST_CLOCK_SKEW_MS: String(SKEW_MS) } : {}),
    }),
  });
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
  const redis = new Redis(redisUrl);
  await deleteServerKeys(redis, serverId);
  redis.disconnect();
}, 60_000);

describe('one rate-limit server, three ingress processes, one of them with a skewed clock', () => {
  it('the skew shim moves the process clock (the check below would prove nothing otherwise)', async () => {
    // time.now is the ingress's own clock (new Date()), as a policy sees it.
    await c.policyRoute('/now', { inbound: [{ actions: [{ type: 'custom-response', config: { status_code: 200, body: '${time.now}' } }] }] });
    const clockOf = async (port: number) => Date.parse((await c.request('/now', { port })).body) - Date.now();
    expect(await clockOf(c.nodes[2]!.http)).toBeGreaterThan(SKEW_MS - 1_000);
    expect(Math.abs(await clockOf(c.nodes[0]!.http))).toBeLessThan(1_000);
  });

  it.each([40, 150])('together they admit exactly the capacity (%i); every 429 names the same moment in Retry-After, whichever process answered', async (L) => {
    const run = randomBytes(4).toString('hex');
    await c.policyRoute(`/rl-${run}`, {
      inbound: [{ actions: [{ type: 'rate-limit', config: { name: 'shared', algorithm: 'sliding_window', capacity: L, rate: '60s', bucket_key: ['req.host', "getReqHeader('x-run')"] } }] }],
    });
    const perNode = Math.ceil((2 * L) / 3) + 20;
    // 20 requests at a time per process: 60 in all stay under the tunnel's cap of open requests
    // per client address (MAX_STREAMS_PER_CLIENT, 80), whose 429 (ERR_WARREN_7014) is not the limiter's.
    const all: Array<{ r: PolicyResponse; at: number; node: number }> = [];
    await Promise.all(
      c.nodes.flatMap((n, node) => {
        let left = perNode;
        return Array.from({ length: 20 }, async () => {
          while (left-- > 0) {
            const r = await c.request(`/rl-${run}/x`, { port: n.http, headers: { 'x-run': run } });
            all.push({ r, at: Date.now(), node });
          }
        });
      }),
    );
    const other = all.filter(({ r }) => !(r.status === 200 || (r.status === 429 && r.headers['warren-error-code'] === undefined)));
    expect(other.map(({ r }) => `${r.status} ${String(r.headers['warren-error-code'] ?? '')} ${r.body.slice(0, 200)}`)).toEqual([]);
    const byNode = [0, 1, 2].map((i) => all.filter((x) => x.node === i && x.r.status === 200).length);
    console.log(`[shared server] L=${L}: ${all.length} requests, admitted ${byNode.join(' + ')} (the last one's clock 5 s ahead)`);
    expect(byNode.reduce((a, b) => a + b, 0)).toBe(L);

    // Every 429 says when the oldest admission leaves the window: 60 s after it was made, on
    // Redis' clock, so one moment for all of them (received at + Retry-After, rounded up to a
    // whole second). A process counting on its own clock would name a moment 5 s off.
    const limited = all.filter(({ r }) => r.status === 429);
    for (const { r } of limited) expect(String(r.headers['retry-after'])).toMatch(/^\d+$/);
    const moments = limited.map(({ r, at }) => at + Number(r.headers['retry-after']) * 1000);
    const spread = Math.max(...moments) - Math.min(...moments);
    console.log(`[shared server] L=${L}: Retry-After ${Math.min(...limited.map(({ r }) => Number(r.headers['retry-after'])))}-${Math.max(...limited.map(({ r }) => Number(r.headers['retry-after'])))} s, moments named within ${spread} ms`);
    // At most the 1 s of rounding plus how much the answers' travel times differ.
    expect(spread).toBeLessThan(2_500);
  }, 60_000);
});
