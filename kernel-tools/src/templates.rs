//! The kernel tools' definition sources (`docs/declaration.md`, "Kernel imports").
//!
//! One JSON text per tool, in catalog order: `{type:"function", function:{name, description,
//! parameters}}`. Descriptions may carry tool-name macros `{{wire_name}}` that the catalog renders
//! with the wire names and a profile renders with its own spellings (`docs/declaration.md`,
//! "Aliases"). The texts are constants so the served bytes never drift; they are parsed once.

/// `nexus.graph.delegate_task`.
const DELEGATE_TASK: &str = r#"{"type":"function","function":{"name":"delegate_task","description":"Delegate a self-contained piece of work to a sub-agent that starts with an empty context and inherits your tools. By default the task runs in the background: this call returns at once and the result arrives later as a task_result message; use {{wait}} to block on it. Set wait to true to run the task inline and receive its final answer as this call's result.","parameters":{"type":"object","properties":{"prompt":{"type":"string","description":"The complete instructions for the sub-agent. It sees nothing else of this conversation, so include every fact it needs."},"model":{"type":"string","description":"A provider/model reference to run the task with. Defaults to your current model."},"lifetime":{"type":"string","enum":["turn","conversation"],"description":"turn ends the task with the current turn; conversation lets it outlive the turn."},"wake":{"type":"string","enum":["auto","passive"],"description":"auto wakes you when the task finishes; passive delivers the result without starting a new turn."},"wait":{"type":"boolean","default":false,"description":"true runs the task inline and returns its final answer as this call's result; false (the default) runs it in the background."},"tools":{"type":"array","items":{"type":"string"},"description":"Narrows the sub-agent's tools to these names, each of which must be one of your own tools. Omit to pass on all of them."}},"required":["prompt"],"additionalProperties":false}}}"#;

/// `nexus.graph.wait`.
const WAIT: &str = r#"{"type":"function","function":{"name":"wait","description":"Wait for a background task started with {{delegate_task}} or {{spawn}} to finish and return its result. Returns early with the task's current state when the timeout passes.","parameters":{"type":"object","properties":{"task":{"type":"string","description":"The key of the task to wait for, as reported when it started."},"run_public_id":{"type":"string","description":"The run that owns the task, when it is not the current one."},"timeout_ms":{"type":"integer","minimum":1,"default":3600000,"description":"How long to wait, in milliseconds. Defaults to one hour; waits beyond 24 hours are cut to 24 hours."}},"required":["task"]}}}"#;

/// `nexus.human.ask`.
const ASK: &str = r#"{"type":"function","function":{"name":"ask","description":"Ask the human a question and pause until they answer. Use it only when you cannot proceed without a decision or a fact that only the human has. The answer arrives as this call's result.","parameters":{"type":"object","properties":{"prompt":{"type":"string","description":"The question, written so that it can be answered without further context."},"options":{"type":"array","items":{"type":"string"},"description":"Suggested answers to choose from."},"multi":{"type":"boolean","description":"Whether several options may be chosen together."}},"required":["prompt"],"additionalProperties":false}}}"#;

/// `nexus.conversation.spawn`.
const SPAWN: &str = r#"{"type":"function","function":{"name":"spawn","description":"Start a child conversation that works on its own, with its own history. Address it later with {{send}}, check it with {{status}}, stop it with {{cancel}}, or collect its result with {{wait}}.","parameters":{"type":"object","properties":{"prompt":{"type":"string","description":"The first message of the child conversation."},"agent":{"type":"string","description":"The agent that answers the child conversation. Defaults to you."},"label":{"type":"string","pattern":"^[a-z0-9][a-z0-9_-]*$","maxLength":64,"description":"A short name for the child, unique among this conversation's children, usable as its address."},"lifetime":{"type":"string","enum":["turn","conversation"],"description":"turn ends the child with the current turn; conversation lets it outlive the turn."},"wake":{"type":"string","enum":["auto","passive"],"description":"auto wakes you when the child finishes; passive delivers its result without starting a new turn."},"wait":{"type":"boolean","default":false,"description":"true blocks until the child answers and returns that answer as this call's result."},"default_runner_executor_public_id":{"type":["string","null"],"format":"uuid","description":"The Runner environment the child uses. Omit to inherit yours; null chooses no Runner."},"model":{"type":"string","description":"A provider/model reference for the child."}},"required":["prompt"]}}}"#;

/// `nexus.conversation.send`.
const SEND: &str = r#"{"type":"function","function":{"name":"send","description":"Send a message to another conversation: a child, a sibling or one you can address by id or label. Delivery can be immediate, delayed with deliver_in, or scheduled with deliver_at.","parameters":{"type":"object","properties":{"to":{"type":"string","description":"The conversation's public id or label."},"message":{"type":"string","description":"The message text."},"agent":{"type":"string","description":"The agent that should answer the message."},"steer":{"type":"boolean","description":"Deliver into the conversation's running turn instead of queueing it for the next one."},"deliver_in":{"type":"string","pattern":"^[0-9]+[smhd]$","description":"A delay such as 90s, 20m, 2h or 1d."},"deliver_at":{"type":"string","format":"date-time","description":"An ISO 8601 time with a UTC offset, such as 2026-01-31T09:00:00+01:00."},"wake":{"type":"string","enum":["auto","passive"],"description":"auto starts a turn when the message arrives; passive only queues it."},"model":{"type":"string","description":"A provider/model reference for the answering turn."}},"required":["to","message"]}}}"#;

/// `nexus.conversation.status`.
const STATUS: &str = r#"{"type":"function","function":{"name":"status","description":"Report the state of a conversation you can address: whether it is working, waiting or finished, and its latest result.","parameters":{"type":"object","properties":{"to":{"type":"string","description":"The conversation's public id or label."}},"required":["to"]}}}"#;

/// `nexus.conversation.cancel`.
const CANCEL: &str = r#"{"type":"function","function":{"name":"cancel","description":"Cancel the running work of a conversation you can address, such as a child started with {{spawn}}.","parameters":{"type":"object","properties":{"to":{"type":"string","description":"The conversation's public id or label."}},"required":["to"]}}}"#;

/// `nexus.conversation.search`.
const SESSION_SEARCH: &str = r#"{"type":"function","function":{"name":"session_search","description":"Search past conversations you can see by their text. Returns matching sessions with a snippet each; open one with {{session_read}}.","parameters":{"type":"object","properties":{"query":{"type":"string","maxLength":1024,"description":"The words to search for, at most 1024 bytes."},"archived":{"type":"string","enum":["exclude","include","only"],"description":"Whether archived conversations are left out (the default), included, or the only ones searched."},"include_auxiliary":{"type":"boolean","description":"Also search auxiliary conversations such as delegated tasks."},"limit":{"type":"integer","minimum":1,"maximum":50,"description":"The most results to return, 1 to 50."},"after":{"type":"string","description":"The cursor of the previous page, to continue a search."}},"required":["query"]}}}"#;

/// `nexus.conversation.read`.
const SESSION_READ: &str = r#"{"type":"function","function":{"name":"session_read","description":"Read turns of a past conversation found with {{session_search}}. Returns at most 50 turns and 12,000 characters per call; page with after_position and before_position.","parameters":{"type":"object","properties":{"session_id":{"type":"string","description":"The conversation to read."},"around_turn_id":{"type":"string","description":"Center the window on this turn."},"after_position":{"type":"integer","minimum":0,"description":"Read turns after this position."},"before_position":{"type":"integer","minimum":0,"description":"Read turns before this position."},"limit":{"type":"integer","minimum":1,"maximum":50,"description":"The most turns to return, 1 to 50."}},"required":["session_id"]}}}"#;

/// `nexus.memory.read`.
const MEMORY_READ: &str = r#"{"type":"function","function":{"name":"memory_read","description":"Read a memory document by path, optionally a window of its lines.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"The document's path, starting with its binding name, such as workspace/notes.md."},"offset":{"type":"integer","minimum":1,"description":"The first line to read, counting from 1."},"limit":{"type":"integer","minimum":1,"description":"The most lines to read."}},"required":["path"]}}}"#;

/// `nexus.memory.write`.
const MEMORY_WRITE: &str = r#"{"type":"function","function":{"name":"memory_write","description":"Create or replace a whole memory document. To change part of a document, use {{memory_edit}}.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"The document's path, starting with its binding name."},"content":{"type":"string","description":"The complete new content of the document."}},"required":["path","content"]}}}"#;

/// `nexus.memory.edit`.
const MEMORY_EDIT: &str = r#"{"type":"function","function":{"name":"memory_edit","description":"Replace one exact passage of a memory document. old_text must occur exactly once; read the document first with {{memory_read}}.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"The document's path, starting with its binding name."},"old_text":{"type":"string","description":"The passage to replace, which must occur exactly once."},"new_text":{"type":"string","description":"The text that replaces it."}},"required":["path","old_text","new_text"]}}}"#;

/// `nexus.memory.ls`.
const MEMORY_LS: &str = r#"{"type":"function","function":{"name":"memory_ls","description":"List the memory documents you can reach, optionally under a path prefix.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"A path prefix to list under. Omit to list every binding."}}}}}"#;

/// `nexus.memory.grep`.
const MEMORY_GREP: &str = r#"{"type":"function","function":{"name":"memory_grep","description":"Search the text of memory documents for a pattern and return the matching lines with their paths and line numbers.","parameters":{"type":"object","properties":{"pattern":{"type":"string","description":"The regular expression to search for."},"path":{"type":"string","description":"Search only under this path prefix."},"ignore_case":{"type":"boolean","description":"Match without regard to case."},"limit":{"type":"integer","minimum":1,"description":"The most matching lines to return."}},"required":["pattern"]}}}"#;

/// `nexus.memory.delete`.
const MEMORY_DELETE: &str = r#"{"type":"function","function":{"name":"memory_delete","description":"Delete a memory document.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"The document's path, starting with its binding name."}},"required":["path"]}}}"#;

/// `nexus.skill.load`.
const SKILL: &str = r#"{"type":"function","function":{"name":"skill","description":"Load a skill by name: its instructions and the resources it names. Load a skill before doing the work it describes.","parameters":{"type":"object","properties":{"name":{"type":"string","description":"The skill's name."}},"required":["name"]}}}"#;

/// `nexus.tools.search`.
const TOOL_SEARCH: &str = r#"{"type":"function","function":{"name":"tool_search","description":"Search the tools you may call but whose schemas are not listed: by name, description, environment or skill. An exact tool name returns that tool; otherwise every query term must match. Call a found tool directly or through {{tool_call}}.","parameters":{"type":"object","properties":{"query":{"type":"string","minLength":1,"description":"A tool name or search terms."},"limit":{"type":"integer","minimum":1,"maximum":20,"default":5,"description":"The most tools to return, 1 to 20."}},"required":["query"]}}}"#;

/// `nexus.tools.call`.
const TOOL_CALL: &str = r#"{"type":"function","function":{"name":"tool_call","description":"Call a tool by its exact name with its input, for a tool found with {{tool_search}}. The call goes through the same approval and deadlines as a direct call.","parameters":{"type":"object","properties":{"name":{"type":"string","description":"The exact name of the tool to call."},"input":{"type":"object","description":"The tool's input, matching its parameter schema."}},"required":["name","input"]}}}"#;

/// `nexus.runners.list`.
const RUNNERS_LIST: &str = r#"{"type":"function","function":{"name":"runners_list","description":"List the Runner environments this work may use, with their display names and environment facts, and the current one. Pass a Runner's id to {{spawn}} to work in another environment.","parameters":{"type":"object","properties":{},"additionalProperties":false}}}"#;

/// The definition sources in catalog order (the order of [`crate::catalog::CATALOG`]).
/// `nexus.graph.join`: nexus's extension (not in the origin's catalog), `docs/delegation.md`.
const JOIN: &str = r#"{"type":"function","function":{"name":"join","description":"Wait for several background tasks started with {{delegate_task}} or {{spawn}} under one policy and return each task's status and result. all_required: every task must succeed; the first failure ends the join and cancels the rest. first_success: the first task to succeed is the selection; the others are canceled, or detached with losers: detach. best_effort: ends when every task has ended, when min_successes have succeeded, or at the timeout, with whatever succeeded.","parameters":{"type":"object","properties":{"tasks":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":32,"description":"The keys of the tasks to join, as reported when they started."},"policy":{"type":"string","enum":["all_required","first_success","best_effort"],"description":"How the join decides."},"timeout_ms":{"type":"integer","minimum":1,"default":3600000,"description":"How long to wait, in milliseconds. Defaults to one hour; at most 24 hours."},"min_successes":{"type":"integer","minimum":1,"description":"best_effort: end once this many tasks have succeeded."},"losers":{"type":"string","enum":["cancel","detach"],"default":"cancel","description":"What happens to the tasks the join no longer needs: canceled (the default) or left running, their results arriving later as task_result messages."}},"required":["tasks","policy"],"additionalProperties":false}}}"#;

pub(crate) const TEMPLATES: [&str; 20] = [
    DELEGATE_TASK,
    WAIT,
    ASK,
    SPAWN,
    SEND,
    STATUS,
    CANCEL,
    SESSION_SEARCH,
    SESSION_READ,
    MEMORY_READ,
    MEMORY_WRITE,
    MEMORY_EDIT,
    MEMORY_LS,
    MEMORY_GREP,
    MEMORY_DELETE,
    SKILL,
    TOOL_SEARCH,
    TOOL_CALL,
    RUNNERS_LIST,
    JOIN,
];
