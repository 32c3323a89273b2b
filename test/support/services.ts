import net from 'node:net';
import pg from 'pg';

export interface Found {
  stop?: () => Promise<void>;
}

async function pgReachable(url: string): Promise<boolean> {
  const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1500 });
  c.on('error', () => {});
  try {
    await c.connect();
    return true;
  } catch {
    return false;
  } finally {
    await c.end().catch(() => {});
  }
}

function tcpReachable(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ port, host });
    s.setTimeout(1000, () => (s.destroy(), resolve(false)));
    s.on('error', () => resolve(false));
    s.on('connect', () => (s.destroy(), resolve(true)));
  });
}

async function dockerAvailable(): Promise<boolean> {
  try {
    const { getContainerRuntimeClient } = await import('testcontainers');
    await getContainerRuntimeClient();
    return true;
  } catch {
    return false;
  }
}

/** Postgres for tests: TEST_DATABASE_URL, else 127.0.0.1:5432, else a testcontainers Postgres. */
export async function findPostgres(): Promise<Found & { adminUrl: string }> {
  if (process.env.TEST_DATABASE_URL) return { adminUrl: process.env.TEST_DATABASE_URL };
  const local = 'postgres://postgres@127.0.0.1:5432/postgres';
  if (await pgReachable(local)) return { adminUrl: local };
  if (await dockerAvailable()) {
    const { GenericContainer, Wait } = await import('testcontainers');
    const c = await new GenericContainer('postgres:16-alpine')
      .withEnvironment({ POSTGRES_PASSWORD: 'postgres' })
      .withExposedPorts(5432)
      .withWaitStrategy(Wait.forLogMessage(/ready to accept connections/, 2))
      .start();
    return { adminUrl: `postgres://postgres:postgres@${c.getHost()}:${c.getMappedPort(5432)}/postgres`, stop: async () => void (await c.stop()) };
  }
  throw new Error('no Postgres for tests: set TEST_DATABASE_URL, start one on 127.0.0.1:5432, or provide a Docker engine');
}

/** Redis for tests: TEST_REDIS_URL, else 127.0.0.1:6379, else a testcontainers Redis. */
export async function findRedis(): Promise<Found & { url: string }> {
  if (process.env.TEST_REDIS_URL) return { url: process.env.TEST_REDIS_URL };
  if (await tcpReachable(6379)) return { url: 'redis://127.0.0.1:6379' };
  if (await dockerAvailable()) {
    const { GenericContainer } = await import('testcontainers');
    const c = await new GenericContainer('redis:7-alpine').withExposedPorts(6379).start();
    return { url: `redis://${c.getHost()}:${c.getMappedPort(6379)}`, stop: async () => void (await c.stop()) };
  }
  throw new Error('no Redis for tests: set TEST_REDIS_URL, start one on 127.0.0.1:6379, or provide a Docker engine');
}
