-- The outbox relay's cursor (worker, services/worker/src/relay): audit events of outbox rows with
-- a config version above it have not been handed to the event buffers in Redis yet.
-- Forward-only; never edit after merge.
--
-- The relay never deletes outbox rows: they are the config-push feed too (read by version). It
-- keeps this cursor instead, advanced in the same transaction that holds the row lock of
-- `event_relay_state` (FOR UPDATE SKIP LOCKED), so of several worker replicas one relays at a time.
-- Versions are dense and in commit order (migration 0002), so `version > cursor` never skips a
-- row that commits late.
--
-- Starting point: the newest committed config version at upgrade time, NOT 0. Until now nothing
-- relayed audit events, so no subscriber has ever received one; replaying the whole history at
-- upgrade would flood every destination with old events at once (CloudWatch would also refuse
-- anything older than 14 days), and which destinations get them would be decided by today's
-- subscriptions, not the ones in force at the time. Events committed after this migration (even
-- while the worker is not deployed yet) are relayed. A fresh install starts at 0 either way.
-- To replay on purpose: UPDATE event_relay_state SET version = <n> (every row above n is sent
-- again, duplicates included).
--
-- Retention (not implemented): outbox rows may only ever be pruned at or below
-- LEAST(event_relay_state.version, what the config feed needs); the config feed already copes with
-- pruned rows by resyncing nodes (config-feed.ts `reset`), the relay would lose the events.
CREATE TABLE event_relay_state (
  id         int PRIMARY KEY CHECK (id = 1),
  version    bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO event_relay_state (id, version)
SELECT 1, COALESCE((SELECT version FROM config_state), (SELECT max(version) FROM outbox), 0);
