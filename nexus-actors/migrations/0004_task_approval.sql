-- The approval fact of a tool call (spec/REFERENCE.md 10): JSON {origin: mode|rule|author|kernel|
-- human|agent, decided_by?, decided_at}, written when the approval stage or a person decides.
-- NULL while the task is parked in needs_approval, for calls refused before the stage, and for
-- rows written before this migration.
ALTER TABLE tasks ADD COLUMN approval TEXT;
