//! The ProfileActor: the only writer of one Agent's standing declaration.
//!
//! PUTs serialize here: validate, one atomic store write, reply (spec/REFERENCE.md 3, "PUT
//! semantics"). Reads go straight to the store.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use uuid::Uuid;

use nexus_proto::{ErrorCode, Refusal};

use crate::declaration::{CONFIGURATION_FIELDS, validate_profile_put};
use crate::root::Fabric;
use crate::store::{MemberRow, ProfileRow, now_ms};

/// The ProfileActor's messages.
pub enum ProfileMsg {
    /// `PUT /agent_api/v1/profile/configuration`: whole replacement. Replies with the profile as
    /// GET reads it.
    Declare(Value, RpcReplyPort<Result<Value, Refusal>>),
}

/// Arguments: the Agent member whose profile this is.
pub struct ProfileArgs {
    /// Shared context.
    pub fabric: Arc<Fabric>,
    /// The Agent member.
    pub member: Uuid,
}

/// State: the member and the shared context.
pub struct ProfileState {
    fabric: Arc<Fabric>,
    member: Uuid,
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
        }
        Ok(())
    }
}

async fn declare(state: &ProfileState, body: &Value) -> Result<Value, Refusal> {
    let store = &state.fabric.store;
    let member =
        store.member(state.member).await.map_err(internal)?.ok_or_else(|| {
            Refusal::new(ErrorCode::Unauthorized, "the member behind this credential no longer exists")
        })?;
    if member.kind != "agent" {
        return Err(Refusal::new(ErrorCode::NotAgent, "only an Agent member has a profile to declare"));
    }
    let models = &state.fabric.models;
    let check =
        |reference: &str| models.resolve(reference).map(|_| ()).map_err(|e| (e.word().to_owned(), e.to_string()));
    let validated = validate_profile_put(body, &check)?;
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
    Ok(profile_json(&member, Some(&profile)))
}

/// The body of `GET /agent_api/v1/profile`:
/// `{member:{public_id, handle, kind, role, display_name}, credential:{plane, expires_at},
/// configuration?, measured_at}`. `configuration` appears only for an Agent; until it declares,
/// every field is null and `tool_definitions` is `[]`.
pub fn profile_json(member: &MemberRow, profile: Option<&ProfileRow>) -> Value {
    let mut body = json!({
        "member": {
            "public_id": member.public_id,
            "handle": member.handle,
            "kind": member.kind,
            "role": "member",
            "display_name": member.display_name,
        },
        "credential": {"plane": "member", "expires_at": Value::Null},
        "measured_at": now_ms(),
    });
    if member.kind == "agent" {
        let configuration = profile.and_then(|p| p.configuration.clone()).unwrap_or_else(|| {
            let mut empty = serde_json::Map::new();
            for field in CONFIGURATION_FIELDS {
                empty.insert(field.to_owned(), Value::Null);
            }
            empty.insert("tool_definitions".into(), json!([]));
            Value::Object(empty)
        });
        let slot = |content: Option<&Value>, version: i64| match content {
            Some(doc) => json!({"content": doc["content"], "role": doc["role"], "version": version}),
            None => json!({"content": Value::Null, "role": Value::Null, "version": version}),
        };
        let default = ProfileRow::default();
        let row = profile.unwrap_or(&default);
        body["configuration"] = configuration;
        body["prompt_documents"] = json!({
            "system_prompt": slot(row.system_prompt.as_ref(), row.system_prompt_version),
            "summarizer": slot(row.summarizer.as_ref(), row.summarizer_version),
        });
    }
    body
}
