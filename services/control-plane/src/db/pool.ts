import pg from 'pg';

export type Queryable = Pick<pg.Pool | pg.PoolClient, 'query'>;

/** Database access handed to services: plain queries and a transaction runner. */
export interface Db {
  /** Runs one statement on the pool. */
  query: Queryable['query'];
  /** Runs `fn` inside BEGIN/COMMIT on one client; rolls back on any throw and re-throws. */
  tx<T>(fn: (q: pg.PoolClient) => Promise<T>): Promise<T>;
  pool: pg.Pool;
}

// bigint (int8) columns come back as numbers: counts and sequence values stay far below 2^53.
pg.types.setTypeParser(20, (v) => Number(v));

export function createPool(connectionString: string, max = 20): pg.Pool {
  const pool = new pg.Pool({ connectionString, max, idleTimeoutMillis: 30_000, connectionTimeoutMillis: 5_000, application_name: 'warren-control-plane' });
  // An idle client that errors (server restart) must not crash the process; the pool replaces it.
  pool.on('error', () => {});
  return pool;
}

export function createDb(pool: pg.Pool): Db {
  return {
    pool,
    query: pool.query.bind(pool) as Queryable['query'],
    async tx(fn) {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const result = await fn(client);
        await client.query('COMMIT');
        return result;
      } catch (err) {
        await client.query('ROLLBACK').catch(() => {});
        throw err;
      } finally {
        client.release();
      }
    },
  };
}
