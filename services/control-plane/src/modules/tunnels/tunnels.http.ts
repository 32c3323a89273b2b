import { notFound, rfc3339 } from '@warren/shared';
import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { envelope, parsePage } from '../../http/paginate.js';
import { optionalStrings, pageRows, ref } from '../common.js';
import { TunnelList, TunnelResponse, TunnelSessionList, TunnelSessionResponse, type Tunnel, type TunnelSession } from './tunnels.schema.js';

/**
 * Read-only views of agent sessions and tunnels. Ingress nodes write these rows (with leases)
 * as agents connect; until the ingress exists both lists are empty.
 */
interface TunnelRow {
  id: string;
  public_url: string;
  started_at: Date;
  metadata: string;
  proto: string;
  region: string;
  tunnel_session_id: string;
  labels: Record<string, string>;
  forwards_to: string;
  backend_ids: string[];
}
/** A `tunnel_sessions` row as `toSession` needs it (columns `SESSION_COLS`). */
export interface SessionRow {
  id: string;
  agent_version: string;
  credential_id: string | null;
  ip: string;
  metadata: string;
  os: string;
  region: string;
  started_at: Date;
}

const TUNNEL_COLS = `id, public_url, started_at, metadata, proto, region, tunnel_session_id, labels, forwards_to,
  ARRAY(SELECT b.id FROM tunnel_group_backends b WHERE b.account_id = t.account_id AND t.labels <> '{}'::jsonb AND t.labels @> b.labels ORDER BY b.id) AS backend_ids`;
export const SESSION_COLS = 'id, agent_version, credential_id, ip, metadata, os, region, started_at';
const LIVE = ' AND tunnel_session_id IN (SELECT id FROM tunnel_sessions WHERE lease_expires_at > now())';
const LIVE_SESSION = ' AND lease_expires_at > now()';

function toTunnel(r: TunnelRow, baseUrl: string): Tunnel {
  const labeled = Object.keys(r.labels).length > 0;
  return {
    id: r.id,
    uri: `${baseUrl}/tunnels/${r.id}`,
    ...optionalStrings({ public_url: r.public_url }),
    started_at: rfc3339(r.started_at),
    ...optionalStrings({ metadata: r.metadata, proto: r.proto }),
    region: r.region,
    tunnel_session: ref(baseUrl, 'tunnel_sessions', r.tunnel_session_id),
    ...(labeled ? { labels: r.labels, backends: r.backend_ids.map((id) => ref(baseUrl, 'backends/tunnel_group', id)) } : {}),
    forwards_to: r.forwards_to,
  };
}

/** A session as the API returns it; the `agent_session_*` events carry the same (config-push/presence.repo.ts). */
export function toSession(r: SessionRow, baseUrl: string): TunnelSession {
  return {
    id: r.id,
    uri: `${baseUrl}/tunnel_sessions/${r.id}`,
    agent_version: r.agent_version,
    credential: ref(baseUrl, 'credentials', r.credential_id ?? ''),
    ip: r.ip,
    ...optionalStrings({ metadata: r.metadata }),
    os: r.os,
    region: r.region,
    started_at: rfc3339(r.started_at),
    transport: 'ngrok/v2',
  };
}

export function registerTunnels(routes: ApiRoutes, deps: ModuleDeps): void {
  const { db } = deps;
  const tag = 'Tunnels';
  routes.route(
    '/tunnels',
    {
      GET: async (req) => {
        const page = parsePage(req.query, 'tn');
        const rows = await pageRows<TunnelRow>(db, 'tunnels t', TUNNEL_COLS, req.ctx.auth.accountId, page, LIVE);
        return { status: 200, body: envelope('tunnels', `${req.ctx.baseUrl}/tunnels`, rows.map((r) => toTunnel(r, req.ctx.baseUrl)), page) };
      },
    },
    { GET: { tag, summary: 'List online tunnels', response: TunnelList, status: 200, paged: true } },
  );
  routes.route(
    '/tunnels/:id',
    {
      GET: async (req) => {
        const { rows } = await db.query<TunnelRow>(`SELECT ${TUNNEL_COLS} FROM tunnels t WHERE account_id = $1 AND id = $2${LIVE}`, [req.ctx.auth.accountId, req.params.id]);
        if (!rows[0]) throw notFound('tunnel', req.params.id!);
        return { status: 200, body: toTunnel(rows[0], req.ctx.baseUrl) };
      },
    },
    { GET: { tag, summary: 'Get a tunnel', response: TunnelResponse, status: 200 } },
  );
  routes.route(
    '/tunnel_sessions',
    {
      GET: async (req) => {
        const page = parsePage(req.query, 'ts');
        const rows = await pageRows<SessionRow>(db, 'tunnel_sessions', SESSION_COLS, req.ctx.auth.accountId, page, LIVE_SESSION);
        return { status: 200, body: envelope('tunnel_sessions', `${req.ctx.baseUrl}/tunnel_sessions`, rows.map((r) => toSession(r, req.ctx.baseUrl)), page) };
      },
    },
    { GET: { tag: 'Tunnel sessions', summary: 'List online agent sessions', response: TunnelSessionList, status: 200, paged: true } },
  );
  routes.route(
    '/tunnel_sessions/:id',
    {
      GET: async (req) => {
        const { rows } = await db.query<SessionRow>(`SELECT ${SESSION_COLS} FROM tunnel_sessions WHERE account_id = $1 AND id = $2${LIVE_SESSION}`, [req.ctx.auth.accountId, req.params.id]);
        if (!rows[0]) throw notFound('tunnel session', req.params.id!);
        return { status: 200, body: toSession(rows[0], req.ctx.baseUrl) };
      },
    },
    { GET: { tag: 'Tunnel sessions', summary: 'Get an agent session', response: TunnelSessionResponse, status: 200 } },
  );
}
