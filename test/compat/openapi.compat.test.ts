/**
 * GET /openapi.json against live behaviour: every documented operation is called for real
 * (resources created in dependency order) and every response body is validated against the
 * schema the document gives for that operation and status, with Ajv's 2020-12 draft. Every
 * non-2xx answer must match the Error schema. Request bodies we send that the server accepts
 * must match the documented request schema too.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import Ajv2020 from 'ajv/dist/2020.js';
import type { ErrorObject, ValidateFunction } from 'ajv/dist/2020.js';
import { startTestApi, type Account, type ApiResult, type TestApi } from '../support/api.js';
import { CA_PEM, IDP_METADATA, rand } from './fixtures.js';

type Method = 'GET' | 'POST' | 'PATCH' | 'PUT' | 'DELETE';
type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any

let api: TestApi;
let acct: Account;
let doc: Json;

// ajv/dist/2020.js is CommonJS: the default import is module.exports (the class, which also
// carries itself as `.default`); TypeScript under NodeNext types it as the module namespace.
type AjvCtor = typeof import('ajv/dist/2020.js').Ajv2020;
const AjvClass = ((Ajv2020 as unknown as { default?: AjvCtor }).default ?? Ajv2020) as unknown as AjvCtor;
const ajv = new AjvClass({ strict: false, allErrors: true, validateFormats: false });
const compiled = new WeakMap<object, ValidateFunction>();
function validator(schema: object): ValidateFunction {
  const known = compiled.get(schema);
  if (known) return known;
  const v = ajv.compile(schema);
  compiled.set(schema, v);
  return v;
}

/** `/edges/https/{edge_id}/routes/{id}` → `/edges/https/{}/routes/{}`: parameter names may differ. */
const shape = (p: string) => p.replace(/\{[^}]+\}/g, '{}');

interface DocOp {
  key: string;
  method: Method;
  path: string;
  op: Json;
  successStatus: number;
}
let ops: Map<string, DocOp>;

/** Operations called (key → statuses seen) and what went wrong, in order. */
const exercised = new Map<string, number[]>();
const problems: string[] = [];
const notImplemented = new Set<string>();
const skipped: string[] = [];

function valueAt(body: unknown, pointer: string): unknown {
  let cur: unknown = body;
  for (const part of pointer.split('/').slice(1)) {
    const k = part.replace(/~1/g, '/').replace(/~0/g, '~');
    cur = cur && typeof cur === 'object' ? (cur as Record<string, unknown>)[k] : undefined;
  }
  return cur;
}

function describeErrors(errors: ErrorObject[] | null | undefined, body: unknown): string {
  // anyOf branches repeat themselves; keep each (path, message) once
  const seen = new Set<string>();
  const lines: string[] = [];
  for (const e of errors ?? []) {
    const at = e.instancePath || '/';
    const extra =
      e.keyword === 'additionalProperties'
        ? ` "${(e.params as { additionalProperty: string }).additionalProperty}"`
        : e.keyword === 'required'
          ? ` "${(e.params as { missingProperty: string }).missingProperty}"`
          : '';
    const line = `    at ${at}: ${e.message}${extra} (schema ${e.schemaPath}); actual: ${JSON.stringify(valueAt(body, e.instancePath))?.slice(0, 160)}`;
    if (!seen.has(line)) lines.push(line), seen.add(line);
  }
  return lines.slice(0, 15).join('\n');
}

function resolveRef(schema: Json): Json {
  if (schema && typeof schema.$ref === 'string' && schema.$ref.startsWith('#/')) return valueAt(doc, schema.$ref.slice(1));
  return schema;
}

function checkError(label: string, res: ApiResult): void {
  const errorSchema = doc.components.schemas.Error;
  const v = validator(errorSchema);
  const body: Json = res.body;
  if (!(v as (d: unknown) => boolean)(body)) problems.push(`${label} → ${res.status}: body does not match components.schemas.Error\n${describeErrors(v.errors, res.body)}`);
  else {
    if (body.status_code !== res.status) problems.push(`${label} → ${res.status}: status_code ${body.status_code} differs from the HTTP status`);
    if (body.details.operation_id !== res.headers.get('warren-operation-id')) problems.push(`${label} → ${res.status}: details.operation_id differs from Warren-Operation-Id`);
  }
}

interface CallOpts {
  params?: Record<string, string | undefined>;
  body?: unknown;
  query?: string;
  /** An expected non-success status (a deliberate error), or the statuses allowed. */
  expect?: number | number[];
}

/**
 * One real call. Validates the response against the documented schema (or Error), records the
 * operation as exercised, and returns the body on success (undefined otherwise).
 */
async function call(method: Method, template: string, opts: CallOpts = {}): Promise<Json> {
  const key = `${method} ${shape(template)}`;
  const label = `${method} ${template}`;
  const missing = Object.entries(opts.params ?? {}).filter(([, v]) => v === undefined);
  if (missing.length) {
    skipped.push(`${label} (needs ${missing.map(([k]) => k).join(', ')})`);
    return undefined;
  }
  const path = template.replace(/\{([^}]+)\}/g, (_, name: string) => encodeURIComponent(opts.params![name]!)) + (opts.query ? `?${opts.query}` : '');
  const res = await acct.call(method, path, opts.body);
  exercised.set(key, [...(exercised.get(key) ?? []), res.status]);

  const d = ops.get(key);
  if (!d) {
    if (res.status === 404 && res.body?.error_code === 'ERR_WARREN_4000') notImplemented.add(label);
    else problems.push(`${label} → ${res.status}: served but not documented in /openapi.json`);
    return undefined;
  }
  const wanted = [opts.expect ?? d.successStatus].flat();
  if (!wanted.includes(res.status)) {
    problems.push(`${label} → ${res.status}, expected ${wanted.join(' or ')}: ${JSON.stringify(res.body)?.slice(0, 300)}`);
  }
  if (res.status >= 200 && res.status < 300) {
    const content = d.op.responses?.[String(res.status)];
    if (!content) problems.push(`${label} → ${res.status}: this status is not documented (documented: ${Object.keys(d.op.responses ?? {}).join(', ')})`);
    const schema = content?.content?.['application/json']?.schema;
    if (schema) {
      const v = validator(resolveRef(schema));
      if (!v(res.body)) problems.push(`${label} → ${res.status}: response does not match the documented schema\n${describeErrors(v.errors, res.body)}`);
    } else if (content && res.body !== undefined) {
      problems.push(`${label} → ${res.status}: documented without a body, but one came: ${JSON.stringify(res.body).slice(0, 200)}`);
    }
    // What the server accepted must be what the document says it accepts.
    const reqSchema = d.op.requestBody?.content?.['application/json']?.schema;
    if (reqSchema && opts.body !== undefined) {
      const rv = validator(resolveRef(reqSchema));
      if (!rv(opts.body)) problems.push(`${label}: the accepted request body does not match the documented request schema\n${describeErrors(rv.errors, opts.body)}`);
    }
    return res.body ?? {};
  }
  checkError(label, res);
  return undefined;
}

function takeProblems(): string[] {
  return problems.splice(0, problems.length);
}
function expectNoProblems(): void {
  const p = takeProblems();
  expect(p, `\n${p.join('\n\n')}\n`).toEqual([]);
}

const S: Record<string, string | undefined> = {};
const NO_ID = (prefix: string) => `${prefix}_2qT9aaaaaaaaaaaaaaaaaaaaaaa`;

beforeAll(async () => {
  api = await startTestApi();
  acct = await api.account('openapi');
  const res = await fetch(`${api.baseUrl}/openapi.json`);
  expect(res.status).toBe(200);
  doc = await res.json();
  ops = new Map();
  for (const [path, item] of Object.entries<Json>(doc.paths ?? {})) {
    for (const [m, op] of Object.entries<Json>(item)) {
      if (!['get', 'post', 'patch', 'put', 'delete'].includes(m)) continue;
      const method = m.toUpperCase() as Method;
      const success = Object.keys(op.responses ?? {}).filter((s) => /^2\d\d$/.test(s));
      ops.set(`${method} ${shape(path)}`, { key: `${method} ${shape(path)}`, method, path, op, successStatus: Number(success[0] ?? 200) });
    }
  }
});
afterAll(() => api?.close());

describe('GET /openapi.json', () => {
  it('is an OpenAPI 3.1 document with valid JSON Schema 2020-12 schemas', () => {
    expect(doc.openapi).toMatch(/^3\.1\.\d+$/);
    expect(doc.info).toMatchObject({ title: expect.any(String), version: expect.any(String) });
    expect(doc.servers?.[0]?.url).toBe(api.baseUrl);
    expect(doc.components?.schemas?.Error).toBeDefined();
    expect(ops.size).toBeGreaterThan(0);
    const bad: string[] = [];
    for (const d of ops.values()) {
      const label = `${d.method} ${d.path}`;
      const success = Object.keys(d.op.responses ?? {}).filter((s) => /^2\d\d$/.test(s));
      if (success.length !== 1) bad.push(`${label}: expected exactly one 2xx response, got ${success.join(', ') || 'none'}`);
      if (!d.op.responses?.default) bad.push(`${label}: no default (error) response`);
      else if (resolveRef(d.op.responses.default.content?.['application/json']?.schema) !== doc.components.schemas.Error) bad.push(`${label}: the default response is not the Error schema`);
      for (const name of [...d.path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1])) {
        if (!(d.op.parameters ?? []).some((p: Json) => p.in === 'path' && p.name === name && p.required)) bad.push(`${label}: path parameter ${name} not declared`);
      }
      for (const [status, r] of Object.entries<Json>(d.op.responses ?? {})) {
        const schema = r.content?.['application/json']?.schema;
        if (!schema) continue;
        try {
          validator(resolveRef(schema));
        } catch (e) {
          bad.push(`${label} ${status}: schema does not compile: ${(e as Error).message}`);
        }
      }
      if (d.method === 'DELETE' && d.op.responses?.['204']?.content) bad.push(`${label}: 204 documented with a body`);
    }
    expect(bad, bad.join('\n')).toEqual([]);
  });

  it('(harness self-check) a wrong body fails validation with a readable path', () => {
    const d = ops.get('GET /reserved_addrs/{}');
    expect(d, 'GET /reserved_addrs/{id} is documented').toBeDefined();
    const v = validator(resolveRef(d!.op.responses['200'].content['application/json'].schema));
    const wrong = { id: 1, uri: 'u', created_at: 'c', addr: 'a', region: 'mars', endpoint_configuration: null, colour: 'red' };
    expect(v(wrong)).toBe(false);
    const text = describeErrors(v.errors, wrong);
    expect(text).toContain('at /id: must be string');
    expect(text).toContain('at /region: must be equal to one of the allowed values');
    expect(text).toContain('must NOT have additional properties "colour"');
  });
});

describe('every documented operation, called for real', () => {
  it('reserved addresses', async () => {
    S.ra = (await call('POST', '/reserved_addrs', { body: { description: 'd', metadata: 'm', region: 'eu' } }))?.id;
    await call('GET', '/reserved_addrs');
    await call('GET', '/reserved_addrs', { query: 'limit=1' });
    await call('GET', '/reserved_addrs/{id}', { params: { id: S.ra } });
    await call('PATCH', '/reserved_addrs/{id}', { params: { id: S.ra }, body: { id: S.ra, description: '' } });
    await call('DELETE', '/reserved_addrs/{id}/endpoint_configuration', { params: { id: S.ra } });
    await call('DELETE', '/reserved_addrs/{id}', { params: { id: S.ra } });
    expectNoProblems();
  });

  it('tunnel group backends, certificate authorities, IP policies and rules', async () => {
    S.bkd = (await call('POST', '/backends/tunnel_group', { body: { description: 'b', labels: { app: 'web' } } }))?.id;
    await call('GET', '/backends/tunnel_group');
    await call('GET', '/backends/tunnel_group/{id}', { params: { id: S.bkd } });
    await call('PATCH', '/backends/tunnel_group/{id}', { params: { id: S.bkd }, body: { labels: { app: 'web', env: 'prod' } } });

    S.ca = (await call('POST', '/certificate_authorities', { body: { ca_pem: CA_PEM, description: 'ca' } }))?.id;
    await call('GET', '/certificate_authorities');
    await call('GET', '/certificate_authorities/{id}', { params: { id: S.ca } });
    await call('PATCH', '/certificate_authorities/{id}', { params: { id: S.ca }, body: { metadata: 'm' } });

    S.ipp = (await call('POST', '/ip_policies', { body: { description: 'office' } }))?.id;
    await call('GET', '/ip_policies');
    await call('GET', '/ip_policies/{id}', { params: { id: S.ipp } });
    await call('PATCH', '/ip_policies/{id}', { params: { id: S.ipp }, body: { metadata: 'm' } });

    const rule = S.ipp ? await call('POST', '/ip_policy_rules', { body: { ip_policy_id: S.ipp, cidr: '10.0.0.0/8', action: 'allow' } }) : undefined;
    await call('GET', '/ip_policy_rules');
    await call('GET', '/ip_policy_rules/{id}', { params: { id: rule?.id } });
    await call('PATCH', '/ip_policy_rules/{id}', { params: { id: rule?.id }, body: { cidr: '10.0.0.0/16', description: 'lan' } });
    await call('DELETE', '/ip_policy_rules/{id}', { params: { id: rule?.id } });
    expectNoProblems();
  });

  it('HTTPS edges and their modules', async () => {
    S.edge = (
      await call('POST', '/edges/https', {
        body: {
          description: 'e',
          hostports: [`${rand()}.example.com:443`],
          ...(S.ca ? { mutual_tls: { enabled: true, certificate_authority_ids: [S.ca] } } : {}),
          tls_termination: { enabled: true, min_version: '1.2' },
        },
      })
    )?.id;
    await call('GET', '/edges/https');
    await call('GET', '/edges/https/{id}', { params: { id: S.edge } });
    await call('PATCH', '/edges/https/{id}', { params: { id: S.edge }, body: { description: 'e2' } });
    if (S.ca) {
      await call('PUT', '/edges/https/{id}/mutual_tls', { params: { id: S.edge }, body: { enabled: true, certificate_authority_ids: [S.ca] } });
      await call('GET', '/edges/https/{id}/mutual_tls', { params: { id: S.edge } });
      await call('DELETE', '/edges/https/{id}/mutual_tls', { params: { id: S.edge } });
    } else skipped.push('PUT/GET/DELETE /edges/https/{id}/mutual_tls: needs a certificate authority');
    await call('GET', '/edges/https/{id}/mutual_tls', { params: { id: S.edge }, expect: 404 });
    await call('PUT', '/edges/https/{id}/tls_termination', { params: { id: S.edge }, body: { enabled: true, min_version: '1.3' } });
    await call('GET', '/edges/https/{id}/tls_termination', { params: { id: S.edge } });
    await call('DELETE', '/edges/https/{id}/tls_termination', { params: { id: S.edge } });
    expectNoProblems();
  });

  it('HTTPS edge routes and every route module', async () => {
    const route = await call('POST', '/edges/https/{edge_id}/routes', {
      params: { edge_id: S.edge },
      body: {
        match_type: 'path_prefix',
        match: '/',
        description: 'r',
        ...(S.bkd ? { backend: { enabled: true, backend_id: S.bkd } } : {}),
        ...(S.ipp ? { ip_restriction: { ip_policy_ids: [S.ipp] } } : {}),
      },
    });
    S.route = route?.id;
    const p = { edge_id: S.edge, id: S.route };
    await call('GET', '/edges/https/{edge_id}/routes/{id}', { params: p });
    await call('PATCH', '/edges/https/{edge_id}/routes/{id}', { params: p, body: { description: 'r2', compression: { enabled: true } } });

    const tp = JSON.stringify({ inbound: [{ actions: [{ type: 'rate-limit', config: { name: 'rl', algorithm: 'sliding_window', capacity: 10, rate: '60s', bucket_key: ['conn.client_ip'] } }] }] });
    const modules: [string, unknown | undefined][] = [
      ['backend', S.bkd ? { enabled: true, backend_id: S.bkd } : undefined],
      ['ip_restriction', S.ipp ? { enabled: true, ip_policy_ids: [S.ipp] } : undefined],
      ['circuit_breaker', { enabled: true, tripped_duration: 10, rolling_window: 60, num_buckets: 10, volume_threshold: 20, error_threshold_percentage: 0.5 }],
      ['compression', { enabled: true }],
      ['request_headers', { enabled: true, add: { 'X-A': '1' }, remove: ['X-B'] }],
      ['response_headers', { enabled: true, add: { Server: 'warren' }, remove: ['ETag'] }],
      ['webhook_verification', { enabled: true, provider: 'github', secret: 'whsec' }],
      ['oauth', { enabled: true, provider: { github: { client_id: 'a', client_secret: 'b', scopes: ['read:user'], email_addresses: [], email_domains: ['example.com'], teams: [], organizations: [] } } }],
      ['saml', { enabled: true, idp_metadata: IDP_METADATA }],
      ['oidc', { enabled: true, issuer: 'https://accounts.example.com', client_id: 'a', client_secret: 'b', scopes: ['openid'] }],
      ['websocket_tcp_converter', { enabled: true }],
      ['user_agent_filter', { enabled: true, allow: ['^curl/'], deny: [] }],
      ['traffic_policy', { enabled: true, value: tp }],
    ];
    for (const [name, body] of modules) {
      const t = `/edges/https/{edge_id}/routes/{id}/${name}`;
      if (body === undefined) {
        skipped.push(`PUT ${t}: needs the referenced resource`);
        continue;
      }
      await call('PUT', t, { params: p, body });
      await call('GET', t, { params: p });
      await call('DELETE', t, { params: p });
      await call('GET', t, { params: p, expect: 404 });
    }
    expectNoProblems();
  });

  it('event destinations, subscriptions and sources', async () => {
    const target = { kinesis: { auth: { role: { role_arn: 'arn:aws:iam::123456789012:role/warren' } }, stream_arn: 'arn:aws:kinesis:us-east-1:123456789012:stream/warren' } };
    S.ed = (await call('POST', '/event_destinations', { body: { description: 'd', format: 'json', target } }))?.id;
    await call('GET', '/event_destinations');
    await call('GET', '/event_destinations/{id}', { params: { id: S.ed } });
    await call('PATCH', '/event_destinations/{id}', { params: { id: S.ed }, body: { description: 'd2' } });
    const dd = await call('POST', '/event_destinations', { body: { format: 'json', target: { datadog: { api_key: 'k', ddtags: 'a:b', service: 's', ddsite: '' } } } });
    await call('DELETE', '/event_destinations/{id}', { params: { id: dd?.id } });

    S.esb = (await call('POST', '/event_subscriptions', { body: { description: 's', sources: [{ type: 'ip_policy_created.v0' }], destination_ids: S.ed ? [S.ed] : [] } }))?.id;
    await call('GET', '/event_subscriptions');
    await call('GET', '/event_subscriptions/{id}', { params: { id: S.esb } });
    await call('PATCH', '/event_subscriptions/{id}', { params: { id: S.esb }, body: { metadata: 'm' } });
    const sp = { id: S.esb, type: 'ip_policy_updated.v0' };
    await call('POST', '/event_subscriptions/{id}/sources', { params: { id: S.esb }, body: { type: 'ip_policy_updated.v0' } });
    await call('GET', '/event_subscriptions/{id}/sources', { params: { id: S.esb } });
    await call('GET', '/event_subscriptions/{id}/sources/{type}', { params: sp });
    await call('PATCH', '/event_subscriptions/{id}/sources/{type}', { params: sp, body: {} });
    await call('DELETE', '/event_subscriptions/{id}/sources/{type}', { params: sp });
    expectNoProblems();
  });

  it('API keys, credentials, tunnels and tunnel sessions', async () => {
    const key = await call('POST', '/api_keys', { body: { description: 'k' } });
    await call('GET', '/api_keys');
    await call('GET', '/api_keys/{id}', { params: { id: key?.id } });
    await call('PATCH', '/api_keys/{id}', { params: { id: key?.id }, body: { metadata: 'm' } });
    await call('DELETE', '/api_keys/{id}', { params: { id: key?.id } });

    const cred = await call('POST', '/credentials', { body: { description: 'c', acl: ['bind:*.example.com'] } });
    await call('GET', '/credentials');
    await call('GET', '/credentials/{id}', { params: { id: cred?.id } });
    await call('PATCH', '/credentials/{id}', { params: { id: cred?.id }, body: { acl: [] } });
    await call('DELETE', '/credentials/{id}', { params: { id: cred?.id } });

    // Written by agents only: the collection is empty here, a single one can only be a 404.
    await call('GET', '/tunnels');
    await call('GET', '/tunnels/{id}', { params: { id: NO_ID('tn') }, expect: 404 });
    await call('GET', '/tunnel_sessions');
    await call('GET', '/tunnel_sessions/{id}', { params: { id: NO_ID('ts') }, expect: 404 });
    expectNoProblems();
  });

  it('deletes, in reverse dependency order', async () => {
    await call('DELETE', '/edges/https/{edge_id}/routes/{id}', { params: { edge_id: S.edge, id: S.route } });
    await call('DELETE', '/edges/https/{id}', { params: { id: S.edge } });
    await call('DELETE', '/event_subscriptions/{id}', { params: { id: S.esb } });
    await call('DELETE', '/event_destinations/{id}', { params: { id: S.ed } });
    await call('DELETE', '/ip_policies/{id}', { params: { id: S.ipp } });
    await call('DELETE', '/certificate_authorities/{id}', { params: { id: S.ca } });
    await call('DELETE', '/backends/tunnel_group/{id}', { params: { id: S.bkd } });
    expectNoProblems();
  });
});

describe('errors', () => {
  it('every documented operation answers a bad request with the Error schema', async () => {
    for (const d of ops.values()) {
      const hasParams = /\{[^}]+\}/.test(d.path);
      const hasBody = d.method === 'POST' || d.method === 'PATCH' || d.method === 'PUT';
      if (hasParams) {
        // a well-formed id that does not exist (or, for the source type, a subscription that does not)
        const params = Object.fromEntries([...d.path.matchAll(/\{([^}]+)\}/g)].map((m) => [m[1]!, m[1] === 'type' ? 'ip_policy_created.v0' : NO_ID('zz')]));
        // With a body, field rules come before the path lookup (wire-conventions.md §1): 400 or 404.
        await call(d.method, d.path, { params, body: hasBody ? {} : undefined, expect: hasBody ? [400, 404] : 404 });
      } else if (hasBody) {
        await call(d.method, d.path, { body: { zz_not_a_field: 1 }, expect: 400 });
      } else if (d.op.parameters?.some((p: Json) => p.name === 'limit')) {
        await call(d.method, d.path, { query: 'limit=0', expect: 400 });
      }
    }
    // protocol errors, before any route
    const raw: [string, ApiResult][] = [
      ['no version header', await api.raw('GET', '/reserved_addrs', { headers: { Authorization: `Bearer ${acct.token}` } })],
      ['no Authorization', await api.raw('GET', '/reserved_addrs', { headers: { 'Service-Version': '2' } })],
      ['unknown path', await acct.call('GET', '/no_such_collection')],
      ['method not allowed', await acct.call('PUT', '/reserved_addrs')],
      ['not JSON', await acct.call('POST', '/reserved_addrs', '{', { 'Content-Type': 'application/json' })],
      ['wrong content type', await acct.call('POST', '/reserved_addrs', 'x', { 'Content-Type': 'text/plain' })],
    ];
    for (const [label, res] of raw) {
      expect(res.status, label).toBeGreaterThanOrEqual(400);
      checkError(label, res);
    }
    expectNoProblems();
  });

  it('every documented operation was exercised', () => {
    const missed = [...ops.keys()].filter((k) => !exercised.has(k));
    const report = [
      missed.length ? `documented but never called (add them to this test):\n  ${missed.join('\n  ')}` : '',
      notImplemented.size ? `called but not served yet (404 ERR_WARREN_4000; not documented either):\n  ${[...notImplemented].join('\n  ')}` : '',
      skipped.length ? `skipped, an earlier step they need did not run:\n  ${[...new Set(skipped)].join('\n  ')}` : '',
    ]
      .filter(Boolean)
      .join('\n');
    if (report) console.info(`[openapi coverage]\n${report}`);
    expect(missed, report).toEqual([]);
  });
});
