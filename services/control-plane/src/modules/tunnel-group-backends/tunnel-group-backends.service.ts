import { AppError, newId, notFound, rfc3339 } from '@warren/shared';
import type { z } from 'zod';
import type { Db } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { envelope, type Page } from '../../http/paginate.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings, ref } from '../common.js';
import { tunnelGroupBackendsRepo as repo, type TunnelGroupBackendRow } from './tunnel-group-backends.repo.js';
import type { TunnelGroupBackend, TunnelGroupBackendCreate, TunnelGroupBackendUpdate } from './tunnel-group-backends.schema.js';

export const TUNNEL_GROUP_BACKENDS = 'backends/tunnel_group';
const EVENT = 'tunnel_group_backend';

export function toTunnelGroupBackend(row: TunnelGroupBackendRow, baseUrl: string): TunnelGroupBackend {
  return {
    id: row.id,
    uri: `${baseUrl}/${TUNNEL_GROUP_BACKENDS}/${row.id}`,
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    labels: row.labels,
    tunnels: row.tunnel_ids.map((id) => ref(baseUrl, 'tunnels', id)),
  };
}

const sameLabels = (a: Record<string, string>, b: Record<string, string>) => {
  const ka = Object.keys(a);
  return ka.length === Object.keys(b).length && ka.every((k) => a[k] === b[k]);
};

export function createTunnelGroupBackendsService(deps: { db: Db }) {
  const { db } = deps;
  return {
    async create(ctx: RequestContext, input: z.output<typeof TunnelGroupBackendCreate>): Promise<TunnelGroupBackend> {
      return db.tx(async (q) => {
        const row = await repo.insert(q, { id: newId('bkdtg'), account_id: ctx.auth.accountId, description: input.description ?? '', metadata: input.metadata ?? '', labels: input.labels });
        const out = toTunnelGroupBackend(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'created', out);
        return out;
      });
    },
    async get(ctx: RequestContext, id: string): Promise<TunnelGroupBackend> {
      const row = await repo.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('tunnel group backend', id);
      return toTunnelGroupBackend(row, ctx.baseUrl);
    },
    async list(ctx: RequestContext, page: Page) {
      const rows = await repo.list(db, ctx.auth.accountId, page);
      return envelope('backends', `${ctx.baseUrl}/${TUNNEL_GROUP_BACKENDS}`, rows.map((r) => toTunnelGroupBackend(r, ctx.baseUrl)), page);
    },
    async update(ctx: RequestContext, id: string, input: z.output<typeof TunnelGroupBackendUpdate>): Promise<TunnelGroupBackend> {
      return db.tx(async (q) => {
        const before = await repo.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('tunnel group backend', id);
        const patch = { description: input.description ?? undefined, metadata: input.metadata ?? undefined, labels: input.labels ?? undefined };
        const unchanged =
          (patch.description ?? before.description) === before.description &&
          (patch.metadata ?? before.metadata) === before.metadata &&
          (!patch.labels || sameLabels(patch.labels, before.labels));
        if (unchanged) return toTunnelGroupBackend(before, ctx.baseUrl);
        const row = (await repo.update(q, ctx.auth.accountId, id, patch))!;
        const out = toTunnelGroupBackend(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'updated', out);
        return out;
      });
    },
    async delete(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const before = await repo.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('tunnel group backend', id);
        const { rows } = await q.query<{ id: string }>('SELECT id FROM https_edge_routes WHERE backend_id = $1 LIMIT 1', [id]);
        if (rows[0]) throw new AppError(4100, `the tunnel group backend is used by the backend module of route ${rows[0].id}`, { resourceId: rows[0].id });
        await repo.delete(q, ctx.auth.accountId, id);
        await audit(q, ctx, EVENT, 'deleted', toTunnelGroupBackend(before, ctx.baseUrl));
      });
    },
  };
}
