-- Delegation (docs/delegation.md): a child execution runs in a conversation of its own whose
-- parent is the delegating execution's conversation; the parent–child relation, the child's
-- disposition when its parent's turn ended, and the parent's consumption of its result are rows
-- here, written before they are acted on. The child's status and result are its execution row's.
ALTER TABLE conversations ADD COLUMN parent_conversation_public_id TEXT;
ALTER TABLE conversations ADD COLUMN label TEXT;
ALTER TABLE executions ADD COLUMN parent_execution_public_id TEXT;

CREATE TABLE children (
    parent_execution_public_id    TEXT NOT NULL,
    task_key                      TEXT NOT NULL,   -- the parent's call that started the child
    parent_conversation_public_id TEXT NOT NULL,
    kind                          TEXT NOT NULL,   -- delegate | spawn
    child_conversation_public_id  TEXT NOT NULL,
    child_execution_public_id     TEXT NOT NULL,
    lifetime                      TEXT NOT NULL,   -- turn | conversation
    wake                          TEXT NOT NULL,   -- auto | passive
    label                         TEXT,
    prompt_head                   TEXT NOT NULL,   -- the prompt's first 80 characters
    consumed_by                   TEXT,            -- task:<key> | execution:<id> | input:<id> | end:<id>
    consumed_at                   BIGINT,
    disposition                   TEXT,            -- canceled | detached
    owner                         TEXT,            -- who a detached child answers to
    created_at                    BIGINT NOT NULL,
    PRIMARY KEY (parent_execution_public_id, task_key)
);
CREATE INDEX children_by_child ON children (child_execution_public_id);
CREATE INDEX children_by_conversation ON children (parent_conversation_public_id);
CREATE INDEX conversations_by_parent ON conversations (parent_conversation_public_id);
