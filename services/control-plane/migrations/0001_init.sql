-- Warren control plane: initial schema. Forward-only; never edit after merge.
-- Every resource row carries account_id; every list is keyset-paged on (account_id, id DESC),
-- served by the (account_id, id) indexes below (scanned backward). Id columns use the "C"
-- collation so that ids (KSUIDs) sort bytewise, i.e. by creation time, whatever the
-- database's default collation is.

CREATE TABLE accounts (
  id          text COLLATE "C" PRIMARY KEY,
  name        text NOT NULL DEFAULT '',
  disabled    boolean NOT NULL DEFAULT false,
  created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
  id          text COLLATE "C" PRIMARY KEY,
  account_id  text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  token_hash  text NOT NULL UNIQUE,            -- sha256 hex of the token; the token itself is never stored
  description text NOT NULL DEFAULT '',
  metadata    text NOT NULL DEFAULT '',
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX api_keys_account_id ON api_keys (account_id, id);

CREATE TABLE credentials (
  id          text COLLATE "C" PRIMARY KEY,
  account_id  text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  token_hash  text NOT NULL UNIQUE,
  description text NOT NULL DEFAULT '',
  metadata    text NOT NULL DEFAULT '',
  acl         text[] NOT NULL DEFAULT '{}',
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX credentials_account_id ON credentials (account_id, id);

CREATE TABLE reserved_addrs (
  id          text COLLATE "C" PRIMARY KEY,
  account_id  text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  description text NOT NULL DEFAULT '',
  metadata    text NOT NULL DEFAULT '',
  region      text NOT NULL,
  addr        text NOT NULL UNIQUE,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reserved_addrs_account_id ON reserved_addrs (account_id, id);

CREATE TABLE tunnel_group_backends (
  id          text COLLATE "C" PRIMARY KEY,
  account_id  text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  description text NOT NULL DEFAULT '',
  metadata    text NOT NULL DEFAULT '',
  labels      jsonb NOT NULL DEFAULT '{}',
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tunnel_group_backends_account_id ON tunnel_group_backends (account_id, id);

CREATE TABLE certificate_authorities (
  id                  text COLLATE "C" PRIMARY KEY,
  account_id          text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  description         text NOT NULL DEFAULT '',
  metadata            text NOT NULL DEFAULT '',
  ca_pem              text NOT NULL,
  subject_common_name text NOT NULL DEFAULT '',
  not_before          timestamptz NOT NULL,
  not_after           timestamptz NOT NULL,
  key_usages          text[] NOT NULL DEFAULT '{}',
  extended_key_usages text[] NOT NULL DEFAULT '{}',
  created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX certificate_authorities_account_id ON certificate_authorities (account_id, id);

CREATE TABLE ip_policies (
  id          text COLLATE "C" PRIMARY KEY,
  account_id  text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  description text NOT NULL DEFAULT '',
  metadata    text NOT NULL DEFAULT '',
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ip_policies_account_id ON ip_policies (account_id, id);

CREATE TABLE ip_policy_rules (
  id           text COLLATE "C" PRIMARY KEY,
  account_id   text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  ip_policy_id text COLLATE "C" NOT NULL REFERENCES ip_policies(id) ON DELETE CASCADE,
  cidr         cidr NOT NULL,
  action       text NOT NULL CHECK (action IN ('allow', 'deny')),
  description  text NOT NULL DEFAULT '',
  metadata     text NOT NULL DEFAULT '',
  created_at   timestamptz NOT NULL DEFAULT now(),
  UNIQUE (ip_policy_id, cidr)
);
CREATE INDEX ip_policy_rules_account_id ON ip_policy_rules (account_id, id);

CREATE TABLE https_edges (
  id              text COLLATE "C" PRIMARY KEY,
  account_id      text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  description     text NOT NULL DEFAULT '',
  metadata        text NOT NULL DEFAULT '',
  hostports       text[] NOT NULL DEFAULT '{}',
  mutual_tls      jsonb,                         -- {enabled}; its CAs live in https_edge_certificate_authorities
  tls_termination jsonb,                         -- {enabled, min_version}
  created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX https_edges_account_id ON https_edges (account_id, id);

-- One row per hostport: the primary key makes a hostport unique across all edges (409 on clash).
CREATE TABLE https_edge_hostports (
  hostport    text PRIMARY KEY,
  edge_id     text COLLATE "C" NOT NULL REFERENCES https_edges(id) ON DELETE CASCADE
);
CREATE INDEX https_edge_hostports_edge_id ON https_edge_hostports (edge_id);

-- mutual_tls certificate authorities; RESTRICT keeps a CA from being deleted while listed (409).
CREATE TABLE https_edge_certificate_authorities (
  edge_id     text COLLATE "C" NOT NULL REFERENCES https_edges(id) ON DELETE CASCADE,
  ca_id       text COLLATE "C" NOT NULL REFERENCES certificate_authorities(id) ON DELETE RESTRICT,
  position    int NOT NULL,
  PRIMARY KEY (edge_id, ca_id)
);
CREATE INDEX https_edge_certificate_authorities_ca_id ON https_edge_certificate_authorities (ca_id);

CREATE TABLE https_edge_routes (
  id          text COLLATE "C" PRIMARY KEY,
  account_id  text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  edge_id     text COLLATE "C" NOT NULL REFERENCES https_edges(id) ON DELETE CASCADE,
  match_type  text NOT NULL CHECK (match_type IN ('exact_path', 'path_prefix')),
  match       text NOT NULL,
  description text NOT NULL DEFAULT '',
  metadata    text NOT NULL DEFAULT '',
  modules     jsonb NOT NULL DEFAULT '{}',       -- module name -> stored module config (secrets included)
  backend_id  text COLLATE "C" REFERENCES tunnel_group_backends(id) ON DELETE RESTRICT,  -- mirrors modules.backend.backend_id
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (edge_id, match_type, match)
);
CREATE INDEX https_edge_routes_edge_id ON https_edge_routes (edge_id, id);
CREATE INDEX https_edge_routes_backend_id ON https_edge_routes (backend_id) WHERE backend_id IS NOT NULL;

-- ip_restriction policies of a route; RESTRICT keeps a listed IP policy from being deleted (409).
CREATE TABLE https_edge_route_ip_policies (
  route_id     text COLLATE "C" NOT NULL REFERENCES https_edge_routes(id) ON DELETE CASCADE,
  ip_policy_id text COLLATE "C" NOT NULL REFERENCES ip_policies(id) ON DELETE RESTRICT,
  position     int NOT NULL,
  PRIMARY KEY (route_id, ip_policy_id)
);
CREATE INDEX https_edge_route_ip_policies_policy ON https_edge_route_ip_policies (ip_policy_id);

CREATE TABLE event_destinations (
  id          text COLLATE "C" PRIMARY KEY,
  account_id  text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  description text NOT NULL DEFAULT '',
  metadata    text NOT NULL DEFAULT '',
  format      text NOT NULL DEFAULT 'json',
  target_kind text NOT NULL,
  target      jsonb NOT NULL,                    -- the configured branch only, secrets included
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_destinations_account_id ON event_destinations (account_id, id);

CREATE TABLE event_subscriptions (
  id          text COLLATE "C" PRIMARY KEY,
  account_id  text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  description text NOT NULL DEFAULT '',
  metadata    text NOT NULL DEFAULT '',
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_subscriptions_account_id ON event_subscriptions (account_id, id);

CREATE TABLE event_subscription_sources (
  subscription_id text COLLATE "C" NOT NULL REFERENCES event_subscriptions(id) ON DELETE CASCADE,
  type            text NOT NULL,
  position        int NOT NULL,
  PRIMARY KEY (subscription_id, type)
);

CREATE TABLE event_subscription_destinations (
  subscription_id text COLLATE "C" NOT NULL REFERENCES event_subscriptions(id) ON DELETE CASCADE,
  destination_id  text COLLATE "C" NOT NULL REFERENCES event_destinations(id) ON DELETE RESTRICT,
  position        int NOT NULL,
  PRIMARY KEY (subscription_id, destination_id)
);
CREATE INDEX event_subscription_destinations_dest ON event_subscription_destinations (destination_id);

-- Agent sessions and tunnels are written by ingress nodes (live-traffic issue); read-only in the API.
CREATE TABLE tunnel_sessions (
  id               text COLLATE "C" PRIMARY KEY,
  account_id       text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  credential_id    text COLLATE "C" REFERENCES credentials(id) ON DELETE CASCADE,
  agent_version    text NOT NULL DEFAULT '',
  ip               text NOT NULL DEFAULT '',
  metadata         text NOT NULL DEFAULT '',
  os               text NOT NULL DEFAULT '',
  region           text NOT NULL DEFAULT 'us',
  ingress_node     text NOT NULL DEFAULT '',
  lease_expires_at timestamptz NOT NULL DEFAULT now(),
  started_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tunnel_sessions_account_id ON tunnel_sessions (account_id, id);

CREATE TABLE tunnels (
  id                text COLLATE "C" PRIMARY KEY,
  account_id        text COLLATE "C" NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
  tunnel_session_id text COLLATE "C" NOT NULL REFERENCES tunnel_sessions(id) ON DELETE CASCADE,
  public_url        text NOT NULL DEFAULT '',
  proto             text NOT NULL DEFAULT '',
  labels            jsonb NOT NULL DEFAULT '{}',
  forwards_to       text NOT NULL DEFAULT '',
  metadata          text NOT NULL DEFAULT '',
  region            text NOT NULL DEFAULT 'us',
  started_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tunnels_account_id ON tunnels (account_id, id);
CREATE INDEX tunnels_labels ON tunnels USING gin (labels);

-- Transactional outbox: every API change writes one row here in the same transaction. The
-- config push and the event pipeline (later issues) read it in seq order.
CREATE TABLE outbox (
  seq           bigserial PRIMARY KEY,
  event_id      text COLLATE "C" NOT NULL UNIQUE,
  account_id    text COLLATE "C" NOT NULL,
  event_type    text NOT NULL,                   -- e.g. ip_policy_created.v0
  resource_type text NOT NULL,                   -- e.g. ip_policy
  resource_id   text COLLATE "C" NOT NULL,
  object        jsonb NOT NULL,                  -- the resource as the API returns it, secrets ""
  principal     jsonb,
  created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_account_created ON outbox (account_id, seq);
