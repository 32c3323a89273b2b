import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { parseModuleBody } from '../https-edges/module-body.js';
import { createHttpsEdgeRoutesService } from './https-edge-routes.service.js';
import { RouteCreate, RouteResponse, RouteUpdate } from './https-edge-routes.schema.js';
import { MODULES, MODULE_NAMES } from './route-modules.js';
import { checkUserAgentFilter, parseRouteBody } from './user-agent-check.js';

const tag = 'HTTPS edge routes';
const moduleTag = 'HTTPS edge route modules';

/** Body keys the TS 0.11 client adds around a route module: `{id, edge_id, module: {...}}`. */
const ROUTE_MODULE_WRAPPER = ['id', 'edge_id'] as const;

export function registerHttpsEdgeRoutes(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createHttpsEdgeRoutesService(deps);
  const checks = deps.userAgentChecks;

  // Routes are listed only inside their edge: GET here answers 405.
  routes.route(
    '/edges/https/:edge_id/routes',
    {
      POST: async (req) => {
        await deps.checkQuota(req.ctx.auth.accountId, 'https_edge_routes'); // 403 comes before body errors (wire-conventions §1)
        const input = await parseRouteBody(RouteCreate, req.body, checks, req.ctx.auth.accountId);
        return { status: 201, body: await svc.create(req.ctx, req.params.edge_id!, input) };
      },
    },
    {
      POST: { tag, summary: 'Create an HTTPS edge route', request: RouteCreate, response: RouteResponse, status: 201 },
    },
  );

  routes.route(
    '/edges/https/:edge_id/routes/:id',
    {
      GET: async (req) => ({ status: 200, body: await svc.get(req.ctx, req.params.edge_id!, req.params.id!) }),
      PATCH: async (req) => {
        const input = await parseRouteBody(RouteUpdate, req.body, checks, req.ctx.auth.accountId);
        return { status: 200, body: await svc.update(req.ctx, req.params.edge_id!, req.params.id!, input) };
      },
      DELETE: async (req) => {
        await svc.delete(req.ctx, req.params.edge_id!, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag, summary: 'Get an HTTPS edge route', response: RouteResponse, status: 200 },
      PATCH: {
        tag,
        summary: 'Update an HTTPS edge route; a given module replaces the stored one, omitted or null modules are unchanged',
        request: RouteUpdate,
        response: RouteResponse,
        status: 200,
      },
      DELETE: { tag, summary: 'Delete an HTTPS edge route', status: 204 },
    },
  );

  for (const name of MODULE_NAMES) {
    const mod = MODULES[name];
    routes.route(
      `/edges/https/:edge_id/routes/:id/${name}`,
      {
        PUT: async (req) => {
          const { input, prefix } = parseModuleBody(mod.request, req.body, ROUTE_MODULE_WRAPPER);
          // Checked before the route is read or locked: the check may wait for a worker.
          if (name === 'user_agent_filter') await checkUserAgentFilter(checks, req.ctx.auth.accountId, input as { allow?: string[] | null; deny?: string[] | null }, prefix);
          return { status: 200, body: await svc.putModule(req.ctx, req.params.edge_id!, req.params.id!, name, input, prefix) };
        },
        GET: async (req) => ({ status: 200, body: await svc.getModule(req.ctx, req.params.edge_id!, req.params.id!, name) }),
        DELETE: async (req) => {
          await svc.deleteModule(req.ctx, req.params.edge_id!, req.params.id!, name);
          return { status: 204 };
        },
      },
      {
        PUT: { tag: moduleTag, summary: `Replace the ${mod.title} module of a route`, request: mod.request, response: mod.response, status: 200 },
        GET: { tag: moduleTag, summary: `Get the ${mod.title} module of a route`, response: mod.response, status: 200 },
        DELETE: { tag: moduleTag, summary: `Remove the ${mod.title} module of a route`, status: 204 },
      },
    );
  }
}
