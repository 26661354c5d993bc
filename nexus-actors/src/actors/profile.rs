//! The ProfileActor: the only writer of one Agent's standing declaration.
//!
//! PUTs serialize here: validate, one atomic store write, reply (`docs/declaration.md`, "Whole
//! replacement"). Reads go straight to the store.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};

use nexus_proto::{ErrorCode, MemberId, MemberKind, MemberStatus, Refusal};

use crate::actors::fabric::Fabric;
use crate::actors::handle;
use crate::declaration::PromptSlot;
use crate::declaration::{CONFIGURATION_FIELDS, validate_profile_put};
use crate::store::{MemberRow, ProfileRow};

/// The ProfileActor's messages.
pub enum ProfileMsg {
    /// `PUT /agent_api/v1/profile/configuration`: whole replacement. Replies with the profile as
    /// GET reads it.
    Declare(Value, RpcReplyPort<Result<Value, Refusal>>),
    /// `PUT /agent_api/v1/profile/agents/{name}`: replies `(minted, definition)`.
    PutAgent(String, Value, RpcReplyPort<Result<(bool, Value), Refusal>>),
    /// `DELETE /agent_api/v1/profile/agents/{name}`.
    DeleteAgent(String, RpcReplyPort<Result<(), Refusal>>),
    /// `PUT /agent_api/v1/profile/prompt_documents/{slot}`: one slot against the then-current
    /// template. Replies with the slot as its GET door reads it.
    EditSlot(PromptSlot, Value, RpcReplyPort<Result<Value, Refusal>>),
}

/// The typed handle on an Agent's ProfileActor. Each method waits at most the call deadline.
#[derive(Clone, Debug)]
pub struct ProfileHandle {
    actor: ActorRef<ProfileMsg>,
    deadline: std::time::Duration,
}

impl ProfileHandle {
    pub(crate) fn new(actor: ActorRef<ProfileMsg>, deadline: std::time::Duration) -> Self {
        ProfileHandle { actor, deadline }
    }

    /// Replaces the whole declaration; answers the profile as GET reads it.
    ///
    /// # Errors
    /// The declaration's refusals; `unavailable` when the actor cannot answer in time.
    pub async fn declare(&self, body: Value) -> Result<Value, Refusal> {
        handle::call(&self.actor, "profile", self.deadline, |reply| ProfileMsg::Declare(body, reply)).await?
    }

    /// Rewrites one prompt-document slot; answers the slot as its GET door reads it.
    ///
    /// # Errors
    /// The slot's refusals; `unavailable` when the actor cannot answer in time.
    pub async fn edit_slot(&self, slot: PromptSlot, body: Value) -> Result<Value, Refusal> {
        handle::call(&self.actor, "profile", self.deadline, |reply| ProfileMsg::EditSlot(slot, body, reply)).await?
    }

    /// Creates, replaces or restores a named definition; answers `(minted, definition)`.
    ///
    /// # Errors
    /// The definition's refusals; `unavailable` when the actor cannot answer in time.
    pub async fn put_agent(&self, name: String, body: Value) -> Result<(bool, Value), Refusal> {
        handle::call(&self.actor, "profile", self.deadline, |reply| ProfileMsg::PutAgent(name, body, reply)).await?
    }

    /// Deletes a named definition.
    ///
    /// # Errors
    /// 404 `not_found` for no live definition; `unavailable` when the actor cannot answer in time.
    pub async fn delete_agent(&self, name: String) -> Result<(), Refusal> {
        handle::call(&self.actor, "profile", self.deadline, |reply| ProfileMsg::DeleteAgent(name, reply)).await?
    }
}

/// Arguments: the Agent member whose profile this is.
pub struct ProfileArgs {
    /// Shared context.
    pub fabric: Arc<Fabric>,
    /// The Agent member.
    pub member: MemberId,
}

/// State: the member and the shared context.
pub struct ProfileState {
    fabric: Arc<Fabric>,
    member: MemberId,
}

/// The ProfileActor.
pub struct ProfileActor;

fn internal(e: impl std::fmt::Display) -> Refusal {
    Refusal::new(ErrorCode::Internal, format!("the profile store failed: {e}"))
}

impl Actor for ProfileActor {
    type Msg = ProfileMsg;
    type State = ProfileState;
    type Arguments = ProfileArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ProfileMsg>,
        args: ProfileArgs,
    ) -> Result<ProfileState, ActorProcessingErr> {
        Ok(ProfileState { fabric: args.fabric, member: args.member })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ProfileMsg>,
        msg: ProfileMsg,
        state: &mut ProfileState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ProfileMsg::Declare(body, reply) => {
                let result = declare(state, &body).await;
                let _ = reply.send(result);
            }
            ProfileMsg::PutAgent(name, body, reply) => {
                let result = put_agent(state, &name, &body).await;
                let _ = reply.send(result);
            }
            ProfileMsg::EditSlot(slot, body, reply) => {
                let result = edit_slot(state, slot, &body).await;
                let _ = reply.send(result);
            }
            ProfileMsg::DeleteAgent(name, reply) => {
                let result = match state.fabric.store.delete_named_definition(state.member, &name).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(Refusal::new(ErrorCode::NotFound, format!("no named definition {name}"))),
                    Err(e) => Err(internal(e)),
                };
                let _ = reply.send(result);
            }
        }
        Ok(())
    }
}

/// The Agent member behind this actor, refreshed from the store.
async fn agent_member(state: &ProfileState, refusal: &str) -> Result<MemberRow, Refusal> {
    let member =
        state.fabric.store.member(state.member).await.map_err(internal)?.ok_or_else(|| {
            Refusal::new(ErrorCode::Unauthorized, "the member behind this credential no longer exists")
        })?;
    if member.kind != MemberKind::Agent {
        return Err(Refusal::new(ErrorCode::NotAgent, refusal));
    }
    // Eligibility is judged when the declaration lock is held, here in the Agent's own actor.
    if member.status != MemberStatus::Active {
        return Err(Refusal::new(
            ErrorCode::NotAuthorized,
            "this Agent is suspended and may not declare; ask an operator to reinstate it",
        ));
    }
    Ok(member)
}

async fn declare(state: &ProfileState, body: &Value) -> Result<Value, Refusal> {
    let store = &state.fabric.store;
    let member = agent_member(state, "only an Agent member has a profile to declare").await?;
    let models = &state.fabric.models;
    let check = |reference: &str| models.check(reference);
    let validated = validate_profile_put(body, &check)?;
    crate::eligibility::refuse_foreign_runners(store, &validated.configuration, state.member).await?;
    let profile = store
        .declare_profile(
            state.member,
            &validated.configuration,
            validated.system_prompt.as_ref(),
            validated.summarizer.as_ref(),
        )
        .await
        .map_err(internal)?;
    tracing::info!(member = %state.member, "profile declared");
    Ok(profile_json(&member, Some(profile), state.fabric.clock.now_ms()))
}

async fn edit_slot(state: &ProfileState, slot: PromptSlot, body: &Value) -> Result<Value, Refusal> {
    let store = &state.fabric.store;
    agent_member(state, "only an Agent member has prompt documents").await?;
    let profile = store
        .profile(state.member)
        .await
        .map_err(internal)?
        .ok_or_else(|| Refusal::new(ErrorCode::NotAgent, "only an Agent member has prompt documents"))?;
    let configuration = profile.configuration.unwrap_or(Value::Null);
    let document = crate::declaration::validate_slot_edit(slot, body, &configuration)?;
    let profile = store.set_prompt_document(state.member, slot, document.as_ref()).await.map_err(internal)?;
    Ok(slot_json(&profile, slot))
}

/// One prompt-document slot as its door reads it: `{slot, content, role, version}`; `content` and
/// `role` are null for a cleared slot.
pub fn slot_json(profile: &ProfileRow, slot: PromptSlot) -> Value {
    let (document, version) = match slot {
        PromptSlot::Summarizer => (profile.summarizer.as_ref(), profile.summarizer_version),
        PromptSlot::SystemPrompt => (profile.system_prompt.as_ref(), profile.system_prompt_version),
    };
    json!({
        "slot": slot,
        "content": document.map_or(Value::Null, |d| d["content"].clone()),
        "role": document.map_or(Value::Null, |d| d["role"].clone()),
        "version": version,
    })
}

/// Named-definition handles: `[a-z0-9][a-z0-9_-]{1,31}`; any other segment is a route miss.
pub fn is_definition_name(name: &str) -> bool {
    static NAME: std::sync::LazyLock<regex::Regex> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"^[a-z0-9][a-z0-9_-]{1,31}$").expect("static regex"));
    NAME.is_match(name)
}

/// The longest composed identifier `<caller agent_identifier>/<name>`, in characters.
pub const IDENTIFIER_BOUND: usize = 128;
/// The longest named-definition description, in characters.
pub const DESCRIPTION_BOUND: usize = 1024;

async fn put_agent(state: &ProfileState, name: &str, body: &Value) -> Result<(bool, Value), Refusal> {
    let store = &state.fabric.store;
    let member = agent_member(state, "only an Agent member has named definitions").await?;
    if !is_definition_name(name) {
        return Err(Refusal::new(ErrorCode::NotFound, "no such door"));
    }
    let Some(object) = body.as_object() else {
        return Err(Refusal::new(ErrorCode::ParameterMissing, "the body must be an object"));
    };
    let missing =
        ["scope", "description", "configuration"].into_iter().find(|k| object.get(*k).is_none_or(Value::is_null));
    if let Some(field) = missing {
        return Err(Refusal::new(ErrorCode::ParameterMissing, format!("{field} is required")));
    }
    let invalid = |field: &str, detail: &str| Refusal::new(ErrorCode::ValidationFailed, format!("{field}: {detail}"));
    let scope = match object["scope"].as_str() {
        Some(scope @ ("instance" | "steward")) => scope.to_owned(),
        _ => return Err(invalid("scope", "must be instance or steward")),
    };
    let description = object["description"].as_str().unwrap_or_default();
    if description.is_empty()
        || description.chars().count() > DESCRIPTION_BOUND
        || description.chars().any(|c| c.is_control())
    {
        return Err(invalid("description", "must be one printable line of 1 to 1024 characters"));
    }
    let display_name = match object.get("display_name") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) if !d.is_empty() && d.chars().count() <= 100 && !d.contains('\0') => Some(d.clone()),
        Some(_) => return Err(invalid("display_name", "must be a string of 1 to 100 characters without NUL")),
    };
    let Some(configuration) = object["configuration"].as_object() else {
        return Err(Refusal::new(ErrorCode::ParameterMissing, "configuration must be an object"));
    };
    let models = &state.fabric.models;
    let check = |reference: &str| models.check(reference);
    let configuration = crate::declaration::validate_configuration(configuration, &check)?;
    crate::eligibility::refuse_foreign_runners(store, &configuration, state.member).await?;
    let put = crate::declaration::validate_profile_put(
        &json!({"configuration": {}, "prompt_documents": {"system_prompt": object.get("system_prompt").cloned().unwrap_or(Value::Null)}}),
        &check,
    )?;
    let identifier = format!("{}/{name}", member.handle);
    if identifier.chars().count() > IDENTIFIER_BOUND {
        return Err(invalid("name", "the composed identifier is over 128 characters"));
    }
    let row = crate::store::NamedDefinitionRow {
        name: name.to_owned(),
        identifier,
        scope,
        description: description.to_owned(),
        configuration,
        display_name,
        system_prompt: put.system_prompt,
        created_at: 0,
        updated_at: 0,
    };
    let minted = store.put_named_definition(state.member, &row).await.map_err(internal)?;
    let stored = store
        .named_definitions(state.member)
        .await
        .map_err(internal)?
        .into_iter()
        .find(|d| d.name == name)
        .ok_or_else(|| Refusal::new(ErrorCode::Internal, "the definition vanished after its write"))?;
    Ok((minted, named_definition_json(&stored)))
}

/// A named definition as the doors show it.
pub fn named_definition_json(row: &crate::store::NamedDefinitionRow) -> Value {
    json!({
        "name": row.name,
        "identifier": row.identifier,
        "scope": row.scope,
        "description": row.description,
        "display_name": row.display_name,
        "configuration": row.configuration,
        "system_prompt": row.system_prompt,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    })
}

/// The body of `GET /agent_api/v1/profile`:
/// `{member:{public_id, handle, kind, role, display_name}, credential:{plane, expires_at},
/// configuration?, measured_at}`. `configuration` appears only for an Agent; until it declares,
/// every field is null and `tool_definitions` is `[]`. `now` is `measured_at`, Unix milliseconds.
pub fn profile_json(member: &MemberRow, profile: Option<ProfileRow>, now: i64) -> Value {
    let mut body = json!({
        "member": {
            "public_id": member.public_id,
            "handle": member.handle,
            "kind": member.kind,
            "role": "member",
            "display_name": member.display_name,
        },
        "credential": {"plane": "member", "expires_at": Value::Null},
        "measured_at": now,
    });
    if member.kind == MemberKind::Agent {
        let mut row = profile.unwrap_or_default();
        // Moved, not copied: the configuration may be a megabyte.
        let configuration = row.configuration.take().unwrap_or_else(|| {
            let mut empty = serde_json::Map::new();
            for field in CONFIGURATION_FIELDS {
                empty.insert(field.to_owned(), Value::Null);
            }
            empty.insert("tool_definitions".into(), json!([]));
            Value::Object(empty)
        });
        // A cleared slot reads as null, so the GET output is itself a valid PUT body.
        let slot = |content: Option<&Value>, version: i64| match content {
            Some(doc) => json!({"content": doc["content"], "role": doc["role"], "version": version}),
            None => Value::Null,
        };
        body["configuration"] = configuration;
        body["prompt_documents"] = json!({
            "system_prompt": slot(row.system_prompt.as_ref(), row.system_prompt_version),
            "summarizer": slot(row.summarizer.as_ref(), row.summarizer_version),
        });
    }
    body
}
