/**
 * Event source types a subscription may list (wire-conventions.md §11): every audit event type
 * and the two traffic event types.
 */
const AUDIT_STEMS = [
  'tcp_address',
  'certificate_authority',
  'event_destination',
  'event_subscription',
  'ip_policy',
  'ip_policy_rule',
  'api_key',
  'tunnel_credential',
  'tunnel_group_backend',
  'https_edge',
  'https_edge_route',
] as const;

export const EVENT_SOURCE_TYPES: readonly string[] = [
  ...AUDIT_STEMS.flatMap((stem) => ['created', 'updated', 'deleted'].map((kind) => `${stem}_${kind}.v0`)),
  'agent_session_start.v0',
  'agent_session_stop.v0',
  'http_request_complete.v0',
  'tcp_connection_closed.v0',
];

const TYPES = new Set(EVENT_SOURCE_TYPES);

export function isEventSourceType(s: string): boolean {
  return TYPES.has(s);
}
