-- History you can read (docs/executions.md, "History"): the listings of conversations and
-- executions read a member's rows newest first, (created_at, public_id) descending, and page with
-- a keyset on the same columns; a conversation's turns find their executions (every candidate of a
-- regenerated turn) by input. Each index serves exactly one of those reads, so a page costs what it
-- shows, never the member's whole history. The status filter has no index of its own: the status
-- column is written by every execution save, and an index on it would add index writes to every
-- save; the filter walks the member's (or the conversation's) index newest first instead.
CREATE INDEX conversations_listing ON conversations (member_public_id, created_at, public_id);
CREATE INDEX executions_listing ON executions (member_public_id, created_at, public_id);
CREATE INDEX executions_listing_by_conversation ON executions (conversation_public_id, created_at, public_id);
CREATE INDEX executions_candidates_by_input ON executions (input_public_id, created_at, public_id);
