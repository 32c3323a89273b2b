import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { parseBody } from '../../http/validate.js';
import { parsePage } from '../../http/paginate.js';
import { createReservedAddrsService } from './reserved-addrs.service.js';
import { ReservedAddrCreate, ReservedAddrList, ReservedAddrResponse, ReservedAddrUpdate } from './reserved-addrs.schema.js';

const tag = 'Reserved addresses';

export function registerReservedAddrs(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createReservedAddrsService(deps);
  routes.route(
    '/reserved_addrs',
    {
      POST: async (req) => ({ status: 201, body: await svc.create(req.ctx, parseBody(ReservedAddrCreate, req.body)) }),
      GET: async (req) => ({ status: 200, body: await svc.list(req.ctx, parsePage(req.query, 'ra')) }),
    },
    {
      POST: { tag, summary: 'Create a reserved address', request: ReservedAddrCreate, response: ReservedAddrResponse, status: 201 },
      GET: { tag, summary: 'List reserved addresses', response: ReservedAddrList, status: 200, paged: true },
    },
  );
  routes.route(
    '/reserved_addrs/:id',
    {
      GET: async (req) => ({ status: 200, body: await svc.get(req.ctx, req.params.id!) }),
      PATCH: async (req) => ({ status: 200, body: await svc.update(req.ctx, req.params.id!, parseBody(ReservedAddrUpdate, req.body)) }),
      DELETE: async (req) => {
        await svc.delete(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag, summary: 'Get a reserved address', response: ReservedAddrResponse, status: 200 },
      PATCH: { tag, summary: 'Update a reserved address', request: ReservedAddrUpdate, response: ReservedAddrResponse, status: 200 },
      DELETE: { tag, summary: 'Delete a reserved address', status: 204 },
    },
  );
  routes.route(
    '/reserved_addrs/:id/endpoint_configuration',
    {
      DELETE: async (req) => {
        await svc.detachEndpointConfiguration(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    { DELETE: { tag, summary: 'Detach the endpoint configuration of a reserved address', status: 204 } },
  );
}
