import { AppError, decodeTrafficPolicy, newId, notFound, restrictIpsPolicyRefs, rfc3339, validateTrafficPolicy } from '@warren/shared';
import type { Db, Queryable } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings, requireOwned } from '../common.js';
import { joinPath, jsonEqual } from '../https-edges/module-body.js';
import { routesRepo as repo, type RouteRow } from './https-edge-routes.repo.js';
import type { Route, RouteCreateInput, RouteUpdateInput } from './https-edge-routes.schema.js';
import { buildModule, checkAuthModules, MODULE_NAMES, renderModule, renderModules, type ModuleName, type StoredModules } from './route-modules.js';

const EVENT = 'https_edge_route';
export const MAX_ROUTES_PER_EDGE = 100;

export function routeUri(baseUrl: string, edgeId: string, id: string): string {
  return `${baseUrl}/edges/https/${edgeId}/routes/${id}`;
}

/** A route as the API returns it: all 13 module keys and `policy`, secrets "". */
export function toRoute(row: RouteRow, baseUrl: string): Route {
  return {
    edge_id: row.edge_id,
    id: row.id,
    uri: routeUri(baseUrl, row.edge_id, row.id),
    created_at: rfc3339(row.created_at),
    match_type: row.match_type,
    match: row.match,
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    ...(renderModules(row.modules, { baseUrl, routeId: row.id }) as Omit<Route, 'edge_id' | 'id' | 'uri' | 'created_at' | 'match_type' | 'match' | 'description' | 'metadata' | 'policy'>),
    policy: null,
  };
}

interface Given {
  name: ModuleName;
  /** JSON path of the module in the request body. */
  prefix: string;
}

type StoredTrafficPolicy = NonNullable<StoredModules['traffic_policy']>;
type PolicyRefs = { path: string; id: string }[];
/** The refs of a stored module object, parsed once per request (check, then mirror). */
const policyRefsCache = new WeakMap<StoredTrafficPolicy, PolicyRefs>();

/**
 * The IP policies the traffic policy's restrict-ips actions name, with their paths in the
 * document. The value was validated (cost included) by the request schema; this only reads it.
 */
function trafficPolicyRefs(tp: StoredTrafficPolicy | undefined): PolicyRefs {
  if (!tp) return [];
  let refs = policyRefsCache.get(tp);
  if (!refs) {
    refs = restrictIpsPolicyRefs(validateTrafficPolicy(decodeTrafficPolicy(tp.value)));
    policyRefsCache.set(tp, refs);
  }
  return refs;
}

/**
 * Every IP policy a traffic policy names must be one of this account's (3002, as for
 * ip_restriction; another account's is reported exactly like a missing one). The message names
 * the place in the document: `traffic_policy.value: inbound[0].actions[0].config.ip_policies[1]: …`.
 */
async function checkTrafficPolicyRefs(q: Queryable, accountId: string, tp: StoredTrafficPolicy, field: string): Promise<void> {
  const refs = trafficPolicyRefs(tp);
  if (refs.length === 0) return;
  const { rows } = await q.query<{ id: string }>('SELECT id FROM ip_policies WHERE account_id = $1 AND id = ANY($2::text[])', [accountId, [...new Set(refs.map((r) => r.id))]]);
  const found = new Set(rows.map((r) => r.id));
  const missing = refs.find((r) => !found.has(r.id));
  if (missing) throw new AppError(3002, `${field}: ${missing.path}: no IP policy with id ${JSON.stringify(missing.id)} in this account`, { field, resourceId: missing.id });
}

/** Body references of the given modules must be resources of this account (3002). */
async function checkReferences(q: Queryable, accountId: string, modules: StoredModules, given: Given[]): Promise<void> {
  for (const { name, prefix } of given) {
    if (name === 'backend' && modules.backend) await requireOwned(q, 'tunnel_group_backends', accountId, [modules.backend.backend_id], joinPath(prefix, 'backend_id'));
    if (name === 'ip_restriction' && modules.ip_restriction)
      await requireOwned(q, 'ip_policies', accountId, modules.ip_restriction.ip_policy_ids, joinPath(prefix, 'ip_policy_ids'));
    if (name === 'traffic_policy' && modules.traffic_policy) await checkTrafficPolicyRefs(q, accountId, modules.traffic_policy, joinPath(prefix, 'value'));
  }
}

/** The distinct IP policies a stored traffic policy names (mirrored for the delete check). */
const trafficPolicyIpPolicyIds = (tp: StoredTrafficPolicy | undefined) => [...new Set(trafficPolicyRefs(tp).map((r) => r.id))];

async function checkMatchFree(q: Queryable, edgeId: string, matchType: string, match: string, exceptId: string): Promise<void> {
  const other = await repo.findByMatch(q, edgeId, matchType, match, exceptId);
  if (other) throw new AppError(4101, `match: route ${other} of this edge already has match_type ${matchType} and match ${JSON.stringify(match)}`, { field: 'match', resourceId: other });
}

/** A unique violation on (edge_id, match_type, match) lost to a concurrent writer: the same 409. */
function mapUnique(err: unknown): unknown {
  const e = err as { code?: string };
  if (e?.code === '23505') return new AppError(4101, 'match: another route of this edge already has this match_type and match', { field: 'match' });
  return err;
}

export function createHttpsEdgeRoutesService(deps: { db: Db }) {
  const { db } = deps;

  async function loadForUpdate(q: Queryable, ctx: RequestContext, edgeId: string, id: string): Promise<RouteRow> {
    const row = await repo.get(q, ctx.auth.accountId, edgeId, id, true);
    if (!row) throw notFound('HTTPS edge route', id);
    return row;
  }

  async function save(q: Queryable, before: RouteRow, next: Pick<RouteRow, 'match_type' | 'match' | 'description' | 'metadata' | 'modules'>): Promise<RouteRow> {
    const row = await repo
      .update(q, before.id, { ...next, backend_id: next.modules.backend?.backend_id ?? null })
      .catch((err: unknown) => {
        throw mapUnique(err);
      });
    const ipBefore = before.modules.ip_restriction?.ip_policy_ids ?? [];
    const ipAfter = next.modules.ip_restriction?.ip_policy_ids ?? [];
    if (!jsonEqual(ipBefore, ipAfter)) await repo.setIpPolicies(q, before.id, ipAfter);
    if (before.modules.traffic_policy?.value !== next.modules.traffic_policy?.value)
      await repo.setTrafficPolicyIpPolicies(q, before.id, trafficPolicyIpPolicyIds(next.modules.traffic_policy));
    return row;
  }

  async function emit(q: Queryable, ctx: RequestContext, kind: 'created' | 'updated' | 'deleted', route: Route): Promise<void> {
    await audit(q, ctx, EVENT, kind, route);
  }

  return {
    async create(ctx: RequestContext, edgeId: string, input: RouteCreateInput): Promise<Route> {
      const id = newId('edghtsrt');
      // Field rules first (no stored state is involved on create), then the edge, the limit, references and clashes.
      const modules: StoredModules = {};
      const given: Given[] = MODULE_NAMES.filter((n) => input[n] != null).map((name) => ({ name, prefix: name }));
      for (const { name, prefix } of given) (modules as Record<string, unknown>)[name] = await buildModule(name, input[name], {}, { prefix, routeId: id });
      checkAuthModules(modules, given.find((g) => g.name === 'oauth' || g.name === 'saml' || g.name === 'oidc')?.prefix ?? '');
      return db.tx(async (q) => {
        if (!(await repo.lockEdge(q, ctx.auth.accountId, edgeId))) throw notFound('HTTPS edge', edgeId);
        if ((await repo.countByEdge(q, edgeId)) >= MAX_ROUTES_PER_EDGE) throw new AppError(6403, `an edge can have at most ${MAX_ROUTES_PER_EDGE} routes`);
        await checkReferences(q, ctx.auth.accountId, modules, given);
        await checkMatchFree(q, edgeId, input.match_type, input.match, '');
        const row = await repo
          .insert(q, {
            id,
            account_id: ctx.auth.accountId,
            edge_id: edgeId,
            match_type: input.match_type,
            match: input.match,
            description: input.description ?? '',
            metadata: input.metadata ?? '',
            modules,
            backend_id: modules.backend?.backend_id ?? null,
          })
          .catch((err: unknown) => {
            throw mapUnique(err);
          });
        if (modules.ip_restriction) await repo.setIpPolicies(q, id, modules.ip_restriction.ip_policy_ids);
        if (modules.traffic_policy) await repo.setTrafficPolicyIpPolicies(q, id, trafficPolicyIpPolicyIds(modules.traffic_policy));
        const out = toRoute(row, ctx.baseUrl);
        await emit(q, ctx, 'created', out);
        return out;
      });
    },

    async get(ctx: RequestContext, edgeId: string, id: string): Promise<Route> {
      const row = await repo.get(db, ctx.auth.accountId, edgeId, id);
      if (!row) throw notFound('HTTPS edge route', id);
      return toRoute(row, ctx.baseUrl);
    },

    async update(ctx: RequestContext, edgeId: string, id: string, input: RouteUpdateInput): Promise<Route> {
      return db.tx(async (q) => {
        const before = await loadForUpdate(q, ctx, edgeId, id);
        const given: Given[] = MODULE_NAMES.filter((n) => input[n] != null).map((name) => ({ name, prefix: name }));
        const modules: StoredModules = { ...before.modules };
        for (const { name, prefix } of given) (modules as Record<string, unknown>)[name] = await buildModule(name, input[name], before.modules, { prefix, routeId: id });
        const next = {
          match_type: input.match_type ?? before.match_type,
          match: input.match ?? before.match,
          description: input.description ?? before.description,
          metadata: input.metadata ?? before.metadata,
          modules,
        };
        const unchanged =
          next.match_type === before.match_type &&
          next.match === before.match &&
          next.description === before.description &&
          next.metadata === before.metadata &&
          jsonEqual(next.modules, before.modules);
        if (unchanged) return toRoute(before, ctx.baseUrl);
        checkAuthModules(modules, given.find((g) => (g.name === 'oauth' || g.name === 'saml' || g.name === 'oidc'))?.prefix ?? '');
        await checkReferences(q, ctx.auth.accountId, modules, given.filter((g) => !jsonEqual(modules[g.name], before.modules[g.name])));
        if (next.match_type !== before.match_type || next.match !== before.match) await checkMatchFree(q, edgeId, next.match_type, next.match, id);
        const out = toRoute(await save(q, before, next), ctx.baseUrl);
        await emit(q, ctx, 'updated', out);
        return out;
      });
    },

    async delete(ctx: RequestContext, edgeId: string, id: string): Promise<void> {
      await db.tx(async (q) => {
        const row = await repo.delete(q, ctx.auth.accountId, edgeId, id);
        if (!row) throw notFound('HTTPS edge route', id);
        await emit(q, ctx, 'deleted', toRoute(row, ctx.baseUrl));
      });
    },

    /** `PUT …/routes/{id}/<module>`: replaces the module; answers its response shape. */
    async putModule(ctx: RequestContext, edgeId: string, id: string, name: ModuleName, input: unknown, prefix: string): Promise<unknown> {
      return db.tx(async (q) => {
        const before = await loadForUpdate(q, ctx, edgeId, id);
        const stored = await buildModule(name, input, before.modules, { prefix, routeId: id });
        const render = () => renderModule(name, stored, { baseUrl: ctx.baseUrl, routeId: id });
        if (jsonEqual(before.modules[name], stored)) return render();
        const modules: StoredModules = { ...before.modules, [name]: stored };
        checkAuthModules(modules, prefix);
        await checkReferences(q, ctx.auth.accountId, modules, [{ name, prefix }]);
        const row = await save(q, before, { match_type: before.match_type, match: before.match, description: before.description, metadata: before.metadata, modules });
        await emit(q, ctx, 'updated', toRoute(row, ctx.baseUrl));
        return render();
      });
    },

    /** `GET …/routes/{id}/<module>`: 404 (4002) when the module is not configured. */
    async getModule(ctx: RequestContext, edgeId: string, id: string, name: ModuleName): Promise<unknown> {
      const row = await repo.get(db, ctx.auth.accountId, edgeId, id);
      if (!row) throw notFound('HTTPS edge route', id);
      const stored = row.modules[name];
      if (!stored) throw new AppError(4002, `the ${name} module is not configured on route ${id}`, { resourceId: id });
      return renderModule(name, stored, { baseUrl: ctx.baseUrl, routeId: id });
    },

    /** `DELETE …/routes/{id}/<module>`: 204 even when the module is not configured (then no event). */
    async deleteModule(ctx: RequestContext, edgeId: string, id: string, name: ModuleName): Promise<void> {
      await db.tx(async (q) => {
        const before = await loadForUpdate(q, ctx, edgeId, id);
        if (!before.modules[name]) return;
        const modules: StoredModules = { ...before.modules };
        delete modules[name];
        const row = await save(q, before, { match_type: before.match_type, match: before.match, description: before.description, metadata: before.metadata, modules });
        await emit(q, ctx, 'updated', toRoute(row, ctx.baseUrl));
      });
    },
  };
}

export type HttpsEdgeRoutesService = ReturnType<typeof createHttpsEdgeRoutesService>;
