-- IP policies named by the restrict-ips actions (`ip_policies`) of a route's traffic policy,
-- mirrored from modules.traffic_policy.value when it is saved. As for ip_restriction
-- (https_edge_route_ip_policies), RESTRICT keeps a named IP policy from being deleted (409).
CREATE TABLE https_edge_route_traffic_policy_ip_policies (
  route_id     text COLLATE "C" NOT NULL REFERENCES https_edge_routes(id) ON DELETE CASCADE,
  ip_policy_id text COLLATE "C" NOT NULL REFERENCES ip_policies(id) ON DELETE RESTRICT,
  PRIMARY KEY (route_id, ip_policy_id)
);
CREATE INDEX https_edge_route_traffic_policy_ip_policies_policy ON https_edge_route_traffic_policy_ip_policies (ip_policy_id);
