import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '@warren/shared';
import { startTestApi, walkPages, expectHiddenFrom, type Account, type TestApi } from '../../../../../test/support/api.js';

let api: TestApi;
let a: Account;
let b: Account;
let dir: string;
const certs = {} as { ca: string; leaf: string; expired: string; other: string };

function openssl(...args: string[]): void {
  execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
}

/** Test certificates, made with openssl: a CA with key usages and EKUs, a leaf, an expired CA. */
function makeCerts(): void {
  dir = mkdtempSync(path.join(tmpdir(), 'warren-ca-'));
  const read = (f: string) => readFileSync(path.join(dir, f), 'utf8');
  openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '30',
    '-subj', '/O=Warren Test/CN=Warren Test CA',
    '-addext', 'basicConstraints=critical,CA:TRUE',
    '-addext', 'keyUsage=critical,digitalSignature,keyCertSign,cRLSign',
    '-addext', 'extendedKeyUsage=serverAuth,clientAuth,1.3.6.1.4.1.311.10.3.4');
  certs.ca = read('ca.pem');
  openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', 'leaf.key', '-out', 'leaf.pem', '-days', '30',
    '-subj', '/CN=leaf.example.com', '-addext', 'basicConstraints=critical,CA:FALSE', '-addext', 'keyUsage=digitalSignature');
  certs.leaf = read('leaf.pem');
  openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'other.key', '-out', 'other.pem', '-days', '30', '-subj', '/CN=Other CA',
    '-addext', 'basicConstraints=critical,CA:TRUE');
  certs.other = read('other.pem');
  // `openssl req` cannot back-date; `openssl ca -selfsign` takes explicit dates.
  writeFileSync(path.join(dir, 'index.txt'), '');
  writeFileSync(path.join(dir, 'serial'), '01\n');
  writeFileSync(
    path.join(dir, 'ca.cnf'),
    ['[ca]', 'default_ca = d', '[d]', 'dir = .', 'database = ./index.txt', 'new_certs_dir = .', 'serial = ./serial', 'default_md = sha256', 'policy = p', 'unique_subject = no',
      '[p]', 'commonName = supplied', '[ext]', 'basicConstraints = critical,CA:TRUE', 'keyUsage = critical,keyCertSign,cRLSign', ''].join('\n'),
  );
  openssl('genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', 'exp.key');
  openssl('req', '-new', '-key', 'exp.key', '-subj', '/CN=Expired CA', '-out', 'exp.csr');
  openssl('ca', '-batch', '-config', 'ca.cnf', '-selfsign', '-keyfile', 'exp.key', '-in', 'exp.csr', '-startdate', '20200101000000Z', '-enddate', '20210101123456Z',
    '-extensions', 'ext', '-notext', '-out', 'exp.pem');
  certs.expired = read('exp.pem');
}

beforeAll(async () => {
  makeCerts();
  api = await startTestApi();
  a = await api.account('a');
  b = await api.account('b');
});
afterAll(async () => {
  await api.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The test CA's DER, changed by `f`, as PEM. */
const withDer = (f: (der: Buffer) => Buffer) =>
  `-----BEGIN CERTIFICATE-----\n${f(Buffer.from(certs.ca.replace(/-----[^-]+-----/g, '').replace(/\s+/g, ''), 'base64')).toString('base64')}\n-----END CERTIFICATE-----\n`;

const create = (acct: Account, body: Record<string, unknown>) => acct.call('POST', '/certificate_authorities', body);

describe('certificate authorities', () => {
  it('creates, gets, updates, lists and deletes, deriving the certificate fields', async () => {
    const created = await create(a, { ca_pem: certs.ca, description: 'clients', metadata: '{"k":1}' });
    expect(created.status).toBe(201);
    const ca = created.body;
    expect(ca.id).toMatch(/^ca_[0-9A-Za-z]{27}$/);
    expect(ca).toMatchObject({
      uri: `${api.baseUrl}/certificate_authorities/${ca.id}`,
      description: 'clients',
      metadata: '{"k":1}',
      subject_common_name: 'Warren Test CA',
      key_usages: ['digital_signature', 'cert_sign', 'crl_sign'],
      extended_key_usages: ['server_auth', 'client_auth', '1.3.6.1.4.1.311.10.3.4'],
    });
    expect(ca.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(ca.not_before).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(ca.not_after).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    const days = (Date.parse(ca.not_after) - Date.parse(ca.not_before)) / 86_400_000;
    expect(Math.round(days)).toBe(30); // openssl may cross a second boundary between notBefore and notAfter
    expect(ca.ca_pem).toBe(certs.ca.trim() + '\n');
    expect(ca.ca_pem.endsWith('-----END CERTIFICATE-----\n')).toBe(true);

    expect((await a.call('GET', `/certificate_authorities/${ca.id}`)).body).toEqual(ca);

    const patched = await a.call('PATCH', `/certificate_authorities/${ca.id}`, { id: ca.id, description: 'renamed' });
    expect(patched.status).toBe(200);
    expect(patched.body).toEqual({ ...ca, description: 'renamed' });
    const cleared = await a.call('PATCH', `/certificate_authorities/${ca.id}`, { description: '', metadata: '' });
    expect(cleared.body.description).toBeUndefined();
    expect(cleared.body.metadata).toBeUndefined();

    const list = await a.call('GET', '/certificate_authorities');
    expect(list.status).toBe(200);
    expect(list.body.uri).toBe(`${api.baseUrl}/certificate_authorities`);
    expect(list.body.next_page_uri).toBeNull();
    expect(list.body.certificate_authorities.map((x: { id: string }) => x.id)).toContain(ca.id);

    const del = await a.call('DELETE', `/certificate_authorities/${ca.id}`);
    expect(del.status).toBe(204);
    expect(del.body).toBeUndefined();
    expect((await a.call('GET', `/certificate_authorities/${ca.id}`)).status).toBe(404);
  });

  it('normalizes the PEM: CRLF, surrounding whitespace, one trailing newline', async () => {
    const messy = `\n\n  ${certs.other.trim().replace(/\n/g, '\r\n')}\r\n\r\n\n`;
    const r = await create(a, { ca_pem: messy });
    expect(r.status).toBe(201);
    expect(r.body.ca_pem).toBe(certs.other.trim() + '\n');
    expect(r.body.subject_common_name).toBe('Other CA');
    expect(r.body.key_usages).toEqual([]);
    expect(r.body.extended_key_usages).toEqual([]);
    expect(r.body.description).toBeUndefined();
  });

  it('accepts an expired CA', async () => {
    const r = await create(a, { ca_pem: certs.expired });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({
      subject_common_name: 'Expired CA',
      not_before: '2020-01-01T00:00:00Z',
      not_after: '2021-01-01T12:34:56Z',
      key_usages: ['cert_sign', 'crl_sign'],
      extended_key_usages: [],
    });
  });

  it('refuses a certificate without a CA basic constraint', async () => {
    const r = await create(a, { ca_pem: certs.leaf });
    expect(r.status).toBe(400);
    expect(r.body).toMatchObject({ error_code: 'ERR_WARREN_6201', status_code: 400, details: { field: 'ca_pem' } });
  });

  it('refuses garbage, several blocks and other block types', async () => {
    const body = certs.ca.trim().split('\n').slice(1, -1).join('\n');
    const cases: [unknown, string][] = [
      ['not a pem', 'ERR_WARREN_6200'],
      [`${certs.ca}${certs.other}`, 'ERR_WARREN_6200'],
      [`-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n`, 'ERR_WARREN_6200'],
      [`-----BEGIN CERTIFICATE-----\n!!!${body}\n-----END CERTIFICATE-----\n`, 'ERR_WARREN_6200'],
      [`-----BEGIN PRIVATE KEY-----\n${body}\n-----END PRIVATE KEY-----\n`, 'ERR_WARREN_6200'],
      [`hello\n${certs.ca}`, 'ERR_WARREN_6200'],
      [withDer((der) => Buffer.concat([der, Buffer.from([0, 0])])), 'ERR_WARREN_6200'],
      [withDer((der) => der.subarray(0, der.length - 8)), 'ERR_WARREN_6200'],
      [body, 'ERR_WARREN_6200'],
      ['', 'ERR_WARREN_2103'],
      [5, 'ERR_WARREN_2102'],
      ['x'.repeat(64 * 1024 + 1), 'ERR_WARREN_5003'],
    ];
    for (const [ca_pem, code] of cases) {
      const r = await create(a, { ca_pem });
      expect(r.status, String(ca_pem).slice(0, 40)).toBe(400);
      expect(r.body).toMatchObject({ error_code: code, details: { field: 'ca_pem' } });
    }
    const missing = await create(a, { description: 'x' });
    expect(missing.body).toMatchObject({ error_code: 'ERR_WARREN_2103', details: { field: 'ca_pem' } });
  });

  it('validates description, metadata and unknown fields; ca_pem cannot be patched', async () => {
    expect((await create(a, { ca_pem: certs.ca, description: 'x'.repeat(256) })).body).toMatchObject({ error_code: 'ERR_WARREN_5000', details: { field: 'description' } });
    expect((await create(a, { ca_pem: certs.ca, metadata: 'x'.repeat(4097) })).body).toMatchObject({ error_code: 'ERR_WARREN_5001', details: { field: 'metadata' } });
    const unknown = await create(a, { ca_pem: certs.ca, colour: 'red' });
    expect(unknown.body.error_code).toBe('ERR_WARREN_2101');
    expect(unknown.body.msg).toBe('unknown field "colour"; supported: description, metadata, ca_pem');

    const id = (await create(a, { ca_pem: certs.ca })).body.id;
    const pem = await a.call('PATCH', `/certificate_authorities/${id}`, { ca_pem: certs.other });
    expect(pem.status).toBe(400);
    expect(pem.body).toMatchObject({ error_code: 'ERR_WARREN_2101', details: { field: 'ca_pem' } });
    expect((await a.call('PATCH', `/certificate_authorities/${id}`, { metadata: 'x'.repeat(4097) })).body.error_code).toBe('ERR_WARREN_5001');
  });

  it('writes outbox rows in the same transaction, and none for a PATCH that changes nothing', async () => {
    const ca = (await create(a, { ca_pem: certs.ca, description: 'd' })).body;
    await a.call('PATCH', `/certificate_authorities/${ca.id}`, { id: ca.id, description: 'd' });
    await a.call('PATCH', `/certificate_authorities/${ca.id}`, { id: ca.id });
    const updated = (await a.call('PATCH', `/certificate_authorities/${ca.id}`, { metadata: 'm' })).body;
    await a.call('DELETE', `/certificate_authorities/${ca.id}`);
    const { rows } = await api.db.query('SELECT event_type, resource_type, object, principal FROM outbox WHERE resource_id = $1 ORDER BY seq', [ca.id]);
    expect(rows.map((r) => r.event_type)).toEqual(['certificate_authority_created.v0', 'certificate_authority_updated.v0', 'certificate_authority_deleted.v0']);
    expect(rows[0].object).toEqual(ca);
    expect(rows[1].object).toEqual(updated);
    expect(rows[2].object).toEqual(updated);
    expect(rows[0].resource_type).toBe('certificate_authority');
    expect(rows[0].principal).toMatchObject({ id: a.apiKeyId, source: 'API' });

    const before = await api.db.query('SELECT count(*)::int AS n FROM outbox');
    await create(a, { ca_pem: certs.leaf });
    expect((await api.db.query('SELECT count(*)::int AS n FROM outbox')).rows[0].n).toBe(before.rows[0].n);
  });

  it('answers 409 when deleting a CA that an HTTPS edge mutual_tls lists', async () => {
    const ca = (await create(a, { ca_pem: certs.ca })).body;
    const edgeId = newId('edghts');
    await api.db.query(`INSERT INTO https_edges (id, account_id, mutual_tls) VALUES ($1, $2, '{"enabled": true}')`, [edgeId, a.accountId]);
    await api.db.query('INSERT INTO https_edge_certificate_authorities (edge_id, ca_id, position) VALUES ($1, $2, 0)', [edgeId, ca.id]);
    const r = await a.call('DELETE', `/certificate_authorities/${ca.id}`);
    expect(r.status).toBe(409);
    expect(r.body.error_code).toBe('ERR_WARREN_4100');
    expect(r.body.msg).toContain(edgeId);
    expect((await a.call('GET', `/certificate_authorities/${ca.id}`)).status).toBe(200);
    const events = await api.db.query(`SELECT 1 FROM outbox WHERE resource_id = $1 AND event_type LIKE '%deleted%'`, [ca.id]);
    expect(events.rows).toHaveLength(0);

    await api.db.query('DELETE FROM https_edges WHERE id = $1', [edgeId]);
    expect((await a.call('DELETE', `/certificate_authorities/${ca.id}`)).status).toBe(204);
  });

  it('isolates accounts: another account id answers 404', async () => {
    const id = (await create(a, { ca_pem: certs.ca })).body.id;
    await expectHiddenFrom(b, `/certificate_authorities/${id}`);
    expect((await b.call('GET', '/certificate_authorities')).body.certificate_authorities.map((x: { id: string }) => x.id)).not.toContain(id);
    expect((await a.call('GET', '/certificate_authorities/ca_nope')).status).toBe(404);
  });

  it('paginates across pages', async () => {
    const c = await api.account('pager');
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push((await create(c, { ca_pem: certs.ca, description: `n${i}` })).body.id);
    const { ids: seen, pages, nextUris } = await walkPages(c, api.baseUrl, '/certificate_authorities?limit=2', 'certificate_authorities');
    for (const next of nextUris) expect(next).toMatch(/\/certificate_authorities\?limit=2&before_id=ca_/);
    expect(pages).toBe(3);
    expect(seen).toEqual([...ids].sort().reverse());
    expect((await c.call('GET', '/certificate_authorities?before_id=ipp_1')).body.error_code).toBe('ERR_WARREN_2203');
  });
});
