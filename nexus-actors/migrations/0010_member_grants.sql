-- People in the loop (docs/executions.md, "People in the loop"): a Human member holds at most one
-- grant on an Agent, as its `steward` (posts inputs and acts on the Agent's executions) or its
-- `viewer` (reads them). A repeat grant replaces the role; a revoke deletes the row, and the next
-- request is judged without it.
CREATE TABLE member_grants (
    agent_public_id TEXT NOT NULL,
    human_public_id TEXT NOT NULL,
    role            TEXT NOT NULL,            -- steward | viewer
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (agent_public_id, human_public_id)
);

-- The Agents a Human may read (the listing doors).
CREATE INDEX member_grants_by_human ON member_grants (human_public_id);
