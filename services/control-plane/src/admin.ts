import { parseArgs } from 'node:util';
import { z } from 'zod';
import { parseEnv, EnvError } from '@warren/shared';
import { createDb, createPool } from './db/pool.js';
import { migrate } from './db/migrate.js';
import { createAccountWithKey, createApiKeyFor, listAccounts, setAccountDisabled } from './modules/accounts/accounts.service.js';
import { resolveDatabaseUrl } from './dev/database-url.js';
import { newConfigEpoch } from './config-push/config-reader.js';

const USAGE = `usage: npm run admin -- <command> [options]

commands:
  create-account --name NAME          create an account and its first API key (printed once)
  create-api-key --account ac_... [--description TEXT]
  disable-account --account ac_...    every key of the account then answers 403
  enable-account --account ac_...
  list-accounts
  new-config-epoch                    after restoring the database in place from a backup: every
                                      ingress node then takes a whole snapshot

DATABASE_URL selects the database (default: the one npm start uses).`;

async function main(): Promise<number> {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: { name: { type: 'string' }, account: { type: 'string' }, description: { type: 'string' }, json: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } },
  });
  const cmd = positionals[0];
  if (!cmd || values.help) {
    console.log(USAGE);
    return cmd ? 0 : 2;
  }
  const env = parseEnv({ DATABASE_URL: z.string().optional() });
  const url = env.DATABASE_URL ?? (await resolveDatabaseUrl({ startEmbedded: false }));
  const pool = createPool(url, 2);
  try {
    await migrate(pool);
    const db = createDb(pool);
    switch (cmd) {
      case 'create-account': {
        const r = await createAccountWithKey(db, values.name ?? '');
        if (values.json) console.log(JSON.stringify({ account_id: r.accountId, api_key_id: r.apiKeyId, token: r.token }));
        else console.log(`account ${r.accountId}\napi key ${r.apiKeyId}\ntoken   ${r.token}\n\nThe token is shown only now; store it safely.`);
        return 0;
      }
      case 'create-api-key': {
        if (!values.account) return usageError('--account is required');
        const r = await createApiKeyFor(db, values.account, values.description ?? '');
        if (!r) return usageError(`no account ${values.account}`);
        if (values.json) console.log(JSON.stringify({ api_key_id: r.apiKeyId, token: r.token }));
        else console.log(`api key ${r.apiKeyId}\ntoken   ${r.token}`);
        return 0;
      }
      case 'disable-account':
      case 'enable-account': {
        if (!values.account) return usageError('--account is required');
        if (!(await setAccountDisabled(db, values.account, cmd === 'disable-account'))) return usageError(`no account ${values.account}`);
        console.log(`${cmd === 'disable-account' ? 'disabled' : 'enabled'} ${values.account}`);
        return 0;
      }
      case 'new-config-epoch': {
        const r = await newConfigEpoch(pool);
        console.log(`config epoch ${r.epoch} at version ${r.version}: every ingress node takes a whole snapshot`);
        return 0;
      }
      case 'list-accounts':
        for (const a of await listAccounts(db)) console.log(`${a.id}\t${a.disabled ? 'disabled' : 'enabled'}\t${a.name}`);
        return 0;
      default:
        return usageError(`unknown command ${cmd}`);
    }
  } finally {
    await pool.end();
  }
}

function usageError(msg: string): number {
  console.error(`warren admin: ${msg}\n\n${USAGE}`);
  return 2;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(`warren admin: ${err instanceof EnvError ? err.message : (err as Error).message}`);
    process.exit(1);
  },
);
