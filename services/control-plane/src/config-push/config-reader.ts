import type pg from 'pg';
import type { DpDeletedIds, DpEntityLists } from '../../../shared/src/proto/index.js';
import { CONFIG_CHANNEL, EPOCH_NOTICE } from '../events/outbox.js';
import { dataplaneRepo as repo } from './dataplane.repo.js';
import { changedIds, toDpBackend, toDpCertificateAuthority, toDpCredential, toDpEdge, toDpEventSubscription, toDpIpPolicy, toDpRoute } from './dataplane.js';

/** Entities of the data-plane configuration, by kind. */
export type ConfigEntities = DpEntityLists;
export type DeletedIds = DpDeletedIds;

export interface VersionInfo {
  version: number;
  epoch: string;
  /** Commit time of `version` (Unix ms). */
  committedAtMs: number;
}

export interface SnapshotData extends VersionInfo {
  entities: ConfigEntities;
}

/** Every entity changed in (fromVersion, version], in its state at `version`, and those gone. */
export interface DeltaData extends VersionInfo {
  fromVersion: number;
  upserts: ConfigEntities;
  deletes: DeletedIds;
  /** Outbox rows the delta covers. */
  changes: number;
}

export interface ReaderOptions {
  onBadPolicy?: (routeId: string, err: Error) => void;
  /** The control plane's public base URL: saml routes are pushed with their login URL under it (dataplane.ts). */
  baseUrl?: string;
}

/**
 * Runs `fn` in a REPEATABLE READ, READ ONLY transaction: everything it reads is the database at
 * one instant, and since config versions are in commit order (migration 0002), the config state it
 * sees is exactly the state at the `config_state.version` it reads.
 */
async function atOneVersion<T>(pool: pg.Pool, fn: (q: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
    const out = await fn(client);
    await client.query('COMMIT');
    return out;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}

/** The head version, outside any transaction. */
export async function readHead(pool: pg.Pool): Promise<VersionInfo> {
  const h = await repo.head(pool);
  return { version: h.version, epoch: h.epoch, committedAtMs: h.committed_at.getTime() };
}

/**
 * Starts a new epoch of the config version sequence (what `npm run admin -- new-config-epoch`
 * does), and wakes every control-plane replica: every ingress node then takes a whole snapshot,
 * whatever version it holds. For a database restored in place from a backup: it brings back its
 * old epoch with a lower version, and the writes after the restore reuse version numbers that
 * nodes have already applied (with other content), which versions alone cannot tell apart.
 */
export async function newConfigEpoch(pool: pg.Pool): Promise<{ epoch: string; version: number }> {
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    const { rows } = await c.query<{ epoch: string; version: string }>(`UPDATE config_state SET epoch = md5(random()::text || clock_timestamp()::text) RETURNING epoch, version`);
    await c.query(`SELECT pg_notify('${CONFIG_CHANNEL}', $1)`, [`${EPOCH_NOTICE}${rows[0]!.epoch}`]);
    await c.query('COMMIT');
    return { epoch: rows[0]!.epoch, version: Number(rows[0]!.version) };
  } catch (err) {
    await c.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    c.release();
  }
}

/** The whole configuration at the current head. */
export function readSnapshot(pool: pg.Pool, opts: ReaderOptions = {}): Promise<SnapshotData> {
  return atOneVersion(pool, async (q) => {
    const head = await repo.head(q);
    // One connection runs these one after another; a pool of them would not see one snapshot.
    const edges = await repo.edges(q);
    const routes = await repo.routes(q);
    const backends = await repo.backends(q);
    const ipPolicies = await repo.ipPolicies(q);
    const cas = await repo.certificateAuthorities(q);
    const credentials = await repo.credentials(q);
    const eventSubscriptions = await repo.eventSubscriptions(q);
    return {
      version: head.version,
      epoch: head.epoch,
      committedAtMs: head.committed_at.getTime(),
      entities: {
        edges: edges.map(toDpEdge),
        routes: routes.map((r) => toDpRoute(r, opts.onBadPolicy, opts.baseUrl)),
        backends: backends.map(toDpBackend),
        ipPolicies: ipPolicies.map(toDpIpPolicy),
        certificateAuthorities: cas.map(toDpCertificateAuthority),
        credentials: credentials.map(toDpCredential),
        eventSubscriptions: eventSubscriptions.map(toDpEventSubscription),
      },
    };
  });
}

/**
 * The delta from `fromVersion` to the current head, built from the outbox rows in between and the
 * current rows of the entities they name (one query per kind). Returns `null` when no delta can
 * be built: `fromVersion` is past the head, the range holds more than `maxChanges` rows (a
 * snapshot is cheaper), or outbox rows of the range were pruned.
 */
export function readDelta(pool: pg.Pool, fromVersion: number, opts: ReaderOptions & { maxChanges?: number } = {}): Promise<DeltaData | null> {
  return atOneVersion(pool, async (q) => {
    const head = await repo.head(q);
    const base = { fromVersion, version: head.version, epoch: head.epoch, committedAtMs: head.committed_at.getTime() };
    if (fromVersion > head.version) return null;
    if (head.version - fromVersion > (opts.maxChanges ?? Infinity)) return null;
    const rows = head.version === fromVersion ? [] : await repo.outboxSince(q, fromVersion, head.version);
    if (rows.length !== head.version - fromVersion) return null;
    const ids = changedIds(rows);
    const credentialIds = new Set([...ids.credentials, ...(await repo.credentialIdsOfAccounts(q, [...ids.accounts]))]);
    const [edges, routes, backends, ipPolicies, cas, credentials, eventSubscriptions] = [
      await repo.edges(q, [...ids.edges]),
      await repo.routes(q, [...ids.routes]),
      await repo.backends(q, [...ids.backends]),
      await repo.ipPolicies(q, [...ids.ipPolicies]),
      await repo.certificateAuthorities(q, [...ids.certificateAuthorities]),
      await repo.credentials(q, [...credentialIds]),
      await repo.eventSubscriptions(q, [...ids.eventSubscriptions]),
    ];
    const gone = (wanted: Iterable<string>, found: { id: string }[]) => {
      const have = new Set(found.map((f) => f.id));
      return [...wanted].filter((id) => !have.has(id));
    };
    return {
      ...base,
      changes: rows.length,
      upserts: {
        edges: edges.map(toDpEdge),
        routes: routes.map((r) => toDpRoute(r, opts.onBadPolicy, opts.baseUrl)),
        backends: backends.map(toDpBackend),
        ipPolicies: ipPolicies.map(toDpIpPolicy),
        certificateAuthorities: cas.map(toDpCertificateAuthority),
        credentials: credentials.map(toDpCredential),
        eventSubscriptions: eventSubscriptions.map(toDpEventSubscription),
      },
      deletes: {
        edges: gone(ids.edges, edges),
        routes: gone(ids.routes, routes),
        backends: gone(ids.backends, backends),
        ipPolicies: gone(ids.ipPolicies, ipPolicies),
        certificateAuthorities: gone(ids.certificateAuthorities, cas),
        credentials: gone(credentialIds, credentials),
        // Deleted, or no longer holding a traffic type and a destination.
        eventSubscriptions: gone(ids.eventSubscriptions, eventSubscriptions),
      },
    };
  });
}
