import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startIngress, type IngressProcess } from '../support/cluster.js';
import { cityRecord, MmdbWriter } from '../support/mmdb-writer.js';
import { startPolicyCluster, type PolicyCluster } from '../support/policy-cluster.js';
import { CLUSTER_HOOK_MS, INGRESS_START_MS, WORK_MS } from '../support/timeouts.js';

/**
 * `conn.geo.*` on live traffic, through real processes: a control plane, two ingress nodes
 * listening on `::` (clients reach them as 127.0.0.1, seen as ::ffff:127.0.0.1, and as ::1), our
 * agent and an upstream echoing the headers it got. Node a reads a test GeoIP database
 * (`WARREN_GEOIP_DB`, written by the test MMDB writer) that puts loopback in the test country
 * "XX"; node b has none, so reading `conn.geo` there is an evaluation error: a deny rule on it
 * denies (fails closed), any other rule on it is skipped. Policies are saved through the API.
 */

const HOST = 'geo.e2e.test';
const dir = mkdtempSync(path.join(tmpdir(), 'warren-geo-e2e-'));
const DB = path.join(dir, 'test-city.mmdb');
let c: PolicyCluster;
let a: IngressProcess, b: IngressProcess;

function writeDatabase(): void {
  const loopback = cityRecord({
    city: 'Loopback',
    country: 'Testland',
    countryCode: 'XX',
    subdivisions: [['Localshire', 'LS'], ['Inner Ward', 'IW']],
    latitude: 51.5,
    longitude: -0.125,
    radius: 5,
    otherLanguages: ['de'],
  });
  const w = new MmdbWriter({ databaseType: 'GeoLite2-City', languages: ['en', 'de'] });
  w.insert('127.0.0.0/8', loopback);
  w.insert('::1/128', loopback);
  w.insert('203.0.113.0/24', cityRecord({ city: 'Strongsville', country: 'United States', countryCode: 'US' }));
  writeFileSync(DB, w.build());
}

const FIELDS = '${conn.geo.city}|${conn.geo.country}|${conn.geo.country_code}|${conn.geo.subdivision}|${conn.geo.latitude}|${conn.geo.longitude}|${conn.geo.radius}';

beforeAll(async () => {
  writeDatabase();
  c = await startPolicyCluster({
    name: 'geo',
    host: HOST,
    nodes: 2,
    // Info logs: each node says at start whether conn.geo is on.
    ingressEnv: (nodeId) => ({ HOST: '::', LOG_LEVEL: 'info', ...(nodeId === 'geo-a' ? { WARREN_GEOIP_DB: DB } : {}) }),
  });
  [a, b] = c.nodes as [IngressProcess, IngressProcess];
}, CLUSTER_HOOK_MS);

afterAll(async () => {
  await c?.stop();
  rmSync(dir, { recursive: true, force: true });
}, 60_000);

describe('conn.geo on live traffic', () => {
  it('denies by country code from the GeoIP database (IPv4-mapped and IPv6 clients)', async () => {
    await c.policyRoute('/geo-deny', { inbound: [{ expressions: ["conn.geo.country_code == 'XX'"], actions: [{ type: 'deny', config: { status_code: 451 } }] }] });
    const v4 = await c.request('/geo-deny/x', { port: a.http });
    expect(v4.status, v4.body).toBe(451);
    const v6 = await c.request('/geo-deny/x', { port: a.http, from: '::1' });
    expect(v6.status, v6.body).toBe(451);
    // Without a database (node b, which hops to the agent's node a): conn.geo cannot be read, the deny fails closed.
    const noDb = await c.request('/geo-deny/x', { port: b.http });
    expect(noDb.status, noDb.body).toBe(451);
    expect((await c.request('/geo-deny/x', { port: b.http, from: '::1' })).status).toBe(451);
  });

  it('a deny-list rule: passes an unlisted country with a database, denies everyone without one (counted, logged)', async () => {
    await c.policyRoute('/geo-list', { on_http_request: [{ expressions: ["conn.geo.country_code in ['RU', 'CN']"], actions: [{ type: 'deny' }] }] });
    const errors = async () => {
      const text = await (await fetch(`${b.internalUrl}/metrics`)).text();
      return Number(/^warren_traffic_policy_expression_errors_total\{[^}]*direction="inbound"[^}]*\} (\d+)/m.exec(text)?.[1] ?? 0);
    };
    const before = await errors();
    for (const from of ['127.0.0.1', '::1'] as const) {
      const listed = await c.request('/geo-list/x', { port: a.http, from });
      expect([listed.status, listed.json().url], from).toEqual([200, '/geo-list/x']); // XX is not listed: reaches the upstream
      const noDb = await c.request('/geo-list/x', { port: b.http, from });
      expect(noDb.status, from).toBe(403);
    }
    expect((await errors()) - before).toBeGreaterThanOrEqual(2);
    expect(b.output()).toContain('no GeoIP database is configured on this node (WARREN_GEOIP_DB)');
    expect(b.output()).toContain('the rule has a deny action, so it applies (fails closed)');
  });

  it('shows every field (names in English, the first subdivision); without a database the rules on it are skipped and the header left out', async () => {
    await c.policyRoute('/geo-show', {
      inbound: [
        { actions: [{ type: 'add-headers', config: { headers: { 'x-geo': FIELDS } } }] },
        { expressions: ["conn.geo.country_code == 'US'"], actions: [{ type: 'add-headers', config: { headers: { 'x-us': 'yes' } } }] },
        { expressions: ["conn.geo.latitude != '' && double(conn.geo.latitude) > 50.0"], actions: [{ type: 'add-headers', config: { headers: { 'x-north': 'yes' } } }] },
      ],
    });
    const withDb = (await c.request('/geo-show/x', { port: a.http })).json().headers;
    expect(withDb['x-geo']).toBe('Loopback|Testland|XX|Localshire|51.5|-0.125|5');
    expect([withDb['x-us'], withDb['x-north']]).toEqual([undefined, 'yes']);
    expect((await c.request('/geo-show/x', { port: a.http, from: '::1' })).json().headers['x-geo']).toBe('Loopback|Testland|XX|Localshire|51.5|-0.125|5');
    const noDb = await c.request('/geo-show/x', { port: b.http });
    expect(noDb.status, noDb.body).toBe(200);
    const without = noDb.json().headers;
    expect([without['x-geo'], without['x-us'], without['x-north']]).toEqual([undefined, undefined, undefined]);
  });

  it('says at start whether conn.geo is on', () => {
    expect(a.output()).toContain('GeoIP database loaded: conn.geo.* traffic-policy variables are on');
    expect(a.output()).toContain('"database_type":"GeoLite2-City"');
    expect(b.output()).toContain('WARREN_GEOIP_DB is not set: reading conn.geo.* in a traffic policy is an evaluation error (no GeoIP database is configured on this node (WARREN_GEOIP_DB)): a rule with a deny action applies, any other is skipped');
  });

  it('an unreadable database stops the ingress at start with one line', async () => {
    for (const [file, line] of [
      [path.join(dir, 'missing.mmdb'), /warren ingress: WARREN_GEOIP_DB=\S+missing\.mmdb: cannot read the GeoIP database: ENOENT[^\n]*\n/],
      [(writeFileSync(path.join(dir, 'bad.mmdb'), 'not a database'), path.join(dir, 'bad.mmdb')), /warren ingress: WARREN_GEOIP_DB=\S+bad\.mmdb: not a MaxMind DB \(\.mmdb\) file: [^\n]*\n/],
    ] as const) {
      const err = await startIngress({ nodeId: 'geo-bad', controlPlane: [`127.0.0.1:${c.cp.grpcPort}`], nodeToken: 'unused', env: { WARREN_GEOIP_DB: file } }).then(
        (n) => {
          void n.stop();
          return new Error('the ingress started');
        },
        (e: Error) => e,
      );
      expect(err.message).toMatch(/exited before listening \(code 1,/);
      expect(err.message).toMatch(line);
    }
    // Two process starts, each up to INGRESS_START_MS (a hang detector: the exit is what is expected).
  }, 2 * INGRESS_START_MS + WORK_MS);
});
