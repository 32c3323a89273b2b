import type pg from 'pg';
import type { DpAgentSession, DpTunnel } from '@warren/shared';
import type { Queryable } from '../db/pool.js';
import { agentPrincipal, writeOutboxEvents } from '../events/outbox.js';
import { SESSION_COLS, toSession, type SessionRow } from '../modules/tunnels/tunnels.http.js';

/** NOTIFY channel of tunnel presence changes (payload: `PresenceNotice` JSON). */
export const TUNNELS_CHANNEL = 'warren_tunnels';

/** What a `warren_tunnels` notification says: tunnels of node `n` that came up (`u`) or went down (`d`). */
export interface PresenceNotice {
  n: string;
  u?: string[];
  d?: string[];
}

// NOTIFY payloads must stay under 8000 bytes; ids are ~30 bytes.
const IDS_PER_NOTICE = 150;

/** Queues `warren_tunnels` notifications (sent at COMMIT) for these changes of node `nodeId`. */
export async function notifyPresence(q: Queryable, nodeId: string, up: string[], down: string[]): Promise<void> {
  const payloads: string[] = [];
  for (let i = 0; i < up.length; i += IDS_PER_NOTICE) payloads.push(JSON.stringify({ n: nodeId, u: up.slice(i, i + IDS_PER_NOTICE) } satisfies PresenceNotice));
  for (let i = 0; i < down.length; i += IDS_PER_NOTICE) payloads.push(JSON.stringify({ n: nodeId, d: down.slice(i, i + IDS_PER_NOTICE) } satisfies PresenceNotice));
  if (payloads.length > 0) await q.query('SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p', [TUNNELS_CHANNEL, payloads]);
}

export type ReportedTunnel = Omit<DpTunnel, 'nodeId' | 'nodeAddress'>;

/**
 * The hostname a tunnel serves publicly as an agent endpoint (a Bind of proto http, https or
 * tls, not `internal`), lower-case; '' for any other tunnel.
 */
export function endpointHost(t: Pick<DpTunnel, 'proto' | 'publicUrl' | 'bindings'>): string {
  if ((t.proto !== 'http' && t.proto !== 'https' && t.proto !== 'tls') || t.bindings.includes('internal')) return '';
  try {
    return new URL(t.publicUrl).hostname.toLowerCase();
  } catch {
    return '';
  }
}

interface TunnelRow {
  id: string;
  account_id: string;
  tunnel_session_id: string;
  proto: string;
  labels: Record<string, string>;
  public_url: string;
  bindings: string[];
  pooling_enabled: boolean;
  forwards_to: string;
  metadata: string;
  started_at: Date;
  ingress_node: string;
  node_address: string;
}

// The API shows no proto for labeled tunnels (as ngrok): `labeled` is stored as ''.
const TUNNEL_COLS = `t.id, t.account_id, t.tunnel_session_id, t.proto, t.labels, t.public_url, t.bindings, t.pooling_enabled, t.forwards_to,
  t.metadata, t.started_at, t.ingress_node, t.node_address`;

function toDpTunnel(r: TunnelRow): DpTunnel {
  return {
    id: r.id,
    accountId: r.account_id,
    sessionId: r.tunnel_session_id,
    proto: r.proto === '' && Object.keys(r.labels).length > 0 ? 'labeled' : r.proto,
    labels: r.labels,
    publicUrl: r.public_url,
    bindings: r.bindings,
    poolingEnabled: r.pooling_enabled,
    forwardsTo: r.forwards_to,
    metadata: r.metadata,
    startedAt: r.started_at.toISOString(),
    nodeId: r.ingress_node,
    nodeAddress: r.node_address,
  };
}

/** RFC 3339 as given when it parses, else now (a bad timestamp must not fail the whole report). */
function timestamp(s: string): string {
  return s && !Number.isNaN(Date.parse(s)) ? new Date(s).toISOString() : new Date().toISOString();
}

const sessionJson = (s: DpAgentSession) => ({
  id: s.id,
  account_id: s.accountId,
  credential_id: s.credentialId,
  agent_version: s.agentVersion,
  os: s.os,
  ip: s.ip,
  metadata: s.metadata,
  started_at: timestamp(s.startedAt),
});

const tunnelJson = (t: ReportedTunnel) => ({
  id: t.id,
  account_id: t.accountId,
  session_id: t.sessionId,
  proto: t.proto === 'labeled' ? '' : t.proto,
  labels: t.labels,
  public_url: t.publicUrl,
  bindings: t.bindings,
  pooling_enabled: t.poolingEnabled,
  forwards_to: t.forwardsTo,
  metadata: t.metadata,
  started_at: timestamp(t.startedAt),
});

/** A session row written or removed: its last state as the API shows it, and what its event's principal needs. */
export interface SessionEventRow extends SessionRow {
  account_id: string;
  credential_description: string | null;
}

/** `stmt` (an INSERT or DELETE of `tunnel_sessions` RETURNING `SESSION_RETURNING`) with each row's credential description. */
const SESSION_RETURNING = `${SESSION_COLS}, account_id`;
const withCredential = (stmt: string) =>
  `WITH w AS (${stmt}) SELECT w.*, c.description AS credential_description FROM w LEFT JOIN credentials c ON c.id = w.credential_id`;

/**
 * The `agent_session_start.v0` / `agent_session_stop.v0` audit events of these sessions
 * (wire-conventions.md §11): object = the session as `GET /tunnel_sessions/{id}` returns it (for
 * a stop, its last state), principal = the session's credential (source `Agent`). Written only
 * for accounts subscribed to the event type, so an agent connecting never moves the config
 * version of an account that does not listen (see `writeOutboxEvents`). One statement; as every
 * outbox write, the transaction's last one, in the transaction that makes the change.
 */
export async function writeSessionEvents(q: Queryable, baseUrl: string, changes: { start?: SessionEventRow[]; stop?: SessionEventRow[] }): Promise<void> {
  const event = (kind: 'start' | 'stop') => (r: SessionEventRow) => ({
    accountId: r.account_id,
    eventType: `agent_session_${kind}.v0`,
    resourceType: 'agent_session',
    resourceId: r.id,
    object: toSession(r, baseUrl),
    principal: r.credential_id ? agentPrincipal(r.credential_id, r.credential_description ?? '', baseUrl) : null,
  });
  await writeOutboxEvents(q, [...(changes.start ?? []).map(event('start')), ...(changes.stop ?? []).map(event('stop'))], { onlySubscribed: true });
}

/** Sessions and tunnels removed: the tunnel ids (to announce) and the sessions' last state (for their stop events). */
export interface Removed {
  tunnels: string[];
  sessions: SessionEventRow[];
}

/** Deletes these sessions, locked by the caller, and their tunnels. Returns the tunnels removed by node, and the sessions. */
async function removeSessions(q: Queryable, ids: string[]): Promise<{ tunnels: Map<string, string[]>; sessions: SessionEventRow[] }> {
  const { rows } = await q.query<{ id: string; ingress_node: string }>('DELETE FROM tunnels WHERE tunnel_session_id = ANY($1::text[]) RETURNING id, ingress_node', [ids]);
  const { rows: sessions } = await q.query<SessionEventRow>(withCredential(`DELETE FROM tunnel_sessions WHERE id = ANY($1::text[]) RETURNING ${SESSION_RETURNING}`), [ids]);
  const byNode = new Map<string, string[]>();
  for (const r of rows) (byNode.get(r.ingress_node) ?? byNode.set(r.ingress_node, []).get(r.ingress_node)!).push(r.id);
  return { tunnels: byNode, sessions };
}

export interface NodeRef {
  id: string;
  address: string;
  leaseMs: number;
}

export const presenceRepo = {
  /**
   * Tunnel rows, all or by id: what the tunnel directory mirrors. Rows whose session's lease has
   * run out are included, on purpose: their lease is not a state any notice follows. The sweeper
   * deletes such rows and announces it; but a node that renews the lease first (its full sync on
   * a new stream, a late keep-alive) brings the tunnel back with no row changed and so with no
   * notice. A directory that left lapsed rows out when (re)loading (a control plane starting
   * after an outage longer than the lease) never heard of those tunnels again.
   */
  async tunnels(q: Queryable, ids?: string[]): Promise<DpTunnel[]> {
    if (ids && ids.length === 0) return [];
    const { rows } = ids
      ? await q.query<TunnelRow>(`SELECT ${TUNNEL_COLS} FROM tunnels t WHERE t.id = ANY($1::text[])`, [ids])
      : await q.query<TunnelRow>(`SELECT ${TUNNEL_COLS} FROM tunnels t ORDER BY t.id`);
    return rows.map(toDpTunnel);
  },

  /**
   * Writes sessions of node `n` with a fresh lease: `upsert` inserts or takes over (an agent that
   * reconnected through this node); `insertMissing` only re-inserts rows that are gone (a repair,
   * which must not take a session back from a node that took it over). A session whose
   * credential is not (or no longer) one of its account's is skipped: the ingress is about to end
   * it. Returns the ids written, and the rows that are new (not taken over nor updated): only
   * those start a session.
   */
  async writeSessions(
    q: Queryable,
    n: NodeRef,
    sessions: DpAgentSession[],
    mode: 'upsert' | 'insertMissing' = 'upsert',
  ): Promise<{ written: string[]; inserted: SessionEventRow[] }> {
    if (sessions.length === 0) return { written: [], inserted: [] };
    const onConflict =
      mode === 'upsert'
        ? `DO UPDATE SET agent_version = excluded.agent_version, ip = excluded.ip, metadata = excluded.metadata, os = excluded.os,
             ingress_node = excluded.ingress_node, lease_expires_at = excluded.lease_expires_at
           WHERE tunnel_sessions.account_id = excluded.account_id`
        : 'DO NOTHING';
    // xmax = 0: the row was inserted, not updated by ON CONFLICT (which leaves the locking xid).
    const { rows } = await q.query<SessionEventRow & { inserted: boolean }>(
      withCredential(`INSERT INTO tunnel_sessions (id, account_id, credential_id, agent_version, ip, metadata, os, ingress_node, lease_expires_at, started_at)
       SELECT x.id, x.account_id, x.credential_id, x.agent_version, x.ip, x.metadata, x.os, $2, now() + make_interval(secs => $3::float8 / 1000), x.started_at
         FROM jsonb_to_recordset($1::jsonb) AS x(id text, account_id text, credential_id text, agent_version text, ip text, metadata text, os text, started_at timestamptz)
        WHERE EXISTS (SELECT 1 FROM credentials c WHERE c.id = x.credential_id AND c.account_id = x.account_id)
       ON CONFLICT (id) ${onConflict}
       RETURNING ${SESSION_RETURNING}, (xmax = 0) AS inserted`),
      [JSON.stringify(sessions.map(sessionJson)), n.id, n.leaseMs],
    );
    return { written: rows.map((r) => r.id), inserted: rows.filter((r) => r.inserted) };
  },

  /**
   * Inserts or updates tunnels of node `n` whose session is this node's (`insertMissing`: only
   * inserts). Returns the ids of the rows that changed (new ones included): only those need
   * announcing.
   */
  async writeTunnels(q: Queryable, n: NodeRef, tunnels: ReportedTunnel[], mode: 'upsert' | 'insertMissing' = 'upsert'): Promise<string[]> {
    if (tunnels.length === 0) return [];
    const onConflict =
      mode === 'upsert'
        ? `DO UPDATE SET tunnel_session_id = excluded.tunnel_session_id, public_url = excluded.public_url, proto = excluded.proto,
             labels = excluded.labels, forwards_to = excluded.forwards_to, metadata = excluded.metadata, ingress_node = excluded.ingress_node,
             node_address = excluded.node_address, bindings = excluded.bindings, pooling_enabled = excluded.pooling_enabled
           WHERE tunnels.account_id = excluded.account_id
             AND (tunnels.tunnel_session_id, tunnels.public_url, tunnels.proto, tunnels.labels, tunnels.forwards_to, tunnels.metadata,
                  tunnels.ingress_node, tunnels.node_address, tunnels.bindings, tunnels.pooling_enabled)
                 IS DISTINCT FROM
                 (excluded.tunnel_session_id, excluded.public_url, excluded.proto, excluded.labels, excluded.forwards_to, excluded.metadata,
                  excluded.ingress_node, excluded.node_address, excluded.bindings, excluded.pooling_enabled)`
        : 'DO NOTHING';
    const { rows } = await q.query<{ id: string }>(
      `INSERT INTO tunnels (id, account_id, tunnel_session_id, public_url, proto, labels, forwards_to, metadata, started_at, ingress_node, node_address, bindings, pooling_enabled)
       SELECT x.id, x.account_id, x.session_id, x.public_url, x.proto, x.labels, x.forwards_to, x.metadata, x.started_at, $2, $3, x.bindings, x.pooling_enabled
         FROM jsonb_to_recordset($1::jsonb) AS x(id text, account_id text, session_id text, proto text, labels jsonb, public_url text, bindings text[],
                                                   pooling_enabled boolean, forwards_to text, metadata text, started_at timestamptz)
        WHERE EXISTS (SELECT 1 FROM tunnel_sessions s WHERE s.id = x.session_id AND s.account_id = x.account_id AND s.ingress_node = $2)
       ON CONFLICT (id) ${onConflict}
       RETURNING id`,
      [JSON.stringify(tunnels.map(tunnelJson)), n.id, n.address],
    );
    return rows.map((r) => r.id);
  },

  /** Ids of the sessions node `nodeId` holds. */
  async sessionIdsOf(q: Queryable, nodeId: string): Promise<string[]> {
    const { rows } = await q.query<{ id: string }>('SELECT id FROM tunnel_sessions WHERE ingress_node = $1', [nodeId]);
    return rows.map((r) => r.id);
  },

  /** Removes a session of node `n` and its tunnels (nothing when another node took it over). */
  async deleteSession(q: Queryable, nodeId: string, sessionId: string): Promise<Removed> {
    const { rows } = await q.query<{ id: string }>('DELETE FROM tunnels WHERE tunnel_session_id = $1 AND ingress_node = $2 RETURNING id', [sessionId, nodeId]);
    const { rows: sessions } = await q.query<SessionEventRow>(
      withCredential(`DELETE FROM tunnel_sessions WHERE id = $1 AND ingress_node = $2 RETURNING ${SESSION_RETURNING}`),
      [sessionId, nodeId],
    );
    return { tunnels: rows.map((r) => r.id), sessions };
  },

  async deleteTunnel(q: Queryable, nodeId: string, tunnelId: string): Promise<string[]> {
    const { rows } = await q.query<{ id: string }>('DELETE FROM tunnels WHERE id = $1 AND ingress_node = $2 RETURNING id', [tunnelId, nodeId]);
    return rows.map((r) => r.id);
  },

  /** Removes node `nodeId`'s sessions and tunnels other than those listed. */
  async deleteOthers(q: Queryable, nodeId: string, keepSessions: string[], keepTunnels: string[]): Promise<Removed> {
    const { rows } = await q.query<{ id: string }>(
      `DELETE FROM tunnels t WHERE (t.ingress_node = $1 AND t.id <> ALL($3::text[]))
          OR t.tunnel_session_id IN (SELECT id FROM tunnel_sessions WHERE ingress_node = $1 AND id <> ALL($2::text[]))
       RETURNING t.id`,
      [nodeId, keepSessions, keepTunnels],
    );
    const { rows: sessions } = await q.query<SessionEventRow>(
      withCredential(`DELETE FROM tunnel_sessions WHERE ingress_node = $1 AND id <> ALL($2::text[]) RETURNING ${SESSION_RETURNING}`),
      [nodeId, keepSessions],
    );
    return { tunnels: rows.map((r) => r.id), sessions };
  },

  /**
   * Removes the sessions of a credential that is being deleted (its row locked by the caller, so
   * no session of it can be written meanwhile) and their tunnels, announcing the tunnels; returns
   * the sessions' last state, for their stop events. The FK cascade would remove them too, but
   * silently.
   */
  async deleteSessionsOfCredential(q: Queryable, credentialId: string): Promise<SessionEventRow[]> {
    // Locked first, as the sweeper does: a session it is removing is waited for, then skipped.
    const { rows: locked } = await q.query<{ id: string }>('SELECT id FROM tunnel_sessions WHERE credential_id = $1 FOR UPDATE', [credentialId]);
    if (locked.length === 0) return [];
    const { tunnels, sessions } = await removeSessions(q, locked.map((s) => s.id));
    for (const [node, tunnelIds] of tunnels) await notifyPresence(q, node, [], tunnelIds);
    return sessions;
  },

  /** Renews the lease of every session of the node; returns how many rows it renewed. */
  async renew(q: Queryable, nodeId: string, leaseMs: number): Promise<number> {
    const { rowCount } = await q.query(`UPDATE tunnel_sessions SET lease_expires_at = now() + make_interval(secs => $2::float8 / 1000) WHERE ingress_node = $1`, [nodeId, leaseMs]);
    return rowCount ?? 0;
  },

  /**
   * Deletes sessions whose lease expired, and their tunnels, in one transaction. Sessions are
   * locked first (SKIP LOCKED), so of several replicas sweeping at once each row is removed and
   * announced by exactly one, and a keep-alive cannot renew a session whose tunnels are going.
   * Writes the sessions' stop events (uris built on `baseUrl`). Returns the removed tunnels by node.
   */
  async sweep(pool: pg.Pool, baseUrl: string, limit = 1000): Promise<{ sessions: number; tunnels: Map<string, string[]> }> {
    // The common case, nothing expired, costs one indexed probe and no transaction.
    const { rowCount } = await pool.query('SELECT 1 FROM tunnel_sessions WHERE lease_expires_at <= now() LIMIT 1');
    if (!rowCount) return { sessions: 0, tunnels: new Map() };
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const { rows: sessions } = await client.query<{ id: string }>(
        'SELECT id FROM tunnel_sessions WHERE lease_expires_at <= now() ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED',
        [limit],
      );
      let byNode = new Map<string, string[]>();
      if (sessions.length > 0) {
        const removed = await removeSessions(client, sessions.map((s) => s.id));
        byNode = removed.tunnels;
        for (const [node, tunnelIds] of byNode) await notifyPresence(client, node, [], tunnelIds);
        await writeSessionEvents(client, baseUrl, { stop: removed.sessions });
      }
      await client.query('COMMIT');
      return { sessions: sessions.length, tunnels: byNode };
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {});
      throw err;
    } finally {
      client.release();
    }
  },
};

export const ingressNodesRepo = {
  async connected(q: Queryable, n: { id: string; address: string; epoch: string; appliedVersion: number; replicaId: string; streamId: string }): Promise<void> {
    await q.query(
      `INSERT INTO ingress_nodes (id, address, epoch, applied_version, connected, replica_id, stream_id, connected_at, last_seen)
       VALUES ($1, $2, $3, $4, true, $5, $6, now(), now())
       ON CONFLICT (id) DO UPDATE SET address = excluded.address, epoch = excluded.epoch, applied_version = excluded.applied_version, connected = true,
         replica_id = excluded.replica_id, stream_id = excluded.stream_id, connected_at = now(), last_seen = now()`,
      [n.id, n.address, n.epoch, n.appliedVersion, n.replicaId, n.streamId],
    );
  },
  /** The node applied `version`: a refusal of an older version is history. */
  async applied(q: Queryable, id: string, version: number, epoch: string): Promise<void> {
    await q.query(
      `UPDATE ingress_nodes SET applied_version = $2, epoch = $3, last_seen = now(),
         last_error = CASE WHEN last_error_version IS NULL OR last_error_version < $2 THEN '' ELSE last_error END,
         last_error_version = CASE WHEN last_error_version IS NULL OR last_error_version < $2 THEN NULL ELSE last_error_version END,
         last_error_at = CASE WHEN last_error_version IS NULL OR last_error_version < $2 THEN NULL ELSE last_error_at END
       WHERE id = $1`,
      [id, version, epoch],
    );
  },
  async rejected(q: Queryable, id: string, version: number, error: string): Promise<void> {
    await q.query('UPDATE ingress_nodes SET last_error = $3, last_error_version = $2, last_error_at = now(), last_seen = now() WHERE id = $1', [id, version, error.slice(0, 4000)]);
  },
  async seen(q: Queryable, id: string): Promise<void> {
    await q.query('UPDATE ingress_nodes SET last_seen = now() WHERE id = $1', [id]);
  },
  async disconnected(q: Queryable, id: string, streamId: string): Promise<void> {
    await q.query('UPDATE ingress_nodes SET connected = false, last_seen = now() WHERE id = $1 AND stream_id = $2', [id, streamId]);
  },
};
