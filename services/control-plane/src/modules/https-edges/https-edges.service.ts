import { AppError, newId, notFound, rfc3339 } from '@warren/shared';
import type { z } from 'zod';
import type { Db, Queryable } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { envelope, type Page } from '../../http/paginate.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings, ref, requireOwned } from '../common.js';
import { routesRepo, type RouteRow } from '../https-edge-routes/https-edge-routes.repo.js';
import { toRoute } from '../https-edge-routes/https-edge-routes.service.js';
import { joinPath, jsonEqual } from './module-body.js';
import { edgesRepo as repo, type EdgeRow, type EdgeWrite, type StoredMutualTls, type StoredTlsTermination } from './https-edges.repo.js';
import type { Edge, EdgeCreate, EdgeUpdate, MutualTlsRequest, MutualTlsResponse, TlsTerminationRequest, TlsTerminationResponse } from './https-edges.schema.js';

const COLLECTION = 'edges/https';
const EVENT = 'https_edge';

type MutualTls = z.infer<typeof MutualTlsResponse>;
type TlsTermination = z.infer<typeof TlsTerminationResponse>;

function renderMutualTls(row: EdgeRow, baseUrl: string): MutualTls | null {
  if (!row.mutual_tls) return null;
  return { enabled: row.mutual_tls.enabled, certificate_authorities: row.ca_ids.map((id) => ref(baseUrl, 'certificate_authorities', id)) };
}

function renderTlsTermination(row: EdgeRow): TlsTermination | null {
  if (!row.tls_termination) return null;
  return { enabled: row.tls_termination.enabled, terminate_at: 'edge', min_version: row.tls_termination.min_version };
}

export function toEdge(row: EdgeRow, routes: RouteRow[], baseUrl: string): Edge {
  return {
    id: row.id,
    uri: `${baseUrl}/${COLLECTION}/${row.id}`,
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    hostports: row.hostports,
    mutual_tls: renderMutualTls(row, baseUrl),
    tls_termination: renderTlsTermination(row),
    routes: routes.map((r) => toRoute(r, baseUrl)),
  };
}

function buildMutualTls(i: z.output<typeof MutualTlsRequest>): { stored: StoredMutualTls; caIds: string[] } {
  return { stored: { enabled: i.enabled ?? true }, caIds: i.certificate_authority_ids ?? [] };
}

function buildTlsTermination(i: z.output<typeof TlsTerminationRequest>): StoredTlsTermination {
  return { enabled: i.enabled ?? true, min_version: (i.min_version || '1.2') as StoredTlsTermination['min_version'] };
}

const sameWrite = (a: EdgeWrite, b: EdgeWrite) =>
  a.description === b.description &&
  a.metadata === b.metadata &&
  jsonEqual(a.hostports, b.hostports) &&
  jsonEqual(a.mutual_tls, b.mutual_tls) &&
  jsonEqual(a.tls_termination, b.tls_termination) &&
  jsonEqual(a.ca_ids, b.ca_ids);

const writeOf = (row: EdgeRow): EdgeWrite => ({
  description: row.description,
  metadata: row.metadata,
  hostports: row.hostports,
  mutual_tls: row.mutual_tls,
  tls_termination: row.tls_termination,
  ca_ids: row.ca_ids,
});

/** A hostport insert that lost a race to another edge: the same 409 as the pre-check. */
function mapUnique(err: unknown): unknown {
  if ((err as { code?: string })?.code === '23505') return new AppError(4101, 'hostports: a hostport is already in use by another edge', { field: 'hostports' });
  return err;
}

export function createHttpsEdgesService(deps: { db: Db }) {
  const { db } = deps;

  async function checkHostports(q: Queryable, accountId: string, edgeId: string, hostports: string[]): Promise<void> {
    const taken = await repo.hostportTaken(q, accountId, edgeId, hostports);
    if (taken) throw new AppError(4101, `hostports: ${JSON.stringify(taken)} is already in use by another edge (a host is served by one account only, on any port)`, { field: 'hostports' });
    // Under the host locks hostportTaken took: an agent endpoint of another account online for
    // the host holds it as an edge would (an edge would otherwise take its traffic).
    const bound = await repo.endpointOfOtherAccount(q, accountId, hostports);
    if (bound) throw new AppError(4101, `hostports: ${JSON.stringify(bound)} is already in use by another account's agent endpoint (a host is served by one account only, on any port)`, { field: 'hostports' });
  }

  async function routesOf(q: Queryable, edgeId: string): Promise<RouteRow[]> {
    return routesRepo.listByEdges(q, [edgeId]);
  }

  async function lock(q: Queryable, ctx: RequestContext, id: string): Promise<EdgeRow> {
    const row = await repo.get(q, ctx.auth.accountId, id, true);
    if (!row) throw notFound('HTTPS edge', id);
    return row;
  }

  /** Writes a changed edge and its `https_edge_updated` event; returns the new row. */
  async function save(q: Queryable, ctx: RequestContext, before: EdgeRow, next: EdgeWrite): Promise<EdgeRow> {
    const row = await repo.update(q, before, next).catch((err: unknown) => {
      throw mapUnique(err);
    });
    const out = toEdge(row, await routesOf(q, row.id), ctx.baseUrl);
    await audit(q, ctx, EVENT, 'updated', out);
    return row;
  }

  return {
    async create(ctx: RequestContext, input: z.output<typeof EdgeCreate>): Promise<Edge> {
      const mtls = input.mutual_tls ? buildMutualTls(input.mutual_tls) : undefined;
      const write: EdgeWrite = {
        description: input.description ?? '',
        metadata: input.metadata ?? '',
        hostports: input.hostports ?? [],
        mutual_tls: mtls?.stored ?? null,
        tls_termination: input.tls_termination ? buildTlsTermination(input.tls_termination) : null,
        ca_ids: mtls?.caIds ?? [],
      };
      const id = newId('edghts');
      return db.tx(async (q) => {
        await requireOwned(q, 'certificate_authorities', ctx.auth.accountId, write.ca_ids, 'mutual_tls.certificate_authority_ids');
        await checkHostports(q, ctx.auth.accountId, id, write.hostports);
        const row = await repo.insert(q, id, ctx.auth.accountId, write).catch((err: unknown) => {
          throw mapUnique(err);
        });
        const out = toEdge(row, [], ctx.baseUrl);
        await audit(q, ctx, EVENT, 'created', out);
        return out;
      });
    },

    async get(ctx: RequestContext, id: string): Promise<Edge> {
      const row = await repo.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('HTTPS edge', id);
      return toEdge(row, await routesOf(db, id), ctx.baseUrl);
    },

    async list(ctx: RequestContext, page: Page) {
      const rows = await repo.list(db, ctx.auth.accountId, page);
      const pageRows = rows.slice(0, page.limit);
      const routes = await routesRepo.listByEdges(
        db,
        pageRows.map((r) => r.id),
      );
      const byEdge = new Map<string, RouteRow[]>();
      for (const r of routes) (byEdge.get(r.edge_id) ?? byEdge.set(r.edge_id, []).get(r.edge_id)!).push(r);
      const items = rows.map((r) => toEdge(r, byEdge.get(r.id) ?? [], ctx.baseUrl));
      return envelope('https_edges', `${ctx.baseUrl}/${COLLECTION}`, items, page);
    },

    async update(ctx: RequestContext, id: string, input: z.output<typeof EdgeUpdate>): Promise<Edge> {
      return db.tx(async (q) => {
        const before = await lock(q, ctx, id);
        const mtls = input.mutual_tls ? buildMutualTls(input.mutual_tls) : undefined;
        const next: EdgeWrite = {
          description: input.description ?? before.description,
          metadata: input.metadata ?? before.metadata,
          hostports: input.hostports ?? before.hostports,
          mutual_tls: mtls ? mtls.stored : before.mutual_tls,
          tls_termination: input.tls_termination ? buildTlsTermination(input.tls_termination) : before.tls_termination,
          ca_ids: mtls ? mtls.caIds : before.ca_ids,
        };
        if (sameWrite(next, writeOf(before))) return toEdge(before, await routesOf(q, id), ctx.baseUrl);
        if (mtls) await requireOwned(q, 'certificate_authorities', ctx.auth.accountId, next.ca_ids, 'mutual_tls.certificate_authority_ids');
        // Only hostports this change adds: ones the edge already had stay (their exact uniqueness
        // is the table's key), so an edge is not stuck on a host another account shared with it
        // before hosts belonged to one account.
        await checkHostports(q, ctx.auth.accountId, id, next.hostports.filter((h) => !before.hostports.includes(h)));
        const row = await save(q, ctx, before, next);
        return toEdge(row, await routesOf(q, id), ctx.baseUrl);
      });
    },

    /** Deletes the edge and, by cascade, its routes; each route gets its `https_edge_route_deleted` event. */
    async delete(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const row = await lock(q, ctx, id);
        const routes = await routesOf(q, id);
        const last = toEdge(row, routes, ctx.baseUrl);
        await repo.delete(q, ctx.auth.accountId, id);
        for (const route of last.routes)
          await audit(q, ctx, 'https_edge_route', 'deleted', route);
        await audit(q, ctx, EVENT, 'deleted', last);
      });
    },

    async putMutualTls(ctx: RequestContext, id: string, input: z.output<typeof MutualTlsRequest>, prefix: string): Promise<MutualTls> {
      return db.tx(async (q) => {
        const before = await lock(q, ctx, id);
        const mtls = buildMutualTls(input);
        const next: EdgeWrite = { ...writeOf(before), mutual_tls: mtls.stored, ca_ids: mtls.caIds };
        if (sameWrite(next, writeOf(before))) return renderMutualTls(before, ctx.baseUrl)!;
        await requireOwned(q, 'certificate_authorities', ctx.auth.accountId, mtls.caIds, joinPath(prefix, 'certificate_authority_ids'));
        return renderMutualTls(await save(q, ctx, before, next), ctx.baseUrl)!;
      });
    },

    async getMutualTls(ctx: RequestContext, id: string): Promise<MutualTls> {
      const row = await repo.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('HTTPS edge', id);
      const out = renderMutualTls(row, ctx.baseUrl);
      if (!out) throw new AppError(4002, `the mutual_tls module is not configured on edge ${id}`, { resourceId: id });
      return out;
    },

    async deleteMutualTls(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const before = await lock(q, ctx, id);
        if (!before.mutual_tls) return;
        await save(q, ctx, before, { ...writeOf(before), mutual_tls: null, ca_ids: [] });
      });
    },

    async putTlsTermination(ctx: RequestContext, id: string, input: z.output<typeof TlsTerminationRequest>): Promise<TlsTermination> {
      return db.tx(async (q) => {
        const before = await lock(q, ctx, id);
        const next: EdgeWrite = { ...writeOf(before), tls_termination: buildTlsTermination(input) };
        if (sameWrite(next, writeOf(before))) return renderTlsTermination(before)!;
        return renderTlsTermination(await save(q, ctx, before, next))!;
      });
    },

    async getTlsTermination(ctx: RequestContext, id: string): Promise<TlsTermination> {
      const row = await repo.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('HTTPS edge', id);
      const out = renderTlsTermination(row);
      if (!out) throw new AppError(4002, `the tls_termination module is not configured on edge ${id}`, { resourceId: id });
      return out;
    },

    async deleteTlsTermination(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const before = await lock(q, ctx, id);
        if (!before.tls_termination) return;
        await save(q, ctx, before, { ...writeOf(before), tls_termination: null });
      });
    },
  };
}
