-- When each hostport was added to its edge (Unix ms, the control plane's clock), so that the data
-- plane decides a hostname race between an HTTPS edge and an agent endpoint of another account by
-- when the edge claimed that host, not by when the edge was created: an edge made long ago and
-- updated to add a host an endpoint had just taken (before the control plane knew of the
-- endpoint) must yield to it. NULL (rows from before this column): since the edge's creation.
ALTER TABLE https_edge_hostports ADD COLUMN claimed_ms bigint;
