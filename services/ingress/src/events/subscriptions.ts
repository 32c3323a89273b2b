import type { DataPlaneConfig, DestinationRef, DpEventSubscription, TrafficEventType } from '@warren/shared';

/** The one empty answer: no allocation when an account has no destination for a type. */
export const NO_DESTINATIONS: readonly DestinationRef[] = Object.freeze([]);

interface AccountDestinations {
  http: readonly DestinationRef[];
  tcp: readonly DestinationRef[];
}

/**
 * Which destinations receive each traffic event type, per account: compiled from the config's
 * event subscriptions once per change (config swaps that keep the same subscriptions map reuse
 * it), so the request path pays one Map lookup. A destination named by several subscriptions of
 * the account for the same type receives each event once (consumers dedupe on `event_id`
 * anyway, but one record is cheaper than two). Destinations keep their first-seen order
 * (subscriptions by id, then each one's destination order).
 */
export class TrafficSubscriptionIndex {
  static readonly EMPTY = new TrafficSubscriptionIndex(new Map());

  private constructor(
    private readonly byAccount: ReadonlyMap<string, AccountDestinations>,
    /** The subscriptions this index was compiled from (identity: unchanged maps are shared across config versions). */
    readonly source: ReadonlyMap<string, DpEventSubscription> | null = null,
  ) {}

  static build(subscriptions: ReadonlyMap<string, DpEventSubscription>): TrafficSubscriptionIndex {
    const acc = new Map<string, { http: Map<string, DestinationRef>; tcp: Map<string, DestinationRef> }>();
    const sorted = [...subscriptions.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    for (const s of sorted) {
      if (s.destinations.length === 0) continue;
      for (const type of s.types) {
        let a = acc.get(s.accountId);
        if (!a) acc.set(s.accountId, (a = { http: new Map(), tcp: new Map() }));
        const into = type === 'http_request_complete.v0' ? a.http : type === 'tcp_connection_closed.v0' ? a.tcp : null;
        if (!into) continue;
        for (const d of s.destinations) if (!into.has(d.id)) into.set(d.id, Object.freeze({ id: d.id, kind: d.kind }));
      }
    }
    const out = new Map<string, AccountDestinations>();
    const list = (m: Map<string, DestinationRef>) => (m.size === 0 ? NO_DESTINATIONS : Object.freeze([...m.values()]));
    for (const [account, a] of acc) if (a.http.size > 0 || a.tcp.size > 0) out.set(account, { http: list(a.http), tcp: list(a.tcp) });
    return new TrafficSubscriptionIndex(out, subscriptions);
  }

  /** The index for `cfg`: `prev` itself when the subscriptions did not change. */
  static forConfig(cfg: DataPlaneConfig, prev: TrafficSubscriptionIndex | null): TrafficSubscriptionIndex {
    if (prev && prev.source === cfg.eventSubscriptions) return prev;
    return cfg.eventSubscriptions.size === 0 ? new TrafficSubscriptionIndex(new Map(), cfg.eventSubscriptions) : TrafficSubscriptionIndex.build(cfg.eventSubscriptions);
  }

  /** Destinations of `accountId` subscribed to `type`; {@link NO_DESTINATIONS} when none. */
  trafficDestinations(accountId: string, type: TrafficEventType): readonly DestinationRef[] {
    const a = this.byAccount.get(accountId);
    if (a === undefined) return NO_DESTINATIONS;
    return type === 'http_request_complete.v0' ? a.http : a.tcp;
  }

  /** Accounts with at least one traffic destination. */
  get accounts(): number {
    return this.byAccount.size;
  }
}
