-- SAML assertion ids accepted by a route's ACS, kept until no assertion with that id could pass
-- the time checks again (replay protection; saml-sp.ts REPLAY_WINDOW_MS, about 12 minutes).
-- Expired rows are deleted by the ACS itself as it inserts.
CREATE TABLE saml_assertion_ids (
  route_id      text COLLATE "C" NOT NULL,
  assertion_id  text NOT NULL,
  expires_at    timestamptz NOT NULL,
  PRIMARY KEY (route_id, assertion_id)
);
CREATE INDEX saml_assertion_ids_expires_at ON saml_assertion_ids (expires_at);
