import { newId } from '@warren/shared';
import type { Db } from '../../db/pool.js';
import { hashToken, newApiKeyToken } from '../../auth/tokens.js';

/**
 * Creates an account and its first API key (the admin bootstrap; the API cannot create
 * accounts). The token is returned once and only its hash is stored.
 */
export async function createAccountWithKey(db: Db, name: string, keyDescription = 'bootstrap key'): Promise<{ accountId: string; apiKeyId: string; token: string }> {
  const accountId = newId('ac');
  const apiKeyId = newId('ak');
  const token = newApiKeyToken();
  await db.tx(async (q) => {
    await q.query('INSERT INTO accounts (id, name) VALUES ($1, $2)', [accountId, name]);
    await q.query('INSERT INTO api_keys (id, account_id, token_hash, description) VALUES ($1, $2, $3, $4)', [apiKeyId, accountId, hashToken(token), keyDescription]);
  });
  return { accountId, apiKeyId, token };
}

/** Adds an API key to an existing account (admin). */
export async function createApiKeyFor(db: Db, accountId: string, description: string): Promise<{ apiKeyId: string; token: string } | undefined> {
  const apiKeyId = newId('ak');
  const token = newApiKeyToken();
  const { rowCount } = await db.query(
    'INSERT INTO api_keys (id, account_id, token_hash, description) SELECT $1, id, $3, $4 FROM accounts WHERE id = $2',
    [apiKeyId, accountId, hashToken(token), description],
  );
  return rowCount ? { apiKeyId, token } : undefined;
}

export async function setAccountDisabled(db: Db, accountId: string, disabled: boolean): Promise<boolean> {
  const { rowCount } = await db.query('UPDATE accounts SET disabled = $2 WHERE id = $1', [accountId, disabled]);
  return (rowCount ?? 0) > 0;
}

export async function listAccounts(db: Db): Promise<{ id: string; name: string; disabled: boolean; created_at: Date }[]> {
  const { rows } = await db.query<{ id: string; name: string; disabled: boolean; created_at: Date }>('SELECT id, name, disabled, created_at FROM accounts ORDER BY id');
  return rows;
}
