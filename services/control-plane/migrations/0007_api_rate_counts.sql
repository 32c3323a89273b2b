-- Per-account management API request counts of each control-plane replica, by rate-limit window
-- (slot = floor(epoch ms / window ms), 60 s windows), so that every replica's limiter adds the
-- other replicas' counts to its own (auth/rate-limit.ts). Each replica upserts its own rows
-- (replica_id: a random id per process) about once a second and reads the rows other replicas
-- changed since its last read; rows whose window ended more than a window ago are deleted by the
-- syncs themselves, in bounded batches, so rows of replicas that are gone age out.
CREATE TABLE api_rate_counts (
  account_id  text COLLATE "C" NOT NULL,
  slot        bigint NOT NULL,
  replica_id  text COLLATE "C" NOT NULL,
  count       integer NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account_id, slot, replica_id)
);
CREATE INDEX api_rate_counts_updated_at ON api_rate_counts (updated_at);
CREATE INDEX api_rate_counts_slot ON api_rate_counts (slot);
