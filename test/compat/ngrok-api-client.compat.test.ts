/**
 * The official TypeScript client, `@ngrok/ngrok-api` 0.11, used unmodified against the real
 * control-plane process. The client camelCases every response key (map keys included) and
 * snake_cases every request key, so labels and header names here are single lowercase words.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Ngrok, EventTarget, HTTPSEdgeRouteUpdate, TunnelGroupBackendUpdate, CredentialCreate, EndpointWebhookValidation, HTTPSEdgeRouteCreate } from '@ngrok/ngrok-api';
import { freshDatabase } from '../support/databases.js';
import { startControlPlane, type ControlPlaneProcess } from '../support/processes.js';
import { CONTROL_PLANE_START_MS, WORK_MS } from '../support/timeouts.js';
import { createDb, createPool } from '../../services/control-plane/src/db/pool.js';
import { createAccountWithKey } from '../../services/control-plane/src/modules/accounts/accounts.service.js';
import { ApiCallError, deleteAndVerify, expectApiError, expectPaging, map, officialClient, times, tolerateEmptyBody } from './client.js';
import { CA2_PEM, CA_PEM, IDP_METADATA, RFC3339, idRe, rand } from './fixtures.js';

let cp: ControlPlaneProcess;
let database: Awaited<ReturnType<typeof freshDatabase>>;
let pool: ReturnType<typeof createPool>;
let base: string;

beforeAll(async () => {
  database = await freshDatabase();
  cp = await startControlPlane({ databaseUrl: database.url });
  base = cp.baseUrl;
  pool = createPool(database.url, 2);
}, CONTROL_PLANE_START_MS + WORK_MS);
afterAll(async () => {
  await cp?.stop();
  await pool?.end();
  await database?.drop();
});

/** A new account (so lists hold exactly what the test made) and an official client for it. */
async function account(name: string): Promise<{ client: Ngrok; token: string; accountId: string; apiKeyId: string }> {
  const acct = await createAccountWithKey(createDb(pool), name);
  return { ...acct, client: officialClient(base, acct.token) };
}

const ref = (collection: string, id: string) => ({ id, uri: `${base}/${collection}/${id}` });
const anyDate = expect.stringMatching(RFC3339);

describe('reservedAddrs', () => {
  it('create, get, update, list across pages, delete', async () => {
    const { client } = await account('ra');
    const created = await client.reservedAddrs.create({ description: 'ssh', metadata: '{"k":1}', region: 'eu' });
    expect(created).toEqual({
      id: expect.stringMatching(idRe('ra')),
      uri: `${base}/reserved_addrs/${created.id}`,
      createdAt: anyDate,
      description: 'ssh',
      metadata: '{"k":1}',
      addr: expect.stringMatching(/^[a-z0-9.-]+:\d{2,5}$/),
      region: 'eu',
      endpointConfiguration: null,
    });
    expect(await client.reservedAddrs.get(created.id)).toEqual(created);

    const updated = await client.reservedAddrs.update({ id: created.id, metadata: 'm2' });
    expect(updated).toEqual({ ...created, metadata: 'm2' });
    const cleared = await client.reservedAddrs.update({ id: created.id, description: '' });
    expect(cleared).toEqual({ ...updated, description: undefined });
    expect('description' in cleared).toBe(false);

    const more = await times(6, (i) => client.reservedAddrs.create({ description: `n${i}`, region: 'us' }));
    await expectPaging((b, l) => client.reservedAddrs.list(b, l), [created.id, ...more.map((r) => r.id)]);

    await deleteAndVerify(() => client.reservedAddrs.delete(created.id), () => client.reservedAddrs.get(created.id));
    expect((await client.reservedAddrs.list()).map((r) => r.id)).not.toContain(created.id);
  });

  it('the default list() pages by 100 and follows on with beforeId', async () => {
    const { client } = await account('ra-many');
    const made = await times(130, (i) => client.reservedAddrs.create({ description: `bulk ${i}`, region: 'us' }));
    const listed = await client.reservedAddrs.list();
    expect(listed).toHaveLength(130);
    expect(listed.map((r) => r.id)).toEqual(made.map((r) => r.id).sort().reverse());
  });

  it('rejects a bad value with an error the client can read', async () => {
    const { client } = await account('ra-bad');
    const e = await expectApiError(client.reservedAddrs.create({ region: 'mars' }), 400, 'ERR_WARREN_2104');
    expect(e.details.get('field')).toBe('region');
    await expectApiError(client.reservedAddrs.get('ra_2qT9aaaaaaaaaaaaaaaaaaaaaaa'), 404, 'ERR_WARREN_4001');
  });
});

describe('backends.tunnelGroupBackends', () => {
  it('create, get, update, list across pages, delete', async () => {
    const { client } = await account('bkd');
    const svc = client.backends.tunnelGroupBackends;
    const created = await svc.create({ description: 'web', metadata: 'm', labels: map({ app: 'web', env: 'prod' }) });
    expect(created).toEqual({
      id: expect.stringMatching(idRe('bkdtg')),
      uri: `${base}/backends/tunnel_group/${created.id}`,
      createdAt: anyDate,
      description: 'web',
      metadata: 'm',
      labels: { app: 'web', env: 'prod' },
      tunnels: [],
    });
    expect(await svc.get(created.id)).toEqual(created);

    const relabeled = await svc.update({ id: created.id, labels: map({ env: 'stage' }) });
    expect(relabeled).toEqual({ ...created, labels: { env: 'stage' } });
    // labels omitted: unchanged (the client types them as required; the wire allows omitting them)
    const renamed = await svc.update({ id: created.id, description: 'web2' } as TunnelGroupBackendUpdate);
    expect(renamed).toEqual({ ...relabeled, description: 'web2' });

    const more = await times(6, (i) => svc.create({ labels: map({ n: String(i) }) }));
    await expectPaging((b, l) => svc.list(b, l), [created.id, ...more.map((x) => x.id)]);

    await deleteAndVerify(() => svc.delete(created.id), () => svc.get(created.id));
  });
});

describe('certificateAuthorities', () => {
  it('create, get, update, list across pages, delete', async () => {
    const { client } = await account('ca');
    const svc = client.certificateAuthorities;
    // Sent without its final line feed: returned with one.
    const created = await svc.create({ caPem: CA_PEM.trimEnd(), description: 'root', metadata: 'm' });
    expect(created).toEqual({
      id: expect.stringMatching(idRe('ca')),
      uri: `${base}/certificate_authorities/${created.id}`,
      createdAt: anyDate,
      description: 'root',
      metadata: 'm',
      caPem: CA_PEM,
      subjectCommonName: 'Warren Test CA',
      notBefore: '2026-11-22T20:44:58Z',
      notAfter: '2126-10-29T20:44:58Z',
      keyUsages: expect.any(Array),
      extendedKeyUsages: expect.any(Array),
    });
    expect(created.keyUsages).toHaveLength(3); // digitalSignature, keyCertSign, cRLSign
    expect(created.extendedKeyUsages).toHaveLength(2); // serverAuth, clientAuth
    expect(await svc.get(created.id)).toEqual(created);

    const updated = await svc.update({ id: created.id, description: 'root CA', metadata: '' });
    expect(updated).toEqual({ ...created, description: 'root CA', metadata: undefined });

    const second = await svc.create({ caPem: CA2_PEM });
    expect(second).toMatchObject({ subjectCommonName: 'Warren Test CA 2', extendedKeyUsages: [] });
    expect(second.keyUsages).toHaveLength(2);
    const more = await times(5, () => svc.create({ caPem: CA2_PEM }));
    await expectPaging((b, l) => svc.list(b, l), [created.id, second.id, ...more.map((x) => x.id)]);

    await expectApiError(svc.create({ caPem: 'not a pem' }), 400);
    await deleteAndVerify(() => svc.delete(created.id), () => svc.get(created.id));
  });
});

describe('edges.edgesHttps and the edge modules', () => {
  it('create, get, update, list across pages, modules replace/get/delete, delete', async () => {
    const { client } = await account('edge');
    const ca = await client.certificateAuthorities.create({ caPem: CA_PEM });
    const ca2 = await client.certificateAuthorities.create({ caPem: CA2_PEM });
    const svc = client.edges.edgesHttps;
    const hp = `${rand()}.example.com:443`;
    const created = await svc.create({
      description: 'edge',
      metadata: 'm',
      hostports: [hp],
      mutualTls: { enabled: true, certificateAuthorityIds: [ca.id] },
      tlsTermination: { enabled: true, minVersion: '1.3' },
    });
    expect(created).toEqual({
      id: expect.stringMatching(idRe('edghts')),
      uri: `${base}/edges/https/${created.id}`,
      createdAt: anyDate,
      description: 'edge',
      metadata: 'm',
      hostports: [hp],
      mutualTls: { enabled: true, certificateAuthorities: [ref('certificate_authorities', ca.id)] },
      tlsTermination: { enabled: true, terminateAt: 'edge', minVersion: '1.3' },
      routes: [],
    });
    expect(await svc.get(created.id)).toEqual(created);

    const hp2 = `${rand()}.example.com:443`;
    const updated = await svc.update({ id: created.id, description: 'edge2', hostports: [hp2, hp] });
    expect(updated).toEqual({ ...created, description: 'edge2', hostports: [hp2, hp] });
    // a hostport belongs to one edge only
    await expectApiError(svc.create({ hostports: [hp2] }), 409, 'ERR_WARREN_4101');
    // a CA listed by mutual_tls cannot go
    await expectApiError(client.certificateAuthorities.delete(ca.id), 409, 'ERR_WARREN_4100');

    // mutual_tls module
    const mtls = client.edgeModules.httpsEdgeMutualTlsModule;
    const m1 = await mtls.replace({ id: created.id, module: { enabled: false, certificateAuthorityIds: [ca.id, ca2.id] } });
    expect(m1).toEqual({ enabled: false, certificateAuthorities: [ref('certificate_authorities', ca.id), ref('certificate_authorities', ca2.id)] });
    expect(await mtls.get(created.id)).toEqual(m1);
    expect((await svc.get(created.id)).mutualTls).toEqual(m1);
    await deleteAndVerify(() => mtls.delete(created.id), () => mtls.get(created.id), 'ERR_WARREN_4002');
    expect((await svc.get(created.id)).mutualTls).toBeNull();
    await tolerateEmptyBody(mtls.delete(created.id)); // DELETE of an unset module is still 204
    // no longer referenced: the CA can go now
    await deleteAndVerify(() => client.certificateAuthorities.delete(ca.id), () => client.certificateAuthorities.get(ca.id));

    // tls_termination module
    const tls = client.edgeModules.httpsEdgeTlsTerminationModule;
    const t1 = await tls.replace({ id: created.id, module: { enabled: true, minVersion: '1.2' } });
    expect(t1).toEqual({ enabled: true, terminateAt: 'edge', minVersion: '1.2' });
    expect(await tls.get(created.id)).toEqual(t1);
    await expectApiError(tls.replace({ id: created.id, module: { enabled: true, minVersion: '1.0' } }), 400);
    await deleteAndVerify(() => tls.delete(created.id), () => tls.get(created.id), 'ERR_WARREN_4002');
    expect((await svc.get(created.id)).tlsTermination).toBeNull();

    const more = await times(6, (i) => svc.create({ description: `e${i}` }));
    await expectPaging((b, l) => svc.list(b, l), [created.id, ...more.map((x) => x.id)]);
    for (const e of more) expect(e).toMatchObject({ hostports: [], routes: [], mutualTls: null, tlsTermination: null });

    await deleteAndVerify(() => svc.delete(created.id), () => svc.get(created.id));
  });
});

describe('edges.edgesHttpsRoutes and the route modules', () => {
  it('create, get, update, routes on the edge, every module replace/get/delete, delete', async () => {
    const { client } = await account('routes');
    const backend = await client.backends.tunnelGroupBackends.create({ labels: map({ app: 'web' }) });
    const backend2 = await client.backends.tunnelGroupBackends.create({ labels: map({ app: 'api' }) });
    const policy = await client.ipPolicies.create({ description: 'office' });
    const edge = await client.edges.edgesHttps.create({ hostports: [`${rand()}.example.com:443`] });
    const svc = client.edges.edgesHttpsRoutes;

    const saml = {
      enabled: true,
      optionsPassthrough: false,
      cookiePrefix: 'warren.',
      inactivityTimeout: 0,
      maximumDuration: 0,
      idpMetadata: IDP_METADATA,
      forceAuthn: true,
      allowIdpInitiated: false,
      authorizedGroups: ['admins'],
      nameidFormat: 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent',
    };
    const cb = { enabled: true, trippedDuration: 10, rollingWindow: 60, numBuckets: 10, volumeThreshold: 20, errorThresholdPercentage: 0.5 };
    const route = await svc.create({
      edgeId: edge.id,
      matchType: 'path_prefix',
      match: '/api',
      description: 'api',
      metadata: 'm',
      backend: { enabled: true, backendId: backend.id },
      ipRestriction: { enabled: true, ipPolicyIds: [policy.id] },
      circuitBreaker: cb,
      compression: { enabled: true },
      requestHeaders: { enabled: true, add: map({ xfoo: 'bar' }), remove: ['cookie'] },
    });
    const unset = {
      responseHeaders: null,
      webhookVerification: null,
      oauth: null,
      saml: null,
      oidc: null,
      websocketTcpConverter: null,
      userAgentFilter: null,
      trafficPolicy: null,
      policy: null,
    };
    expect(route).toEqual({
      edgeId: edge.id,
      id: expect.stringMatching(idRe('edghtsrt')),
      uri: `${base}/edges/https/${edge.id}/routes/${route.id}`,
      createdAt: anyDate,
      matchType: 'path_prefix',
      match: '/api',
      description: 'api',
      metadata: 'm',
      backend: { enabled: true, backend: ref('backends/tunnel_group', backend.id) },
      ipRestriction: { enabled: true, ipPolicies: [ref('ip_policies', policy.id)] },
      circuitBreaker: cb,
      compression: { enabled: true },
      requestHeaders: { enabled: true, add: { xfoo: 'bar' }, remove: ['cookie'] },
      ...unset,
    });
    const item = { edgeId: edge.id, id: route.id };
    expect(await svc.get(item)).toEqual(route);

    // PATCH: modules not given stay; the client always sends edge_id and id in the body.
    const renamed = await svc.update({ ...item, matchType: 'path_prefix', match: '/api', description: 'api v2' });
    expect(renamed).toEqual({ ...route, description: 'api v2' });
    // traffic_policy is not in the 0.11 client's types; its serializer passes it through.
    const tp = JSON.stringify({ inbound: [{ actions: [{ type: 'rate-limit', config: { name: 'per-ip', algorithm: 'sliding_window', capacity: 100, rate: '60s', bucket_key: ['conn.client_ip'] } }] }] });
    const withPolicy = await svc.update({ ...item, matchType: 'path_prefix', match: '/api', trafficPolicy: { enabled: true, value: tp } } as HTTPSEdgeRouteUpdate);
    expect((withPolicy as unknown as { trafficPolicy: unknown }).trafficPolicy).toEqual({ enabled: true, value: tp });

    const second = await svc.create({ edgeId: edge.id, matchType: 'exact_path', match: '/health' });
    expect(second).toMatchObject({ backend: null, ipRestriction: null, compression: null, ...unset });
    await expectApiError(svc.create({ edgeId: edge.id, matchType: 'exact_path', match: '/health' }), 409, 'ERR_WARREN_4101');
    // routes are listed only on their edge, oldest first
    expect((await client.edges.edgesHttps.get(edge.id)).routes.map((r) => r.id)).toEqual([route.id, second.id]);

    // references from route modules block deletes
    await expectApiError(client.backends.tunnelGroupBackends.delete(backend.id), 409, 'ERR_WARREN_4100');
    await expectApiError(client.ipPolicies.delete(policy.id), 409, 'ERR_WARREN_4100');

    // Every route module the client offers: replace → get → the route shows it → delete → 404 4002 → null on the route.
    const m = client.edgeModules;
    const modules: { key: string; replace: () => Promise<unknown>; get: () => Promise<unknown>; del: () => Promise<unknown>; want: unknown }[] = [
      {
        key: 'backend',
        replace: () => m.edgeRouteBackendModule.replace({ ...item, module: { enabled: false, backendId: backend2.id } }),
        get: () => m.edgeRouteBackendModule.get(item),
        del: () => m.edgeRouteBackendModule.delete(item),
        want: { enabled: false, backend: ref('backends/tunnel_group', backend2.id) },
      },
      {
        key: 'ipRestriction',
        replace: () => m.edgeRouteIpRestrictionModule.replace({ ...item, module: { enabled: true, ipPolicyIds: [policy.id] } }),
        get: () => m.edgeRouteIpRestrictionModule.get(item),
        del: () => m.edgeRouteIpRestrictionModule.delete(item),
        want: { enabled: true, ipPolicies: [ref('ip_policies', policy.id)] },
      },
      {
        key: 'requestHeaders',
        replace: () => m.edgeRouteRequestHeadersModule.replace({ ...item, module: { enabled: true, add: map({ xa: '1', xb: 'two words' }), remove: ['xc'] } }),
        get: () => m.edgeRouteRequestHeadersModule.get(item),
        del: () => m.edgeRouteRequestHeadersModule.delete(item),
        want: { enabled: true, add: { xa: '1', xb: 'two words' }, remove: ['xc'] },
      },
      {
        key: 'responseHeaders',
        replace: () => m.edgeRouteResponseHeadersModule.replace({ ...item, module: { enabled: true, add: map({ server: 'warren' }), remove: ['etag'] } }),
        get: () => m.edgeRouteResponseHeadersModule.get(item),
        del: () => m.edgeRouteResponseHeadersModule.delete(item),
        want: { enabled: true, add: { server: 'warren' }, remove: ['etag'] },
      },
      {
        key: 'compression',
        replace: () => m.edgeRouteCompressionModule.replace({ ...item, module: { enabled: false } }),
        get: () => m.edgeRouteCompressionModule.get(item),
        del: () => m.edgeRouteCompressionModule.delete(item),
        want: { enabled: false },
      },
      {
        key: 'circuitBreaker',
        replace: () => m.edgeRouteCircuitBreakerModule.replace({ ...item, module: { ...cb, numBuckets: 128, errorThresholdPercentage: 1 } }),
        get: () => m.edgeRouteCircuitBreakerModule.get(item),
        del: () => m.edgeRouteCircuitBreakerModule.delete(item),
        want: { ...cb, numBuckets: 128, errorThresholdPercentage: 1 },
      },
      {
        key: 'webhookVerification',
        // The 0.11 type has only `secret`; `provider` and `enabled` pass through its serializer.
        replace: () => m.edgeRouteWebhookVerificationModule.replace({ ...item, module: { enabled: true, provider: 'github', secret: 'whsec' } as EndpointWebhookValidation }),
        get: () => m.edgeRouteWebhookVerificationModule.get(item),
        del: () => m.edgeRouteWebhookVerificationModule.delete(item),
        want: { enabled: true, provider: 'github', secret: '' },
      },
      {
        key: 'oauth',
        replace: () =>
          m.edgeRouteOAuthModule.replace({
            ...item,
            module: {
              enabled: true,
              provider: {
                github: { clientId: 'gh-id', clientSecret: 'gh-secret', scopes: ['read:user'], emailAddresses: ['a@example.com'], emailDomains: ['example.com'], teams: ['org/team'], organizations: ['org'] },
              },
              optionsPassthrough: true,
              cookiePrefix: 'warren.',
              inactivityTimeout: 3600,
              maximumDuration: 86400,
              authCheckInterval: 300,
            },
          }),
        get: () => m.edgeRouteOAuthModule.get(item),
        del: () => m.edgeRouteOAuthModule.delete(item),
        want: {
          enabled: true,
          provider: {
            github: { clientId: 'gh-id', clientSecret: '', scopes: ['read:user'], emailAddresses: ['a@example.com'], emailDomains: ['example.com'], teams: ['org/team'], organizations: ['org'] },
            facebook: null,
            microsoft: null,
            google: null,
            linkedin: null,
            gitlab: null,
            twitch: null,
            amazon: null,
          },
          optionsPassthrough: true,
          cookiePrefix: 'warren.',
          inactivityTimeout: 3600,
          maximumDuration: 86400,
          authCheckInterval: 300,
        },
      },
      {
        key: 'saml',
        replace: () =>
          m.edgeRouteSamlModule.replace({
            ...item,
            module: saml,
          }),
        get: () => m.edgeRouteSamlModule.get(item),
        del: () => m.edgeRouteSamlModule.delete(item),
        want: {
          ...saml,
          entityId: expect.any(String),
          assertionConsumerServiceUrl: expect.any(String),
          singleLogoutUrl: expect.any(String),
          requestSigningCertificatePem: expect.any(String),
          metadataUrl: expect.any(String),
        },
      },
      {
        key: 'oidc',
        replace: () =>
          m.edgeRouteOidcModule.replace({
            ...item,
            module: {
              enabled: true,
              optionsPassthrough: false,
              cookiePrefix: 'warren.',
              inactivityTimeout: 600,
              maximumDuration: 3600,
              issuer: 'https://accounts.example.com',
              clientId: 'oidc-id',
              clientSecret: 'oidc-secret',
              scopes: ['openid', 'email'],
            },
          }),
        get: () => m.edgeRouteOidcModule.get(item),
        del: () => m.edgeRouteOidcModule.delete(item),
        want: {
          enabled: true,
          optionsPassthrough: false,
          cookiePrefix: 'warren.',
          inactivityTimeout: 600,
          maximumDuration: 3600,
          issuer: 'https://accounts.example.com',
          clientId: 'oidc-id',
          clientSecret: '',
          scopes: ['openid', 'email'],
        },
      },
      {
        key: 'websocketTcpConverter',
        replace: () => m.edgeRouteWebsocketTcpConverterModule.replace({ ...item, module: { enabled: true } }),
        get: () => m.edgeRouteWebsocketTcpConverterModule.get(item),
        del: () => m.edgeRouteWebsocketTcpConverterModule.delete(item),
        want: { enabled: true },
      },
      {
        key: 'userAgentFilter',
        replace: () => m.edgeRouteUserAgentFilterModule.replace({ ...item, module: { enabled: true, allow: ['^curl/'], deny: ['bot'] } }),
        get: () => m.edgeRouteUserAgentFilterModule.get(item),
        del: () => m.edgeRouteUserAgentFilterModule.delete(item),
        want: { enabled: true, allow: ['^curl/'], deny: ['bot'] },
      },
    ];
    const failures: string[] = [];
    for (const mod of modules) {
      try {
        const put = await mod.replace();
        expect(put, `${mod.key} replace`).toEqual(mod.want);
        expect(await mod.get(), `${mod.key} get`).toEqual(mod.want);
        expect((await svc.get(item) as unknown as Record<string, unknown>)[mod.key], `${mod.key} on the route`).toEqual(mod.want);
        await deleteAndVerify(mod.del, mod.get, 'ERR_WARREN_4002');
        expect((await svc.get(item) as unknown as Record<string, unknown>)[mod.key], `${mod.key} on the route after delete`).toBeNull();
        await tolerateEmptyBody(mod.del()); // unset: still 204
      } catch (e) {
        failures.push(`${mod.key}: ${(e as Error).message.split('\n').slice(0, 12).join('\n')}`);
      }
    }
    expect(failures, `route modules that failed:\n${failures.join('\n\n')}`).toEqual([]);

    // oauth, saml and oidc exclude each other
    await modules.find((x) => x.key === 'oidc')!.replace();
    await expectApiError(modules.find((x) => x.key === 'oauth')!.replace(), 400, 'ERR_WARREN_6402');

    // deleting a route, then the edge cascades the rest
    await deleteAndVerify(() => svc.delete(item), () => svc.get(item));
    await deleteAndVerify(() => client.edges.edgesHttps.delete(edge.id), () => client.edges.edgesHttps.get(edge.id));
    await expectApiError(svc.get({ edgeId: edge.id, id: second.id }), 404);
    // nothing refers to them any more
    await deleteAndVerify(() => client.backends.tunnelGroupBackends.delete(backend.id), () => client.backends.tunnelGroupBackends.get(backend.id));
    await deleteAndVerify(() => client.ipPolicies.delete(policy.id), () => client.ipPolicies.get(policy.id));
  });

  it('route create requires an existing edge and same-account references', async () => {
    const { client } = await account('routes-bad');
    await expectApiError(
      client.edges.edgesHttpsRoutes.create({ edgeId: 'edghts_2qT9aaaaaaaaaaaaaaaaaaaaaaa', matchType: 'path_prefix', match: '/' } as HTTPSEdgeRouteCreate),
      404,
      'ERR_WARREN_4001',
    );
    const edge = await client.edges.edgesHttps.create({});
    await expectApiError(
      client.edges.edgesHttpsRoutes.create({ edgeId: edge.id, matchType: 'path_prefix', match: '/', backend: { enabled: true, backendId: 'bkdtg_2qT9aaaaaaaaaaaaaaaaaaaaaaa' } }),
      400,
      'ERR_WARREN_3002',
    );
  });
});

describe('ipPolicies', () => {
  it('create, get, update, list across pages, delete', async () => {
    const { client } = await account('ipp');
    const svc = client.ipPolicies;
    const created = await svc.create({ description: 'office', metadata: 'm' });
    expect(created).toEqual({ id: expect.stringMatching(idRe('ipp')), uri: `${base}/ip_policies/${created.id}`, createdAt: anyDate, description: 'office', metadata: 'm' });
    expect(await svc.get(created.id)).toEqual(created);
    expect(await svc.update({ id: created.id, description: 'hq' })).toEqual({ ...created, description: 'hq' });
    const more = await times(6, () => svc.create({}));
    await expectPaging((b, l) => svc.list(b, l), [created.id, ...more.map((x) => x.id)]);
    await deleteAndVerify(() => svc.delete(created.id), () => svc.get(created.id));
  });
});

describe('ipPolicyRules', () => {
  it('create, get, update, list across pages, delete; a policy delete cascades its rules', async () => {
    const { client } = await account('ipr');
    const policy = await client.ipPolicies.create({});
    const svc = client.ipPolicyRules;
    const created = await svc.create({ ipPolicyId: policy.id, cidr: '10.0.0.0/8', action: 'allow', description: 'lan' });
    expect(created).toEqual({
      id: expect.stringMatching(idRe('ipr')),
      uri: `${base}/ip_policy_rules/${created.id}`,
      createdAt: anyDate,
      description: 'lan',
      cidr: '10.0.0.0/8',
      ipPolicy: ref('ip_policies', policy.id),
      action: 'allow',
    });
    expect(await svc.get(created.id)).toEqual(created);
    expect(await svc.update({ id: created.id, cidr: '10.1.0.0/16', metadata: 'm' })).toEqual({ ...created, cidr: '10.1.0.0/16', metadata: 'm' });
    await expectApiError(svc.create({ ipPolicyId: policy.id, cidr: '10.1.0.0/16', action: 'deny' }), 409, 'ERR_WARREN_4101');
    await expectApiError(svc.create({ ipPolicyId: policy.id, cidr: '10.1.2.3/16', action: 'deny' }), 400);

    const more = await times(6, (i) => svc.create({ ipPolicyId: policy.id, cidr: `192.168.${i}.0/24`, action: 'deny' }));
    await expectPaging((b, l) => svc.list(b, l), [created.id, ...more.map((x) => x.id)]);

    await deleteAndVerify(() => svc.delete(created.id), () => svc.get(created.id));
    await deleteAndVerify(() => client.ipPolicies.delete(policy.id), () => client.ipPolicies.get(policy.id));
    await expectApiError(svc.get(more[0]!.id), 404, 'ERR_WARREN_4001');
  });
});

const ROLE = 'arn:aws:iam::123456789012:role/warren-events';
const KINESIS: EventTarget = { kinesis: { auth: { role: { roleArn: ROLE } }, streamArn: 'arn:aws:kinesis:us-east-1:123456789012:stream/warren' } };
const noTargets = { firehose: null, kinesis: null, cloudwatchLogs: null, datadog: null, azureLogsIngestion: null };

describe('eventDestinations', () => {
  it('create (every target kind), get, update, list across pages, delete', async () => {
    const { client } = await account('ed');
    const svc = client.eventDestinations;
    const kinesis = await svc.create({ description: 'stream', metadata: 'm', format: 'json', target: KINESIS });
    expect(kinesis).toEqual({
      id: expect.stringMatching(idRe('ed')),
      uri: `${base}/event_destinations/${kinesis.id}`,
      createdAt: anyDate,
      description: 'stream',
      metadata: 'm',
      format: 'json',
      target: { ...noTargets, kinesis: { auth: { role: { roleArn: ROLE }, creds: null }, streamArn: 'arn:aws:kinesis:us-east-1:123456789012:stream/warren' } },
    });
    expect(await svc.get(kinesis.id)).toEqual(kinesis);

    const firehose = await svc.create({
      format: 'JSON',
      target: { firehose: { auth: { creds: { awsAccessKeyId: 'AKIAIOSFODNN7EXAMPLE', awsSecretAccessKey: 'aws-secret' } }, deliveryStreamArn: 'arn:aws:firehose:eu-west-1:123456789012:deliverystream/warren' } },
    });
    expect(firehose.format).toBe('json');
    expect(firehose.target).toEqual({
      ...noTargets,
      firehose: { auth: { role: null, creds: { awsAccessKeyId: 'AKIAIOSFODNN7EXAMPLE', awsSecretAccessKey: '' } }, deliveryStreamArn: 'arn:aws:firehose:eu-west-1:123456789012:deliverystream/warren' },
    });
    const cloudwatch = await svc.create({ format: 'json', target: { cloudwatchLogs: { auth: { role: { roleArn: ROLE } }, logGroupArn: 'arn:aws:logs:us-east-1:123456789012:log-group:warren' } } });
    expect(cloudwatch.target).toEqual({ ...noTargets, cloudwatchLogs: { auth: { role: { roleArn: ROLE }, creds: null }, logGroupArn: 'arn:aws:logs:us-east-1:123456789012:log-group:warren' } });
    const datadog = await svc.create({ format: 'json', target: { datadog: { apiKey: 'dd-secret', ddtags: 'env:test', service: 'warren', ddsite: 'datadoghq.eu' } } });
    expect(datadog.target).toEqual({ ...noTargets, datadog: { apiKey: '', ddtags: 'env:test', service: 'warren', ddsite: 'datadoghq.eu' } });
    const azureIn = {
      tenantId: '00000000-0000-0000-0000-000000000001',
      clientId: '00000000-0000-0000-0000-000000000002',
      clientSecret: 'azure-secret',
      logsIngestionUri: 'https://warren-abcd.eastus-1.ingest.monitor.azure.com',
      dataCollectionRuleId: 'dcr-00000000000000000000000000000000',
      dataCollectionStreamName: 'Custom-Warren',
    };
    // azure_logs_ingestion is not in the 0.11 client's types; its serializer passes it through.
    const azure = await svc.create({ format: 'json', target: { azureLogsIngestion: azureIn } as EventTarget });
    expect(azure.target).toEqual({ ...noTargets, azureLogsIngestion: { ...azureIn, clientSecret: '' } });

    // replace a target of the same kind: the omitted secret is kept (not observable, but accepted)
    const dd2 = await svc.update({ id: datadog.id, description: 'dd', target: { datadog: { ddtags: 'env:prod' } } });
    expect(dd2.description).toBe('dd');
    expect(dd2.target.datadog).toMatchObject({ apiKey: '', ddtags: 'env:prod' });
    // the target kind is immutable
    await expectApiError(svc.update({ id: kinesis.id, target: { datadog: { apiKey: 'x' } } }), 400, 'ERR_WARREN_4200');
    expect(await svc.update({ id: kinesis.id, metadata: 'm2' })).toEqual({ ...kinesis, metadata: 'm2' });

    const more = await times(2, () => svc.create({ format: 'json', target: KINESIS }));
    await expectPaging((b, l) => svc.list(b, l), [kinesis.id, firehose.id, cloudwatch.id, datadog.id, azure.id, ...more.map((x) => x.id)]);
    await deleteAndVerify(() => svc.delete(kinesis.id), () => svc.get(kinesis.id));
  });
});

describe('eventSubscriptions', () => {
  it('create, get, update, list across pages, delete; a listed destination cannot be deleted', async () => {
    const { client } = await account('esb');
    const dest = await client.eventDestinations.create({ format: 'json', target: KINESIS });
    const svc = client.eventSubscriptions;
    const created = await svc.create({ description: 'audit', metadata: 'm', sources: [{ type: 'ip_policy_created.v0' }, { type: 'ip_policy_deleted.v0' }], destinationIds: [dest.id] });
    const src = (id: string, type: string) => ({ type, uri: `${base}/event_subscriptions/${id}/sources/${type}` });
    expect(created).toEqual({
      id: expect.stringMatching(idRe('esb')),
      uri: `${base}/event_subscriptions/${created.id}`,
      createdAt: anyDate,
      description: 'audit',
      metadata: 'm',
      sources: [src(created.id, 'ip_policy_created.v0'), src(created.id, 'ip_policy_deleted.v0')],
      destinations: [ref('event_destinations', dest.id)],
    });
    expect(await svc.get(created.id)).toEqual(created);
    const updated = await svc.update({ id: created.id, sources: [{ type: 'api_key_created.v0' }] });
    expect(updated).toEqual({ ...created, sources: [src(created.id, 'api_key_created.v0')] });

    await expectApiError(client.eventDestinations.delete(dest.id), 409, 'ERR_WARREN_4100');
    await expectApiError(svc.create({ sources: [{ type: 'no_such_event.v0' }], destinationIds: [] }), 400, 'ERR_WARREN_6601');

    const more = await times(6, () => svc.create({ sources: [], destinationIds: [] }));
    for (const s of more) expect(s).toMatchObject({ sources: [], destinations: [] });
    await expectPaging((b, l) => svc.list(b, l), [created.id, ...more.map((x) => x.id)]);

    await deleteAndVerify(() => svc.delete(created.id), () => svc.get(created.id));
    await deleteAndVerify(() => client.eventDestinations.delete(dest.id), () => client.eventDestinations.get(dest.id));
  });
});

describe('eventSources', () => {
  it('create, get, list, update, delete', async () => {
    const { client } = await account('src');
    const sub = await client.eventSubscriptions.create({ sources: [{ type: 'ip_policy_created.v0' }], destinationIds: [] });
    const svc = client.eventSources;
    const uri = (type: string) => `${base}/event_subscriptions/${sub.id}/sources/${type}`;
    const created = await svc.create({ subscriptionId: sub.id, type: 'ip_policy_updated.v0' });
    expect(created).toEqual({ type: 'ip_policy_updated.v0', uri: uri('ip_policy_updated.v0') });
    await expectApiError(svc.create({ subscriptionId: sub.id, type: 'ip_policy_updated.v0' }), 409);
    expect(await svc.get({ subscriptionId: sub.id, type: 'ip_policy_updated.v0' })).toEqual(created);
    expect(await svc.list({ subscriptionId: sub.id })).toEqual({
      sources: [{ type: 'ip_policy_created.v0', uri: uri('ip_policy_created.v0') }, created],
      uri: `${base}/event_subscriptions/${sub.id}/sources`,
    });
    expect(await svc.update({ subscriptionId: sub.id, type: 'ip_policy_updated.v0' })).toEqual(created);
    await deleteAndVerify(
      () => svc.delete({ subscriptionId: sub.id, type: 'ip_policy_updated.v0' }),
      () => svc.get({ subscriptionId: sub.id, type: 'ip_policy_updated.v0' }),
    );
    expect((await client.eventSubscriptions.get(sub.id)).sources.map((s) => s.type)).toEqual(['ip_policy_created.v0']);
  });
});

describe('apiKeys', () => {
  it('create (token once), get, update, list across pages, delete; the last key stays', async () => {
    const { client, apiKeyId } = await account('ak');
    const svc = client.apiKeys;
    const created = await svc.create({ description: 'ci', metadata: 'm' });
    expect(created).toEqual({
      id: expect.stringMatching(idRe('ak')),
      uri: `${base}/api_keys/${created.id}`,
      createdAt: anyDate,
      description: 'ci',
      metadata: 'm',
      token: expect.any(String),
    });
    const fetched = await svc.get(created.id);
    expect(fetched).toEqual({ ...created, token: null });
    // the new key works with the official client
    const other = officialClient(base, created.token!);
    expect(await other.reservedAddrs.list()).toEqual([]);
    expect(await svc.update({ id: created.id, description: 'ci-2' })).toEqual({ ...created, token: null, description: 'ci-2' });

    const more = await times(5, () => svc.create({}));
    await expectPaging((b, l) => svc.list(b, l), [apiKeyId, created.id, ...more.map((x) => x.id)]);

    await deleteAndVerify(() => svc.delete(created.id), () => svc.get(created.id));
    await expectApiError(other.reservedAddrs.list(), 401, 'ERR_WARREN_1002');
    for (const k of more) await deleteAndVerify(() => svc.delete(k.id));
    await expectApiError(svc.delete(apiKeyId), 409, 'ERR_WARREN_4102');
  });
});

describe('credentials', () => {
  it('create (token once), get, update, list across pages, delete; an authtoken is not an API key', async () => {
    const { client } = await account('cr');
    const svc = client.credentials;
    const created = await svc.create({ description: 'agent', metadata: 'm', acl: ['bind:*.example.com', 'bind:app=web'] });
    expect(created).toEqual({
      id: expect.stringMatching(idRe('cr')),
      uri: `${base}/credentials/${created.id}`,
      createdAt: anyDate,
      description: 'agent',
      metadata: 'm',
      token: expect.any(String),
      acl: ['bind:*.example.com', 'bind:app=web'],
    });
    expect(await svc.get(created.id)).toEqual({ ...created, token: null });
    const reacl = await svc.update({ id: created.id, acl: ['bind:foo.example.com'] });
    expect(reacl).toEqual({ ...created, token: null, acl: ['bind:foo.example.com'] });
    expect(await svc.update({ id: created.id, description: 'agent-2' })).toEqual({ ...reacl, description: 'agent-2' });

    await expectApiError(officialClient(base, created.token!).reservedAddrs.list(), 401, 'ERR_WARREN_1003');

    const bare = await svc.create({} as CredentialCreate);
    expect(bare.acl).toEqual([]);
    const more = await times(5, () => svc.create({ acl: [] }));
    await expectPaging((b, l) => svc.list(b, l), [created.id, bare.id, ...more.map((x) => x.id)]);
    await deleteAndVerify(() => svc.delete(created.id), () => svc.get(created.id));
  });
});

describe('tunnels and tunnelSessions (read-only, written by agents)', () => {
  it('list empty and answer 404 for unknown ids', async () => {
    const { client } = await account('tn');
    expect(await client.tunnels.list()).toEqual([]);
    expect(await client.tunnels.list(undefined, '5')).toEqual([]);
    await expectApiError(client.tunnels.get('tn_2qT9aaaaaaaaaaaaaaaaaaaaaaa'), 404, 'ERR_WARREN_4001');
    expect(await client.tunnelSessions.list()).toEqual([]);
    await expectApiError(client.tunnelSessions.get('ts_2qT9aaaaaaaaaaaaaaaaaaaaaaa'), 404, 'ERR_WARREN_4001');
  });
});

describe('the client error path', () => {
  it('reads every error the server sends (details is a map with operation_id)', async () => {
    const bad = officialClient(base, 'not-a-key');
    const e = await expectApiError(bad.reservedAddrs.list(), 401, 'ERR_WARREN_1002');
    expect(e).toBeInstanceOf(ApiCallError);
    expect(e.details).toBeInstanceOf(Map);
  });
});
