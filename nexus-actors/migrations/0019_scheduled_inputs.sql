-- Scheduled inputs (docs/executions.md, "Scheduled inputs"). An input admitted with `deliver_at`
-- (Unix milliseconds) is held out of its conversation's line until then: its execution is
-- `pending` from admission, but the line reads only inputs that are not held. `delivered_at` is
-- written once, by the compare-and-set that delivers it (from null, while its execution still
-- waits), in the same statement that moves it to the conversation's next turn. An input without
-- `deliver_at` was never held; one with `deliver_at` and no `delivered_at` is held.
ALTER TABLE inputs ADD COLUMN deliver_at BIGINT;
ALTER TABLE inputs ADD COLUMN delivered_at BIGINT;

-- The held inputs, read at recovery (every delivery timer is re-armed from it) and at each
-- admission to a conversation (held inputs count toward its 16 waiting inputs). The partial index
-- holds only held rows, so both reads cost what is scheduled now, never the delivered history. A
-- query uses it only when its WHERE names the same condition, verbatim.
CREATE INDEX inputs_held ON inputs (conversation_public_id, deliver_at)
    WHERE deliver_at IS NOT NULL AND delivered_at IS NULL;
