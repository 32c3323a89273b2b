import type { Queryable } from '../../db/pool.js';
import type { Page } from '../../http/paginate.js';
import { pageRows } from '../common.js';

export interface StoredMutualTls {
  enabled: boolean;
}
export interface StoredTlsTermination {
  enabled: boolean;
  min_version: '1.2' | '1.3';
}

export interface EdgeRow {
  id: string;
  account_id: string;
  description: string;
  metadata: string;
  hostports: string[];
  mutual_tls: StoredMutualTls | null;
  tls_termination: StoredTlsTermination | null;
  created_at: Date;
  /** mutual_tls certificate authorities, in order (https_edge_certificate_authorities). */
  ca_ids: string[];
}

const COLS = `id, account_id, description, metadata, hostports, mutual_tls, tls_termination, created_at,
  (SELECT COALESCE(array_agg(c.ca_id ORDER BY c.position), '{}') FROM https_edge_certificate_authorities c WHERE c.edge_id = https_edges.id) AS ca_ids`;

export type EdgeWrite = Pick<EdgeRow, 'description' | 'metadata' | 'hostports' | 'mutual_tls' | 'tls_termination' | 'ca_ids'>;

export const edgesRepo = {
  async insert(q: Queryable, id: string, accountId: string, e: EdgeWrite): Promise<EdgeRow> {
    await q.query(
      `INSERT INTO https_edges (id, account_id, description, metadata, hostports, mutual_tls, tls_termination) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
      [id, accountId, e.description, e.metadata, e.hostports, e.mutual_tls && JSON.stringify(e.mutual_tls), e.tls_termination && JSON.stringify(e.tls_termination)],
    );
    await this.setHostports(q, id, e.hostports);
    await this.setCertificateAuthorities(q, id, e.ca_ids);
    return (await this.get(q, accountId, id))!;
  },

  async get(q: Queryable, accountId: string, id: string, forUpdate = false): Promise<EdgeRow | undefined> {
    const { rows } = await q.query<EdgeRow>(`SELECT ${COLS} FROM https_edges WHERE account_id = $1 AND id = $2${forUpdate ? ' FOR UPDATE' : ''}`, [accountId, id]);
    return rows[0];
  },

  list(q: Queryable, accountId: string, page: Page): Promise<EdgeRow[]> {
    return pageRows<EdgeRow>(q, 'https_edges', COLS, accountId, page);
  },

  async update(q: Queryable, before: EdgeRow, e: EdgeWrite): Promise<EdgeRow> {
    await q.query(`UPDATE https_edges SET description = $2, metadata = $3, hostports = $4, mutual_tls = $5, tls_termination = $6 WHERE id = $1`, [
      before.id,
      e.description,
      e.metadata,
      e.hostports,
      e.mutual_tls && JSON.stringify(e.mutual_tls),
      e.tls_termination && JSON.stringify(e.tls_termination),
    ]);
    if (e.hostports.join('\n') !== before.hostports.join('\n')) await this.setHostports(q, before.id, e.hostports);
    if (e.ca_ids.join('\n') !== before.ca_ids.join('\n')) await this.setCertificateAuthorities(q, before.id, e.ca_ids);
    return (await this.get(q, before.account_id, before.id))!;
  },

  async delete(q: Queryable, accountId: string, id: string): Promise<boolean> {
    const { rowCount } = await q.query('DELETE FROM https_edges WHERE account_id = $1 AND id = $2', [accountId, id]);
    return (rowCount ?? 0) > 0;
  },

  /**
   * The first of `hostports` that another edge already serves, or whose host an edge of another
   * account serves on any port (a host belongs to one account: otherwise another account could
   * claim `victim.example:80` or `:8443` beside the owner's `:443` and answer requests that name
   * that port). Takes a transaction-scoped advisory lock per host first, so two accounts claiming
   * one host on different ports at once cannot both pass.
   */
  async hostportTaken(q: Queryable, accountId: string, edgeId: string, hostports: string[]): Promise<string | undefined> {
    if (hostports.length === 0) return undefined;
    const hosts = [...new Set(hostports.map(hostOf))];
    await lockHosts(q, hosts);
    const { rows } = await q.query<{ hostport: string; same: boolean }>(
      `SELECT h.hostport, e.account_id = $3 AS same
         FROM https_edge_hostports h JOIN https_edges e ON e.id = h.edge_id
        WHERE h.edge_id <> $2 AND (h.hostport = ANY($1::text[]) OR regexp_replace(h.hostport, ':[0-9]+$', '') = ANY($4::text[]))`,
      [hostports, edgeId, accountId, hosts],
    );
    const exact = new Set(rows.map((r) => r.hostport));
    const foreignHosts = new Set(rows.filter((r) => !r.same).map((r) => hostOf(r.hostport)));
    return hostports.find((h) => exact.has(h) || foreignHosts.has(hostOf(h)));
  },

  /**
   * The first of `hostports` whose host a public Bind tunnel (agent endpoint: proto http, https or
   * tls, not `internal`) of another account serves now, as the nodes reported it (`tunnels`).
   * Call after {@link hostportTaken}, in its transaction: the node presence takes the same
   * per-host advisory lock when it records a new tunnel ({@link lockHosts}), so an edge
   * creation and a concurrent Bind report are serialised and cannot both pass unseen.
   */
  async endpointOfOtherAccount(q: Queryable, accountId: string, hostports: string[]): Promise<string | undefined> {
    if (hostports.length === 0) return undefined;
    const hosts = [...new Set(hostports.map(hostOf))];
    const { rows } = await q.query<{ host: string }>(
      `SELECT DISTINCT h.host FROM tunnels t, LATERAL (SELECT ${URL_HOST_SQL} AS host) h
        WHERE t.account_id <> $1 AND t.proto IN ('http', 'https', 'tls') AND NOT ('internal' = ANY(t.bindings)) AND h.host = ANY($2::text[])`,
      [accountId, hosts],
    );
    const held = new Set(rows.map((r) => r.host));
    return hostports.find((h) => held.has(hostOf(h)));
  },

  /**
   * Mirrors the hostports into https_edge_hostports, whose primary key makes them unique across
   * edges (another edge's hostport fails the insert with 23505). Hostports the edge keeps keep
   * their claim time; the ones it gains are claimed now (`claimed_ms`, this process's clock, as
   * the edge id's time is): the data plane settles a race for a host with an agent endpoint by it.
   */
  async setHostports(q: Queryable, edgeId: string, hostports: string[]): Promise<void> {
    await q.query('DELETE FROM https_edge_hostports WHERE edge_id = $1 AND hostport <> ALL($2::text[])', [edgeId, hostports]);
    if (hostports.length > 0)
      await q.query(
        `INSERT INTO https_edge_hostports (hostport, edge_id, claimed_ms)
         SELECT h, $2, $3 FROM unnest($1::text[]) AS h
          WHERE NOT EXISTS (SELECT 1 FROM https_edge_hostports x WHERE x.hostport = h AND x.edge_id = $2)`,
        [hostports, edgeId, Date.now()],
      );
  },

  async setCertificateAuthorities(q: Queryable, edgeId: string, caIds: string[]): Promise<void> {
    await q.query('DELETE FROM https_edge_certificate_authorities WHERE edge_id = $1', [edgeId]);
    if (caIds.length > 0)
      await q.query(
        `INSERT INTO https_edge_certificate_authorities (edge_id, ca_id, position)
         SELECT $1, id, ord::int - 1 FROM unnest($2::text[]) WITH ORDINALITY AS t(id, ord)`,
        [edgeId, caIds],
      );
  },
};

/** The lower-case host of `t.public_url` (`https://App.test:8443` → `app.test`; an IPv6 host keeps its brackets), in SQL. */
const URL_HOST_SQL = `lower(substring(t.public_url from '^[A-Za-z][A-Za-z0-9+.-]*://(\\[[^]]*\\]|[^/:?#]+)'))`;

/**
 * Takes the transaction-scoped advisory lock of each host, as {@link edgesRepo.hostportTaken}
 * does (same keys, same order): for the node presence recording a public Bind tunnel, so that an
 * edge creation for its host waits for the tunnel's row, and sees it.
 */
export async function lockHosts(q: Queryable, hosts: string[]): Promise<void> {
  if (hosts.length === 0) return;
  // Locked in the order of their lock keys (not of the names: two names may share a key), one
  // at a time, so two transactions never wait on each other's locks in opposite orders.
  const { rows: keys } = await q.query<{ k: number }>("SELECT DISTINCT hashtext('warren:edge-host:' || h) AS k FROM unnest($1::text[]) AS t(h) ORDER BY k", [[...new Set(hosts)]]);
  for (const { k } of keys) await q.query('SELECT pg_advisory_xact_lock($1::int)', [k]);
}

/** The host of a `host:port` (an IPv6 host keeps its brackets). */
function hostOf(hostport: string): string {
  return hostport.replace(/:[0-9]+$/, '');
}
