import { z } from 'zod';
import { boundedList, description, metadata, obj, refId } from '../../http/validate.js';
import { RefSchema } from '../common.js';
import { EVENT_SOURCE_TYPES, isEventSourceType } from './source-types.js';

export const MAX_DESTINATIONS = 10;

const sourceType = () =>
  z
    .string()
    .superRefine((s, ctx) => {
      if (!isEventSourceType(s))
        ctx.addIssue({ code: 'custom', message: `unknown event source type ${JSON.stringify(s.slice(0, 64))}; valid types: ${EVENT_SOURCE_TYPES.join(', ')}`, params: { code: 6601 } });
    })
    .describe('event type, e.g. ip_policy_created.v0');

const EventSourceReplace = obj({ type: sourceType() });

const sources = () =>
  z
    .array(EventSourceReplace)
    .superRefine((list, ctx) => {
      const seen = new Set<string>();
      list.forEach((s, i) => {
        if (seen.has(s.type)) ctx.addIssue({ code: 'custom', path: [i, 'type'], message: `source type ${s.type} is listed twice`, params: { code: 6600 } });
        seen.add(s.type);
      });
    })
    .describe('event types that trigger this subscription, each at most once');

const destinationIds = () =>
  boundedList(refId('ed'), MAX_DESTINATIONS)
    .superRefine((ids, ctx) => {
      const seen = new Set<string>();
      ids.forEach((id, i) => {
        if (seen.has(id)) ctx.addIssue({ code: 'custom', path: [i], message: `destination ${id} is listed twice`, params: { code: 6600 } });
        seen.add(id);
      });
    })
    .describe(`event destinations (ed_) of this account, at most ${MAX_DESTINATIONS}`);

export const EventSubscriptionCreate = obj({
  description: description().nullish(),
  metadata: metadata().nullish(),
  sources: sources().nullish(),
  destination_ids: destinationIds().nullish(),
});

export const EventSubscriptionUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  description: description().nullish(),
  metadata: metadata().nullish(),
  sources: sources().nullish().describe('replaces the stored sources when given'),
  destination_ids: destinationIds().nullish().describe('replaces the stored destinations when given'),
});

export const EventSourceResponse = z.object({ type: z.string(), uri: z.string() });
export type EventSource = z.infer<typeof EventSourceResponse>;

export const EventSubscriptionResponse = z.object({
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
  sources: z.array(EventSourceResponse),
  destinations: z.array(RefSchema),
});
export type EventSubscription = z.infer<typeof EventSubscriptionResponse>;

export const EventSubscriptionList = z.object({ event_subscriptions: z.array(EventSubscriptionResponse), uri: z.string(), next_page_uri: z.string().nullable() });

export const EventSourceCreate = obj({
  subscription_id: z.string().nullish().describe('ignored; sent by the official clients (the path names the subscription)'),
  type: sourceType(),
});

export const EventSourceUpdate = obj({
  subscription_id: z.string().nullish().describe('ignored; sent by the official clients'),
  type: z.string().nullish().describe('ignored; sent by the official clients (the path names the type)'),
});

export const EventSourceList = z.object({ sources: z.array(EventSourceResponse), uri: z.string() });
