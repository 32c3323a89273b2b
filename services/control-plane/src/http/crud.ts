import type { z } from 'zod';
import type { IdPrefix } from '@warren/shared';
import type { RequestContext } from './context.js';
import type { QuotaCheck, QuotaTable } from '../auth/quotas.js';
import { parsePage, type Page } from './paginate.js';
import type { ApiRoutes } from './router.js';
import { parseBody } from './validate.js';

/** The five operations every listed resource offers, as its service implements them. */
export interface CrudService<C, U> {
  create(ctx: RequestContext, input: C): Promise<unknown>;
  get(ctx: RequestContext, id: string): Promise<unknown>;
  list(ctx: RequestContext, page: Page): Promise<unknown>;
  update(ctx: RequestContext, id: string, input: U): Promise<unknown>;
  delete(ctx: RequestContext, id: string): Promise<void>;
}

export interface CrudSpec<CS extends z.ZodType, US extends z.ZodType> {
  /** Collection path, e.g. `/ip_policies`; the item path is `<path>/:id`. */
  path: string;
  /** The table whose rows count toward the account quota of this resource type. */
  table: QuotaTable;
  /** Prefix of the ids in this collection (pagination cursors are checked against it). */
  idPrefix: IdPrefix;
  tag: string;
  /** Singular with its article and plural, for the OpenAPI summaries: `['an IP policy', 'IP policies']`. */
  names: [string, string];
  create: CS;
  update: US;
  response: z.ZodType;
  list: z.ZodType;
  /** Summary overrides, e.g. `{ DELETE: 'Delete an IP policy and its rules' }`. */
  summaries?: Partial<Record<'POST' | 'GET_LIST' | 'GET' | 'PATCH' | 'DELETE', string>>;
}

/**
 * Registers create (201), list (200, keyset paged), get, PATCH and DELETE (204) for one
 * resource, with request parsing and OpenAPI docs; the service does the rest.
 */
export function registerCrud<CS extends z.ZodType, US extends z.ZodType>(
  routes: ApiRoutes,
  spec: CrudSpec<CS, US>,
  svc: CrudService<z.output<CS>, z.output<US>>,
  checkQuota: QuotaCheck,
): void {
  const { tag, names: [one, many], summaries = {} } = spec;
  routes.route(
    spec.path,
    {
      POST: async (req) => {
        await checkQuota(req.ctx.auth.accountId, spec.table); // 403 comes before body errors (wire-conventions §1)
        const input = parseBody(spec.create, req.body);
        return { status: 201, body: await svc.create(req.ctx, input) };
      },
      GET: async (req) => ({ status: 200, body: await svc.list(req.ctx, parsePage(req.query, spec.idPrefix)) }),
    },
    {
      POST: { tag, summary: summaries.POST ?? `Create ${one}`, request: spec.create, response: spec.response, status: 201 },
      GET: { tag, summary: summaries.GET_LIST ?? `List ${many}`, response: spec.list, status: 200, paged: true },
    },
  );
  routes.route(
    `${spec.path}/:id`,
    {
      GET: async (req) => ({ status: 200, body: await svc.get(req.ctx, req.params.id!) }),
      PATCH: async (req) => ({ status: 200, body: await svc.update(req.ctx, req.params.id!, parseBody(spec.update, req.body)) }),
      DELETE: async (req) => {
        await svc.delete(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag, summary: summaries.GET ?? `Get ${one}`, response: spec.response, status: 200 },
      PATCH: { tag, summary: summaries.PATCH ?? `Update ${one}`, request: spec.update, response: spec.response, status: 200 },
      DELETE: { tag, summary: summaries.DELETE ?? `Delete ${one}`, status: 204 },
    },
  );
}
