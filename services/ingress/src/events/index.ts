/** Traffic events of the ingress node: subscriptions index, queue and emitter, request tracking. */
export { NO_DESTINATIONS, TrafficSubscriptionIndex } from './subscriptions.js';
export {
  HTTP_REQUEST_COMPLETE,
  TCP_CONNECTION_CLOSED,
  TrafficEventQueue,
  TrafficEvents,
  eventTimestamp,
  trafficEnvelope,
  trafficTs,
  type DropReason,
  type EventPublisher,
  type HttpRequestCompleteObject,
  type RateLimitVars,
  type TcpConnectionClosedObject,
  type TrafficEventMetrics,
  type TrafficEventsOptions,
} from './traffic-events.js';
export { HttpRequestTracker, rateLimitVarsOf, trackTcpConnection, type HttpTrackContext, type TcpTrackContext } from './tracking.js';
export { createTrafficEvents } from './redis.js';
