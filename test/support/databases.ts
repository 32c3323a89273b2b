import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import pg from 'pg';
import { withDatabase } from './global-setup.js';

/**
 * A fresh database cloned from this run's migrated template. Call once per test file; `drop`
 * removes it (global teardown sweeps any left behind).
 */
export async function freshDatabase(): Promise<{ url: string; name: string; drop: () => Promise<void> }> {
  const adminUrl = inject('pgAdminUrl');
  const name = `warren_test_${randomBytes(4).toString('hex')}_${inject('runId')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    // Cloning needs the template free of other sessions; parallel clones may briefly collide.
    for (let attempt = 0; ; attempt++) {
      try {
        await admin.query(`CREATE DATABASE ${name} TEMPLATE ${inject('pgTemplate')}`);
        break;
      } catch (err) {
        if ((err as { code?: string }).code !== '55006' || attempt > 50) throw err;
        await new Promise((r) => setTimeout(r, 50 + Math.random() * 100));
      }
    }
  } finally {
    await admin.end();
  }
  return {
    url: withDatabase(adminUrl, name),
    name,
    drop: async () => {
      const c = new pg.Client({ connectionString: adminUrl });
      await c.connect();
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
      await c.end();
    },
  };
}
