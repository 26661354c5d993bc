-- Whose runner is whose (docs/protocol.md, "Assignment"). A runner is `account_wide` (every Agent
-- of the deployment may use it) or `user_private`, which in nexus means "assigned": it serves only
-- the Agents listed here. Runners created before this migration keep `account_wide`, which is
-- what every runner was until now, so nothing they serve changes.
CREATE TABLE runner_assignments (
    runner_public_id TEXT NOT NULL,
    agent_public_id  TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (runner_public_id, agent_public_id)
);
CREATE INDEX runner_assignments_by_agent ON runner_assignments (agent_public_id);
