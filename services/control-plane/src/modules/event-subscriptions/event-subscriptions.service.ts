import { AppError, newId, notFound, rfc3339 } from '@warren/shared';
import type { z } from 'zod';
import type { Db, Queryable } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { envelope, type Page } from '../../http/paginate.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings, ref } from '../common.js';
import { eventSubscriptionsRepo as repo, type EventSubscriptionRow } from './event-subscriptions.repo.js';
import type { EventSource, EventSourceCreate, EventSubscription, EventSubscriptionCreate, EventSubscriptionUpdate } from './event-subscriptions.schema.js';

export const EVENT_SUBSCRIPTIONS = 'event_subscriptions';
const EVENT = 'event_subscription';

const subscriptionUri = (baseUrl: string, id: string) => `${baseUrl}/${EVENT_SUBSCRIPTIONS}/${id}`;
const sourcesUri = (baseUrl: string, id: string) => `${subscriptionUri(baseUrl, id)}/sources`;

export function toEventSource(baseUrl: string, subscriptionId: string, type: string): EventSource {
  return { type, uri: `${sourcesUri(baseUrl, subscriptionId)}/${type}` };
}

export function toEventSubscription(row: EventSubscriptionRow, baseUrl: string): EventSubscription {
  return {
    id: row.id,
    uri: subscriptionUri(baseUrl, row.id),
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    sources: row.source_types.map((t) => toEventSource(baseUrl, row.id, t)),
    destinations: row.destination_ids.map((id) => ref(baseUrl, 'event_destinations', id)),
  };
}

/** 400 (3002) naming the first destination id that is not an event destination of this account. */
async function requireDestinations(q: Queryable, accountId: string, ids: string[]): Promise<void> {
  if (ids.length === 0) return;
  const { rows } = await q.query<{ id: string }>('SELECT id FROM event_destinations WHERE account_id = $1 AND id = ANY($2::text[]) FOR KEY SHARE', [accountId, ids]);
  const found = new Set(rows.map((r) => r.id));
  const i = ids.findIndex((id) => !found.has(id));
  if (i >= 0) {
    const field = `destination_ids[${i}]`;
    throw new AppError(3002, `${field}: no event destination with id ${JSON.stringify(ids[i])} in this account`, { field, resourceId: ids[i]! });
  }
}

const sameList = (a: readonly string[], b: readonly string[]) => a.length === b.length && a.every((x, i) => x === b[i]);

export function createEventSubscriptionsService(deps: { db: Db }) {
  const { db } = deps;

  async function emitUpdated(q: Queryable, ctx: RequestContext, id: string): Promise<EventSubscription> {
    const out = toEventSubscription((await repo.get(q, ctx.auth.accountId, id))!, ctx.baseUrl);
    await audit(q, ctx, EVENT, 'updated', out);
    return out;
  }

  async function mustGet(q: Queryable, ctx: RequestContext, id: string, forUpdate = false): Promise<EventSubscriptionRow> {
    const row = await repo.get(q, ctx.auth.accountId, id, forUpdate);
    if (!row) throw notFound('event subscription', id);
    return row;
  }

  function sourceNotFound(id: string, type: string): AppError {
    return new AppError(4001, `event subscription ${id} has no source ${JSON.stringify(type.slice(0, 64))}`, { resourceId: id });
  }

  return {
    async create(ctx: RequestContext, input: z.output<typeof EventSubscriptionCreate>): Promise<EventSubscription> {
      const types = (input.sources ?? []).map((s) => s.type);
      const destinationIds = input.destination_ids ?? [];
      return db.tx(async (q) => {
        await requireDestinations(q, ctx.auth.accountId, destinationIds);
        const id = newId('esb');
        await repo.insert(q, { id, account_id: ctx.auth.accountId, description: input.description ?? '', metadata: input.metadata ?? '' });
        await repo.replaceSources(q, id, types);
        await repo.replaceDestinations(q, id, destinationIds);
        const out = toEventSubscription((await repo.get(q, ctx.auth.accountId, id))!, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'created', out);
        return out;
      });
    },

    async get(ctx: RequestContext, id: string): Promise<EventSubscription> {
      return toEventSubscription(await mustGet(db, ctx, id), ctx.baseUrl);
    },

    async list(ctx: RequestContext, page: Page) {
      const rows = await repo.list(db, ctx.auth.accountId, page);
      return envelope(EVENT_SUBSCRIPTIONS, `${ctx.baseUrl}/${EVENT_SUBSCRIPTIONS}`, rows.map((r) => toEventSubscription(r, ctx.baseUrl)), page);
    },

    async update(ctx: RequestContext, id: string, input: z.output<typeof EventSubscriptionUpdate>): Promise<EventSubscription> {
      return db.tx(async (q) => {
        const before = await mustGet(q, ctx, id, true);
        const next = {
          description: input.description ?? before.description,
          metadata: input.metadata ?? before.metadata,
          types: input.sources ? input.sources.map((s) => s.type) : before.source_types,
          destinationIds: input.destination_ids ?? before.destination_ids,
        };
        const metaChanged = next.description !== before.description || next.metadata !== before.metadata;
        const sourcesChanged = !sameList(next.types, before.source_types);
        const destinationsChanged = !sameList(next.destinationIds, before.destination_ids);
        if (!metaChanged && !sourcesChanged && !destinationsChanged) return toEventSubscription(before, ctx.baseUrl);
        if (destinationsChanged) await requireDestinations(q, ctx.auth.accountId, next.destinationIds);
        if (metaChanged) await repo.update(q, ctx.auth.accountId, id, next);
        if (sourcesChanged) await repo.replaceSources(q, id, next.types);
        if (destinationsChanged) await repo.replaceDestinations(q, id, next.destinationIds);
        return emitUpdated(q, ctx, id);
      });
    },

    async delete(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const before = await mustGet(q, ctx, id, true);
        await repo.delete(q, ctx.auth.accountId, id);
        await audit(q, ctx, EVENT, 'deleted', toEventSubscription(before, ctx.baseUrl));
      });
    },

    // ---- event sources: /event_subscriptions/{id}/sources[/{type}] ----

    async addSource(ctx: RequestContext, id: string, input: z.output<typeof EventSourceCreate>): Promise<EventSource> {
      return db.tx(async (q) => {
        const before = await mustGet(q, ctx, id, true);
        if (before.source_types.includes(input.type))
          throw new AppError(4101, `type: event subscription ${id} already has source ${input.type}`, { field: 'type', resourceId: id });
        await repo.addSource(q, id, input.type);
        await emitUpdated(q, ctx, id);
        return toEventSource(ctx.baseUrl, id, input.type);
      });
    },

    async listSources(ctx: RequestContext, id: string): Promise<{ sources: EventSource[]; uri: string }> {
      const row = await mustGet(db, ctx, id);
      return { sources: row.source_types.map((t) => toEventSource(ctx.baseUrl, id, t)), uri: sourcesUri(ctx.baseUrl, id) };
    },

    /** GET, and PATCH too: a source has nothing to change, so PATCH answers the source as it is. */
    async getSource(ctx: RequestContext, id: string, type: string): Promise<EventSource> {
      const row = await mustGet(db, ctx, id);
      if (!row.source_types.includes(type)) throw sourceNotFound(id, type);
      return toEventSource(ctx.baseUrl, id, type);
    },

    async removeSource(ctx: RequestContext, id: string, type: string): Promise<void> {
      await db.tx(async (q) => {
        await mustGet(q, ctx, id, true);
        if (!(await repo.removeSource(q, id, type))) throw sourceNotFound(id, type);
        await emitUpdated(q, ctx, id);
      });
    },
  };
}
