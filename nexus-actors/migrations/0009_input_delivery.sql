-- One execution at a time per conversation (docs/executions.md, "Conversations: one turn at a
-- time"). An input is delivered as a turn of its own (`queue`, the default) or steered into the
-- conversation's live execution (`steer`). A steer that a live execution will apply has no
-- execution of its own: `steer_outcome` stays null until the live execution applies it
-- (`applied`, with the execution and the round at whose boundary it was applied), it becomes a
-- turn with its own execution (`turn`), or it is canceled (`canceled`, with an execution that
-- ended `canceled` without materializing). Every write of `steer_outcome` is a compare-and-set
-- from null, so a steer is disposed of once.
ALTER TABLE inputs ADD COLUMN delivery_mode TEXT NOT NULL DEFAULT 'queue';
ALTER TABLE inputs ADD COLUMN steer_outcome TEXT;
ALTER TABLE inputs ADD COLUMN applied_execution_public_id TEXT;
ALTER TABLE inputs ADD COLUMN applied_round BIGINT;

-- The live executions of a conversation, read at every admission and every hand-off.
CREATE INDEX executions_by_conversation ON executions (conversation_public_id, status);
