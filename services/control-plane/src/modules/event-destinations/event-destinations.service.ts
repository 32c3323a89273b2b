import { AppError, newId, notFound, rfc3339 } from '@warren/shared';
import type { z } from 'zod';
import type { Db } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { envelope, type Page } from '../../http/paginate.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings } from '../common.js';
import { eventDestinationsRepo as repo, type EventDestinationRow } from './event-destinations.repo.js';
import type { EventDestination, EventDestinationCreate, EventDestinationUpdate } from './event-destinations.schema.js';
import { kindOf, redact, sameJson, toStored } from './event-destinations.target.js';

/** NOTIFY channel: an unchanged PATCH of an event destination (payload: its id); see the worker's relay. */
export const DESTINATION_RESUME_CHANNEL = 'warren_event_destination_resume';

export const EVENT_DESTINATIONS = 'event_destinations';
const EVENT = 'event_destination';

export function toEventDestination(row: EventDestinationRow, baseUrl: string): EventDestination {
  return {
    id: row.id,
    uri: `${baseUrl}/${EVENT_DESTINATIONS}/${row.id}`,
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    format: 'json',
    target: redact(row.target_kind, row.target),
  };
}

export function createEventDestinationsService(deps: { db: Db }) {
  const { db } = deps;
  return {
    async create(ctx: RequestContext, input: z.output<typeof EventDestinationCreate>): Promise<EventDestination> {
      const target = toStored(input.target);
      return db.tx(async (q) => {
        const row = await repo.insert(q, {
          id: newId('ed'),
          account_id: ctx.auth.accountId,
          description: input.description ?? '',
          metadata: input.metadata ?? '',
          format: 'json',
          target_kind: kindOf(input.target),
          target,
        });
        const out = toEventDestination(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'created', out);
        return out;
      });
    },

    async get(ctx: RequestContext, id: string): Promise<EventDestination> {
      const row = await repo.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('event destination', id);
      return toEventDestination(row, ctx.baseUrl);
    },

    async list(ctx: RequestContext, page: Page) {
      const rows = await repo.list(db, ctx.auth.accountId, page);
      return envelope(EVENT_DESTINATIONS, `${ctx.baseUrl}/${EVENT_DESTINATIONS}`, rows.map((r) => toEventDestination(r, ctx.baseUrl)), page);
    },

    async update(ctx: RequestContext, id: string, input: z.output<typeof EventDestinationUpdate>): Promise<EventDestination> {
      return db.tx(async (q) => {
        const before = await repo.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('event destination', id);
        let target = before.target;
        if (input.target) {
          const kind = kindOf(input.target);
          if (kind !== before.target_kind)
            throw new AppError(4200, `target: the target kind cannot change after create (${before.target_kind} to ${kind}); create a new event destination instead`, {
              field: 'target',
            });
          target = toStored(input.target, before.target);
        }
        const next = { description: input.description ?? before.description, metadata: input.metadata ?? before.metadata, target };
        if (next.description === before.description && next.metadata === before.metadata && sameJson(next.target, before.target)) {
          // No change and no event, but a PATCH still resumes a destination the worker paused
          // (say after the customer fixed IAM on their side): the workers LISTEN for this.
          await q.query('SELECT pg_notify($1, $2)', [DESTINATION_RESUME_CHANNEL, id]);
          return toEventDestination(before, ctx.baseUrl);
        }
        const row = (await repo.update(q, ctx.auth.accountId, id, next))!;
        const out = toEventDestination(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'updated', out);
        return out;
      });
    },

    async delete(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const before = await repo.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('event destination', id);
        // The FK (RESTRICT) guards races too; this check names the subscriptions.
        const subs = await repo.referencingSubscriptions(q, id);
        if (subs.length > 0)
          throw new AppError(4100, `the event destination is used by event subscription ${subs.join(', ')}; remove it there first`, { resourceId: id });
        await repo.delete(q, ctx.auth.accountId, id);
        await audit(q, ctx, EVENT, 'deleted', toEventDestination(before, ctx.baseUrl));
      });
    },
  };
}
