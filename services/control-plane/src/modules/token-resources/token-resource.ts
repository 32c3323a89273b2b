import { z } from 'zod';
import { AppError, newId, notFound, rfc3339, type IdPrefix } from '@warren/shared';
import type { Db, Queryable } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { envelope, parsePage } from '../../http/paginate.js';
import { boundedList, description, metadata, obj, parseBody } from '../../http/validate.js';
import type { ApiRoutes } from '../../http/router.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings, pageRows } from '../common.js';
import { hashToken } from '../../auth/tokens.js';
import type { QuotaCheck } from '../../auth/quotas.js';

/**
 * API keys and agent credentials share one shape: a secret token shown once at create (only its
 * SHA-256 is stored), description, metadata and, for credentials, an ACL. This factory serves
 * both so the two stay identical where they should.
 */
export interface TokenResourceSpec {
  table: 'api_keys' | 'credentials';
  collection: string;
  listKey: string;
  prefix: IdPrefix;
  eventStem: string;
  what: string;
  tag: string;
  newToken: () => string;
  /** Credentials carry `acl`; API keys do not. */
  acl: boolean;
  /**
   * Runs inside the delete transaction before the row goes (e.g. "not the last key"). What it
   * returns runs after the row is gone, just before the audit row: for outbox rows of its own,
   * which must come last (see `writeOutbox`).
   */
  beforeDelete?: (q: Queryable, ctx: RequestContext, id: string) => Promise<void | ((q: Queryable) => Promise<void>)>;
  afterDelete?: (id: string) => void;
}

interface Row {
  id: string;
  description: string;
  metadata: string;
  acl: string[];
  created_at: Date;
}

const ACL_ENTRY = /^(\*|bind:(\*|\*\.[A-Za-z0-9.-]+|[A-Za-z0-9.-]+(:\d{1,5})?|[^=\s]+=[^=\s]+))$/;
export const Acl = boundedList(
  z.string().max(256).refine((s) => ACL_ENTRY.test(s), { message: 'an ACL entry must be "*", "bind:<host>", "bind:*.<suffix>", "bind:<host>:<port>" or "bind:<key>=<value>"', params: { code: 6800 } }),
  100,
);

export function tokenResourceSchemas(spec: Pick<TokenResourceSpec, 'acl'>) {
  const aclField: z.ZodRawShape = spec.acl ? { acl: Acl.nullish() } : {};
  const create = obj({ description: description().nullish(), metadata: metadata().nullish(), ...aclField });
  const update = obj({ id: z.string().nullish().describe('ignored; sent by the official clients'), description: description().nullish(), metadata: metadata().nullish(), ...aclField });
  const response = z.object({
    id: z.string(),
    uri: z.string(),
    created_at: z.string(),
    description: z.string().optional(),
    metadata: z.string().optional(),
    token: z.string().nullable().describe('the secret, in the create response only'),
    ...((spec.acl ? { acl: z.array(z.string()) } : {}) as z.ZodRawShape),
  });
  return { create, update, response };
}

export function registerTokenResource(routes: ApiRoutes, db: Db, spec: TokenResourceSpec, checkQuota: QuotaCheck): void {
  const { create: Create, update: Update, response: Response } = tokenResourceSchemas(spec);
  const cols = `id, description, metadata, ${spec.acl ? 'acl' : "'{}'::text[] AS acl"}, created_at`;
  const List = z.object({ [spec.listKey]: z.array(Response), uri: z.string(), next_page_uri: z.string().nullable() });
  const map = (row: Row, baseUrl: string, token: string | null = null) => ({
    id: row.id,
    uri: `${baseUrl}/${spec.collection}/${row.id}`,
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    token,
    ...(spec.acl ? { acl: row.acl } : {}),
  });
  const get = async (q: Queryable, ctx: RequestContext, id: string, lock = false) => {
    const { rows } = await q.query<Row>(`SELECT ${cols} FROM ${spec.table} WHERE account_id = $1 AND id = $2${lock ? ' FOR UPDATE' : ''}`, [ctx.auth.accountId, id]);
    if (!rows[0]) throw notFound(spec.what, id);
    return rows[0];
  };
  const auditRow = (q: Queryable, ctx: RequestContext, kind: 'created' | 'updated' | 'deleted', row: Row) => audit(q, ctx, spec.eventStem, kind, map(row, ctx.baseUrl));

  routes.route(
    `/${spec.collection}`,
    {
      POST: async (req) => {
        await checkQuota(req.ctx.auth.accountId, spec.table);
        const input = parseBody(Create, req.body) as { description?: string | null; metadata?: string | null; acl?: string[] | null };
        const token = spec.newToken();
        const row = await db.tx(async (q) => {
          const { rows } = await q.query<Row>(
            `INSERT INTO ${spec.table} (id, account_id, token_hash, description, metadata${spec.acl ? ', acl' : ''})
             VALUES ($1, $2, $3, $4, $5${spec.acl ? ', $6' : ''}) RETURNING ${cols}`,
            [newId(spec.prefix), req.ctx.auth.accountId, hashToken(token), input.description ?? '', input.metadata ?? '', ...(spec.acl ? [input.acl ?? []] : [])],
          );
          await auditRow(q, req.ctx, 'created', rows[0]!);
          return rows[0]!;
        });
        return { status: 201, body: map(row, req.ctx.baseUrl, token) };
      },
      GET: async (req) => {
        const page = parsePage(req.query, spec.prefix);
        const rows = await pageRows<Row>(db, spec.table, cols, req.ctx.auth.accountId, page);
        return { status: 200, body: envelope(spec.listKey, `${req.ctx.baseUrl}/${spec.collection}`, rows.map((r) => map(r, req.ctx.baseUrl)), page) };
      },
    },
    {
      POST: { tag: spec.tag, summary: `Create ${spec.what}; the token is returned only now`, request: Create, response: Response, status: 201 },
      GET: { tag: spec.tag, summary: `List ${spec.what}s`, response: List, status: 200, paged: true },
    },
  );
  routes.route(
    `/${spec.collection}/:id`,
    {
      GET: async (req) => ({ status: 200, body: map(await get(db, req.ctx, req.params.id!), req.ctx.baseUrl) }),
      PATCH: async (req) => {
        const input = parseBody(Update, req.body) as { description?: string | null; metadata?: string | null; acl?: string[] | null };
        const out = await db.tx(async (q) => {
          const before = await get(q, req.ctx, req.params.id!, true);
          const next = { ...before, description: input.description ?? before.description, metadata: input.metadata ?? before.metadata, acl: input.acl ?? before.acl };
          if (next.description === before.description && next.metadata === before.metadata && next.acl.join('\n') === before.acl.join('\n')) return before;
          await q.query(`UPDATE ${spec.table} SET description = $3, metadata = $4${spec.acl ? ', acl = $5' : ''} WHERE account_id = $1 AND id = $2`, [
            req.ctx.auth.accountId, before.id, next.description, next.metadata, ...(spec.acl ? [next.acl] : []),
          ]);
          await auditRow(q, req.ctx, 'updated', next);
          return next;
        });
        return { status: 200, body: map(out, req.ctx.baseUrl) };
      },
      DELETE: async (req) => {
        await db.tx(async (q) => {
          const before = await get(q, req.ctx, req.params.id!, true);
          const beforeAudit = await spec.beforeDelete?.(q, req.ctx, before.id);
          await q.query(`DELETE FROM ${spec.table} WHERE account_id = $1 AND id = $2`, [req.ctx.auth.accountId, before.id]);
          if (beforeAudit) await beforeAudit(q);
          await auditRow(q, req.ctx, 'deleted', before);
        });
        spec.afterDelete?.(req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag: spec.tag, summary: `Get ${spec.what}`, response: Response, status: 200 },
      PATCH: { tag: spec.tag, summary: `Update ${spec.what}`, request: Update, response: Response, status: 200 },
      DELETE: { tag: spec.tag, summary: `Delete ${spec.what}`, status: 204 },
    },
  );
}

/** Refuses to delete the account's last API key (409 4102): the account would be locked out. */
export async function notLastApiKey(q: Queryable, ctx: RequestContext, _id: string): Promise<void> {
  // Lock the account's keys so two concurrent deletes cannot both pass the check.
  const { rows } = await q.query<{ id: string }>('SELECT id FROM api_keys WHERE account_id = $1 FOR UPDATE', [ctx.auth.accountId]);
  if (rows.length <= 1) throw new AppError(4102);
}
