-- Memory (docs/kernel-tools.md, "memory"): documents an Agent keeps, addressed binding/path. A
-- document belongs to one root: the Agent whose memory it is, a scope (conversation | workspace |
-- speaker) and the owner the scope names (the conversation, the Agent, the speaking Human). The
-- document row holds the current revision; a deleted document keeps its row with a NULL content,
-- so its revisions keep counting up when it is written again. Every write adds one revision, with
-- the task that made it (execution + task key, unique: a kernel call run again after a restart
-- finds its revision and answers it) or the member who wrote it through a door.
CREATE TABLE memory_documents (
    agent_public_id TEXT NOT NULL,
    scope           TEXT NOT NULL,
    owner_public_id TEXT NOT NULL,
    path            TEXT NOT NULL,
    content         TEXT,                     -- NULL: deleted
    bytes           BIGINT NOT NULL,
    revision        BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (agent_public_id, scope, owner_public_id, path)
);

CREATE TABLE memory_revisions (
    agent_public_id     TEXT NOT NULL,
    scope               TEXT NOT NULL,
    owner_public_id     TEXT NOT NULL,
    path                TEXT NOT NULL,
    revision            BIGINT NOT NULL,
    content             TEXT,                 -- NULL: the delete marker
    bytes               BIGINT NOT NULL,
    execution_public_id TEXT,
    task_key            TEXT,
    member_public_id    TEXT,
    created_at          BIGINT NOT NULL,
    PRIMARY KEY (agent_public_id, scope, owner_public_id, path, revision)
);

-- The reconciliation lookup of a kernel call's write (NULLs are distinct on both backends).
CREATE UNIQUE INDEX memory_revisions_by_task ON memory_revisions (execution_public_id, task_key);
