-- Several nodes on one PostgreSQL (docs/cluster.md). On SQLite these tables stay empty: one node
-- serves the data dir, kept alone by its flock.
--
-- `cluster_nodes`: one row per node that ever served this database, keyed by the node id kept in
-- its data dir (`DATA_DIR/node-id`). `role` is `active` (it holds the serve lease) or `standby`
-- (it waits for the lease); `heartbeat_at_ms` is the database's clock at its last heartbeat.
CREATE TABLE cluster_nodes (
    node_id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    role TEXT NOT NULL,
    started_at_ms BIGINT NOT NULL,
    heartbeat_at_ms BIGINT NOT NULL
);

-- `cluster_lease`: the serve lease, one row named `serve`. Its holder drives every execution and
-- every runner inbox; `generation` grows by one at each take-over, and every group-committed write
-- of the holder first checks (under a key-share row lock) that the row still names it, at its
-- generation, unexpired: a node that lost the lease commits nothing after a take-over.
CREATE TABLE cluster_lease (
    name TEXT PRIMARY KEY,
    holder TEXT,
    generation BIGINT NOT NULL,
    acquired_at_ms BIGINT NOT NULL,
    lease_until_ms BIGINT NOT NULL
);

INSERT INTO cluster_lease (name, holder, generation, acquired_at_ms, lease_until_ms) VALUES ('serve', NULL, 0, 0, 0);
