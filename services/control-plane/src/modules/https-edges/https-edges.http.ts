import type { ApiRoutes } from '../../http/router.js';
import { registerCrud } from '../../http/crud.js';
import type { ModuleDeps } from '../../http/deps.js';
import { createHttpsEdgesService } from './https-edges.service.js';
import { parseModuleBody } from './module-body.js';
import { EdgeCreate, EdgeList, EdgeResponse, EdgeUpdate, MutualTlsRequest, MutualTlsResponse, TlsTerminationRequest, TlsTerminationResponse } from './https-edges.schema.js';

const tag = 'HTTPS edges';
const moduleTag = 'HTTPS edge modules';

/** Body keys the TS 0.11 client adds around an edge module: `{id, module: {...}}`. */
const EDGE_MODULE_WRAPPER = ['id'] as const;

export function registerHttpsEdges(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createHttpsEdgesService(deps);
  registerCrud(
    routes,
    {
      path: '/edges/https',
      table: 'https_edges',
      idPrefix: 'edghts',
      tag,
      names: ['an HTTPS edge', 'HTTPS edges'],
      create: EdgeCreate,
      update: EdgeUpdate,
      response: EdgeResponse,
      list: EdgeList,
      summaries: { PATCH: 'Update an HTTPS edge; a given module replaces the stored one', DELETE: 'Delete an HTTPS edge and its routes' },
    },
    svc,
    deps.checkQuota,
  );
  routes.route(
    '/edges/https/:id/mutual_tls',
    {
      PUT: async (req) => {
        const { input, prefix } = parseModuleBody(MutualTlsRequest, req.body, EDGE_MODULE_WRAPPER);
        return { status: 200, body: await svc.putMutualTls(req.ctx, req.params.id!, input, prefix) };
      },
      GET: async (req) => ({ status: 200, body: await svc.getMutualTls(req.ctx, req.params.id!) }),
      DELETE: async (req) => {
        await svc.deleteMutualTls(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      PUT: { tag: moduleTag, summary: 'Replace the mutual TLS module of an edge', request: MutualTlsRequest, response: MutualTlsResponse, status: 200 },
      GET: { tag: moduleTag, summary: 'Get the mutual TLS module of an edge', response: MutualTlsResponse, status: 200 },
      DELETE: { tag: moduleTag, summary: 'Remove the mutual TLS module of an edge', status: 204 },
    },
  );
  routes.route(
    '/edges/https/:id/tls_termination',
    {
      PUT: async (req) => {
        const { input } = parseModuleBody(TlsTerminationRequest, req.body, EDGE_MODULE_WRAPPER);
        return { status: 200, body: await svc.putTlsTermination(req.ctx, req.params.id!, input) };
      },
      GET: async (req) => ({ status: 200, body: await svc.getTlsTermination(req.ctx, req.params.id!) }),
      DELETE: async (req) => {
        await svc.deleteTlsTermination(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      PUT: { tag: moduleTag, summary: 'Replace the TLS termination module of an edge', request: TlsTerminationRequest, response: TlsTerminationResponse, status: 200 },
      GET: { tag: moduleTag, summary: 'Get the TLS termination module of an edge', response: TlsTerminationResponse, status: 200 },
      DELETE: { tag: moduleTag, summary: 'Remove the TLS termination module of an edge', status: 204 },
    },
  );
}
