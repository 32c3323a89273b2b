import { newId } from '@warren/shared';
import type { Account, ApiResult, TestApi } from '../../../../../test/support/api.js';
import { createSelfSignedCertificate } from '@warren/shared';

/**
 * Test helpers for edges and routes: referenced resources (tunnel group backends, IP policies,
 * certificate authorities) are created through their API when it is registered, and inserted
 * with SQL while their endpoints are still placeholders (answering 404 ERR_WARREN_4000).
 */

const notRegistered = (r: ApiResult) => r.status === 404 && r.body?.error_code === 'ERR_WARREN_4000';

let caPem: Promise<string> | undefined;
/** A self-signed CA certificate (basic constraint CA:TRUE), made once per test file. */
export function testCaPem(): Promise<string> {
  caPem ??= createSelfSignedCertificate({ commonName: 'Warren test CA', days: 30, ca: true }).then((c) => c.certificatePem);
  return caPem;
}

export async function createBackend(api: TestApi, acct: Account): Promise<string> {
  const r = await acct.call('POST', '/backends/tunnel_group', { labels: { app: 'web' } });
  if (r.status === 201) return r.body.id;
  if (!notRegistered(r)) throw new Error(`backend create failed: ${r.status} ${JSON.stringify(r.body)}`);
  const id = newId('bkdtg');
  await api.db.query('INSERT INTO tunnel_group_backends (id, account_id, labels) VALUES ($1, $2, $3)', [id, acct.accountId, JSON.stringify({ app: 'web' })]);
  return id;
}

export async function createIpPolicy(api: TestApi, acct: Account): Promise<string> {
  const r = await acct.call('POST', '/ip_policies', { description: 'office' });
  if (r.status === 201) return r.body.id;
  if (!notRegistered(r)) throw new Error(`IP policy create failed: ${r.status} ${JSON.stringify(r.body)}`);
  const id = newId('ipp');
  await api.db.query('INSERT INTO ip_policies (id, account_id) VALUES ($1, $2)', [id, acct.accountId]);
  return id;
}

export async function createCa(api: TestApi, acct: Account): Promise<string> {
  const pem = await testCaPem();
  const r = await acct.call('POST', '/certificate_authorities', { ca_pem: pem });
  if (r.status === 201) return r.body.id;
  if (!notRegistered(r)) throw new Error(`CA create failed: ${r.status} ${JSON.stringify(r.body)}`);
  const id = newId('ca');
  await api.db.query(`INSERT INTO certificate_authorities (id, account_id, ca_pem, not_before, not_after) VALUES ($1, $2, $3, now(), now() + interval '30 days')`, [
    id,
    acct.accountId,
    pem,
  ]);
  return id;
}

/**
 * Deletes a referenced resource through its API (expecting the caller to check the 409) or, while
 * the endpoint is a placeholder, with SQL, reporting the foreign-key violation that the error
 * handler turns into 409 (ERR_WARREN_4100).
 */
export async function deleteReferenced(api: TestApi, acct: Account, path: string, table: string, id: string): Promise<{ status: number; error_code?: string }> {
  const r = await acct.call('DELETE', path);
  if (!notRegistered(r)) return { status: r.status, error_code: r.body?.error_code };
  try {
    await api.db.query(`DELETE FROM ${table} WHERE id = $1`, [id]);
    return { status: 204 };
  } catch (err) {
    if ((err as { code?: string }).code === '23503') return { status: 409, error_code: 'ERR_WARREN_4100' };
    throw err;
  }
}

/** Asserts a Warren error: status, code and (when given) the field. */
export function errorOf(r: ApiResult): { status: number; code: string; field: string | undefined; msg: string } {
  return { status: r.status, code: r.body?.error_code, field: r.body?.details?.field, msg: r.body?.msg };
}
