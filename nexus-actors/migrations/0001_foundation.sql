-- The foundation schema. Portable SQL: TEXT, BIGINT and no engine-specific types, so the same
-- file serves SQLite now and PostgreSQL next. Times are Unix milliseconds; booleans are 0/1.

CREATE TABLE members (
    public_id    TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,            -- agent | human
    handle       TEXT NOT NULL UNIQUE,
    display_name TEXT NOT NULL,
    created_at   BIGINT NOT NULL
);

-- Bearer credentials, stored only as SHA-256 digests (hex).
CREATE TABLE credentials (
    digest            TEXT PRIMARY KEY,
    plane             TEXT NOT NULL,       -- member | executor_transport
    subject_public_id TEXT NOT NULL,       -- a member or an executor
    credential_epoch  BIGINT NOT NULL,
    created_at        BIGINT NOT NULL,
    expires_at        BIGINT
);

CREATE TABLE profiles (
    member_public_id          TEXT PRIMARY KEY,
    configuration             TEXT,        -- canonical JSON, null until declared
    system_prompt             TEXT,        -- {content, role} JSON or null
    system_prompt_version     BIGINT NOT NULL,
    summarizer                TEXT,
    summarizer_version        BIGINT NOT NULL,
    declared_at               BIGINT
);

CREATE TABLE executors (
    public_id        TEXT PRIMARY KEY,
    kind             TEXT NOT NULL,        -- runner
    display_name     TEXT NOT NULL,
    status           TEXT NOT NULL,        -- active | revoked
    assignment_scope TEXT NOT NULL,        -- account_wide | user_private
    credential_epoch BIGINT NOT NULL,
    announcement     TEXT NOT NULL,        -- canonical {tools, environment, documents}
    announced_at     BIGINT,
    connected_at     BIGINT,
    last_seen_at     BIGINT,
    created_at       BIGINT NOT NULL
);

CREATE TABLE conversations (
    public_id        TEXT PRIMARY KEY,
    member_public_id TEXT NOT NULL,
    created_at       BIGINT NOT NULL
);

CREATE TABLE inputs (
    public_id                  TEXT PRIMARY KEY,
    conversation_public_id     TEXT NOT NULL,
    member_public_id           TEXT NOT NULL,
    text                       TEXT NOT NULL,
    execution_declaration      TEXT,       -- the authored inline object, or null
    runner_executor_public_id  TEXT,
    tool_names                 TEXT,       -- JSON array or null
    created_at                 BIGINT NOT NULL
);

CREATE TABLE executions (
    public_id              TEXT PRIMARY KEY,
    conversation_public_id TEXT NOT NULL,
    input_public_id        TEXT NOT NULL,
    member_public_id       TEXT NOT NULL,
    status                 TEXT NOT NULL,  -- pending | running | needs_attention | canceling | completed | canceled
    attention_reason       TEXT,
    declaration            TEXT,           -- the frozen declaration, null until materialized
    transcript             TEXT NOT NULL,  -- JSON array of chat messages
    round                  BIGINT NOT NULL,
    final_text             TEXT,
    error_key              TEXT,
    event_seq              BIGINT NOT NULL,
    created_at             BIGINT NOT NULL,
    updated_at             BIGINT NOT NULL
);

-- Tasks are the inbox rows. One row per (run, task_key); claim tokens only as digests.
CREATE TABLE tasks (
    run_public_id             TEXT NOT NULL,
    task_key                  TEXT NOT NULL,
    kind                      TEXT NOT NULL,   -- tool_call
    round                     BIGINT NOT NULL,
    callable_name             TEXT NOT NULL,   -- the name the model called
    tool_name                 TEXT NOT NULL,   -- the served name
    tool_input                TEXT NOT NULL,
    tool_call_id              TEXT NOT NULL,
    target_executor_public_id TEXT,
    effect_profile            TEXT,
    timeout_ms                BIGINT NOT NULL,
    status                    TEXT NOT NULL,   -- task statuses of REFERENCE.md 7
    claimed                   BIGINT NOT NULL,
    claim_token_digest        TEXT,
    started_at                BIGINT NOT NULL,
    deadline_at               BIGINT NOT NULL,
    result                    TEXT,            -- the committed {content, structured_content, is_error, ...}
    error_key                 TEXT,
    settled_at                BIGINT,
    PRIMARY KEY (run_public_id, task_key)
);
CREATE INDEX tasks_open_by_target ON tasks (target_executor_public_id, status);

-- The durable event log, cursor-addressed per execution.
CREATE TABLE events (
    execution_public_id TEXT NOT NULL,
    seq                 BIGINT NOT NULL,
    type                TEXT NOT NULL,
    data                TEXT NOT NULL,
    at                  BIGINT NOT NULL,
    PRIMARY KEY (execution_public_id, seq)
);
