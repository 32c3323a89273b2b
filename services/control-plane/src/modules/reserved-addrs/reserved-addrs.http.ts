import type { ApiRoutes } from '../../http/router.js';
import { registerCrud } from '../../http/crud.js';
import type { ModuleDeps } from '../../http/deps.js';
import { createReservedAddrsService } from './reserved-addrs.service.js';
import { ReservedAddrCreate, ReservedAddrList, ReservedAddrResponse, ReservedAddrUpdate } from './reserved-addrs.schema.js';

const tag = 'Reserved addresses';

export function registerReservedAddrs(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createReservedAddrsService(deps);
  registerCrud(
    routes,
    {
      path: '/reserved_addrs',
      table: 'reserved_addrs',
      idPrefix: 'ra',
      tag,
      names: ['a reserved address', 'reserved addresses'],
      create: ReservedAddrCreate,
      update: ReservedAddrUpdate,
      response: ReservedAddrResponse,
      list: ReservedAddrList,
    },
    svc,
    deps.checkQuota,
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
