//! The discovery bridge and the source routing of `skill` (`docs/kernel-tools.md`, "tool_call"
//! and "skill"): pure steps of [`super::task_for_call`] between reading a call's input and the
//! approval stage.
//!
//! - `tool_call {name, input}` is no task of its own: it expands into the call of `name`, an
//!   exact callable of the FROZEN set (deferred ones included), built as a direct call of it
//!   would be (alias mapping, route and target, timeout, effect profile) and then staged like one.
//!   The row keeps `tool_call` as its callable name beside the target's served name, the way an
//!   alias is recorded; it is not a bypass.
//! - `skill {name}` goes where its argument comes from: a document the selected runner announced
//!   is a runner task on that runner's `skill` tool; any other name runs in-process
//!   ([`super::kernel`]).

use serde_json::{Value, json};

use crate::declaration::tools::{SKILL_CANONICAL, TOOL_CALL_CANONICAL};
use crate::declaration::{FrozenDeclaration, FrozenTool};
use crate::store::TaskRow;

/// Why a `tool_call` cannot expand: the failure word and the sentence the model reads.
pub type Refused = (&'static str, String);

/// The target of a `tool_call`: when `tool` is `tool_call` (under any spelling), the frozen
/// callable `input.name` of `declaration` and its input `input.input`; `None` for any other tool.
/// `input` is the call's input after `tool`'s own alias mapping.
///
/// # Errors
/// `invalid_tool_input` when `name` is not a string or `input` is missing or not an object;
/// `tool_not_declared` when `name` is not a frozen callable, or is `tool_call` itself.
pub fn expand<'a>(
    declaration: &'a FrozenDeclaration,
    tool: &FrozenTool,
    input: &'a Value,
) -> Result<Option<(&'a FrozenTool, &'a Value)>, Refused> {
    if tool.canonical_name() != Some(TOOL_CALL_CANONICAL) || tool.route.is_some() {
        return Ok(None);
    }
    if let Some(unknown) =
        input.as_object().and_then(|fields| fields.keys().find(|k| !matches!(k.as_str(), "name" | "input")))
    {
        let unknown: String = unknown.chars().take(64).collect();
        return Err(("invalid_tool_input", format!("{}: takes name and input; remove {unknown:?}", tool.name)));
    }
    let name = match input.get("name") {
        Some(Value::String(name)) => name.as_str(),
        Some(_) => {
            return Err((
                "invalid_tool_input",
                format!("{}: name must be a string: the exact name of a declared tool", tool.name),
            ));
        }
        None => {
            return Err((
                "invalid_tool_input",
                format!(
                    "{}: name is required: the exact name of a declared tool (find it with tool_search)",
                    tool.name
                ),
            ));
        }
    };
    let target_input = match input.get("input") {
        Some(object @ Value::Object(_)) => object,
        Some(_) => return Err(("invalid_tool_input", format!("{}: input must be an object", tool.name))),
        None => {
            return Err((
                "invalid_tool_input",
                format!("{}: input is required: the tool's arguments, an object", tool.name),
            ));
        }
    };
    match declaration.tools.iter().find(|t| t.name == name) {
        Some(target) if target.canonical_name() == Some(TOOL_CALL_CANONICAL) && target.route.is_none() => Err((
            "tool_not_declared",
            format!("{name} cannot be called through {}: call the tool you mean by its own name", tool.name),
        )),
        Some(target) => Ok(Some((target, target_input))),
        None => Err((
            "tool_not_declared",
            format!(
                "{name} is not a declared tool; call tool_search first and pass the exact name it returns to {}",
                tool.name
            ),
        )),
    }
}

/// Routes a resolved `skill` row by the source of its argument: a skill a runner announced is
/// addressed to that runner's `skill` tool (target, served name `skill`, input `{name}`, the
/// announced effect profile and `timeout_ms`); any other row is left as it is. `tool` is the
/// callable the row runs as.
pub fn route_skill(declaration: &FrozenDeclaration, tool: &FrozenTool, task: &mut TaskRow) {
    if tool.canonical_name() != Some(SKILL_CANONICAL) || tool.route.is_some() {
        return;
    }
    let Some(name) = task.tool_input["name"].as_str() else { return };
    let Some(skill) = declaration.skills.iter().find(|s| s.name == name) else { return };
    let Some(route) = &skill.route else { return };
    task.target_executor_public_id = Some(route.runner_executor_public_id);
    task.tool_name.clone_from(&route.tool_name);
    task.tool_input = json!({"name": name});
    if skill.effect_profile.is_some() {
        task.effect_profile.clone_from(&skill.effect_profile);
    }
    if let Some(timeout) = skill.timeout_ms {
        task.timeout_ms = i64::try_from(timeout).unwrap_or(i64::MAX);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::declaration::tools::RunnerSelection;
    use crate::declaration::{Eligibility, RunnerFacts, freeze};

    fn frozen() -> (FrozenDeclaration, nexus_proto::RunnerId) {
        let runner = nexus_proto::RunnerId::new_v4();
        let effect = json!({"kind":"read_only","destructive":false,"effect_scope":"closed","idempotency":"intrinsic","reconciliation":"none"});
        let facts = RunnerFacts {
            public_id: runner,
            display_name: "w".into(),
            eligibility: Eligibility::Eligible,
            announcement: json!({"tools": [
                {"name": "bash", "description": "Run", "input_schema": {"type": "object"}, "effect_profile": effect, "timeout_ms": 5000},
                {"name": "skill", "effect_profile": effect, "timeout_ms": 7000},
            ], "environment": {}, "documents": [{"name": "deploy", "description": "How to deploy"}]}),
        };
        let configuration = json!({"approval_mode": "bypass", "runner_executor_public_ids": [runner],
            "kernel_tools": ["nexus.tools.search", "nexus.tools.call", "nexus.skill.load"],
            "tool_definitions": [{"name": "Run", "canonical": "nexus.tools.call"}]});
        let frozen = freeze(&configuration, None, RunnerSelection::FirstEligible, &[facts], None).expect("frozen");
        (frozen, runner)
    }

    fn tool<'a>(frozen: &'a FrozenDeclaration, name: &str) -> &'a FrozenTool {
        frozen.tools.iter().find(|t| t.name == name).expect(name)
    }

    #[test]
    fn tool_call_expands_into_its_frozen_target_deferred_included() {
        let (frozen, _) = frozen();
        let call = tool(&frozen, "tool_call");
        assert!(tool(&frozen, "bash").deferred(), "the runner import is deferred");
        let input = json!({"name": "bash", "input": {"command": "ls"}});
        let (target, target_input) = expand(&frozen, call, &input).expect("expands").expect("a target");
        assert_eq!((target.name.as_str(), target_input), ("bash", &json!({"command": "ls"})));
        // An alias of tool_call expands the same way; any other tool is itself.
        let input = json!({"name": "bash", "input": {}});
        let (target, _) = expand(&frozen, tool(&frozen, "Run"), &input).expect("alias").expect("a target");
        assert_eq!(target.name, "bash");
        assert!(expand(&frozen, tool(&frozen, "bash"), &json!({"command": "ls"})).expect("direct").is_none());
    }

    #[test]
    fn tool_call_refusals() {
        let (frozen, _) = frozen();
        let call = tool(&frozen, "tool_call");
        let rows = [
            ("undeclared", json!({"name": "deploy", "input": {}}), "tool_not_declared"),
            ("itself", json!({"name": "tool_call", "input": {"name": "bash", "input": {}}}), "tool_not_declared"),
            ("its alias", json!({"name": "Run", "input": {}}), "tool_not_declared"),
            ("name missing", json!({"input": {}}), "invalid_tool_input"),
            ("name not a string", json!({"name": 3, "input": {}}), "invalid_tool_input"),
            ("input missing", json!({"name": "bash"}), "invalid_tool_input"),
            ("input not an object", json!({"name": "bash", "input": "ls"}), "invalid_tool_input"),
        ];
        for (row, input, word) in rows {
            let refused = expand(&frozen, call, &input).map(|found| found.map(|(t, _)| t.name.clone())).expect_err(row);
            assert_eq!(refused.0, word, "{row}: {}", refused.1);
        }
        let input = json!({"name": "deploy", "input": {}});
        let (_, message) = expand(&frozen, call, &input).map(|_| ()).expect_err("undeclared");
        assert!(message.contains("deploy") && message.contains("tool_search"), "{message}");
    }

    #[test]
    fn a_runner_document_routes_skill_to_that_runner() {
        let (frozen, runner) = frozen();
        assert_eq!(frozen.skills.len(), 1, "the selected runner's documents are frozen when skill is declared");
        let skill = tool(&frozen, "skill");
        let mut row = TaskRow::new(
            nexus_proto::ExecutionId::new_v4(),
            nexus_proto::TaskKey::Call { round: 1, index: 0 },
            1,
            "skill".into(),
            1,
            0,
        );
        row.tool_input = json!({"name": "deploy", "extra": true});
        route_skill(&frozen, skill, &mut row);
        assert_eq!(row.target_executor_public_id, Some(runner));
        assert_eq!(
            (row.tool_name.as_str(), &row.tool_input, row.timeout_ms),
            ("skill", &json!({"name": "deploy"}), 7000)
        );
        let mut other = TaskRow { target_executor_public_id: None, ..row.clone() };
        other.tool_input = json!({"name": "elsewhere"});
        route_skill(&frozen, skill, &mut other);
        assert_eq!(other.target_executor_public_id, None, "any other name runs in-process");
        // Without `skill` declared nothing is frozen.
        let configuration = json!({"approval_mode": "bypass", "kernel_tools": ["nexus.tools.search"]});
        let bare = freeze(&configuration, None, RunnerSelection::NoRunner, &[], None).expect("frozen");
        assert!(bare.skills.is_empty());
    }
}
