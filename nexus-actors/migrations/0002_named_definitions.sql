-- Named definitions (spec/REFERENCE.md 3, "Named definitions"): an Agent's spawnable leaf
-- declarations under PUT /agent_api/v1/profile/agents/{name}. A deleted definition keeps its row
-- (deleted_at set) so that a later PUT restores it.

CREATE TABLE named_definitions (
    member_public_id TEXT NOT NULL,
    name             TEXT NOT NULL,
    identifier       TEXT NOT NULL UNIQUE,  -- <caller agent_identifier>/<name>
    scope            TEXT NOT NULL,         -- instance | steward
    description      TEXT NOT NULL,
    configuration    TEXT NOT NULL,         -- canonical configuration JSON
    display_name     TEXT,
    system_prompt    TEXT,                  -- {content, role} JSON or null
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    deleted_at       BIGINT,
    PRIMARY KEY (member_public_id, name)
);
