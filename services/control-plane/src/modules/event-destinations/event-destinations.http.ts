import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { parseBody } from '../../http/validate.js';
import { parsePage } from '../../http/paginate.js';
import { createEventDestinationsService } from './event-destinations.service.js';
import { EventDestinationCreate, EventDestinationList, EventDestinationResponse, EventDestinationUpdate } from './event-destinations.schema.js';

const tag = 'Event destinations';

export function registerEventDestinations(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createEventDestinationsService(deps);
  routes.route(
    '/event_destinations',
    {
      POST: async (req) => ({ status: 201, body: await svc.create(req.ctx, parseBody(EventDestinationCreate, req.body)) }),
      GET: async (req) => ({ status: 200, body: await svc.list(req.ctx, parsePage(req.query, 'ed')) }),
    },
    {
      POST: { tag, summary: 'Create an event destination', request: EventDestinationCreate, response: EventDestinationResponse, status: 201 },
      GET: { tag, summary: 'List event destinations', response: EventDestinationList, status: 200, paged: true },
    },
  );
  routes.route(
    '/event_destinations/:id',
    {
      GET: async (req) => ({ status: 200, body: await svc.get(req.ctx, req.params.id!) }),
      PATCH: async (req) => ({ status: 200, body: await svc.update(req.ctx, req.params.id!, parseBody(EventDestinationUpdate, req.body)) }),
      DELETE: async (req) => {
        await svc.delete(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag, summary: 'Get an event destination', response: EventDestinationResponse, status: 200 },
      PATCH: { tag, summary: 'Update an event destination', request: EventDestinationUpdate, response: EventDestinationResponse, status: 200 },
      DELETE: { tag, summary: 'Delete an event destination', status: 204 },
    },
  );
}
