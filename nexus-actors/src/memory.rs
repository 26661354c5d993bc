//! Memory (`docs/kernel-tools.md`, "memory"): documents an Agent keeps, addressed `binding/path`,
//! in three scopes, and the pure rules over them: the effective context an execution freezes
//! (R36, R38), the path grammar, the bounds and the `memory` prompt block. The store keeps the
//! documents and their revisions ([`crate::store::Store::memory_write`]); the memory tools run in
//! [`crate::actors::execution::kernel`], the doors in [`crate::doors::api::memory`].
//!
//! - `conversation/…`: owned by the conversation the execution answers;
//! - `workspace/…`: owned by the Agent, shared by all its conversations;
//! - `speaker/…`: owned by the Human who posted the input, under that Agent (absent when the
//!   Agent posted the input itself).
//!
//! Every document belongs to one Agent: nothing of an Agent's memory is visible to another.

pub mod tools;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use nexus_proto::{ConversationId, ErrorCode, MemberId, Refusal};

/// The most bytes of one document's content (64 KiB, REFERENCE 14 "Limits").
pub const DOCUMENT_BYTES: usize = 64 * 1024;
/// The most live documents one root owner holds (64, REFERENCE 14 "Limits").
pub const DOCUMENTS_PER_OWNER: usize = 64;
/// The most bytes of a document's path after its binding name.
pub const PATH_BYTES: usize = 256;
/// The reserved prefix right after the binding: skills, written by people through the doors.
pub const SKILLS_PREFIX: &str = "skills/";
/// The most bytes of the `memory` prompt block; the documents past it are named in a tail count.
pub const BLOCK_BYTES: usize = 8 * 1024;

/// A memory scope: who owns the documents of a root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    /// Owned by one conversation.
    Conversation,
    /// Owned by the Agent: its standing memory.
    Workspace,
    /// Owned by the Human who posted the input, under the Agent.
    Speaker,
}

impl MemoryScope {
    /// Every scope, in the block's order.
    pub const ALL: [MemoryScope; 3] = [MemoryScope::Conversation, MemoryScope::Workspace, MemoryScope::Speaker];

    /// The spec word, also the root binding's name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            MemoryScope::Conversation => "conversation",
            MemoryScope::Workspace => "workspace",
            MemoryScope::Speaker => "speaker",
        }
    }
}

impl fmt::Display for MemoryScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MemoryScope {
    type Err = nexus_proto::UnknownWord;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        MemoryScope::ALL
            .into_iter()
            .find(|s| s.as_str() == word)
            .ok_or_else(|| nexus_proto::UnknownWord { vocabulary: "memory scope", word: word.to_owned() })
    }
}

/// What a binding lets an execution do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryAccess {
    /// Read only.
    Read,
    /// Read and write.
    ReadWrite,
}

impl MemoryAccess {
    /// The spec word.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            MemoryAccess::Read => "read",
            MemoryAccess::ReadWrite => "read_write",
        }
    }

    fn parse(word: &str) -> Option<MemoryAccess> {
        match word {
            "read" => Some(MemoryAccess::Read),
            "read_write" => Some(MemoryAccess::ReadWrite),
            _ => None,
        }
    }
}

/// One root as the store keys it: the Agent whose memory it is, the scope and the owner
/// (the conversation, the Agent itself, or the speaker).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryRoot {
    /// The Agent whose memory this is.
    pub agent_public_id: MemberId,
    /// The scope.
    pub scope: MemoryScope,
    /// The owner: a conversation id, the Agent's id, or the speaker's id.
    pub owner_public_id: uuid::Uuid,
}

/// One effective binding, frozen at materialization (R38) with its owner resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBinding {
    /// The scope; also the binding's name (roots only).
    pub scope: MemoryScope,
    /// The access the effective context grants.
    pub access: MemoryAccess,
    /// The Agent whose memory this is.
    pub agent_public_id: MemberId,
    /// The owner the scope resolved to.
    pub owner_public_id: uuid::Uuid,
    /// Whether the access is `read` because the limit narrowed it (for the refusal's message).
    #[serde(default)]
    pub narrowed: bool,
}

impl MemoryBinding {
    /// The root this binding addresses.
    #[must_use]
    pub fn root(&self) -> MemoryRoot {
        MemoryRoot { agent_public_id: self.agent_public_id, scope: self.scope, owner_public_id: self.owner_public_id }
    }
}

/// The selected roots of an execution: the three roots, all `read_write` (REFERENCE 14, "The
/// DEFAULT is the three roots", with `speaker` for `user`), the speaker root only when a Human
/// other than the Agent posted the input.
#[must_use]
pub fn selected_roots(agent: MemberId, conversation: ConversationId, speaker: Option<MemberId>) -> Vec<MemoryBinding> {
    let binding = |scope, owner| MemoryBinding {
        scope,
        access: MemoryAccess::ReadWrite,
        agent_public_id: agent,
        owner_public_id: owner,
        narrowed: false,
    };
    let mut roots =
        vec![binding(MemoryScope::Conversation, conversation.uuid()), binding(MemoryScope::Workspace, agent.uuid())];
    if let Some(speaker) = speaker.filter(|s| *s != agent) {
        roots.push(binding(MemoryScope::Speaker, speaker.uuid()));
    }
    roots
}

/// The effective context: `selected` ∩ `limit` (R36). A `null` limit is no ceiling; `{"bindings":
/// []}` admits none; a root the limit does not name is dropped, none is added, and `read` beats
/// `read_write`. A `user` binding in a limit admits nothing (no `user` root is ever selected).
/// The limit was validated at declaration ([`crate::declaration`]); an unreadable one admits
/// nothing.
#[must_use]
pub fn effective(selected: Vec<MemoryBinding>, limit: &Value) -> Vec<MemoryBinding> {
    if limit.is_null() {
        return selected;
    }
    let Some(bounds) = limit.get("bindings").and_then(Value::as_array) else { return Vec::new() };
    selected
        .into_iter()
        .filter_map(|mut binding| {
            let bound = bounds.iter().find(|b| b["name"].as_str() == Some(binding.scope.as_str()))?;
            let ceiling = bound["access"].as_str().and_then(MemoryAccess::parse)?;
            if ceiling < binding.access {
                binding.access = ceiling;
                binding.narrowed = true;
            }
            Some(binding)
        })
        .collect()
}

/// A parsed address `binding/path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// The binding the first segment names.
    pub scope: MemoryScope,
    /// The path after the binding (`notes.md`, `a/b.md`).
    pub path: String,
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.scope, self.path)
    }
}

/// Checks a document path (after the binding): segments of `[A-Za-z0-9._-]`, none empty, `.` or
/// `..`, at most [`PATH_BYTES`].
///
/// # Errors
/// 422 `memory_path_invalid` naming the rule broken.
pub fn check_path(path: &str) -> Result<(), Refusal> {
    let invalid = |why: &str| Refusal::new(ErrorCode::MemoryPathInvalid, format!("{path:?}: {why}"));
    if path.is_empty() {
        return Err(invalid("a document path is required after the binding, e.g. workspace/notes.md"));
    }
    if path.len() > PATH_BYTES {
        return Err(invalid("is longer than 256 bytes after the binding"));
    }
    for segment in path.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(invalid("has an empty, `.` or `..` segment"));
        }
        if !segment.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return Err(invalid("a segment may hold only letters, digits, `.`, `_` and `-`"));
        }
    }
    Ok(())
}

/// The scope a binding name selects.
///
/// # Errors
/// 422 `memory_scope_unavailable` for a name that is no root.
pub fn scope_named(name: &str) -> Result<MemoryScope, Refusal> {
    name.parse().map_err(|_| {
        Refusal::new(
            ErrorCode::MemoryScopeUnavailable,
            format!("{name:?} is not a memory binding; use conversation/, workspace/ or speaker/"),
        )
    })
}

/// Parses `binding/path` (a document address).
///
/// # Errors
/// 422 `memory_scope_unavailable` for an unknown binding, `memory_path_invalid` for a bad path.
pub fn parse_address(full: &str) -> Result<Address, Refusal> {
    let Some((binding, path)) = full.split_once('/') else {
        return Err(Refusal::new(
            ErrorCode::MemoryPathInvalid,
            format!("{full:?}: a path starts with its binding, e.g. workspace/notes.md"),
        ));
    };
    let scope = scope_named(binding)?;
    check_path(path)?;
    Ok(Address { scope, path: path.to_owned() })
}

/// Parses a listing prefix: empty (every binding), `binding`, `binding/` or `binding/prefix`.
/// Answers the scope (none for every binding) and the path prefix after it.
///
/// # Errors
/// As [`parse_address`]; a prefix's segments follow the path grammar, the last may be partial.
pub fn parse_prefix(full: &str) -> Result<(Option<MemoryScope>, String), Refusal> {
    let full = full.trim_start_matches('/');
    if full.is_empty() {
        return Ok((None, String::new()));
    }
    let (binding, rest) = full.split_once('/').unwrap_or((full, ""));
    let scope = scope_named(binding)?;
    let trimmed = rest.trim_end_matches('/');
    if !trimmed.is_empty() {
        check_path(trimmed)?;
    }
    Ok((Some(scope), rest.to_owned()))
}

/// The document path of skill `name` in a binding: `skills/<name>.md` (`docs/kernel-tools.md`,
/// "skill").
#[must_use]
pub fn skill_path(name: &str) -> String {
    format!("{SKILLS_PREFIX}{name}.md")
}

/// The skill a document at `path` (after its binding) holds: `skills/<name>.md` with `name` in the
/// skill grammar (`^[a-z0-9](?:-?[a-z0-9])*$`, at most 64 characters), else `None`.
#[must_use]
pub fn skill_name(path: &str) -> Option<&str> {
    let name = path.strip_prefix(SKILLS_PREFIX)?.strip_suffix(".md")?;
    let grammar = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    grammar.then_some(name)
}

/// A skill document's one-line description: the `description:` line of a leading `---`
/// front-matter block, else its first non-empty line (a leading `#` heading mark dropped), cut
/// to 1,024 bytes at a character boundary; `None` for a document with no text.
#[must_use]
pub fn skill_description(content: &str) -> Option<String> {
    let mut lines = content.lines();
    let mut front = None;
    if content.starts_with("---") {
        lines.next();
        for line in lines.by_ref() {
            if line.trim() == "---" {
                break;
            }
            if let Some(value) = line.strip_prefix("description:") {
                front = Some(value.trim().trim_matches('"').to_owned());
            }
        }
    }
    let line = front.filter(|d| !d.is_empty()).or_else(|| {
        lines.map(|l| l.trim().trim_start_matches('#').trim()).find(|l| !l.is_empty()).map(str::to_owned)
    })?;
    let mut end = line.len().min(1024);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    Some(line[..end].to_owned())
}

/// Whether `path` lies under the reserved `skills/` prefix.
#[must_use]
pub fn reserved(path: &str) -> bool {
    path.starts_with(SKILLS_PREFIX) || path == "skills"
}

/// One document as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocumentInfo {
    /// The path after the binding.
    pub path: String,
    /// The content's size in bytes.
    pub bytes: i64,
    /// The document's revision (1 for the first write).
    pub revision: i64,
    /// When the revision was written, Unix ms.
    pub updated_at: i64,
}

/// Renders the `memory` prompt block (REFERENCE 12, "[memory]"): a header, one line per binding
/// with its access, then one line per document with its size, bounded at [`BLOCK_BYTES`] with a
/// names-only count of the rest. `None` when the effective context is empty.
#[must_use]
pub fn render_block(bindings: &[MemoryBinding], documents: &[(MemoryScope, Vec<DocumentInfo>)]) -> Option<String> {
    if bindings.is_empty() {
        return None;
    }
    let mut text = String::from("Memory you can reach now (read with memory_read, list with memory_ls).\n");
    for binding in bindings {
        text.push_str(&format!("- {}/ ({})\n", binding.scope, binding.access.as_str()));
    }
    let all: Vec<String> = documents
        .iter()
        .flat_map(|(scope, docs)| docs.iter().map(move |d| format!("- {scope}/{} ({} bytes)\n", d.path, d.bytes)))
        .collect();
    if all.is_empty() {
        text.push_str("No documents yet.\n");
        return Some(text);
    }
    text.push_str("Documents:\n");
    for (i, line) in all.iter().enumerate() {
        let tail = format!("…and {} more\n", all.len() - i);
        if text.len() + line.len() + tail.len() > BLOCK_BYTES {
            text.push_str(&tail);
            break;
        }
        text.push_str(line);
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ids() -> (MemberId, ConversationId, MemberId) {
        (MemberId::new_v4(), ConversationId::new_v4(), MemberId::new_v4())
    }

    #[test]
    fn r36_effective_is_selected_intersect_limit() {
        let (agent, conversation, speaker) = ids();
        let selected = selected_roots(agent, conversation, Some(speaker));
        assert_eq!(effective(selected.clone(), &Value::Null).len(), 3, "null: no ceiling");
        assert!(effective(selected.clone(), &json!({"bindings": []})).is_empty(), "[] admits none");
        let limit = json!({"bindings": [
            {"name": "conversation", "scope": "conversation", "access": "read_write"},
            {"name": "workspace", "scope": "workspace", "access": "read"},
            {"name": "user", "scope": "user", "access": "read_write"},
        ]});
        let got = effective(selected, &limit);
        assert_eq!(
            got.iter().map(|b| (b.scope, b.access)).collect::<Vec<_>>(),
            [(MemoryScope::Conversation, MemoryAccess::ReadWrite), (MemoryScope::Workspace, MemoryAccess::Read)]
        );
        assert!(got[1].narrowed);
        // No root is added: without a speaker, a limit naming speaker adds none.
        let limit = json!({"bindings": [{"name": "conversation", "scope": "conversation", "access": "read"},
                                         {"name": "speaker", "scope": "speaker", "access": "read_write"}]});
        let got = effective(selected_roots(agent, conversation, Some(agent)), &limit);
        assert_eq!(
            got.iter().map(|b| (b.scope, b.access)).collect::<Vec<_>>(),
            [(MemoryScope::Conversation, MemoryAccess::Read)]
        );
    }

    #[test]
    fn paths_follow_the_grammar() {
        assert_eq!(
            parse_address("workspace/a/b-c_d.md").ok(),
            Some(Address { scope: MemoryScope::Workspace, path: "a/b-c_d.md".into() })
        );
        let long = format!("workspace/{}", "a".repeat(257));
        for (bad, code) in [
            ("notes.md", ErrorCode::MemoryPathInvalid),
            ("workspace/", ErrorCode::MemoryPathInvalid),
            ("workspace/a//b", ErrorCode::MemoryPathInvalid),
            ("workspace/../x", ErrorCode::MemoryPathInvalid),
            ("workspace/./x", ErrorCode::MemoryPathInvalid),
            ("workspace/a b", ErrorCode::MemoryPathInvalid),
            (long.as_str(), ErrorCode::MemoryPathInvalid),
            ("team/x.md", ErrorCode::MemoryScopeUnavailable),
            ("user/x.md", ErrorCode::MemoryScopeUnavailable),
        ] {
            assert_eq!(parse_address(bad).map_err(|r| r.code).err(), Some(code), "{bad}");
        }
        assert_eq!(parse_prefix("").ok(), Some((None, String::new())));
        assert_eq!(parse_prefix("workspace").ok(), Some((Some(MemoryScope::Workspace), String::new())));
        assert_eq!(parse_prefix("workspace/no").ok(), Some((Some(MemoryScope::Workspace), "no".into())));
        assert!(reserved("skills/x.md") && !reserved("skillset.md"));
    }

    #[test]
    fn the_block_lists_bindings_and_documents_bounded() {
        let (agent, conversation, _) = ids();
        let bindings = selected_roots(agent, conversation, None);
        assert!(render_block(&[], &[]).is_none());
        let docs: Vec<DocumentInfo> = (0..400)
            .map(|i| DocumentInfo { path: format!("note-{i:04}.md"), bytes: 10, revision: 1, updated_at: 0 })
            .collect();
        let text = render_block(&bindings, &[(MemoryScope::Workspace, docs)]).expect("block");
        assert!(text.contains("- conversation/ (read_write)\n- workspace/ (read_write)\n"), "{text}");
        assert!(text.contains("- workspace/note-0000.md (10 bytes)"));
        assert!(text.len() <= BLOCK_BYTES);
        assert!(text.trim_end().ends_with("more"), "{text}");
    }
}
