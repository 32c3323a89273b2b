import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { parseBody } from '../../http/validate.js';
import { parsePage } from '../../http/paginate.js';
import { createHttpsEdgesService } from './https-edges.service.js';
import { parseModuleBody } from './module-body.js';
import { EdgeCreate, EdgeList, EdgeResponse, EdgeUpdate, MutualTlsRequest, MutualTlsResponse, TlsTerminationRequest, TlsTerminationResponse } from './https-edges.schema.js';

const tag = 'HTTPS edges';
const moduleTag = 'HTTPS edge modules';

/** Body keys the TS 0.11 client adds around an edge module: `{id, module: {...}}`. */
const EDGE_MODULE_WRAPPER = ['id'] as const;

export function registerHttpsEdges(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createHttpsEdgesService(deps);
  routes.route(
    '/edges/https',
    {
      POST: async (req) => ({ status: 201, body: await svc.create(req.ctx, parseBody(EdgeCreate, req.body)) }),
      GET: async (req) => ({ status: 200, body: await svc.list(req.ctx, parsePage(req.query, 'edghts')) }),
    },
    {
      POST: { tag, summary: 'Create an HTTPS edge', request: EdgeCreate, response: EdgeResponse, status: 201 },
      GET: { tag, summary: 'List HTTPS edges', response: EdgeList, status: 200, paged: true },
    },
  );
  routes.route(
    '/edges/https/:id',
    {
      GET: async (req) => ({ status: 200, body: await svc.get(req.ctx, req.params.id!) }),
      PATCH: async (req) => ({ status: 200, body: await svc.update(req.ctx, req.params.id!, parseBody(EdgeUpdate, req.body)) }),
      DELETE: async (req) => {
        await svc.delete(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag, summary: 'Get an HTTPS edge', response: EdgeResponse, status: 200 },
      PATCH: { tag, summary: 'Update an HTTPS edge; a given module replaces the stored one', request: EdgeUpdate, response: EdgeResponse, status: 200 },
      DELETE: { tag, summary: 'Delete an HTTPS edge and its routes', status: 204 },
    },
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
