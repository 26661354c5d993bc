//! Command tools (`[[tool]]` of the tools file): any program, run as one child process of
//! [`super::process`] (own process group, timeout, cancel, output bounds, the call's sweep), in
//! the workdir (`docs/runner-tools.md`, "Command tools").
//!
//! In: the call's `tool_input` as JSON on stdin, then EOF; the same JSON in `NEXUS_TOOL_INPUT`
//! when it is at most [`MAX_INPUT_ENV_BYTES`]; `NEXUS_TOOL_NAME`, `NEXUS_RUN_ID` and
//! `NEXUS_TASK_KEY`; and the tool's `env`.
//!
//! Out: a zero exit whose stdout is exactly one JSON object with a string `content` is the
//! result `{content, is_error (default false), structured_content (default null)}`; any other
//! stdout of a zero exit is the plain-text `content`. A non-zero exit, a kill at the timeout and
//! a stop are `is_error: true`, the content naming the exit code (or why it was killed) and
//! carrying the tail of stderr.

use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::process::Command;
use tokio::time::Instant;

use super::bash::exit_code;
use super::process::{self, Capture, Exited, Killed, NotStarted, TAIL_BYTES};
use super::{EffectKind, StopReason, ToolContext, ToolOutcome};
use crate::toolsfile::CommandTool;

/// `NEXUS_TOOL_INPUT` carries the input only up to this many bytes (32 KiB); stdin always does.
pub(crate) const MAX_INPUT_ENV_BYTES: usize = 32 * 1024;

/// Runs one call of `tool` to its outcome.
pub(super) async fn run(tool: &CommandTool, input: Map<String, Value>, ctx: &mut ToolContext) -> ToolOutcome {
    let input = Value::Object(input).to_string();
    // The sentence names this budget, never the elapsed time, so equal timeouts give equal bytes.
    let timeout_ms = ctx.task_timeout_ms.map_or(tool.timeout_ms, |ms| ms.min(tool.timeout_ms));
    let started = Instant::now();
    let budget = started + Duration::from_millis(timeout_ms);
    let kill_at = ctx.clamp_at.map_or(budget, |clamp| clamp.min(budget));

    let mut command = Command::new(&tool.program);
    command.args(&tool.args).envs(&tool.env).env("NEXUS_TOOL_NAME", &tool.name);
    if input.len() <= MAX_INPUT_ENV_BYTES {
        command.env("NEXUS_TOOL_INPUT", &input);
    } else {
        command.env_remove("NEXUS_TOOL_INPUT");
    }
    match ctx.claim.as_ref().map(|claim| claim.task()) {
        Some(task) => command.env("NEXUS_RUN_ID", &task.run_public_id).env("NEXUS_TASK_KEY", &task.task_key),
        None => command.env_remove("NEXUS_RUN_ID").env_remove("NEXUS_TASK_KEY"),
    };
    let name = &tool.name;
    match process::run(command, Some(input.into_bytes()), kill_at, ctx).await {
        Ok(exited) => render(tool, exited, timeout_ms),
        Err(NotStarted::Spawn(err)) if !ctx.workdir.is_dir() => ToolOutcome::Failed {
            content: format!("could not start `{name}`: the workdir {} is missing ({err})", ctx.workdir.display()),
        },
        Err(err) => {
            ToolOutcome::Failed { content: format!("could not start `{name}` ({}): {err}", tool.program.display()) }
        }
    }
}

fn render(tool: &CommandTool, exited: Exited, timeout_ms: u64) -> ToolOutcome {
    let Exited { status, killed, stdout, stderr } = exited;
    let name = &tool.name;
    let effect = match tool.effect_profile.kind {
        EffectKind::Write => "; whether it took effect is unknown",
        EffectKind::ReadOnly | EffectKind::Pure => "",
    };
    let truncated = stdout.truncated() || stderr.truncated();
    let why = match (killed, &status) {
        (Some(Killed::Timeout), _) => Some(format!("`{name}` was killed after its timeout of {timeout_ms} ms{effect}")),
        (Some(Killed::Stopped(StopReason::Canceled)), _) => {
            Some(format!("`{name}` was killed because its task was canceled{effect}"))
        }
        (Some(Killed::Stopped(StopReason::Shutdown)), _) => {
            Some(format!("`{name}` was killed because the runner shut down{effect}"))
        }
        _ => None,
    };
    if let Some(why) = why {
        return ToolOutcome::Completed {
            content: with_tail(why, &stderr),
            structured_content: json!({
                "exit_code": null, "stdout": stdout.text(), "stderr": stderr.text(), "truncated": truncated,
                "killed": true, "timeout_ms": timeout_ms,
            }),
            is_error: true,
        };
    }
    let status = match status {
        Some(Ok(status)) => status,
        Some(Err(err)) => return ToolOutcome::error(format!("could not wait for `{name}`: {err}{effect}")),
        None => return ToolOutcome::error(format!("`{name}` ended without an exit status{effect}")),
    };
    let code = exit_code(status);
    if code != 0 {
        let mut content = with_tail(format!("`{name}` exited with code {code}"), &stderr);
        if stderr.total == 0 && stdout.total > 0 {
            content.push_str(&format!("\nstdout (its last {TAIL_BYTES} bytes at most):\n{}", stdout.tail_text()));
        }
        return ToolOutcome::Completed {
            content,
            structured_content: json!({
                "exit_code": code, "stdout": stdout.text(), "stderr": stderr.text(), "truncated": truncated,
            }),
            is_error: true,
        };
    }
    if !stdout.truncated()
        && let Some(result) = structured(&stdout.text())
    {
        return result;
    }
    let mut content = stdout.text();
    if stdout.truncated() {
        content.push_str(&format!("\n[stdout cut: showing the first {} of {} bytes]", stdout.kept(), stdout.total));
    }
    ToolOutcome::Completed { content, structured_content: Value::Null, is_error: false }
}

/// The structured result in `stdout`: exactly one JSON object with a string `content`, a boolean
/// (or absent) `is_error`, and any `structured_content`.
fn structured(stdout: &str) -> Option<ToolOutcome> {
    let Ok(Value::Object(mut object)) = serde_json::from_str::<Value>(stdout.trim()) else {
        return None;
    };
    let is_error = match object.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(_) => return None,
    };
    let Some(Value::String(content)) = object.remove("content") else {
        return None;
    };
    let structured_content = object.remove("structured_content").unwrap_or(Value::Null);
    Some(ToolOutcome::Completed { content, structured_content, is_error })
}

/// `sentence`, then the tail of stderr when it wrote anything.
fn with_tail(mut sentence: String, stderr: &Capture) -> String {
    if stderr.total > 0 {
        sentence.push_str(&format!("\nstderr (its last {TAIL_BYTES} bytes at most):\n{}", stderr.tail_text()));
    }
    sentence
}

#[cfg(test)]
mod tests;
