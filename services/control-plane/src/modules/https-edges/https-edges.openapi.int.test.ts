import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import Ajv2020 from 'ajv/dist/2020.js';
import { startTestApi, type Account, type ApiResult, type TestApi } from '../../../../../test/support/api.js';
import { IDP_METADATA, PLAIN_MODULES } from '../https-edge-routes/fixtures.js';
import { MODULE_NAMES } from '../https-edge-routes/route-modules.js';
import { createBackend, createCa, createIpPolicy } from './testing.js';

/** Live responses of every edge and route operation validate against the schemas of GET /openapi.json. */

type AjvCtor = typeof import('ajv/dist/2020.js').Ajv2020;
const AjvClass = ((Ajv2020 as unknown as { default?: AjvCtor }).default ?? Ajv2020) as unknown as AjvCtor;
const ajv = new AjvClass({ strict: false, allErrors: true, validateFormats: false });

let api: TestApi;
let a: Account;
let doc: any;

beforeAll(async () => {
  api = await startTestApi();
  a = await api.account('a');
  doc = (await api.raw('GET', '/openapi.json')).body;
});
afterAll(() => api.close());

function check(method: string, docPath: string, r: ApiResult): void {
  const op = doc.paths[docPath]?.[method.toLowerCase()];
  expect(op, `${method} ${docPath} is documented`).toBeDefined();
  const res = op.responses[String(r.status)];
  expect(res, `${method} ${docPath} documents status ${r.status}`).toBeDefined();
  if (r.status === 204) return;
  const validate = ajv.compile(res.content['application/json'].schema);
  const ok = validate(r.body);
  expect({ op: `${method} ${docPath}`, errors: ok ? [] : validate.errors }).toEqual({ op: `${method} ${docPath}`, errors: [] });
}

describe('OpenAPI schemas of HTTPS edges and routes', () => {
  it('match the live responses', async () => {
    const ca = await createCa(api, a);
    const backend = await createBackend(api, a);
    const ipp = await createIpPolicy(api, a);
    const E = '/edges/https';
    const created = await a.call('POST', E, { description: 'd', hostports: ['doc.example.com:443'], mutual_tls: { certificate_authority_ids: [ca] }, tls_termination: {} });
    check('POST', E, created);
    const id = created.body.id;
    const R = `${E}/{edge_id}/routes`;
    const routeBody = { ...PLAIN_MODULES, backend: { backend_id: backend }, ip_restriction: { ip_policy_ids: [ipp] } };
    const routes = [
      await a.call('POST', `${E}/${id}/routes`, { match_type: 'path_prefix', match: '/', metadata: 'm', ...routeBody, oauth: { provider: { github: {} } } }),
      await a.call('POST', `${E}/${id}/routes`, { match_type: 'exact_path', match: '/saml', saml: { idp_metadata: IDP_METADATA } }),
      await a.call('POST', `${E}/${id}/routes`, { match_type: 'exact_path', match: '/oidc', oidc: { issuer: 'https://id.example.com', client_id: 'c', client_secret: 's' } }),
      await a.call('POST', `${E}/${id}/routes`, { match_type: 'exact_path', match: '/bare' }),
    ];
    for (const r of routes) check('POST', R, r);
    check('GET', `${E}/{id}`, await a.call('GET', `${E}/${id}`));
    check('GET', E, await a.call('GET', E));
    check('PATCH', `${E}/{id}`, await a.call('PATCH', `${E}/${id}`, { description: '' }));
    for (const m of ['mutual_tls', 'tls_termination']) {
      check('GET', `${E}/{id}/${m}`, await a.call('GET', `${E}/${id}/${m}`));
      check('PUT', `${E}/{id}/${m}`, await a.call('PUT', `${E}/${id}/${m}`, { enabled: false }));
      check('DELETE', `${E}/{id}/${m}`, await a.call('DELETE', `${E}/${id}/${m}`));
    }
    const RI = `${R}/{id}`;
    for (const r of routes) {
      check('GET', RI, await a.call('GET', `${E}/${id}/routes/${r.body.id}`));
      check('PATCH', RI, await a.call('PATCH', `${E}/${id}/routes/${r.body.id}`, { description: 'x' }));
      for (const name of MODULE_NAMES) {
        const g = await a.call('GET', `${E}/${id}/routes/${r.body.id}/${name}`);
        if (g.status === 200) {
          check('GET', `${RI}/${name}`, g);
          const body = (routeBody as Record<string, unknown>)[name];
          if (body) check('PUT', `${RI}/${name}`, await a.call('PUT', `${E}/${id}/routes/${r.body.id}/${name}`, body));
        }
      }
    }
    check('DELETE', RI, await a.call('DELETE', `${E}/${id}/routes/${routes[3]!.body.id}`));
    check('DELETE', `${E}/{id}`, await a.call('DELETE', `${E}/${id}`));
  });
});
