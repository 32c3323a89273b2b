import type { ApiRoutes } from '../../http/router.js';
import { registerCrud } from '../../http/crud.js';
import type { ModuleDeps } from '../../http/deps.js';
import { createEventDestinationsService } from './event-destinations.service.js';
import { EventDestinationCreate, EventDestinationList, EventDestinationResponse, EventDestinationUpdate } from './event-destinations.schema.js';

const tag = 'Event destinations';

export function registerEventDestinations(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createEventDestinationsService(deps);
  registerCrud(
    routes,
    {
      path: '/event_destinations',
      table: 'event_destinations',
      idPrefix: 'ed',
      tag,
      names: ['an event destination', 'event destinations'],
      create: EventDestinationCreate,
      update: EventDestinationUpdate,
      response: EventDestinationResponse,
      list: EventDestinationList,
    },
    svc,
    deps.checkQuota,
  );
}
