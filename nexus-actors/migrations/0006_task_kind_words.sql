-- Task kinds take the spec's graph words (docs/executions.md, "Task kinds"): a tool call's row is
-- a `tool_task`, as `model_task` already was. `tool_call` stays the word runners see for a
-- claimable row (docs/protocol.md, "Inbox rows"); it is no longer stored.
UPDATE tasks SET kind = 'tool_task' WHERE kind = 'tool_call';
