//! Prompt assembly: one model request's messages from the frozen documents, the conversation's
//! history and the turn's own transcript, by the declared `prompt_mechanism`
//! (`docs/prompt.md`, "The prompt as declared"). Pure: no I/O, no clock.
//!
//! - `raw`: the documents, then the turn. No history.
//! - `default`: `[system_prompt][character][persona][memory][skills][history][inline lead]
//!   [inline tail][input]`.
//! - `assembly`: the `prompt_template` blocks in their order, its `variables` at their defaults.
//!
//! Each block becomes its own message; the provider adapters join adjacent messages of the same
//! role into one, each block remaining its own part. Blocks nexus has no source for yet
//! (`character`, `persona`, `memory`, `lead`, `tail`), and `skills` when the execution has no
//! skill to list, render nothing and are named in the manifest's `empty_blocks`.
//!
//! # Skills
//!
//! The `skills` block is a system message listing the skills the execution froze (only when
//! `skill` is declared): the header `Skills available now.`, then one `- name: description` line
//! per skill, in order. It is at most [`SKILLS_BLOCK_BOUND`] bytes: skills whose lines do not fit
//! are listed by name only after them, and names that do not fit either are counted
//! ([`skills_block`]).
//!
//! # History
//!
//! A history *entry* is a user message, or an assistant message together with the tool results
//! answering its calls (so trimming never splits a call from its result). The entries are the
//! earlier turns' transcripts as the model last saw them, oldest first, without their documents
//! (system and developer messages); a call left without its result (a turn that ended mid-round)
//! is dropped from its message. Call ids are unique in one execution, not across turns: a history
//! call whose id is taken by a later turn goes out under `h{turn}c{n}`.
//!
//! # Budget
//!
//! Everything but history is a floor: the documents, the inline blocks, the turn and the tools are
//! always sent. History gets `cap` tokens, where (window = the model's `context_window_tokens`,
//! room = window minus the floor) `cap = min(room, max(min_tokens, min(max_tokens, share ×
//! window)))`, each term applying when declared and `share × window` being `room` when `share`
//! is absent. It is filled from the newest entry back while an entry fits and at most
//! `max_entries` (default [`DEFAULT_MAX_ENTRIES`]) are taken; what is older is trimmed, and the
//! included history starts at a user message. Tokens are estimated as a message's JSON bytes over
//! the estimate door's bytes per token, rounded up.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use nexus_proto::{ExecutionId, InputId};

use super::ChatMessage;
use crate::declaration::FrozenSkill;
pub use crate::declaration::template::Mechanism;

/// History entries a request carries at most when the history block names no `max_entries`
/// (the spec's bound of `max_entries`).
pub const DEFAULT_MAX_ENTRIES: u64 = 200;
/// Entries the manifest lists in `included` and in `trimmed` each, the newest first; the counts
/// give the rest.
pub const MANIFEST_ENTRY_BOUND: usize = 32;
/// The bound of the skills block, in bytes (REFERENCE 12, "Skills block": 16 KiB).
pub const SKILLS_BLOCK_BOUND: usize = 16_384;
/// The skills block's first line.
pub const SKILLS_HEADER: &str = "Skills available now.";
/// What starts the names-only tail of a skills block over its bound.
const SKILLS_TAIL: &str = "\nMore skills, by name only (load one with skill to read it): ";
/// Room kept for the tail's closing count (` and N more`).
const SKILLS_MORE_ROOM: usize = 32;

/// The skills block's text for `skills` ([module docs](self), "Skills"); `None` when there are
/// none. Never longer than [`SKILLS_BLOCK_BOUND`] bytes.
#[must_use]
pub fn skills_block(skills: &[FrozenSkill]) -> Option<String> {
    if skills.is_empty() {
        return None;
    }
    let lines: Vec<String> =
        skills.iter().map(|s| format!("\n- {}: {}", s.name, s.description.replace(['\n', '\r'], " "))).collect();
    let mut out = String::from(SKILLS_HEADER);
    if out.len() + lines.iter().map(String::len).sum::<usize>() <= SKILLS_BLOCK_BOUND {
        out.extend(lines);
        return Some(out);
    }
    // Whole lines while room stays for the tail, the next skill's name and the count.
    let mut full = 0;
    while full < skills.len() {
        let next_name = skills.get(full + 1).map_or(0, |s| s.name.len());
        if out.len() + lines[full].len() + SKILLS_TAIL.len() + next_name + SKILLS_MORE_ROOM > SKILLS_BLOCK_BOUND {
            break;
        }
        out.push_str(&lines[full]);
        full += 1;
    }
    out.push_str(SKILLS_TAIL);
    let mut listed = full;
    for skill in &skills[full..] {
        let separator = if listed == full { "" } else { ", " };
        if out.len() + separator.len() + skill.name.len() + SKILLS_MORE_ROOM > SKILLS_BLOCK_BOUND {
            break;
        }
        out.push_str(separator);
        out.push_str(&skill.name);
        listed += 1;
    }
    if listed < skills.len() {
        out.push_str(&format!(" and {} more", skills.len() - listed));
    }
    Some(out)
}

nexus_proto::words! {
    /// The role a block reaches the provider in.
    pub enum PromptRole("prompt role") {
        /// Instructions.
        System => "system",
        /// Developer instructions (OpenAI-compatible `developer`; Anthropic's `system`).
        Developer => "developer",
        /// A user message.
        User => "user",
        /// An assistant message.
        Assistant => "assistant",
    }
}

nexus_proto::words! {
    /// Why a block rendered nothing.
    pub enum EmptyReason("empty block reason") {
        /// nexus holds no source for it yet (character, persona, memory, skills).
        NoSource => "no_source",
        /// The input carries no inline entries for it (lead, tail).
        NoInlineEntries => "no_inline_entries",
        /// The document is empty or absent.
        EmptyDocument => "empty_document",
    }
}

/// The macro values of one execution, taken once at materialization (`input_materialized.macros`)
/// so that every round and every recovery renders the same text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Macros {
    /// `{{agent}}`: the answering Agent's handle.
    pub agent: String,
    /// `{{user}}`: the poster's handle (the Agent's own when it posted itself).
    pub user: String,
    /// `{{workspace}}`: `[execution] workspace_name`.
    pub workspace: String,
    /// `{{date}}`: the materialization's UTC date, ISO 8601 (`2026-12-01`).
    pub date: String,
    /// `{{conversation_kind}}`: `conversation` for inputs posted to the input door.
    pub conversation_kind: String,
    /// The `memory` block's text, taken with the macros at materialization
    /// ([`crate::memory::render_block`]): what the effective memory context held then. Absent
    /// when no memory tool is declared, the context is empty, or the execution was materialized
    /// before the block was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

impl Macros {
    fn value(&self, name: &str) -> Option<&str> {
        Some(match name {
            "agent" => &self.agent,
            "user" => &self.user,
            "workspace" => &self.workspace,
            "date" => &self.date,
            "conversation_kind" => &self.conversation_kind,
            _ => return None,
        })
    }
}

/// The ISO 8601 date (`YYYY-MM-DD`, UTC) of a Unix time in milliseconds.
#[must_use]
pub fn iso_date(unix_ms: i64) -> String {
    // Days to civil date (Howard Hinnant's algorithm), valid for the whole i64 day range used here.
    let days = unix_ms.div_euclid(86_400_000) + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// `text` with every `{{name}}` that names a macro or a variable replaced by its value; any other
/// `{{…}}` stays as written (validation refused unknown names when the document was stored).
#[must_use]
pub fn render(text: &str, macros: &Macros, variables: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            out.push_str(&rest[open..]);
            return out;
        };
        let name = &after[..close];
        let value = (!name.contains('{') && !name.contains('}'))
            .then(|| macros.value(name).or_else(|| variables.get(name).map(String::as_str)))
            .flatten();
        match value {
            Some(value) => {
                out.push_str(value);
                rest = &after[close + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A frozen prompt document.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// The content as stored, macros unrendered.
    pub content: String,
    /// `system` or `developer`.
    pub role: PromptRole,
    /// The profile's document version; `None` for an inline declaration's document.
    pub version: Option<i64>,
}

/// One earlier turn of the conversation: the input and the transcript of the execution that
/// answered it (its newest candidate), as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryTurn {
    /// The turn's input.
    pub input_public_id: InputId,
    /// The execution that answered it.
    pub execution_public_id: ExecutionId,
    /// Its 1-based place in the conversation.
    pub turn: i64,
    /// Its transcript, oldest first.
    pub messages: Vec<ChatMessage>,
}

/// What one request is assembled from.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// The `prompt_template` (read under `assembly` only).
    pub template: Option<&'a Value>,
    /// The `system_prompt` document.
    pub system_prompt: Option<&'a Document>,
    /// The macro values.
    pub macros: &'a Macros,
    /// The input's template variables, over the template's defaults (read under `assembly`
    /// only).
    pub variables: &'a BTreeMap<String, String>,
    /// The earlier turns, oldest first (ignored under `raw`).
    pub history: &'a [HistoryTurn],
    /// The skills the `skills` block lists (empty when `skill` is not declared).
    pub skills: &'a [FrozenSkill],
    /// The turn's own transcript: its input, then its rounds. Leading system messages (stored
    /// by executions materialized before history existed) are skipped: the documents come from
    /// the declaration.
    pub turn: &'a [ChatMessage],
    /// The model's context window, in tokens.
    pub window_tokens: u64,
    /// The offered tools' canonical JSON size, in bytes (part of the floor).
    pub tools_bytes: usize,
    /// The estimator's bytes per token.
    pub bytes_per_token: usize,
}

/// A document or inline block a request carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocumentRef {
    /// `system_prompt`, or `inline` for a template's inline block.
    pub slot: String,
    /// The role it reached the provider in.
    pub role: PromptRole,
    /// The document's version (null for an inline declaration's document and inline blocks).
    pub version: Option<i64>,
    /// The template block's index, for inline blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<usize>,
    /// How many entries the block lists, for the `skills` block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
}

/// A block that rendered nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmptyBlock {
    /// `system_prompt`, `character`, `persona`, `memory`, `skills`, `lead` or `tail`.
    pub block: String,
    /// Why.
    pub reason: EmptyReason,
}

/// One history entry named in the manifest: the turn, its input and execution, and the position
/// of the entry's first message in that execution's transcript.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRef {
    /// The turn.
    pub turn: i64,
    /// Its input.
    pub input_public_id: InputId,
    /// The execution whose transcript holds it.
    pub execution_public_id: ExecutionId,
    /// 0-based index of the entry's first message in that transcript.
    pub position: usize,
    /// `user` or `assistant`.
    pub role: PromptRole,
}

/// The history part of a manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryManifest {
    /// The most entries the request could carry.
    pub max_entries: u64,
    /// The tokens history could use ([module docs](self), "Budget").
    pub budget_tokens: u64,
    /// The tokens the included entries use.
    pub included_tokens: u64,
    /// The included entries, newest first, at most [`MANIFEST_ENTRY_BOUND`].
    pub included: Vec<EntryRef>,
    /// How many entries were included.
    pub included_count: usize,
    /// The trimmed entries, newest first, at most [`MANIFEST_ENTRY_BOUND`].
    pub trimmed: Vec<EntryRef>,
    /// How many entries were trimmed.
    pub trimmed_count: usize,
}

/// What one model request carried (`round_started.context`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextManifest {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// The documents and inline blocks, in request order.
    pub documents: Vec<DocumentRef>,
    /// The blocks that rendered nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub empty_blocks: Vec<EmptyBlock>,
    /// The history; absent under `raw`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<HistoryManifest>,
    /// The whole request's estimated tokens (messages and tools).
    pub estimated_tokens: u64,
}

/// An assembled request.
#[derive(Clone, Debug, PartialEq)]
pub struct Assembled {
    /// The messages, in order.
    pub messages: Vec<ChatMessage>,
    /// What they carry.
    pub manifest: ContextManifest,
}

/// One history entry ([module docs](self)).
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    at: EntryRef,
    messages: Vec<ChatMessage>,
    tokens: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Budget {
    share: Option<f64>,
    min_tokens: Option<u64>,
    max_tokens: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
enum Block {
    Slot(String),
    Inline { index: usize, role: PromptRole, text: String },
    Memory,
    Skills,
    Lead,
    Tail,
    History { max_entries: u64, budget: Budget },
    Input,
}

fn tokens_of(bytes: usize, per_token: usize) -> u64 {
    bytes.div_ceil(per_token.max(1)) as u64
}

fn message_tokens(message: &ChatMessage, per_token: usize) -> u64 {
    tokens_of(serde_json::to_vec(message).map_or(0, |b| b.len()), per_token)
}

fn default_blocks() -> Vec<Block> {
    vec![
        Block::Slot("system_prompt".into()),
        Block::Slot("character".into()),
        Block::Slot("persona".into()),
        Block::Memory,
        Block::Skills,
        Block::History { max_entries: DEFAULT_MAX_ENTRIES, budget: Budget::default() },
        Block::Lead,
        Block::Tail,
        Block::Input,
    ]
}

/// The blocks of a validated template; a block it cannot read is skipped, and a template without
/// an input block gets one last (the turn is always sent).
fn template_blocks(template: Option<&Value>) -> Vec<Block> {
    let Some(blocks) = template.and_then(|t| t.get("blocks")).and_then(Value::as_array) else {
        return default_blocks();
    };
    let mut out: Vec<Block> = blocks
        .iter()
        .enumerate()
        .filter_map(|(index, block)| {
            Some(match block.get("type")?.as_str()? {
                "slot" => Block::Slot(block.get("slot")?.as_str()?.to_owned()),
                "inline" => Block::Inline {
                    index,
                    role: block.get("role")?.as_str()?.parse().ok()?,
                    text: block.get("text")?.as_str()?.to_owned(),
                },
                "memory" => Block::Memory,
                "skills" => Block::Skills,
                "lead" => Block::Lead,
                "tail" => Block::Tail,
                "history" => {
                    let budget = block.get("budget");
                    let number = |key: &str| budget.and_then(|b| b.get(key)).and_then(Value::as_u64);
                    Block::History {
                        max_entries: block.get("max_entries").and_then(Value::as_u64).unwrap_or(DEFAULT_MAX_ENTRIES),
                        budget: Budget {
                            share: budget.and_then(|b| b.get("share")).and_then(Value::as_f64),
                            min_tokens: number("min_tokens"),
                            max_tokens: number("max_tokens"),
                        },
                    }
                }
                "input" => Block::Input,
                _ => return None,
            })
        })
        .collect();
    if !out.contains(&Block::Input) {
        out.push(Block::Input);
    }
    out
}

fn template_variables(template: Option<&Value>) -> BTreeMap<String, String> {
    template
        .and_then(|t| t.get("variables"))
        .and_then(Value::as_object)
        .map(|vars| vars.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

fn role_message(role: PromptRole, content: String) -> ChatMessage {
    match role {
        PromptRole::System => ChatMessage::System { content },
        PromptRole::Developer => ChatMessage::Developer { content },
        PromptRole::User => ChatMessage::User { content },
        PromptRole::Assistant => ChatMessage::Assistant { content: Some(content), tool_calls: Vec::new() },
    }
}

fn is_document(message: &ChatMessage) -> bool {
    matches!(message, ChatMessage::System { .. } | ChatMessage::Developer { .. })
}

/// The call ids a transcript carries.
fn call_ids(messages: &[ChatMessage]) -> impl Iterator<Item = &str> {
    messages.iter().flat_map(|m| match m {
        ChatMessage::Assistant { tool_calls, .. } => tool_calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ChatMessage::Tool { tool_call_id, .. } => vec![tool_call_id.as_str()],
        _ => Vec::new(),
    })
}

/// The history entries of `turns`, oldest first ([module docs](self), "History"). `taken` holds
/// the call ids the turn itself carries.
fn entries(turns: &[HistoryTurn], mut taken: HashSet<String>, per_token: usize) -> Vec<Entry> {
    let mut by_turn: Vec<Vec<Entry>> = Vec::with_capacity(turns.len());
    // Newest first, so a later turn keeps its ids and an earlier one is renamed.
    for turn in turns.iter().rev() {
        let answered: HashSet<&str> = turn
            .messages
            .iter()
            .filter_map(|m| match m {
                ChatMessage::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        let mut renamed: HashMap<String, String> = HashMap::new();
        let mut minted = 0usize;
        for id in call_ids(&turn.messages).filter(|id| answered.contains(id)) {
            if renamed.contains_key(id) {
                continue;
            }
            let mut name = id.to_owned();
            while taken.contains(&name) {
                minted += 1;
                name = format!("h{}c{minted}", turn.turn);
            }
            taken.insert(name.clone());
            renamed.insert(id.to_owned(), name);
        }
        let rename = |id: &str| renamed.get(id).cloned().unwrap_or_else(|| id.to_owned());
        let mut list: Vec<Entry> = Vec::new();
        let mut open: HashSet<String> = HashSet::new();
        for (position, message) in turn.messages.iter().enumerate() {
            let at = |role| EntryRef {
                turn: turn.turn,
                input_public_id: turn.input_public_id,
                execution_public_id: turn.execution_public_id,
                position,
                role,
            };
            match message {
                ChatMessage::System { .. } | ChatMessage::Developer { .. } => {}
                ChatMessage::User { content } => {
                    open.clear();
                    list.push(Entry {
                        at: at(PromptRole::User),
                        messages: vec![ChatMessage::User { content: content.clone() }],
                        tokens: 0,
                    });
                }
                ChatMessage::Assistant { content, tool_calls } => {
                    let calls: Vec<_> = tool_calls
                        .iter()
                        .filter(|c| answered.contains(c.id.as_str()))
                        .map(|c| super::ToolCall { id: rename(&c.id), ..c.clone() })
                        .collect();
                    open = calls.iter().map(|c| c.id.clone()).collect();
                    if content.as_deref().is_none_or(str::is_empty) && calls.is_empty() {
                        continue;
                    }
                    list.push(Entry {
                        at: at(PromptRole::Assistant),
                        messages: vec![ChatMessage::Assistant { content: content.clone(), tool_calls: calls }],
                        tokens: 0,
                    });
                }
                ChatMessage::Tool { tool_call_id, content } => {
                    let id = rename(tool_call_id);
                    // A result belongs to the assistant message right before it; any other is
                    // an orphan and is not history.
                    if open.remove(&id)
                        && let Some(entry) = list.last_mut()
                    {
                        entry.messages.push(ChatMessage::Tool { tool_call_id: id, content: content.clone() });
                    }
                }
            }
        }
        for entry in &mut list {
            entry.tokens = entry.messages.iter().map(|m| message_tokens(m, per_token)).sum();
        }
        by_turn.push(list);
    }
    by_turn.into_iter().rev().flatten().collect()
}

fn history_cap(budget: Budget, window: u64, floor: u64) -> u64 {
    let room = window.saturating_sub(floor);
    let mut cap = match budget.share {
        // Truncation toward zero: the share's tokens, never more.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        Some(share) => (share.clamp(0.0, 1.0) * window as f64) as u64,
        None => room,
    };
    if let Some(max) = budget.max_tokens {
        cap = cap.min(max);
    }
    if let Some(min) = budget.min_tokens {
        cap = cap.max(min);
    }
    cap.min(room)
}

fn refs(entries: impl Iterator<Item = EntryRef>) -> Vec<EntryRef> {
    entries.take(MANIFEST_ENTRY_BOUND).collect()
}

/// Assembles one request ([module docs](self)).
#[must_use]
pub fn assemble(request: &Request<'_>) -> Assembled {
    let per_token = request.bytes_per_token;
    let blocks = match request.mechanism {
        Mechanism::Raw => vec![Block::Slot("system_prompt".into()), Block::Input],
        Mechanism::Default => default_blocks(),
        Mechanism::Assembly => template_blocks(request.template),
    };
    let variables = match request.mechanism {
        Mechanism::Assembly => {
            let mut variables = template_variables(request.template);
            variables.extend(request.variables.iter().map(|(k, v)| (k.clone(), v.clone())));
            variables
        }
        _ => BTreeMap::new(),
    };
    let turn: Vec<ChatMessage> = request.turn.iter().skip_while(|m| is_document(m)).cloned().collect();

    // The floor first: every block but history, in order; history's place is kept.
    let mut parts: Vec<Option<Vec<ChatMessage>>> = Vec::new();
    let mut documents = Vec::new();
    let mut empty_blocks = Vec::new();
    let mut history_block = None;
    let mut empty = |block: &str, reason| empty_blocks.push(EmptyBlock { block: block.to_owned(), reason });
    for block in &blocks {
        match block {
            Block::Slot(slot) if slot == "system_prompt" => {
                let document = request.system_prompt.filter(|d| !d.content.is_empty());
                let Some(document) = document else {
                    empty("system_prompt", EmptyReason::EmptyDocument);
                    continue;
                };
                documents.push(DocumentRef {
                    slot: slot.clone(),
                    role: document.role,
                    version: document.version,
                    block: None,
                    count: None,
                });
                let content = render(&document.content, request.macros, &variables);
                parts.push(Some(vec![role_message(document.role, content)]));
            }
            Block::Slot(slot) => empty(slot, EmptyReason::NoSource),
            Block::Inline { index, role, text } => {
                documents.push(DocumentRef {
                    slot: "inline".into(),
                    role: *role,
                    version: None,
                    block: Some(*index),
                    count: None,
                });
                parts.push(Some(vec![role_message(*role, render(text, request.macros, &variables))]));
            }
            Block::Memory => match request.macros.memory.as_deref() {
                Some(text) => {
                    documents.push(DocumentRef {
                        slot: "memory".into(),
                        role: PromptRole::System,
                        version: None,
                        block: None,
                        count: None,
                    });
                    parts.push(Some(vec![ChatMessage::System { content: text.to_owned() }]));
                }
                None => empty("memory", EmptyReason::NoSource),
            },
            Block::Skills => match skills_block(request.skills) {
                Some(text) => {
                    documents.push(DocumentRef {
                        slot: "skills".into(),
                        role: PromptRole::System,
                        version: None,
                        block: None,
                        count: Some(request.skills.len()),
                    });
                    parts.push(Some(vec![ChatMessage::System { content: text }]));
                }
                None => empty("skills", EmptyReason::NoSource),
            },
            Block::Lead => empty("lead", EmptyReason::NoInlineEntries),
            Block::Tail => empty("tail", EmptyReason::NoInlineEntries),
            Block::History { max_entries, budget } => {
                if history_block.is_none() {
                    history_block = Some((*max_entries, *budget));
                    parts.push(None);
                }
            }
            Block::Input => parts.push(Some(turn.clone())),
        }
    }
    let floor: u64 = parts.iter().flatten().flatten().map(|m| message_tokens(m, per_token)).sum::<u64>()
        + tokens_of(request.tools_bytes, per_token);

    let mut history_messages = Vec::new();
    let mut history_manifest = None;
    let mut history_tokens = 0;
    if let Some((max_entries, budget)) = history_block {
        let taken: HashSet<String> = call_ids(&turn).map(str::to_owned).collect();
        let all = entries(request.history, taken, per_token);
        let cap = history_cap(budget, request.window_tokens, floor);
        let mut first = all.len();
        let mut used = 0u64;
        for (index, entry) in all.iter().enumerate().rev() {
            if (all.len() - index) as u64 > max_entries || used + entry.tokens > cap {
                break;
            }
            used += entry.tokens;
            first = index;
        }
        // The history starts at a user message.
        while first < all.len() && all[first].at.role != PromptRole::User {
            used -= all[first].tokens;
            first += 1;
        }
        history_tokens = used;
        history_messages = all[first..].iter().flat_map(|e| e.messages.iter().cloned()).collect();
        history_manifest = Some(HistoryManifest {
            max_entries,
            budget_tokens: cap,
            included_tokens: used,
            included: refs(all[first..].iter().rev().map(|e| e.at.clone())),
            included_count: all.len() - first,
            trimmed: refs(all[..first].iter().rev().map(|e| e.at.clone())),
            trimmed_count: first,
        });
    }
    let mut messages = Vec::new();
    for part in parts {
        match part {
            Some(part) => messages.extend(part),
            None => messages.append(&mut history_messages),
        }
    }
    Assembled {
        messages,
        manifest: ContextManifest {
            mechanism: request.mechanism,
            documents,
            empty_blocks,
            history: history_manifest,
            estimated_tokens: floor + history_tokens,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::ToolCall;

    static NO_VARIABLES: BTreeMap<String, String> = BTreeMap::new();

    fn macros() -> Macros {
        Macros {
            agent: "ada".into(),
            user: "grace".into(),
            workspace: "lab".into(),
            date: "2026-12-01".into(),
            conversation_kind: "conversation".into(),
            memory: None,
        }
    }

    fn user(text: &str) -> ChatMessage {
        ChatMessage::User { content: text.into() }
    }

    fn answer(text: &str) -> ChatMessage {
        ChatMessage::Assistant { content: Some(text.into()), tool_calls: Vec::new() }
    }

    fn calls(ids: &[&str]) -> ChatMessage {
        ChatMessage::Assistant {
            content: None,
            tool_calls: ids
                .iter()
                .map(|id| ToolCall { id: (*id).into(), name: "bash".into(), arguments: "{}".into(), model_id: None })
                .collect(),
        }
    }

    fn result(id: &str, text: &str) -> ChatMessage {
        ChatMessage::Tool { tool_call_id: id.into(), content: text.into() }
    }

    fn turn(n: i64, messages: Vec<ChatMessage>) -> HistoryTurn {
        HistoryTurn {
            input_public_id: InputId::from_uuid(uuid::Uuid::from_u128(n as u128)),
            execution_public_id: ExecutionId::from_uuid(uuid::Uuid::from_u128(1000 + n as u128)),
            turn: n,
            messages,
        }
    }

    fn request<'a>(
        mechanism: Mechanism,
        template: Option<&'a Value>,
        system_prompt: Option<&'a Document>,
        macros: &'a Macros,
        history: &'a [HistoryTurn],
        turn: &'a [ChatMessage],
    ) -> Request<'a> {
        Request {
            mechanism,
            template,
            system_prompt,
            macros,
            variables: &NO_VARIABLES,
            history,
            skills: &[],
            turn,
            window_tokens: 128_000,
            tools_bytes: 0,
            bytes_per_token: 4,
        }
    }

    fn texts(messages: &[ChatMessage]) -> Vec<String> {
        messages
            .iter()
            .map(|m| match m {
                ChatMessage::System { content } => format!("system:{content}"),
                ChatMessage::Developer { content } => format!("developer:{content}"),
                ChatMessage::User { content } => format!("user:{content}"),
                ChatMessage::Assistant { content, tool_calls } => format!(
                    "assistant:{}{}",
                    content.clone().unwrap_or_default(),
                    tool_calls.iter().map(|c| format!("[{}]", c.id)).collect::<String>()
                ),
                ChatMessage::Tool { tool_call_id, content } => format!("tool:{tool_call_id}={content}"),
            })
            .collect()
    }

    #[test]
    fn macros_render_and_unknown_names_stay() {
        let variables = BTreeMap::from([("tone".to_owned(), "calm".to_owned())]);
        let text = "You are {{agent}} for {{user}} in {{workspace}} on {{date}} ({{conversation_kind}}), {{tone}}; {{ agent }} {{nope}} {{";
        assert_eq!(
            render(text, &macros(), &variables),
            "You are ada for grace in lab on 2026-12-01 (conversation), calm; {{ agent }} {{nope}} {{"
        );
        assert_eq!(iso_date(0), "1970-01-01");
        assert_eq!(iso_date(1_796_083_200_000), "2026-12-01");
        assert_eq!(iso_date(951_782_400_000), "2000-02-29");
    }

    #[test]
    fn default_order_carries_history_then_the_turn() {
        let doc = Document { content: "You are {{agent}}.".into(), role: PromptRole::Developer, version: Some(3) };
        let history = [turn(
            1,
            vec![
                ChatMessage::System { content: "legacy document".into() },
                user("list files"),
                calls(&["c1"]),
                result("c1", "a.txt"),
                answer("one file"),
            ],
        )];
        let current = [user("and now?")];
        let macros = macros();
        let assembled = assemble(&request(Mechanism::Default, None, Some(&doc), &macros, &history, &current));
        assert_eq!(
            texts(&assembled.messages),
            [
                "developer:You are ada.",
                "user:list files",
                "assistant:[c1]",
                "tool:c1=a.txt",
                "assistant:one file",
                "user:and now?"
            ]
        );
        let manifest = &assembled.manifest;
        assert_eq!(
            manifest.documents,
            vec![DocumentRef {
                slot: "system_prompt".into(),
                role: PromptRole::Developer,
                version: Some(3),
                block: None,
                count: None,
            }]
        );
        let blocks: Vec<&str> = manifest.empty_blocks.iter().map(|b| b.block.as_str()).collect();
        assert_eq!(blocks, ["character", "persona", "memory", "skills", "lead", "tail"]);
        let history = manifest.history.as_ref().expect("history");
        assert_eq!((history.included_count, history.trimmed_count), (3, 0));
        // Newest first, named by position in the earlier execution's transcript.
        let positions: Vec<usize> = history.included.iter().map(|e| e.position).collect();
        assert_eq!(positions, [4, 2, 1]);
        assert!(manifest.estimated_tokens > history.included_tokens);
    }

    #[test]
    fn raw_carries_no_history_and_legacy_documents_are_not_doubled() {
        let doc = Document { content: "sys".into(), role: PromptRole::System, version: None };
        let history = [turn(1, vec![user("old"), answer("older")])];
        let current = [ChatMessage::System { content: "sys".into() }, user("new")];
        let macros = macros();
        let assembled = assemble(&request(Mechanism::Raw, None, Some(&doc), &macros, &history, &current));
        assert_eq!(texts(&assembled.messages), ["system:sys", "user:new"]);
        assert!(assembled.manifest.history.is_none());
    }

    #[test]
    fn unanswered_calls_and_orphans_are_not_history_and_colliding_ids_are_renamed() {
        let history = [
            turn(1, vec![user("one"), calls(&["c1"]), result("c1", "r1"), answer("done")]),
            // Ended mid-round: the call has no result.
            turn(2, vec![user("two"), calls(&["c9"]), result("zz", "orphan")]),
        ];
        let current = [user("three"), calls(&["c1"]), result("c1", "r3")];
        let macros = macros();
        let assembled = assemble(&request(Mechanism::Default, None, None, &macros, &history, &current));
        assert_eq!(
            texts(&assembled.messages),
            [
                "user:one",
                "assistant:[h1c1]",
                "tool:h1c1=r1",
                "assistant:done",
                "user:two",
                "user:three",
                "assistant:[c1]",
                "tool:c1=r3"
            ]
        );
    }

    #[test]
    fn assembly_order_budget_and_max_entries() {
        let template = json!({
            "blocks": [
                {"type": "inline", "role": "system", "text": "rules for {{user}}"},
                {"type": "slot", "slot": "system_prompt"},
                {"type": "history", "max_entries": 3},
                {"type": "inline", "role": "developer", "text": "tone: {{tone}}"},
                {"type": "input"}
            ],
            "variables": {"tone": "calm"}
        });
        let doc = Document { content: "be {{tone}}".into(), role: PromptRole::System, version: Some(1) };
        let history: Vec<HistoryTurn> =
            (1..=3).map(|n| turn(n, vec![user(&format!("q{n}")), answer(&format!("a{n}"))])).collect();
        let current = [user("q4")];
        let macros = macros();
        let assembled =
            assemble(&request(Mechanism::Assembly, Some(&template), Some(&doc), &macros, &history, &current));
        // Three entries at most: a3, q3, a2; a2 does not start at a user message, so it goes too.
        assert_eq!(
            texts(&assembled.messages),
            ["system:rules for grace", "system:be calm", "user:q3", "assistant:a3", "developer:tone: calm", "user:q4"]
        );
        let history_manifest = assembled.manifest.history.clone().expect("history");
        assert_eq!((history_manifest.included_count, history_manifest.trimmed_count), (2, 4));
        assert_eq!(history_manifest.trimmed[0].turn, 2);
        let slots: Vec<(String, Option<usize>)> =
            assembled.manifest.documents.iter().map(|d| (d.slot.clone(), d.block)).collect();
        assert_eq!(
            slots,
            [("inline".to_owned(), Some(0)), ("system_prompt".to_owned(), None), ("inline".to_owned(), Some(3))]
        );

        // A token budget that holds one turn: the oldest are trimmed first.
        let one_turn: u64 = [user("q3"), answer("a3")].iter().map(|m| message_tokens(m, 4)).sum();
        let template = json!({"blocks": [
            {"type": "history", "budget": {"max_tokens": one_turn + 1}},
            {"type": "input"}
        ]});
        let assembled = assemble(&request(Mechanism::Assembly, Some(&template), None, &macros, &history, &current));
        assert_eq!(texts(&assembled.messages), ["user:q3", "assistant:a3", "user:q4"]);
        let history_manifest = assembled.manifest.history.expect("history");
        assert_eq!(history_manifest.budget_tokens, one_turn + 1);
        assert_eq!(history_manifest.included_tokens, one_turn);
    }

    #[test]
    fn the_floor_is_kept_and_history_takes_what_the_window_leaves() {
        let history = [turn(1, vec![user("q1"), answer(&"x".repeat(400))])];
        let current = [user(&"y".repeat(400))];
        let macros = macros();
        let mut small = request(Mechanism::Default, None, None, &macros, &history, &current);
        small.window_tokens = 120;
        let assembled = assemble(&small);
        // The turn alone is ~108 tokens: the newest entry (the long answer) does not fit what is
        // left, so nothing older is taken either; the turn is sent whole.
        assert_eq!(assembled.messages.last(), Some(&current[0]));
        let manifest = assembled.manifest.history.expect("history");
        assert!(manifest.trimmed_count >= 1, "{manifest:?}");
        assert!(manifest.budget_tokens <= 120);
        // min_tokens never lifts history over the window's room; share is of the window.
        assert_eq!(history_cap(Budget { min_tokens: Some(1_000), ..Budget::default() }, 100, 40), 60);
        assert_eq!(history_cap(Budget { share: Some(0.25), ..Budget::default() }, 1_000, 0), 250);
        assert_eq!(history_cap(Budget { share: Some(0.1), min_tokens: Some(200), max_tokens: None }, 1_000, 0), 200);
        assert_eq!(history_cap(Budget { share: Some(1.0), max_tokens: Some(50), min_tokens: None }, 1_000, 0), 50);
    }

    #[test]
    fn the_manifest_is_bounded() {
        let history: Vec<HistoryTurn> = (1..=50).map(|n| turn(n, vec![user("q"), answer("a")])).collect();
        let current = [user("last")];
        let macros = macros();
        let assembled = assemble(&request(Mechanism::Default, None, None, &macros, &history, &current));
        let manifest = assembled.manifest.history.expect("history");
        assert_eq!(manifest.included_count, 100);
        assert_eq!(manifest.included.len(), MANIFEST_ENTRY_BOUND);
        assert_eq!(manifest.included[0].turn, 50, "newest first");
    }

    fn skill(name: &str, description: &str) -> FrozenSkill {
        FrozenSkill {
            name: name.into(),
            description: description.into(),
            route: None,
            effect_profile: None,
            timeout_ms: None,
            memory: None,
        }
    }

    #[test]
    fn the_skills_block_renders_at_its_place_with_its_count() {
        let skills = [skill("deploy", "How to ship"), skill("triage", "Sort bugs")];
        let doc = Document { content: "You are {{agent}}.".into(), role: PromptRole::System, version: None };
        let macros = macros();
        let current = [user("go")];
        let mut with_skills = request(Mechanism::Default, None, Some(&doc), &macros, &[], &current);
        with_skills.skills = &skills;
        let assembled = assemble(&with_skills);
        assert_eq!(
            texts(&assembled.messages),
            [
                "system:You are ada.",
                "system:Skills available now.\n- deploy: How to ship\n- triage: Sort bugs",
                "user:go"
            ]
        );
        let skills_ref = assembled.manifest.documents.iter().find(|d| d.slot == "skills").expect("listed");
        assert_eq!((skills_ref.role, skills_ref.count), (PromptRole::System, Some(2)));
        assert!(!assembled.manifest.empty_blocks.iter().any(|b| b.block == "skills"));
        // Under assembly it sits where the template puts it; without skills it is empty.
        let template = json!({"blocks": [{"type": "history"}, {"type": "skills"}, {"type": "input"}]});
        let mut assembly = request(Mechanism::Assembly, Some(&template), None, &macros, &[], &current);
        assembly.skills = &skills;
        let texts_of = texts(&assemble(&assembly).messages);
        assert!(texts_of[0].starts_with("system:Skills available now."), "{texts_of:?}");
        let bare = assemble(&request(Mechanism::Default, None, None, &macros, &[], &current));
        assert!(bare.manifest.empty_blocks.iter().any(|b| b.block == "skills"));
        // Raw carries no skills block.
        let mut raw = request(Mechanism::Raw, None, None, &macros, &[], &current);
        raw.skills = &skills;
        assert_eq!(texts(&assemble(&raw).messages), ["user:go"]);
    }

    #[test]
    fn the_skills_block_is_bounded_with_a_names_only_tail() {
        let description = "d".repeat(1000);
        let skills: Vec<FrozenSkill> = (0..2000).map(|i| skill(&format!("skill-{i:04}"), &description)).collect();
        let text = skills_block(&skills).expect("some");
        assert!(text.len() <= SKILLS_BLOCK_BOUND, "{} bytes", text.len());
        assert!(text.starts_with("Skills available now.\n- skill-0000: d"));
        let full = text.matches("\n- ").count();
        assert!(full > 10 && full < 17, "{full} whole lines fit 16 KiB");
        assert!(text.contains(&format!("by name only (load one with skill to read it): skill-{full:04}, ")), "{text}");
        let listed = text.matches("skill-").count();
        assert!(text.ends_with(&format!(" and {} more", 2000 - listed)), "{}", &text[text.len() - 40..]);
        // Everything that fits is listed whole, and one line per skill.
        let few = skills_block(&[skill("a", "one\ntwo")]).expect("some");
        assert_eq!(few, "Skills available now.\n- a: one two");
        assert_eq!(skills_block(&[]), None);
    }
}
