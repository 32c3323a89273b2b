import { randomInt } from 'node:crypto';
import { AppError, newId, notFound, rfc3339 } from '@warren/shared';
import type { z } from 'zod';
import type { Db } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { envelope, type Page } from '../../http/paginate.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings } from '../common.js';
import { reservedAddrsRepo as repo, type ReservedAddrRow } from './reserved-addrs.repo.js';
import type { ReservedAddr, ReservedAddrCreate, ReservedAddrUpdate } from './reserved-addrs.schema.js';

const COLLECTION = 'reserved_addrs';
const EVENT = 'tcp_address';

export function toReservedAddr(row: ReservedAddrRow, baseUrl: string): ReservedAddr {
  return {
    id: row.id,
    uri: `${baseUrl}/${COLLECTION}/${row.id}`,
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    addr: row.addr,
    region: row.region as ReservedAddr['region'],
    endpoint_configuration: null,
  };
}

export function createReservedAddrsService(deps: { db: Db; tcpAddrHost: string }) {
  const { db } = deps;
  return {
    async create(ctx: RequestContext, input: z.output<typeof ReservedAddrCreate>): Promise<ReservedAddr> {
      return db.tx(async (q) => {
        // A free port in 10000–59999; the unique index on addr settles races, so retry on clash.
        for (let attempt = 0; ; attempt++) {
          const addr = `${deps.tcpAddrHost}:${randomInt(10_000, 60_000)}`;
          await q.query('SAVEPOINT addr');
          try {
            const row = await repo.insert(q, {
              id: newId('ra'),
              account_id: ctx.auth.accountId,
              description: input.description ?? '',
              metadata: input.metadata ?? '',
              region: input.region ?? 'us',
              addr,
            });
            const out = toReservedAddr(row, ctx.baseUrl);
            await audit(q, ctx, EVENT, 'created', out);
            return out;
          } catch (err) {
            if ((err as { code?: string }).code !== '23505') throw err;
            // 20 clashes in a row means the 50,000-port pool is nearly full: a capacity problem, not a conflict.
            if (attempt >= 20) throw new AppError(9003);
            await q.query('ROLLBACK TO SAVEPOINT addr');
          }
        }
      });
    },

    async get(ctx: RequestContext, id: string): Promise<ReservedAddr> {
      const row = await repo.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('reserved address', id);
      return toReservedAddr(row, ctx.baseUrl);
    },

    async list(ctx: RequestContext, page: Page) {
      const rows = await repo.list(db, ctx.auth.accountId, page);
      return envelope(COLLECTION, `${ctx.baseUrl}/${COLLECTION}`, rows.map((r) => toReservedAddr(r, ctx.baseUrl)), page);
    },

    async update(ctx: RequestContext, id: string, input: z.output<typeof ReservedAddrUpdate>): Promise<ReservedAddr> {
      if (input.endpoint_configuration_id)
        throw new AppError(3002, 'endpoint_configuration_id: endpoint configurations are not offered; send "" to detach', { field: 'endpoint_configuration_id' });
      return db.tx(async (q) => {
        const before = await repo.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('reserved address', id);
        const patch = { description: input.description ?? undefined, metadata: input.metadata ?? undefined };
        if ((patch.description ?? before.description) === before.description && (patch.metadata ?? before.metadata) === before.metadata)
          return toReservedAddr(before, ctx.baseUrl);
        const row = (await repo.update(q, ctx.auth.accountId, id, patch))!;
        const out = toReservedAddr(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'updated', out);
        return out;
      });
    },

    async delete(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const row = await repo.delete(q, ctx.auth.accountId, id);
        if (!row) throw notFound('reserved address', id);
        await audit(q, ctx, EVENT, 'deleted', toReservedAddr(row, ctx.baseUrl));
      });
    },

    /** `DELETE /reserved_addrs/{id}/endpoint_configuration`: nothing can be attached, so only existence matters. */
    async detachEndpointConfiguration(ctx: RequestContext, id: string): Promise<void> {
      await this.get(ctx, id);
    },
  };
}
