import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { createCertificate, type DataPlaneConfig } from '@warren/shared';
import { startTestApi, type Account, type TestApi } from '../../../../test/support/api.js';
import { hashToken } from '../auth/tokens.js';
import { createCa, createIpPolicy } from '../modules/https-edges/testing.js';
import { RATE_LIMIT_POLICY } from '../modules/https-edge-routes/fixtures.js';
import { cleanupNodes, metricValue, newNode, startTestPush, tempDir, type TestNode } from './testing.js';
import type { ConfigPush } from './index.js';
import { newConfigEpoch } from './config-reader.js';

let api: TestApi;
let push: ConfigPush & { registry: import('prom-client').Registry };
let acct: Account;
let target: string;

beforeAll(async () => {
  api = await startTestApi();
  push = await startTestPush(api.db);
  target = `127.0.0.1:${push.port}`;
  acct = await api.account('push');
});
afterEach(async () => {
  await cleanupNodes();
});
afterAll(async () => {
  await push?.stop(1_000);
  await api?.close();
});

async function ok(r: Promise<{ status: number; body: any }>, status = 200): Promise<any> {
  const res = await r;
  if (res.status !== status) throw new Error(`expected ${status}, got ${res.status}: ${JSON.stringify(res.body)}`);
  return res.body;
}
const post = (path: string, body: unknown) => ok(acct.call('POST', path, body), 201);
const patch = (path: string, body: unknown) => ok(acct.call('PATCH', path, body));
const put = (path: string, body: unknown) => ok(acct.call('PUT', path, body));
const del = (path: string) => ok(acct.call('DELETE', path), 204);

async function headVersion(): Promise<number> {
  return (await api.db.query<{ version: number }>('SELECT version FROM config_state')).rows[0]!.version;
}

/** Waits until the node's config satisfies `check` (and is at the head version, when asked). */
async function until(node: TestNode, check: (c: DataPlaneConfig) => boolean, atHead = true): Promise<DataPlaneConfig> {
  await expect
    .poll(async () => {
      const c = node.client.config;
      return !!c && check(c) && (!atHead || c.version === (await headVersion()));
    }, { timeout: 5_000, interval: 10 })
    .toBe(true);
  return node.client.config!;
}

async function started(targets = [target], over: Parameters<typeof newNode>[1] = {}): Promise<TestNode> {
  const n = await newNode(targets, over);
  const connected = new Promise<void>((r) => n.client.once('connected', () => r()));
  await n.client.start();
  await connected;
  return n;
}

describe('config push', () => {
  it('sends a snapshot, then a delta for every change of every entity type', async () => {
    const caId = await createCa(api, acct);
    const edge = await post('/edges/https', { hostports: ['snap.example.com:443'], mutual_tls: { certificate_authority_ids: [caId] }, tls_termination: { min_version: '1.3' } });
    const backend = await post('/backends/tunnel_group', { labels: { app: 'web' } });
    const policyId = await createIpPolicy(api, acct);
    const rule = await post('/ip_policy_rules', { ip_policy_id: policyId, cidr: '10.0.0.0/8', action: 'allow' });
    const route = await post(`/edges/https/${edge.id}/routes`, {
      match_type: 'path_prefix',
      match: '/',
      backend: { backend_id: backend.id },
      ip_restriction: { ip_policy_ids: [policyId] },
      traffic_policy: { value: RATE_LIMIT_POLICY },
      webhook_verification: { provider: 'GitHub', secret: 'whsec-123' },
    });
    const cred = await post('/credentials', { acl: ['bind:*.example.com'] });

    const node = await started();
    let cfg = await until(node, (c) => c.routes.has(route.id));
    const claimed = cfg.edges.get(edge.id)!.hostportClaimedMs!['snap.example.com:443']!;
    expect(claimed).toBeGreaterThanOrEqual(Date.parse(edge.created_at));
    expect(claimed).toBeLessThanOrEqual(Date.now());
    const head = await headVersion();
    expect(cfg.version).toBe(head);
    expect(cfg.edges.get(edge.id)).toEqual({
      id: edge.id,
      accountId: acct.accountId,
      hostports: ['snap.example.com:443'],
      mutualTls: { enabled: true, certificateAuthorityIds: [caId] },
      tlsTermination: { enabled: true, minVersion: '1.3' },
      hostportClaimedMs: { 'snap.example.com:443': claimed },
    });
    const r = cfg.routes.get(route.id)!;
    expect(r).toMatchObject({ id: route.id, accountId: acct.accountId, edgeId: edge.id, matchType: 'path_prefix', match: '/', backendId: backend.id, ipPolicyIds: [policyId] });
    expect(r.modules).toMatchObject({ backend: { enabled: true, backend_id: backend.id }, webhook_verification: { provider: 'GitHub', secret: 'whsec-123' } });
    expect(r.modules).not.toHaveProperty('traffic_policy');
    expect(r.trafficPolicy).toMatchObject({ enabled: true, value: { inbound: [{ name: 'per-ip', actions: [{ type: 'rate-limit', config: { capacity: 100, rate: '60s', bucket_key: ['conn.client_ip'] } }] }] } });
    expect(cfg.backends.get(backend.id)).toEqual({ id: backend.id, accountId: acct.accountId, labels: { app: 'web' } });
    expect(cfg.ipPolicies.get(policyId)).toEqual({ id: policyId, accountId: acct.accountId, rules: [{ id: rule.id, cidr: '10.0.0.0/8', action: 'allow' }] });
    expect(cfg.certificateAuthorities.get(caId)).toMatchObject({ id: caId, accountId: acct.accountId });
    expect(cfg.certificateAuthorities.get(caId)!.caPem).toMatch(/BEGIN CERTIFICATE/);
    const dpCred = { id: cred.id, accountId: acct.accountId, tokenHash: hashToken(cred.token), acl: ['bind:*.example.com'] };
    expect(cfg.credentials.get(cred.id)).toEqual(dpCred);
    expect(cfg.credentialsByTokenHash.get(dpCred.tokenHash)).toEqual(dpCred);
    expect(await metricValue(node.registry, 'warren_ingress_config_applied_version')).toBe(head);
    expect(await metricValue(node.registry, 'warren_ingress_config_lag_versions')).toBe(0);

    // route update
    await patch(`/edges/https/${edge.id}/routes/${route.id}`, { match: '/api' });
    cfg = await until(node, (c) => c.routes.get(route.id)?.match === '/api');
    // route module: backend disabled → no backendId
    await put(`/edges/https/${edge.id}/routes/${route.id}/backend`, { enabled: false, backend_id: backend.id });
    cfg = await until(node, (c) => c.routes.get(route.id)?.backendId === null);
    // edge update
    // edge update: the hostport it keeps keeps its claim time, the one it gains is claimed now
    // (the data plane settles a race for a host with an agent endpoint by it).
    const beforeAdd = Date.now();
    await patch(`/edges/https/${edge.id}`, { hostports: ['snap.example.com:443', 'snap2.example.com:443'] });
    cfg = await until(node, (c) => c.edges.get(edge.id)?.hostports.length === 2);
    const claims = cfg.edges.get(edge.id)!.hostportClaimedMs!;
    expect(claims['snap.example.com:443']).toBe(claimed);
    expect(claims['snap2.example.com:443']).toBeGreaterThanOrEqual(beforeAdd);
    await patch(`/edges/https/${edge.id}`, { hostports: ['snap2.example.com:443'] });
    cfg = await until(node, (c) => c.edges.get(edge.id)?.hostports.length === 1);
    expect(cfg.edges.get(edge.id)!.hostportClaimedMs).toEqual({ 'snap2.example.com:443': claims['snap2.example.com:443'] });
    await del(`/edges/https/${edge.id}/mutual_tls`);
    await until(node, (c) => c.edges.get(edge.id)?.mutualTls === null);
    // backend update
    await patch(`/backends/tunnel_group/${backend.id}`, { labels: { app: 'api', env: 'prod' } });
    await until(node, (c) => c.backends.get(backend.id)?.labels.env === 'prod');
    // IP policy rules: create, update, delete
    const rule2 = await post('/ip_policy_rules', { ip_policy_id: policyId, cidr: '192.168.0.0/16', action: 'allow' });
    await until(node, (c) => c.ipPolicies.get(policyId)?.rules.length === 2);
    await patch(`/ip_policy_rules/${rule2.id}`, { cidr: '192.168.1.0/24' });
    await until(node, (c) => c.ipPolicies.get(policyId)?.rules.some((x) => x.cidr === '192.168.1.0/24') === true);
    await del(`/ip_policy_rules/${rule.id}`);
    await until(node, (c) => c.ipPolicies.get(policyId)?.rules.map((x) => x.id).join() === rule2.id);
    // credential update and a new one
    await patch(`/credentials/${cred.id}`, { acl: ['bind:app.example.com'] });
    await until(node, (c) => c.credentials.get(cred.id)?.acl[0] === 'bind:app.example.com');
    const cred2 = await post('/credentials', {});
    await until(node, (c) => c.credentialsByTokenHash.has(hashToken(cred2.token)));
    // account disabled: its credentials leave the data plane; enabled: they are back
    await api.db.query('UPDATE accounts SET disabled = true WHERE id = $1', [acct.accountId]);
    await until(node, (c) => c.credentials.size === 0 && c.credentialsByTokenHash.size === 0);
    await api.db.query('UPDATE accounts SET disabled = false WHERE id = $1', [acct.accountId]);
    await until(node, (c) => c.credentials.has(cred.id) && c.credentials.has(cred2.id));
    // credential delete
    await del(`/credentials/${cred2.id}`);
    await until(node, (c) => !c.credentials.has(cred2.id) && !c.credentialsByTokenHash.has(hashToken(cred2.token)));
    // route delete; a second route, then the edge: it and its routes go
    await del(`/edges/https/${edge.id}/routes/${route.id}`);
    await until(node, (c) => !c.routes.has(route.id));
    const route2 = await post(`/edges/https/${edge.id}/routes`, { match_type: 'exact_path', match: '/x', backend: { backend_id: backend.id } });
    await until(node, (c) => c.routes.has(route2.id));
    await del(`/edges/https/${edge.id}`);
    cfg = await until(node, (c) => !c.edges.has(edge.id) && !c.routes.has(route2.id));
    // IP policy, backend and CA deletes
    await del(`/ip_policies/${policyId}`);
    await del(`/backends/tunnel_group/${backend.id}`);
    await del(`/certificate_authorities/${caId}`);
    cfg = await until(node, (c) => c.ipPolicies.size === 0 && c.backends.size === 0 && c.certificateAuthorities.size === 0);
    expect(cfg.credentials.has(cred.id)).toBe(true);
    // changes with no data-plane form still advance the version
    await post('/reserved_addrs', { description: 'not data plane' });
    await until(node, () => true);

    // the control plane records what each node applied
    await expect
      .poll(async () => (await api.db.query('SELECT applied_version, connected, last_error FROM ingress_nodes WHERE id = $1', [node.nodeId])).rows[0], { timeout: 5_000 })
      .toEqual({ applied_version: await headVersion(), connected: true, last_error: '' });
    expect(await metricValue(push.registry, 'warren_control_plane_config_nodes_connected')).toBeGreaterThanOrEqual(1);
    const latency = (await push.registry.getSingleMetric('warren_control_plane_config_push_latency_seconds')!.get()).values as { metricName?: string; value: number }[];
    expect(latency.find((v) => v.metricName?.endsWith('_count'))?.value).toBeGreaterThan(0);
  });

  it('keeps the old config and records the error when a validator refuses a version; recovers on the next good one', async () => {
    const edge = await post('/edges/https', { hostports: ['nack.example.com:443'] });
    const node = await newNode([target]);
    node.client.addValidator((c) => {
      for (const r of c.routes.values()) if (r.match === '/forbidden') throw new Error(`route ${r.id}: /forbidden is not allowed here`);
    });
    const configs: number[] = [];
    node.client.on('config', (c) => configs.push(c.version));
    await node.client.start();
    await until(node, (c) => c.edges.has(edge.id));
    const good = node.client.config!;

    const bad = await post(`/edges/https/${edge.id}/routes`, { match_type: 'path_prefix', match: '/forbidden' });
    const badVersion = await headVersion();
    await expect
      .poll(async () => (await api.db.query('SELECT last_error, last_error_version FROM ingress_nodes WHERE id = $1', [node.nodeId])).rows[0], { timeout: 5_000 })
      .toEqual({ last_error: `route ${bad.id}: /forbidden is not allowed here`, last_error_version: badVersion });
    expect(node.client.config).toBe(good); // the very same object: nothing was swapped
    expect(await metricValue(node.registry, 'warren_ingress_config_applies_total', { kind: 'delta', result: 'rejected' })).toBe(1);
    expect(await metricValue(node.registry, 'warren_ingress_config_lag_versions')).toBe(1);

    // An unrelated change after the refused one cannot apply on its own (it does not follow the
    // applied version); the node asks for a resync and still refuses while the bad route exists.
    await post('/edges/https', { hostports: ['nack2.example.com:443'] });
    await expect.poll(async () => metricValue(node.registry, 'warren_ingress_config_applies_total', { kind: 'delta', result: 'rejected' }), { timeout: 5_000 }).toBe(2);
    expect(node.client.config).toBe(good);

    // Fixing it brings the node to the head in one step, and the error is cleared.
    await patch(`/edges/https/${edge.id}/routes/${bad.id}`, { match: '/fine' });
    const cfg = await until(node, (c) => c.routes.get(bad.id)?.match === '/fine');
    expect(cfg.edges.size).toBeGreaterThanOrEqual(2);
    await expect
      .poll(async () => (await api.db.query('SELECT last_error, last_error_version, applied_version FROM ingress_nodes WHERE id = $1', [node.nodeId])).rows[0], { timeout: 5_000 })
      .toEqual({ last_error: '', last_error_version: null, applied_version: cfg.version });
    expect(configs.every((v, i) => i === 0 || v > configs[i - 1]!)).toBe(true);
  });

  it('boots from disk while the control plane is unreachable, then catches up', async () => {
    const edge = await post('/edges/https', { hostports: ['disk.example.com:443'] });
    const first = await started();
    await until(first, (c) => c.edges.has(edge.id));
    await first.client.stop(); // persisted on stop at the latest
    const version = first.client.config!.version;

    // A port nothing listens on: the node serves from disk and keeps trying.
    const dead = await newNode(['127.0.0.1:1'], { stateDir: first.stateDir, nodeId: first.nodeId });
    const seen: DataPlaneConfig[] = [];
    dead.client.on('config', (c, prev) => {
      expect(prev).toBeNull();
      seen.push(c);
    });
    await dead.client.start();
    expect(dead.client.connected).toBe(false);
    expect(seen).toHaveLength(1);
    expect(seen[0]!.version).toBe(version);
    expect(dead.client.config!.edges.get(edge.id)!.hostports).toEqual(['disk.example.com:443']);
    await dead.client.stop();

    // A change made meanwhile arrives once a control plane is reachable (second target).
    await patch(`/edges/https/${edge.id}`, { hostports: ['disk2.example.com:443'] });
    const back = await newNode(['127.0.0.1:1', target], { stateDir: first.stateDir, nodeId: first.nodeId });
    await back.client.start();
    expect(back.client.config!.version).toBe(version);
    await until(back, (c) => c.edges.get(edge.id)?.hostports[0] === 'disk2.example.com:443');
    // It resumed with a delta from its version rather than a snapshot.
    expect(await metricValue(back.registry, 'warren_ingress_config_applies_total', { kind: 'delta', result: 'ok' })).toBeGreaterThanOrEqual(1);
    expect(await metricValue(back.registry, 'warren_ingress_config_applies_total', { kind: 'snapshot', result: 'ok' })).toBeUndefined();
  });

  it('ships event subscriptions with traffic types (types and destination kinds only) in snapshots and deltas', async () => {
    const secret = 'dd-key-never-pushed-7f3a';
    const d1 = await post('/event_destinations', { target: { datadog: { api_key: secret } } });
    const d2 = await post('/event_destinations', { target: { datadog: { api_key: secret, ddsite: 'datadoghq.eu' } } });
    const a = await post('/event_subscriptions', { sources: [{ type: 'ip_policy_created.v0' }, { type: 'http_request_complete.v0' }], destination_ids: [d1.id] });
    const b = await post('/event_subscriptions', { sources: [{ type: 'ip_policy_created.v0' }], destination_ids: [d2.id] });
    const noDest = await post('/event_subscriptions', { sources: [{ type: 'http_request_complete.v0' }] });

    const node = await started();
    let cfg = await until(node, (c) => c.eventSubscriptions.has(a.id));
    expect(cfg.eventSubscriptions.get(a.id)).toEqual({ id: a.id, accountId: acct.accountId, types: ['http_request_complete.v0'], destinations: [{ id: d1.id, kind: 'datadog' }] });
    // Audit-only subscriptions and subscriptions without destinations are not part of the data plane.
    expect(cfg.eventSubscriptions.has(b.id)).toBe(false);
    expect(cfg.eventSubscriptions.has(noDest.id)).toBe(false);
    expect(JSON.stringify([...cfg.eventSubscriptions.values()])).not.toContain(secret);

    // A source added through the sources endpoint brings b in.
    await post(`/event_subscriptions/${b.id}/sources`, { type: 'tcp_connection_closed.v0' });
    cfg = await until(node, (c) => c.eventSubscriptions.has(b.id));
    expect(cfg.eventSubscriptions.get(b.id)).toMatchObject({ types: ['tcp_connection_closed.v0'], destinations: [{ id: d2.id, kind: 'datadog' }] });
    // Destinations replaced by a PATCH.
    await patch(`/event_subscriptions/${a.id}`, { destination_ids: [d2.id, d1.id] });
    await until(node, (c) => c.eventSubscriptions.get(a.id)?.destinations.map((d) => d.id).join() === `${d2.id},${d1.id}`);
    // Its last traffic source removed: a delete for the node; added back: an upsert.
    await del(`/event_subscriptions/${a.id}/sources/http_request_complete.v0`);
    await until(node, (c) => !c.eventSubscriptions.has(a.id));
    await post(`/event_subscriptions/${a.id}/sources`, { type: 'http_request_complete.v0' });
    await until(node, (c) => c.eventSubscriptions.get(a.id)?.types.join() === 'http_request_complete.v0');
    // Sources replaced by a PATCH, audit only: gone.
    await patch(`/event_subscriptions/${b.id}`, { sources: [{ type: 'api_key_created.v0' }] });
    await until(node, (c) => !c.eventSubscriptions.has(b.id));
    // Destinations cleared, then the subscription deleted.
    await patch(`/event_subscriptions/${noDest.id}`, { destination_ids: [d1.id] });
    await until(node, (c) => c.eventSubscriptions.has(noDest.id));
    await patch(`/event_subscriptions/${noDest.id}`, { destination_ids: [] });
    await until(node, (c) => !c.eventSubscriptions.has(noDest.id));
    await del(`/event_subscriptions/${a.id}`);
    cfg = await until(node, (c) => !c.eventSubscriptions.has(a.id));
    expect(cfg.eventSubscriptions.size).toBe(0);
    await del(`/event_subscriptions/${b.id}`);
    await del(`/event_subscriptions/${noDest.id}`);
  });

  it('loads a persisted config of format 1 (before event subscriptions), then takes a snapshot instead of a delta', async () => {
    const d = await post('/event_destinations', { target: { datadog: { api_key: 'k' } } });
    const s = await post('/event_subscriptions', { sources: [{ type: 'http_request_complete.v0' }], destination_ids: [d.id] });
    const first = await started();
    await until(first, (c) => c.eventSubscriptions.has(s.id));
    await first.client.stop();
    // What an older node wrote: format 1, no eventSubscriptions.
    const file = path.join(first.stateDir, 'config.json');
    const stored = JSON.parse(await readFile(file, 'utf8'));
    expect(stored.format).toBe(2);
    expect(stored.entities.eventSubscriptions).toHaveLength(1);
    delete stored.entities.eventSubscriptions;
    await writeFile(file, JSON.stringify({ ...stored, format: 1 }));

    const again = await newNode([target], { stateDir: first.stateDir, nodeId: first.nodeId });
    const fromDisk = new Promise<DataPlaneConfig>((r) => again.client.once('config', (c) => r(c)));
    await again.client.start();
    const loaded = await fromDisk;
    expect(loaded.version).toBe(stored.version);
    expect(loaded.eventSubscriptions.size).toBe(0);
    await until(again, (c) => c.eventSubscriptions.has(s.id));
    expect(await metricValue(again.registry, 'warren_ingress_config_applies_total', { kind: 'snapshot', result: 'ok' })).toBe(1);
    await again.client.stop();
    expect(JSON.parse(await readFile(file, 'utf8')).format).toBe(2);
    await del(`/event_subscriptions/${s.id}`);
  });

  it('refuses nodes without the right token when one is set', async () => {
    const secured = await startTestPush(api.db, { grpc: { host: '127.0.0.1', port: 0, token: 'node-secret-0123456789' } });
    try {
      const t = `127.0.0.1:${secured.port}`;
      const bad = await newNode([t], { token: 'wrong' });
      await bad.client.start();
      const good = await started([t], { token: 'node-secret-0123456789' });
      await until(good, () => true);
      await new Promise((r) => setTimeout(r, 200));
      expect(bad.client.connected).toBe(false);
      expect(bad.client.config).toBeNull();
    } finally {
      await cleanupNodes();
      await secured.stop(1_000);
    }
  });
});

describe('transport security', () => {
  it('serves mutual TLS: a node with a certificate from the client CA gets its config, one without does not', async () => {
    const ca = await createCertificate({ commonName: 'test CA', days: 1, ca: true, keyType: 'ec' });
    const server = await createCertificate({ commonName: 'cp', days: 1, issuer: ca, ipAddresses: ['127.0.0.1'], dnsNames: ['localhost'], keyType: 'ec' });
    const nodeCert = await createCertificate({ commonName: 'node', days: 1, issuer: ca, dnsNames: ['node.local'], keyType: 'ec' });
    const dir = await tempDir();
    const file = async (name: string, text: string) => {
      await writeFile(path.join(dir, name), text);
      return path.join(dir, name);
    };
    const tls = { certFile: await file('cert.pem', server.certificatePem), keyFile: await file('key.pem', server.privateKeyPem), clientCaFile: await file('ca.pem', ca.certificatePem) };
    const secured = await startTestPush(api.db, { grpc: { host: '127.0.0.1', port: 0, tls, token: 'tls-node-token' } });
    try {
      const t = `127.0.0.1:${secured.port}`;
      const caBuf = Buffer.from(ca.certificatePem);
      const noCert = await newNode([t], { token: 'tls-node-token', tls: { ca: caBuf, serverNameOverride: 'localhost' } });
      await noCert.client.start();
      const good = await started([t], { token: 'tls-node-token', tls: { ca: caBuf, cert: Buffer.from(nodeCert.certificatePem), key: Buffer.from(nodeCert.privateKeyPem), serverNameOverride: 'localhost' } });
      await until(good, () => true);
      await new Promise((r) => setTimeout(r, 200));
      expect(noCert.client.connected).toBe(false);
    } finally {
      await cleanupNodes();
      await secured.stop(1_000);
    }
  });
});

describe('outages', () => {
  it('reconnects to a restarted control plane and catches up with a delta', async () => {
    const p1 = await startTestPush(api.db);
    const port = p1.port;
    let p2: Awaited<ReturnType<typeof startTestPush>> | undefined;
    try {
      const edge = await post('/edges/https', { hostports: ['restart.example.com:443'] });
      const node = await started([`127.0.0.1:${port}`]);
      await until(node, (c) => c.edges.has(edge.id));
      const disconnected = new Promise<void>((r) => node.client.once('disconnected', () => r()));
      await p1.stop(500);
      await disconnected;
      expect(node.client.connected).toBe(false);
      // The node keeps serving; changes made meanwhile wait in the database.
      await patch(`/edges/https/${edge.id}`, { hostports: ['restart2.example.com:443'] });
      expect(node.client.config!.edges.get(edge.id)!.hostports).toEqual(['restart.example.com:443']);

      const reconnected = new Promise<void>((r) => node.client.once('connected', () => r()));
      p2 = await startTestPush(api.db, { grpc: { host: '127.0.0.1', port } });
      await reconnected;
      await until(node, (c) => c.edges.get(edge.id)?.hostports[0] === 'restart2.example.com:443');
      expect(await metricValue(node.registry, 'warren_ingress_config_applies_total', { kind: 'snapshot', result: 'ok' })).toBe(1);
      expect(await metricValue(node.registry, 'warren_ingress_config_reconnects_total')).toBeGreaterThanOrEqual(1);
    } finally {
      await cleanupNodes();
      await p1.stop(200);
      await p2?.stop(200);
    }
  });

  it('catches up after its LISTEN connection is cut', async () => {
    const node = await started();
    const edge = await post('/edges/https', { hostports: ['listen.example.com:443'] });
    await until(node, (c) => c.edges.has(edge.id));
    const cut = await api.db.query(
      `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'warren-control-plane-listener'`,
    );
    expect(cut.rowCount).toBeGreaterThanOrEqual(1);
    // Committed while nobody listens: picked up from the outbox on reconnect.
    await patch(`/edges/https/${edge.id}`, { hostports: ['listen2.example.com:443'] });
    await until(node, (c) => c.edges.get(edge.id)?.hostports[0] === 'listen2.example.com:443');
    expect(await metricValue(push.registry, 'warren_control_plane_config_listener_reconnects_total')).toBeGreaterThanOrEqual(1);
  });

  it('a database restored in place (same epoch, lower version) diverges nodes until new-config-epoch, which resyncs them whole', async () => {
    const node = await started();
    const lost = await post('/credentials', { acl: [] });
    const lostAt = await headVersion();
    await until(node, (c) => c.credentials.has(lost.id));
    // "Restore a backup from before `lost`": its row, its outbox row and the version go back
    // (the epoch row comes back as it was in the backup: unchanged).
    await api.db.query(`DELETE FROM credentials WHERE id = $1`, [lost.id]);
    await api.db.query(`DELETE FROM outbox WHERE version >= $1`, [lostAt]);
    await api.db.query(`UPDATE config_state SET version = $1`, [lostAt - 1]);
    // A write after the restore reuses the version number the node already applied.
    const fresh = await post('/credentials', { acl: [] });
    expect(await headVersion()).toBe(lostAt);
    await new Promise((r) => setTimeout(r, 300));
    const before = node.client.config!;
    // What versions alone cannot tell apart: the node holds the lost credential and not the new one.
    expect([before.version, before.credentials.has(lost.id), before.credentials.has(fresh.id)]).toEqual([lostAt, true, false]);
    const r = await newConfigEpoch(api.db.pool);
    const after = await until(node, (c) => c.credentials.has(fresh.id) && !c.credentials.has(lost.id));
    expect(after.version).toBe(lostAt);
    expect((node.client as unknown as { epoch: string }).epoch).toBe(r.epoch);
  });

  it("a node that cannot save its config serves and ACKs it, and says so (persisted version and error)", async () => {
    // STATE_DIR under a regular file: every save fails (ENOTDIR).
    const file = path.join(await tempDir(), 'not-a-dir');
    await writeFile(file, 'x');
    const node = await started([target], { stateDir: path.join(file, 'state') });
    const cred = await post('/credentials', { acl: [] });
    await until(node, (c) => c.credentials.has(cred.id));
    await expect.poll(() => node.client.persisted.error, { timeout: 5_000 }).toMatch(/ENOTDIR|not a directory/);
    expect(node.client.persisted.version).toBe(0);
    // A node that can save: the version it serves, no error.
    const good = await started();
    await until(good, (c) => c.credentials.has(cred.id));
    // The save runs on the store's worker thread: a loaded machine takes more than poll's default second.
    await expect.poll(() => good.client.persisted, { timeout: 10_000 }).toEqual({ version: await headVersion(), error: null });
  });
});
