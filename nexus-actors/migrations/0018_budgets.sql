-- Execution budgets (docs/executions.md, "Budgets"). An input may carry a budget
-- {deadline_ms?, max_model_tokens?, max_cost_usd?, max_tool_calls?, max_children?}, validated at
-- admission and frozen on its execution at materialization: inputs.budget is that object as JSON
-- text, null when the input sets none. executions.budget is the execution's ledger (its limits,
-- what is reserved and what is used) as JSON text, written with every save so that usage and
-- reservations survive a restart; null for an execution without a budget.
ALTER TABLE inputs ADD COLUMN budget TEXT;
ALTER TABLE executions ADD COLUMN budget TEXT;
