-- Event delivery (services/worker, event-delivery.md §2): destination health (paused
-- destinations, continuous failure tracking) and the dead letters. Forward-only; never edit
-- after merge.

-- One row per destination the worker has had something to say about. `paused`: the worker
-- keeps buffering its events but sends nothing (auth failure, or failing for 72 h); it re-probes
-- every PAUSE_PROBE_MS, and a PATCH of the destination resumes it at once.
CREATE TABLE event_destination_health (
  destination_id  text COLLATE "C" PRIMARY KEY REFERENCES event_destinations(id) ON DELETE CASCADE,
  paused          boolean NOT NULL DEFAULT false,
  reason          text NOT NULL DEFAULT '',
  paused_at       timestamptz,
  failing_since   timestamptz,
  last_success_at timestamptz,
  updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_destination_health_paused ON event_destination_health (paused_at) WHERE paused;

-- Events the worker gave up on, with the envelopes so that they can be replayed
-- (`npm run events-admin -- replay …`). No foreign key: the destination may be gone.
CREATE TABLE event_dead_letters (
  id               bigserial PRIMARY KEY,
  destination_id   text COLLATE "C" NOT NULL,
  account_id       text COLLATE "C" NOT NULL DEFAULT '',
  event_ids        text[] NOT NULL,
  reason           text NOT NULL,
  payload          jsonb NOT NULL,                 -- array of envelopes (JSON values, in order)
  first_attempt_at timestamptz,
  last_attempt_at  timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_dead_letters_destination ON event_dead_letters (destination_id, id);
