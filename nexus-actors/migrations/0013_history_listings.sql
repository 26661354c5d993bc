-- History you can read (docs/executions.md, "History"): the listings of conversations and
-- executions read a member's rows newest first, (created_at, public_id) descending, and page with
-- a keyset on the same columns; a conversation's turns find their executions (every candidate of a
-- regenerated turn) by input. Each index serves exactly one of those reads, so a page costs what it
-- shows, never the member's whole history.
CREATE INDEX conversations_listing ON conversations (member_public_id, created_at, public_id);
CREATE INDEX executions_listing ON executions (member_public_id, created_at, public_id);
CREATE INDEX executions_listing_by_conversation ON executions (conversation_public_id, created_at, public_id);
CREATE INDEX executions_candidates_by_input ON executions (input_public_id, created_at, public_id);
