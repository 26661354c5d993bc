//! The memory doors for people and programs (`docs/kernel-tools.md`, "memory"; REFERENCE 14):
//! HTTP `GET|PUT|DELETE /agent_api/v1/memory/{binding}/{path}`, the listing `GET
//! /agent_api/v1/memory?binding=&prefix=`, the history `GET …/{binding}/{path}?revisions=true`,
//! and their gRPC twins `GetMemory`, `PutMemory`, `DeleteMemory`, `ListMemory` call this.
//!
//! Which root a request names:
//! - `conversation` needs `conversation=<id>`: the conversation's Agent;
//! - `workspace`: the caller itself for an Agent; the Agent a Human names in `agent_public_id`;
//! - `speaker`: a Human's own memory under the Agent it names (an Agent has none of its own).
//!
//! Who may: the standing rule of [`super::standing`] (the Agent and its stewards read and write,
//! its viewers read, another Agent gets 404 as for an unknown id, a Human without a grant 403).
//! Then the Agent's standing profile's `memory_context_limit` applies as it does to executions:
//! a root it leaves out is 422 `memory_scope_unavailable`, a `read` root refuses writes with 403
//! `memory_read_only`. Writes are conditional on `expected_revision` (null to create); a
//! mismatch is 409 `stale_object`.

use serde_json::{Value, json};

use nexus_proto::{ConversationId, ErrorCode, MemberId, MemberKind, Refusal};

use super::standing::{judge, standing};
use super::{Api, Caller, Need, internal};
use crate::memory::{DOCUMENT_BYTES, MemoryAccess, MemoryRoot, MemoryScope, check_path, effective, scope_named};
use crate::store::{MemoryAuthor, MemoryChange, MemoryExpected, MemoryRevision, MemoryWritten};

/// What names a root beside the binding: the query of the HTTP doors, the fields of the gRPC
/// requests.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct MemoryQuery {
    /// `conversation=<id>`: required for the conversation binding.
    pub conversation: Option<String>,
    /// `agent_public_id=<id>`: the Agent a Human names (an Agent may name only itself).
    pub agent_public_id: Option<String>,
    /// The listing's binding.
    pub binding: Option<String>,
    /// The listing's path prefix.
    pub prefix: Option<String>,
    /// `revisions=true`: the document's history instead of its content.
    pub revisions: Option<String>,
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::new(ErrorCode::ParameterInvalid, message)
}

fn missing(message: impl Into<String>) -> Refusal {
    Refusal::new(ErrorCode::ParameterMissing, message)
}

/// A resolved root and the access the Agent's limit leaves on it.
struct Resolved {
    root: MemoryRoot,
    access: MemoryAccess,
}

impl Api {
    /// The root `binding` names for `caller` under `query`, judged for `need` (module docs).
    async fn memory_root(
        &self,
        caller: &Caller,
        binding: &str,
        query: &MemoryQuery,
        need: Need,
    ) -> Result<Resolved, Refusal> {
        let store = &self.fabric.store;
        let scope = scope_named(binding)?;
        let named: Option<MemberId> = match query.agent_public_id.as_deref() {
            None | Some("") => None,
            Some(text) => Some(text.parse().map_err(|_| invalid("agent_public_id must be a UUID"))?),
        };
        let conversation: Option<ConversationId> = match query.conversation.as_deref() {
            None | Some("") => None,
            Some(text) => Some(text.parse().map_err(|_| invalid("conversation must be a UUID"))?),
        };
        let agent = match (scope, conversation) {
            (MemoryScope::Conversation, None) => {
                return Err(missing("conversation=<id> is required for the conversation binding"));
            }
            (MemoryScope::Conversation, Some(id)) => {
                let agent = self.conversation_for(caller, id, need).await?;
                if named.is_some_and(|named| named != agent) {
                    return Err(invalid(format!("agent_public_id: conversation {id} belongs to Agent {agent}")));
                }
                agent
            }
            (_, _) => self.memory_agent(caller, named, need).await?,
        };
        let owner = match scope {
            MemoryScope::Conversation => conversation.map(ConversationId::uuid).unwrap_or_default(),
            MemoryScope::Workspace => agent.uuid(),
            MemoryScope::Speaker if caller.member.kind == MemberKind::Human => caller.member.public_id.uuid(),
            MemoryScope::Speaker => {
                return Err(Refusal::new(
                    ErrorCode::MemoryScopeUnavailable,
                    "an Agent has no speaker memory of its own: speaker/ is the memory of the Human who posts an \
                     input; a Human reads and writes theirs here with agent_public_id",
                ));
            }
        };
        let limit = store.profile(agent).await.map_err(internal)?.and_then(|p| p.configuration);
        let limit = limit.map_or(Value::Null, |c| c["memory_context_limit"].clone());
        let root = MemoryRoot { agent_public_id: agent, scope, owner_public_id: owner };
        let selected = vec![crate::memory::MemoryBinding {
            scope,
            access: MemoryAccess::ReadWrite,
            agent_public_id: agent,
            owner_public_id: owner,
            narrowed: false,
        }];
        let Some(binding) = effective(selected, &limit).into_iter().next() else {
            return Err(Refusal::new(
                ErrorCode::MemoryScopeUnavailable,
                format!("{scope}/ is outside the Agent's memory_context_limit; its profile admits no such memory"),
            ));
        };
        Ok(Resolved { root, access: binding.access })
    }

    /// The Agent of a workspace or speaker request: the caller itself for an Agent (naming
    /// another is 404), the named Agent for a Human, judged for `need`.
    async fn memory_agent(&self, caller: &Caller, named: Option<MemberId>, need: Need) -> Result<MemberId, Refusal> {
        let me = caller.member.public_id;
        if caller.member.kind == MemberKind::Agent {
            return match named {
                None => Ok(me),
                Some(named) if named == me => Ok(me),
                Some(named) => Err(Refusal::new(ErrorCode::NotFound, format!("no Agent {named}"))),
            };
        }
        let Some(agent) = named else {
            return Err(missing("agent_public_id is required: a Human names the Agent whose memory it reads"));
        };
        let not_found = || Refusal::new(ErrorCode::NotFound, format!("no Agent {agent}"));
        let member = self.fabric.store.member(agent).await.map_err(internal)?;
        if member.is_none_or(|member| member.kind != MemberKind::Agent) {
            return Err(not_found());
        }
        let standing = standing(&self.fabric.store, &caller.member, agent).await?;
        judge(&caller.member, standing, need, &format!("Agent {agent}"), not_found)?;
        Ok(agent)
    }

    /// `GET /agent_api/v1/memory/{binding}/{path}` (gRPC `GetMemory`): `{binding, path, content,
    /// revision, bytes, updated_at}`; with `revisions=true` the history `{binding, path,
    /// revisions:[{revision, content, bytes, deleted, execution_public_id, task_key,
    /// member_public_id, created_at}]}`, oldest first, the newest 200.
    ///
    /// # Errors
    /// 400 `parameter_missing`/`parameter_invalid`, 404 `memory_not_found` (and `not_found` for
    /// another Agent's), 403 `not_authorized`, 422 `memory_path_invalid`/`memory_scope_unavailable`.
    pub async fn get_memory(
        &self,
        caller: &Caller,
        binding: &str,
        path: &str,
        query: &MemoryQuery,
    ) -> Result<Value, Refusal> {
        let history = match query.revisions.as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(_) => return Err(invalid("revisions must be true or false")),
        };
        let resolved = self.memory_root(caller, binding, query, Need::Read).await?;
        check_path(path)?;
        let store = &self.fabric.store;
        let gone = || Refusal::new(ErrorCode::MemoryNotFound, format!("{binding}/{path} does not exist"));
        if history {
            let revisions = store.memory_revisions(&resolved.root, path).await.map_err(internal)?;
            if revisions.is_empty() {
                return Err(gone());
            }
            let revisions: Vec<Value> = revisions.iter().map(revision_json).collect();
            return Ok(json!({"binding": binding, "path": path, "revisions": revisions}));
        }
        let document = store.memory_document(&resolved.root, path).await.map_err(internal)?.ok_or_else(gone)?;
        Ok(json!({
            "binding": binding, "path": path, "content": document.content, "revision": document.revision,
            "bytes": document.content.len(), "updated_at": document.updated_at,
        }))
    }

    /// `PUT /agent_api/v1/memory/{binding}/{path}` (gRPC `PutMemory`) with `{content,
    /// expected_revision}` (both required; `expected_revision: null` creates): `{binding, path,
    /// revision, bytes, created}`.
    ///
    /// # Errors
    /// As [`Api::get_memory`] (the act of a steward or the Agent), and 403 `memory_read_only`,
    /// 409 `stale_object`, 422 `memory_bound`.
    pub async fn put_memory(
        &self,
        caller: &Caller,
        binding: &str,
        path: &str,
        query: &MemoryQuery,
        body: &Value,
    ) -> Result<Value, Refusal> {
        crate::declaration::known_fields(body, &["content", "expected_revision"])?;
        let content = match body.get("content") {
            None => return Err(missing("content is required (the whole document)")),
            // Neither store holds U+0000 in text (`docs/executions.md`, "Text and NUL").
            Some(Value::String(content)) if content.contains('\0') => {
                return Err(invalid("content must not contain NUL (U+0000); remove it and send again"));
            }
            Some(Value::String(content)) => content.clone(),
            Some(_) => return Err(invalid("content must be a string")),
        };
        let expected = match body.get("expected_revision") {
            None => return Err(missing("expected_revision is required: null to create, else the revision you read")),
            Some(Value::Null) => MemoryExpected::Absent,
            Some(value) => match value.as_i64().filter(|r| *r >= 1) {
                Some(revision) => MemoryExpected::Revision(revision),
                None => return Err(invalid("expected_revision must be null or a revision number")),
            },
        };
        if content.len() > DOCUMENT_BYTES {
            return Err(Refusal::new(
                ErrorCode::MemoryBound,
                format!("content is {} bytes; a document holds at most {DOCUMENT_BYTES}", content.len()),
            ));
        }
        let written = self.memory_change(caller, binding, path, query, MemoryChange::Put(content), expected).await?;
        Ok(json!({"binding": binding, "path": path, "revision": written.0, "bytes": written.1,
                  "created": expected == MemoryExpected::Absent}))
    }

    /// `DELETE /agent_api/v1/memory/{binding}/{path}` (gRPC `DeleteMemory`): writes a delete
    /// marker revision; `{binding, path, deleted: true, revision}`.
    ///
    /// # Errors
    /// As [`Api::put_memory`]; 404 `memory_not_found` when the document does not exist.
    pub async fn delete_memory(
        &self,
        caller: &Caller,
        binding: &str,
        path: &str,
        query: &MemoryQuery,
    ) -> Result<Value, Refusal> {
        let written =
            self.memory_change(caller, binding, path, query, MemoryChange::Delete, MemoryExpected::Any).await?;
        Ok(json!({"binding": binding, "path": path, "deleted": true, "revision": written.0}))
    }

    async fn memory_change(
        &self,
        caller: &Caller,
        binding: &str,
        path: &str,
        query: &MemoryQuery,
        change: MemoryChange,
        expected: MemoryExpected,
    ) -> Result<(i64, i64), Refusal> {
        let resolved = self.memory_root(caller, binding, query, Need::Act).await?;
        check_path(path)?;
        caller.require_active("write memory")?;
        if resolved.access == MemoryAccess::Read {
            return Err(Refusal::new(
                ErrorCode::MemoryReadOnly,
                format!("{binding}/ is read-only: the Agent's memory_context_limit grants it read only"),
            ));
        }
        let author = MemoryAuthor::Member(caller.member.public_id);
        let written =
            self.fabric.store.memory_write(resolved.root, path, change, expected, author).await.map_err(internal)?;
        match written {
            MemoryWritten::Written { revision, bytes, .. } => Ok((revision, bytes)),
            MemoryWritten::NotFound if expected == MemoryExpected::Any => {
                Err(Refusal::new(ErrorCode::MemoryNotFound, format!("{binding}/{path} does not exist")))
            }
            MemoryWritten::NotFound => Err(Refusal::new(
                ErrorCode::StaleObject,
                format!("{binding}/{path} does not exist; send expected_revision: null to create it"),
            )),
            MemoryWritten::Stale { current } => Err(Refusal::new(
                ErrorCode::StaleObject,
                match current {
                    Some(current) => format!(
                        "{binding}/{path} is at revision {current}; read it again and send that expected_revision"
                    ),
                    None => format!("{binding}/{path} does not exist; send expected_revision: null to create it"),
                },
            )),
            MemoryWritten::TooLarge { bytes } => Err(Refusal::new(
                ErrorCode::MemoryBound,
                format!("content is {bytes} bytes; a document holds at most {DOCUMENT_BYTES}"),
            )),
            MemoryWritten::TooMany => Err(Refusal::new(
                ErrorCode::MemoryBound,
                format!("{binding}/ holds 64 documents, the most it may; delete one first"),
            )),
            MemoryWritten::NoMatch | MemoryWritten::Ambiguous { .. } => {
                Err(Refusal::new(ErrorCode::Internal, "a door write is never an edit"))
            }
        }
    }

    /// `GET /agent_api/v1/memory?binding=&prefix=` (gRPC `ListMemory`): `{binding, documents:
    /// [{path, bytes, revision, updated_at}]}` by path (at most 64 live documents exist per root).
    ///
    /// # Errors
    /// As [`Api::get_memory`]; 400 `parameter_missing` without `binding`.
    pub async fn list_memory(&self, caller: &Caller, query: &MemoryQuery) -> Result<Value, Refusal> {
        let Some(binding) = query.binding.as_deref().filter(|b| !b.is_empty()) else {
            return Err(missing("binding is required: conversation, workspace or speaker"));
        };
        let resolved = self.memory_root(caller, binding, query, Need::Read).await?;
        let prefix = query.prefix.as_deref().unwrap_or_default();
        let trimmed = prefix.trim_end_matches('/');
        if !trimmed.is_empty() {
            check_path(trimmed)?;
        }
        let documents = self.fabric.store.memory_list(&resolved.root, prefix).await.map_err(internal)?;
        Ok(json!({"binding": binding, "documents": documents}))
    }
}

fn revision_json(revision: &MemoryRevision) -> Value {
    json!({
        "revision": revision.revision,
        "content": revision.content,
        "bytes": revision.bytes,
        "deleted": revision.content.is_none(),
        "execution_public_id": revision.execution_public_id,
        "task_key": revision.task_key.map(|k| k.to_string()),
        "member_public_id": revision.member_public_id,
        "created_at": revision.created_at,
    })
}
