-- The history search of the kernel tool session_search (docs/kernel-tools.md, "session_search and
-- session_read") walks the answering Agent's inputs newest first, (created_at, public_id)
-- descending, and pages with a keyset on the same columns. A substring match cannot use an
-- index, but this one lets a page stop after its `limit` matches instead of sorting the Agent's
-- whole history first.
CREATE INDEX inputs_search ON inputs (member_public_id, created_at, public_id);
