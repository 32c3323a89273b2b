import { newId } from '@warren/shared';
import type { Queryable } from '../db/pool.js';
import { principalOf, type Principal, type RequestContext } from '../http/context.js';

export type ChangeKind = 'created' | 'updated' | 'deleted';

export interface OutboxChange {
  accountId: string;
  /** Event name stem, e.g. `ip_policy` → `ip_policy_created.v0`. */
  eventStem: string;
  kind: ChangeKind;
  resourceId: string;
  /** The resource as the API returns it (secrets already ""); for deletes, its last state. */
  object: unknown;
  principal: Principal | null;
}

/** NOTIFY channel of committed config versions (payload: the version, a hint only). */
export const CONFIG_CHANNEL = 'warren_config';
/** Payload prefix, on CONFIG_CHANNEL, of a new epoch of the version sequence (`epoch:<epoch>`; config-reader.ts newConfigEpoch). */
export const EPOCH_NOTICE = 'epoch:';

/** One outbox row, with its full event type (`writeOutbox` builds it from a stem and a kind). */
export interface OutboxEvent {
  accountId: string;
  /** e.g. `agent_session_start.v0`. */
  eventType: string;
  /** e.g. `agent_session`; the config feed maps the types it knows to data-plane entities and ignores the rest. */
  resourceType: string;
  resourceId: string;
  /** The resource as the API returns it (secrets already ""); for deletes, its last state. */
  object: unknown;
  principal: Principal | null;
}

/**
 * Writes one outbox row: the config change and its audit event. Must be called with the
 * client of the transaction that makes the change, so the two commit or vanish together, and as
 * the transaction's last statement(s).
 *
 * Config versions: the insert stamps the row with the next config version (trigger
 * `outbox_stamp_version`, migration 0002), which takes the row lock of the one-row counter
 * `config_state` and holds it until the transaction ends, then notifies `warren_config` at commit.
 * So versions are dense and in commit order across connections and replicas, and writers of
 * config changes commit one at a time from this statement on: keep it last, so the lock is held
 * only for the insert and the COMMIT. Returns the version.
 */
export async function writeOutbox(q: Queryable, c: OutboxChange): Promise<number> {
  const [version] = await writeOutboxEvents(q, [
    { accountId: c.accountId, eventType: `${c.eventStem}_${c.kind}.v0`, resourceType: c.eventStem, resourceId: c.resourceId, object: c.object, principal: c.principal },
  ]);
  return version!;
}

/**
 * Writes outbox rows in one statement, in the order given; same rules as `writeOutbox` (the
 * transaction's last statement). Returns the versions of the rows written.
 *
 * `onlySubscribed`: a row is written only when its account has a subscription whose sources list
 * its event type, decided in the same statement. For events with no config behind them (agent
 * sessions): without a subscriber nothing is inserted, so the config counter is neither locked
 * nor moved and no config version is pushed to the nodes. (A subscription created later does not
 * get the events from before it: nor would the relay have sent them to it.)
 */
export async function writeOutboxEvents(q: Queryable, events: OutboxEvent[], opts: { onlySubscribed?: boolean } = {}): Promise<number[]> {
  if (events.length === 0) return [];
  const rows = events.map((e, n) => ({
    n,
    event_id: newId('ev'),
    account_id: e.accountId,
    event_type: e.eventType,
    resource_type: e.resourceType,
    resource_id: e.resourceId,
    object: e.object,
    principal: e.principal,
  }));
  const subscribed = opts.onlySubscribed
    ? `WHERE EXISTS (SELECT 1 FROM event_subscriptions es JOIN event_subscription_sources src ON src.subscription_id = es.id
                      WHERE es.account_id = x.account_id AND src.type = x.event_type)`
    : '';
  // A JSON null principal becomes SQL NULL.
  const { rows: out } = await q.query<{ version: number }>(
    `INSERT INTO outbox (event_id, account_id, event_type, resource_type, resource_id, object, principal)
     SELECT x.event_id, x.account_id, x.event_type, x.resource_type, x.resource_id, x.object, x.principal
       FROM jsonb_to_recordset($1::jsonb) AS x(n int, event_id text, account_id text, event_type text, resource_type text, resource_id text, object jsonb, principal jsonb)
     ${subscribed}
      ORDER BY x.n
     RETURNING version`,
    [JSON.stringify(rows)],
  );
  return out.map((r) => r.version);
}

/** The principal of an agent's doing (wire-conventions.md §11): its credential, described by the credential's description. */
export function agentPrincipal(credentialId: string, credentialDescription: string, baseUrl: string): Principal {
  return { id: credentialId, subject: credentialDescription, source: 'Agent', credential: { id: credentialId, uri: `${baseUrl}/credentials/${credentialId}` } };
}

/**
 * The outbox row of an API change made by the caller of `ctx`: its audit event names the API key
 * as principal, and `object` (the resource as returned, with its `id`) is the event's object.
 */
export async function audit(q: Queryable, ctx: RequestContext, eventStem: string, kind: ChangeKind, object: { id: string }): Promise<void> {
  await writeOutbox(q, { accountId: ctx.auth.accountId, eventStem, kind, resourceId: object.id, object, principal: principalOf(ctx) });
}
