-- The open inbox (spec/REFERENCE.md 6.5): a runner's open tasks, read in offer order
-- (started_at, task_key) when its ExecutorActor loads, and which runners have any, read at
-- recovery. The partial index holds only open rows, so both reads cost what is open, never the
-- settled history, and the offer order needs no sort. It replaces the (target, status) index,
-- whose only readers were these two queries; a settled row now leaves the index instead of
-- staying in it. A query uses it only when its WHERE names the same status list, verbatim.
DROP INDEX IF EXISTS tasks_open_by_target;
CREATE INDEX tasks_open_inbox ON tasks (target_executor_public_id, started_at, task_key)
    WHERE status IN ('dispatched', 'running');
