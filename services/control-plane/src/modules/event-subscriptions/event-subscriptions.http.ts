import type { ApiRoutes } from '../../http/router.js';
import { registerCrud } from '../../http/crud.js';
import type { ModuleDeps } from '../../http/deps.js';
import { parseBody } from '../../http/validate.js';
import { createEventSubscriptionsService } from './event-subscriptions.service.js';
import {
  EventSourceCreate,
  EventSourceList,
  EventSourceResponse,
  EventSourceUpdate,
  EventSubscriptionCreate,
  EventSubscriptionList,
  EventSubscriptionResponse,
  EventSubscriptionUpdate,
} from './event-subscriptions.schema.js';

const tag = 'Event subscriptions';
const sourceTag = 'Event sources';

/** Event subscriptions and their sources sub-resource (wire-conventions.md §10). */
export function registerEventSubscriptions(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createEventSubscriptionsService(deps);
  registerCrud(
    routes,
    {
      path: '/event_subscriptions',
      table: 'event_subscriptions',
      idPrefix: 'esb',
      tag,
      names: ['an event subscription', 'event subscriptions'],
      create: EventSubscriptionCreate,
      update: EventSubscriptionUpdate,
      response: EventSubscriptionResponse,
      list: EventSubscriptionList,
      summaries: { DELETE: 'Delete an event subscription and its sources' },
    },
    svc,
    deps.checkQuota,
  );
  routes.route(
    '/event_subscriptions/:id/sources',
    {
      POST: async (req) => ({ status: 201, body: await svc.addSource(req.ctx, req.params.id!, parseBody(EventSourceCreate, req.body)) }),
      GET: async (req) => ({ status: 200, body: await svc.listSources(req.ctx, req.params.id!) }),
    },
    {
      POST: { tag: sourceTag, summary: 'Add an event source to a subscription', request: EventSourceCreate, response: EventSourceResponse, status: 201 },
      GET: { tag: sourceTag, summary: 'List the event sources of a subscription (not paged)', response: EventSourceList, status: 200 },
    },
  );
  routes.route(
    '/event_subscriptions/:id/sources/:type',
    {
      GET: async (req) => ({ status: 200, body: await svc.getSource(req.ctx, req.params.id!, req.params.type!) }),
      PATCH: async (req) => {
        parseBody(EventSourceUpdate, req.body);
        return { status: 200, body: await svc.getSource(req.ctx, req.params.id!, req.params.type!) };
      },
      DELETE: async (req) => {
        await svc.removeSource(req.ctx, req.params.id!, req.params.type!);
        return { status: 204 };
      },
    },
    {
      GET: { tag: sourceTag, summary: 'Get an event source', response: EventSourceResponse, status: 200 },
      PATCH: { tag: sourceTag, summary: 'Update an event source (nothing to change; answers the source)', request: EventSourceUpdate, response: EventSourceResponse, status: 200 },
      DELETE: { tag: sourceTag, summary: 'Remove an event source from a subscription', status: 204 },
    },
  );
}
