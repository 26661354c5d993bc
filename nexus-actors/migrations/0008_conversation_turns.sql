-- A conversation is its ordered turns (docs/executions.md, "Conversations"). Each input keeps its
-- place in its conversation (`turn`, 1-based, the order of admission) and who posted it
-- (`posted_by_public_id`: a Human steward posting to an Agent; null when the answering Agent
-- posted it itself). Inputs written before this migration are numbered in the order they were
-- created, ties broken by id.
ALTER TABLE inputs ADD COLUMN posted_by_public_id TEXT;
ALTER TABLE inputs ADD COLUMN turn BIGINT NOT NULL DEFAULT 0;

UPDATE inputs SET turn = (
    SELECT COUNT(*) FROM inputs AS earlier
    WHERE earlier.conversation_public_id = inputs.conversation_public_id
      AND (earlier.created_at < inputs.created_at
           OR (earlier.created_at = inputs.created_at AND earlier.public_id <= inputs.public_id))
);

CREATE UNIQUE INDEX inputs_by_turn ON inputs (conversation_public_id, turn);
