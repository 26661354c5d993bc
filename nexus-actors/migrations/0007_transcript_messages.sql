-- A transcript is stored one message per row (docs/architecture.md, "Transcript storage"), so a
-- save writes only the messages that are new and its bytes stay flat as an execution grows; the
-- whole JSON array in `executions.transcript` was written again on every save. A rewrite of the
-- transcript (a compaction) replaces the rows from the first message it changed.
--
-- `transcript_length` is how many rows the execution's transcript has; a reader reads the rows
-- below it, so a save committed between its two reads is never half seen. An execution written
-- before this migration has length 0 and its transcript whole in `executions.transcript`, where
-- it is read until the first save moves it here and leaves `[]` in its place. No data is
-- rewritten by this migration: expanding a JSON array is not portable SQL.
ALTER TABLE executions ADD COLUMN transcript_length BIGINT NOT NULL DEFAULT 0;

CREATE TABLE transcript_messages (
    execution_public_id TEXT NOT NULL,
    position            BIGINT NOT NULL,   -- 0-based, the message's index in the transcript
    message             TEXT NOT NULL,     -- one chat message as JSON
    PRIMARY KEY (execution_public_id, position)
);
