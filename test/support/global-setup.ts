import { randomBytes } from 'node:crypto';
import type { TestProject } from 'vitest/node';
import pg from 'pg';
import { createPool } from '../../services/control-plane/src/db/pool.js';
import { migrate } from '../../services/control-plane/src/db/migrate.js';
import { findPostgres, findRedis } from './services.js';

/**
 * Once per run: finds Postgres (TEST_DATABASE_URL, the local server, or testcontainers) and
 * Redis the same way, creates a migrated template database unique to this run, and hands its
 * name to the test files, which clone it (see databases.ts). Everything is removed at the end,
 * so two runs at once never meet.
 */
export default async function setup(project: TestProject) {
  const runId = `${Date.now().toString(36)}_${randomBytes(3).toString('hex')}`;
  const postgres = await findPostgres();
  const redis = await findRedis();
  const template = `warren_test_tpl_${runId}`;
  const admin = new pg.Client({ connectionString: postgres.adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${template}`);
  const tplUrl = withDatabase(postgres.adminUrl, template);
  const pool = createPool(tplUrl, 1);
  await migrate(pool);
  await pool.end();

  project.provide('pgAdminUrl', postgres.adminUrl);
  project.provide('pgTemplate', template);
  project.provide('runId', runId);
  project.provide('redisUrl', redis.url);

  return async () => {
    // Drop the template and any clone a crashed test file left behind.
    const { rows } = await admin.query<{ datname: string }>(`SELECT datname FROM pg_database WHERE datname LIKE $1`, [`warren_test_%${runId}%`]);
    for (const { datname } of rows) await admin.query(`DROP DATABASE IF EXISTS ${datname} WITH (FORCE)`).catch(() => {});
    await admin.end();
    await postgres.stop?.();
    await redis.stop?.();
  };
}

export function withDatabase(url: string, db: string): string {
  const u = new URL(url);
  u.pathname = `/${db}`;
  return u.toString();
}

declare module 'vitest' {
  export interface ProvidedContext {
    pgAdminUrl: string;
    pgTemplate: string;
    runId: string;
    redisUrl: string;
  }
}
