-- Request forwarding between nodes (docs/cluster.md, "Any node answers"): `forward_key` is a
-- random secret the holder draws at each take-over. A standby reads it with the lease and sends it
-- on every request it forwards to the holder, so the holder can trust the caller's address the
-- standby reports (the doors' loopback rule and failed-credential throttle key on it) and refuse
-- a request that merely claims to be forwarded. Empty until a node of this version takes the lease.
ALTER TABLE cluster_lease ADD COLUMN forward_key TEXT NOT NULL DEFAULT '';
