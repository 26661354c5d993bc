-- What each node runs with, so that nodes of one database that differ are told (docs/cluster.md,
-- "Settings every node shares"): `lease_ms` is its `[cluster] lease_ms` (0 for a row an older
-- nexus wrote), `providers_digest` the SHA-256 (first 16 hex digits) of its `[providers]` table
-- as JSON ('' for a row an older nexus wrote).
ALTER TABLE cluster_nodes ADD COLUMN lease_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cluster_nodes ADD COLUMN providers_digest TEXT NOT NULL DEFAULT '';
