import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { parseBody } from '../../http/validate.js';
import { parsePage } from '../../http/paginate.js';
import { createTunnelGroupBackendsService } from './tunnel-group-backends.service.js';
import { TunnelGroupBackendCreate, TunnelGroupBackendList, TunnelGroupBackendResponse, TunnelGroupBackendUpdate } from './tunnel-group-backends.schema.js';

const tag = 'Tunnel group backends';

export function registerTunnelGroupBackends(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createTunnelGroupBackendsService(deps);
  routes.route(
    '/backends/tunnel_group',
    {
      POST: async (req) => ({ status: 201, body: await svc.create(req.ctx, parseBody(TunnelGroupBackendCreate, req.body)) }),
      GET: async (req) => ({ status: 200, body: await svc.list(req.ctx, parsePage(req.query, 'bkdtg')) }),
    },
    {
      POST: { tag, summary: 'Create a tunnel group backend', request: TunnelGroupBackendCreate, response: TunnelGroupBackendResponse, status: 201 },
      GET: { tag, summary: 'List tunnel group backends', response: TunnelGroupBackendList, status: 200, paged: true },
    },
  );
  routes.route(
    '/backends/tunnel_group/:id',
    {
      GET: async (req) => ({ status: 200, body: await svc.get(req.ctx, req.params.id!) }),
      PATCH: async (req) => ({ status: 200, body: await svc.update(req.ctx, req.params.id!, parseBody(TunnelGroupBackendUpdate, req.body)) }),
      DELETE: async (req) => {
        await svc.delete(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag, summary: 'Get a tunnel group backend', response: TunnelGroupBackendResponse, status: 200 },
      PATCH: { tag, summary: 'Update a tunnel group backend', request: TunnelGroupBackendUpdate, response: TunnelGroupBackendResponse, status: 200 },
      DELETE: { tag, summary: 'Delete a tunnel group backend', status: 204 },
    },
  );
}
