-- Config versions in commit order, ingress node status, and tunnel presence columns.
-- Forward-only; never edit after merge.

-- One row: the newest config version and the epoch of this version sequence (a database restored
-- or re-created starts a new epoch, so ingress nodes never compare versions across the two).
CREATE TABLE config_state (
  id           boolean PRIMARY KEY DEFAULT true CHECK (id),
  version      bigint NOT NULL,
  epoch        text NOT NULL,
  committed_at timestamptz NOT NULL DEFAULT now()
);

-- Every outbox row gets the next config version. The counter row is updated by the outbox insert,
-- which every API change runs as its last statement, so its row lock is held until COMMIT: a
-- second writer waits at its own outbox insert until the first has committed (or rolled back,
-- which also rolls the counter back). Versions are therefore dense (no gaps) and in commit order,
-- across connections and control-plane replicas: once version N is visible, so is every version
-- below it. `committed_at` is the clock at that last statement, a moment before COMMIT.
ALTER TABLE outbox ADD COLUMN version bigint;
ALTER TABLE outbox ADD COLUMN committed_at timestamptz;
UPDATE outbox o SET version = s.n, committed_at = o.created_at
  FROM (SELECT seq, row_number() OVER (ORDER BY seq) AS n FROM outbox) s
 WHERE o.seq = s.seq;
ALTER TABLE outbox ALTER COLUMN version SET NOT NULL;
ALTER TABLE outbox ALTER COLUMN committed_at SET NOT NULL;
CREATE UNIQUE INDEX outbox_version ON outbox (version);

INSERT INTO config_state (version, epoch)
SELECT (SELECT count(*) FROM outbox), md5(random()::text || clock_timestamp()::text);

-- Stamps the version and wakes every replica's listener (LISTEN warren_config; delivered at
-- COMMIT, never for a rolled-back transaction). The payload is only a hint: listeners read the
-- outbox from the last version they handled.
CREATE FUNCTION outbox_stamp_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE config_state SET version = version + 1, committed_at = clock_timestamp()
   RETURNING version, committed_at INTO NEW.version, NEW.committed_at;
  PERFORM pg_notify('warren_config', NEW.version::text);
  RETURN NEW;
END
$$;
CREATE TRIGGER outbox_stamp_version BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION outbox_stamp_version();

-- Disabling or enabling an account removes or restores its agent credentials in the data plane:
-- the change gets an outbox row (and so a config version) whoever makes it (admin CLI, SQL).
CREATE FUNCTION accounts_outbox_disabled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO outbox (event_id, account_id, event_type, resource_type, resource_id, object, principal)
  VALUES ('ev_' || md5(random()::text || clock_timestamp()::text), NEW.id, 'account_updated.v0', 'account', NEW.id,
          jsonb_build_object('id', NEW.id, 'disabled', NEW.disabled), NULL);
  RETURN NULL;
END
$$;
CREATE TRIGGER accounts_outbox_disabled AFTER UPDATE OF disabled ON accounts
  FOR EACH ROW WHEN (OLD.disabled IS DISTINCT FROM NEW.disabled) EXECUTE FUNCTION accounts_outbox_disabled();

-- Ingress nodes as the control plane last saw them: the config version each one applied, and the
-- last config it refused (cleared when a newer version is applied).
CREATE TABLE ingress_nodes (
  id                 text COLLATE "C" PRIMARY KEY,
  address            text NOT NULL DEFAULT '',
  epoch              text NOT NULL DEFAULT '',
  applied_version    bigint NOT NULL DEFAULT 0,
  last_error         text NOT NULL DEFAULT '',
  last_error_version bigint,
  last_error_at      timestamptz,
  connected          boolean NOT NULL DEFAULT false,
  -- the replica and stream serving it, so a stale stream's close cannot mark a reconnected node offline
  replica_id         text NOT NULL DEFAULT '',
  stream_id          text NOT NULL DEFAULT '',
  connected_at       timestamptz,
  last_seen          timestamptz NOT NULL DEFAULT now()
);

-- Presence: sessions and tunnels are written by the control plane from node reports, with a lease
-- renewed by the node's keep-alives; expired rows are swept (any replica).
CREATE INDEX tunnel_sessions_ingress_node ON tunnel_sessions (ingress_node);
CREATE INDEX tunnel_sessions_lease ON tunnel_sessions (lease_expires_at);

ALTER TABLE tunnels ADD COLUMN ingress_node    text NOT NULL DEFAULT '';
ALTER TABLE tunnels ADD COLUMN node_address    text NOT NULL DEFAULT '';
ALTER TABLE tunnels ADD COLUMN bindings        text[] NOT NULL DEFAULT '{}';
ALTER TABLE tunnels ADD COLUMN pooling_enabled boolean NOT NULL DEFAULT false;
CREATE INDEX tunnels_ingress_node ON tunnels (ingress_node);
CREATE INDEX tunnels_tunnel_session_id ON tunnels (tunnel_session_id);
