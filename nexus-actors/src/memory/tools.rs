//! The six memory tools (`docs/kernel-tools.md`, "memory"): `memory_read`, `memory_write`,
//! `memory_edit`, `memory_ls`, `memory_grep`, `memory_delete`, run in-process over the frozen
//! effective context ([`FrozenDeclaration::memory_bindings`]).
//!
//! Every refusal is a call error envelope the model reads, starting with its word
//! (`memory_read_only: …`), and changes nothing. The writes record the calling task
//! ([`MemoryAuthor::Task`]); a call run again answers its first revision.

use regex::RegexBuilder;
use serde_json::{Value, json};

use nexus_proto::Refusal;

use crate::declaration::FrozenDeclaration;
use crate::store::{MemoryAuthor, MemoryChange, MemoryExpected, MemoryWritten, Store, StoreResult};

use super::{
    Address, DOCUMENT_BYTES, DOCUMENTS_PER_OWNER, MemoryAccess, MemoryBinding, MemoryScope, parse_address,
    parse_prefix, reserved,
};

/// The memory tools' wire names.
pub const WIRE_NAMES: [&str; 6] =
    ["memory_read", "memory_write", "memory_edit", "memory_ls", "memory_grep", "memory_delete"];
/// `memory_grep`'s default and largest `limit` (matching lines).
pub const GREP_LIMIT: (u64, u64) = (50, 200);
/// The most bytes of a `memory_grep` pattern.
pub const PATTERN_BYTES: usize = 1024;
/// The most bytes of one matching line `memory_grep` returns (longer lines are cut).
pub const GREP_LINE_BYTES: usize = 512;
/// The most documents `memory_ls` lists.
pub const LS_LIMIT: usize = 200;

type Outcome = Result<Value, String>;

fn refused(refusal: &Refusal) -> String {
    format!("{}: {}", refusal.code, refusal.message)
}

/// Runs the memory tool `wire_name` with `input` for the execution frozen as `declaration`,
/// writing as `author`. `None` for a name that is not a memory tool.
///
/// # Errors
/// A store failure (the call fails `internal`).
pub async fn run(
    store: &Store,
    declaration: &FrozenDeclaration,
    author: MemoryAuthor,
    wire_name: &str,
    input: &Value,
) -> StoreResult<Option<Outcome>> {
    let context = &declaration.memory_bindings;
    // The catalog's parameters and nothing else: a misspelt one would otherwise be dropped unseen.
    let known: &[&str] = match wire_name {
        "memory_read" => &["path", "offset", "limit"],
        "memory_write" => &["path", "content"],
        "memory_edit" => &["path", "old_text", "new_text"],
        "memory_ls" => &["path"],
        "memory_grep" => &["pattern", "path", "ignore_case", "limit"],
        "memory_delete" => &["path"],
        _ => return Ok(None),
    };
    if let Some(unknown) = input.as_object().and_then(|fields| fields.keys().find(|k| !known.contains(&k.as_str()))) {
        let unknown: String = unknown.chars().take(64).collect();
        return Ok(Some(Err(format!("parameter_invalid: {wire_name} takes {}; remove {unknown:?}", known.join(", ")))));
    }
    Ok(Some(match wire_name {
        "memory_read" => read(store, context, input).await?,
        "memory_write" => match string(input, "content") {
            Ok(content) => write(store, context, author, input, MemoryChange::Put(content.to_owned())).await?,
            Err(message) => Err(message),
        },
        "memory_edit" => match (string(input, "old_text"), string(input, "new_text")) {
            (Ok(old_text), Ok(new_text)) => {
                let change = MemoryChange::Edit { old_text: old_text.to_owned(), new_text: new_text.to_owned() };
                write(store, context, author, input, change).await?
            }
            (Err(message), _) | (_, Err(message)) => Err(message),
        },
        "memory_delete" => write(store, context, author, input, MemoryChange::Delete).await?,
        "memory_ls" => ls(store, context, input).await?,
        "memory_grep" => grep(store, context, input).await?,
        _ => return Ok(None),
    }))
}

fn string<'a>(input: &'a Value, key: &str) -> Result<&'a str, String> {
    input
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("parameter_missing: {key} is required and must be a string"))
}

/// The address a call names, with its binding from the effective context.
fn address<'a>(context: &'a [MemoryBinding], input: &Value) -> Result<(Address, &'a MemoryBinding), String> {
    let full = string(input, "path")?;
    let address = parse_address(full).map_err(|r| refused(&r))?;
    if reserved(&address.path) {
        return Err(format!(
            "memory_reserved_prefix: {address} is under {}/skills/, which people write through the memory doors; \
             load a skill with the skill tool",
            address.scope
        ));
    }
    let binding = bound(context, address.scope)?;
    Ok((address, binding))
}

fn bound(context: &[MemoryBinding], scope: MemoryScope) -> Result<&MemoryBinding, String> {
    context.iter().find(|b| b.scope == scope).ok_or_else(|| {
        let reachable: Vec<String> = context.iter().map(|b| format!("{}/", b.scope)).collect();
        let reachable = if reachable.is_empty() { "none".to_owned() } else { reachable.join(", ") };
        format!(
            "memory_scope_unavailable: {scope}/ is not in this execution's memory context (reachable: {reachable}); \
             the memory_context_limit or the input leaves it out"
        )
    })
}

fn positive(input: &Value, key: &str) -> Result<Option<u64>, String> {
    match input.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_u64().filter(|n| *n >= 1) {
            Some(n) => Ok(Some(n)),
            None => Err(format!("parameter_invalid: {key} must be an integer of at least 1")),
        },
    }
}

async fn read(store: &Store, context: &[MemoryBinding], input: &Value) -> StoreResult<Outcome> {
    let (address, binding) = match address(context, input) {
        Ok(found) => found,
        Err(message) => return Ok(Err(message)),
    };
    let (offset, limit) = match (positive(input, "offset"), positive(input, "limit")) {
        (Ok(offset), Ok(limit)) => (offset.unwrap_or(1), limit),
        (Err(message), _) | (_, Err(message)) => return Ok(Err(message)),
    };
    let Some(document) = store.memory_document(&binding.root(), &address.path).await? else {
        return Ok(Err(format!("memory_not_found: {address} does not exist; list documents with memory_ls")));
    };
    let lines: Vec<&str> = document.content.split_inclusive('\n').collect();
    let skip = usize::try_from(offset - 1).unwrap_or(usize::MAX);
    let take = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    let window: String = lines.iter().skip(skip).take(take).copied().collect();
    let returned = lines.len().saturating_sub(skip).min(take);
    Ok(Ok(json!({
        "path": address.to_string(),
        "revision": document.revision,
        "content": window,
        "offset": offset,
        "lines": returned,
        "total_lines": lines.len(),
    })))
}

async fn write(
    store: &Store,
    context: &[MemoryBinding],
    author: MemoryAuthor,
    input: &Value,
    change: MemoryChange,
) -> StoreResult<Outcome> {
    let (address, binding) = match address(context, input) {
        Ok(found) => found,
        Err(message) => return Ok(Err(message)),
    };
    if binding.access == MemoryAccess::Read {
        let why = if binding.narrowed { "the memory_context_limit" } else { "its binding" };
        return Ok(Err(format!("memory_read_only: {}/ is read-only here ({why} grants read only)", address.scope)));
    }
    let deleting = change == MemoryChange::Delete;
    let written = store.memory_write(binding.root(), &address.path, change, MemoryExpected::Any, author).await?;
    Ok(match written {
        MemoryWritten::Written { revision, bytes, deleted, .. } => Ok(match deleting || deleted {
            true => json!({"path": address.to_string(), "deleted": true, "revision": revision}),
            false => json!({"path": address.to_string(), "revision": revision, "bytes": bytes}),
        }),
        MemoryWritten::NotFound => {
            Err(format!("memory_not_found: {address} does not exist; list documents with memory_ls"))
        }
        MemoryWritten::NoMatch => Err(format!(
            "memory_edit_no_match: old_text does not occur in {address}; read it with memory_read and copy the passage exactly"
        )),
        MemoryWritten::Ambiguous { count } => Err(format!(
            "memory_edit_ambiguous: old_text occurs {count} times in {address}; include more context so it occurs once"
        )),
        MemoryWritten::TooLarge { bytes } => Err(format!(
            "memory_bound: {address} would hold {bytes} bytes; a document holds at most {DOCUMENT_BYTES} bytes"
        )),
        MemoryWritten::TooMany => Err(format!(
            "memory_bound: {}/ holds {DOCUMENTS_PER_OWNER} documents already, the most it may; delete one first",
            address.scope
        )),
        // The tools write unconditionally.
        MemoryWritten::Stale { .. } => Err(format!("stale_object: {address} changed meanwhile; try again")),
    })
}

/// The bindings a listing or search covers, with the path prefix inside them.
fn covered<'a>(context: &'a [MemoryBinding], input: &Value) -> Result<(Vec<&'a MemoryBinding>, String), String> {
    let prefix = match input.get("path") {
        None | Some(Value::Null) => "",
        Some(Value::String(prefix)) => prefix.as_str(),
        Some(_) => return Err("parameter_invalid: path must be a string prefix such as workspace/".into()),
    };
    let (scope, rest) = parse_prefix(prefix).map_err(|r| refused(&r))?;
    if reserved(&rest) {
        return Err("memory_reserved_prefix: skills/ is reserved; load a skill with the skill tool".into());
    }
    Ok(match scope {
        None => (context.iter().collect(), rest),
        Some(scope) => (vec![bound(context, scope)?], rest),
    })
}

async fn ls(store: &Store, context: &[MemoryBinding], input: &Value) -> StoreResult<Outcome> {
    let (bindings, prefix) = match covered(context, input) {
        Ok(found) => found,
        Err(message) => return Ok(Err(message)),
    };
    let mut documents = Vec::new();
    let mut truncated = false;
    for binding in bindings {
        for document in store.memory_list(&binding.root(), &prefix).await? {
            if reserved(&document.path) {
                continue;
            }
            if documents.len() == LS_LIMIT {
                truncated = true;
                break;
            }
            documents.push(json!({
                "path": format!("{}/{}", binding.scope, document.path),
                "bytes": document.bytes,
                "revision": document.revision,
                "updated_at": document.updated_at,
            }));
        }
    }
    Ok(Ok(json!({"documents": documents, "truncated": truncated})))
}

fn cut(line: &str) -> &str {
    if line.len() <= GREP_LINE_BYTES {
        return line;
    }
    let mut end = GREP_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

async fn grep(store: &Store, context: &[MemoryBinding], input: &Value) -> StoreResult<Outcome> {
    let pattern = match string(input, "pattern") {
        Ok(pattern) if !pattern.is_empty() && pattern.len() <= PATTERN_BYTES => pattern,
        Ok(_) => return Ok(Err("parameter_invalid: pattern must be 1 to 1024 bytes".into())),
        Err(message) => return Ok(Err(message)),
    };
    let ignore_case = match input.get("ignore_case") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(_) => return Ok(Err("parameter_invalid: ignore_case must be true or false".into())),
    };
    let limit = match positive(input, "limit") {
        Ok(limit) => limit.unwrap_or(GREP_LIMIT.0).min(GREP_LIMIT.1),
        Err(message) => return Ok(Err(message)),
    };
    let regex = match RegexBuilder::new(pattern).case_insensitive(ignore_case).size_limit(1 << 20).build() {
        Ok(regex) => regex,
        Err(error) => return Ok(Err(format!("parameter_invalid: pattern is not a regular expression: {error}"))),
    };
    let (bindings, prefix) = match covered(context, input) {
        Ok(found) => found,
        Err(message) => return Ok(Err(message)),
    };
    let shown = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut matches = Vec::new();
    let mut truncated = false;
    'search: for binding in bindings {
        for document in store.memory_contents(&binding.root()).await? {
            if !document.path.starts_with(&prefix) || reserved(&document.path) {
                continue;
            }
            for (number, line) in document.content.lines().enumerate() {
                if !regex.is_match(line) {
                    continue;
                }
                if matches.len() == shown {
                    truncated = true;
                    break 'search;
                }
                matches.push(json!({
                    "path": format!("{}/{}", binding.scope, document.path),
                    "line": number + 1,
                    "text": cut(line),
                }));
            }
        }
    }
    Ok(Ok(json!({"matches": matches, "truncated": truncated})))
}
