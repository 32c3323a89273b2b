import type { ApiRoutes } from '../../http/router.js';
import { registerCrud } from '../../http/crud.js';
import type { ModuleDeps } from '../../http/deps.js';
import { createTunnelGroupBackendsService } from './tunnel-group-backends.service.js';
import { TunnelGroupBackendCreate, TunnelGroupBackendList, TunnelGroupBackendResponse, TunnelGroupBackendUpdate } from './tunnel-group-backends.schema.js';

const tag = 'Tunnel group backends';

export function registerTunnelGroupBackends(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createTunnelGroupBackendsService(deps);
  registerCrud(
    routes,
    {
      path: '/backends/tunnel_group',
      table: 'tunnel_group_backends',
      idPrefix: 'bkdtg',
      tag,
      names: ['a tunnel group backend', 'tunnel group backends'],
      create: TunnelGroupBackendCreate,
      update: TunnelGroupBackendUpdate,
      response: TunnelGroupBackendResponse,
      list: TunnelGroupBackendList,
    },
    svc,
    deps.checkQuota,
  );
}
