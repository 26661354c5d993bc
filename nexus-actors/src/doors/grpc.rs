//! The gRPC edge: `nexus.runner.v1.RunnerService` and `nexus.agent.v1.AgentService`.
//!
//! Generated types are converted to domain calls here and go no further. Refusals travel as
//! gRPC statuses whose `nexus-error-code` metadata carries the spec's word.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use nexus_proto::agent::v1::agent_service_server::AgentService;
use nexus_proto::agent::v1::{
    CancelInputRequest, CompactExecutionRequest, CreateInputReply, CreateInputRequest, DeclareProfileRequest,
    EstimateContextRequest, Execution, ExecutionEvent, ExecutorRequest, GetConversationRequest, GetExecutionRequest,
    GetProfileRequest, JsonReply, JsonRequest, ListConversationsRequest, ListExecutionsRequest, MemoryRequest,
    NamedDefinitionRequest, PauseExecutionRequest, ProfileReply, PromptDocumentRequest, RegenerateExecutionRequest,
    ResumeExecutionRequest, StopExecutionRequest, StreamEventsRequest, TaskDecisionRequest,
};
use nexus_proto::runner::v1::runner_service_server::RunnerService;
use nexus_proto::runner::v1::{NexusFrame, RunnerFrame};
use nexus_proto::{ErrorCode, Refusal};

use crate::actors::connection::OUTBOUND_BUFFER;
use crate::actors::connection::{ConnectionActor, ConnectionArgs};
use crate::auth::bearer_of;
use crate::auth::throttle::Source;
use crate::declaration::known_fields;
use crate::doors::api::conversations::listing_limit;
use crate::doors::api::{Api, Caller, CreateInput};

/// `RunnerService`: one [`ConnectionActor`] per stream.
#[derive(Clone, Debug)]
pub struct RunnerGrpc {
    api: Arc<Api>,
}

impl RunnerGrpc {
    /// The service over the shared API.
    pub fn new(api: Arc<Api>) -> Self {
        RunnerGrpc { api }
    }
}

type FrameStream = Pin<Box<dyn Stream<Item = Result<NexusFrame, Status>> + Send>>;

#[tonic::async_trait]
impl RunnerService for RunnerGrpc {
    type ConnectStream = FrameStream;

    async fn connect(&self, request: Request<Streaming<RunnerFrame>>) -> Result<Response<Self::ConnectStream>, Status> {
        let (outbound, receiver) = mpsc::channel(OUTBOUND_BUFFER);
        let source = request.remote_addr().map(|address| Source::of(address.ip()));
        let args = ConnectionArgs {
            fabric: self.api.fabric.clone(),
            root: self.api.root.clone(),
            inbound: request.into_inner(),
            outbound,
            on_authenticated: crate::doors::sockets::current()
                .map(|socket| Box::new(move || socket.authenticated()) as Box<dyn FnOnce() + Send>),
            credentials: self.api.credentials.clone(),
            source,
        };
        ractor::Actor::spawn_linked(None, ConnectionActor, args, self.api.root.cell())
            .await
            .map_err(|e| Status::unavailable(format!("cannot open the stream: {e}")))?;
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}

/// `AgentService`: the client API over the same [`Api`] as the HTTP doors.
#[derive(Clone, Debug)]
pub struct AgentGrpc {
    api: Arc<Api>,
}

impl AgentGrpc {
    /// The service over the shared API.
    pub fn new(api: Arc<Api>) -> Self {
        AgentGrpc { api }
    }

    /// The member behind the request's one `authorization` metadata entry, presented from the
    /// peer's address.
    async fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let values = request.metadata().get_all("authorization").iter().map(|v| v.to_str().ok());
        let token = bearer_of(values).map_err(|r| r.to_status())?;
        let source = request.remote_addr().map(|address| Source::of(address.ip()));
        self.api.member_from(token, source).await.map_err(|r| r.to_status())
    }
}

/// A request's `body_json`: empty means no body; anything else must be a JSON object (a literal
/// `null` is refused like any other body that is not an object, so it can never pass for "no
/// body"). The rules and words are the HTTP bodies' ([`crate::doors::body`]).
fn body_arg(text: &str) -> Result<Option<serde_json::Value>, Status> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    crate::doors::body::object(text.as_bytes(), "body_json").map(Some).map_err(|r| r.to_status())
}

/// A JSON field of a request (`field` names it): empty means absent; otherwise any JSON value
/// (the door judges its shape), read by the HTTP bodies' rules.
fn json_arg(text: &str, field: &str) -> Result<Option<serde_json::Value>, Status> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    crate::doors::body::json(text.as_bytes(), field).map(Some).map_err(|r| r.to_status())
}

fn uuid_arg<T: std::str::FromStr>(text: &str, field: &str) -> Result<Option<T>, Status> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    text.trim()
        .parse()
        .map(Some)
        .map_err(|_| Refusal::new(ErrorCode::ParameterInvalid, format!("{field} must be a UUID")).to_status())
}

fn required_uuid<T: std::str::FromStr>(text: &str, field: &str) -> Result<T, Status> {
    uuid_arg(text, field)?
        .ok_or_else(|| Refusal::new(ErrorCode::ParameterMissing, format!("{field} is required")).to_status())
}

/// The execution a control or decision door names: required (`parameter_missing`), and a UUID
/// (`parameter_invalid`), as on the HTTP doors.
fn execution_arg(text: &str) -> Result<nexus_proto::ExecutionId, Status> {
    required_uuid(text, "execution_public_id")
}

/// The `body_json` of a door that takes no fields (approve, retry, abandon, and the reads whose
/// request has a `body_json`): empty or `{}`, as on the HTTP doors; anything else is refused, never
/// ignored.
fn empty_body(body_json: &str) -> Result<(), Status> {
    let body = body_arg(body_json)?.unwrap_or_default();
    known_fields(&body, &[]).map_err(|r| r.to_status())
}

/// The `Execution` message of an execution's JSON. The final text travels once, in its own field:
/// `execution_json` is the rest (`docs/executions.md`, "Reply bounds").
fn execution_message(mut value: serde_json::Value) -> Execution {
    let final_text = match value.as_object_mut().and_then(|object| object.remove("final_text")) {
        Some(serde_json::Value::String(text)) => text,
        _ => String::new(),
    };
    let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
    Execution {
        execution_public_id: text("execution_public_id"),
        conversation_public_id: text("conversation_public_id"),
        status: text("status"),
        final_text,
        error_key: text("error_key"),
        execution_json: value.to_string(),
    }
}

fn reply(value: &serde_json::Value) -> Response<JsonReply> {
    Response::new(JsonReply { body_json: value.to_string(), created: false })
}

fn body_of(text: &str) -> Result<serde_json::Value, Status> {
    body_arg(text)?.ok_or_else(|| Refusal::new(ErrorCode::ParameterMissing, "body_json is required").to_status())
}

type EventStream = Pin<Box<dyn Stream<Item = Result<ExecutionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for AgentGrpc {
    type StreamEventsStream = EventStream;

    async fn declare_profile(&self, request: Request<DeclareProfileRequest>) -> Result<Response<ProfileReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = body_arg(&request.get_ref().body_json)?
            .ok_or_else(|| Refusal::new(ErrorCode::ParameterMissing, "body_json is required").to_status())?;
        let profile = self.api.declare(&caller, body).await.map_err(|r| r.to_status())?;
        Ok(Response::new(ProfileReply { profile_json: profile.to_string() }))
    }

    async fn get_profile(&self, request: Request<GetProfileRequest>) -> Result<Response<ProfileReply>, Status> {
        let caller = self.caller(&request).await?;
        let profile = self.api.profile(&caller).await.map_err(|r| r.to_status())?;
        Ok(Response::new(ProfileReply { profile_json: profile.to_string() }))
    }

    async fn create_input(&self, request: Request<CreateInputRequest>) -> Result<Response<CreateInputReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let input = CreateInput {
            conversation_public_id: uuid_arg(&body.conversation_public_id, "conversation_public_id")?,
            text: body.text.clone(),
            execution_declaration: json_arg(&body.execution_declaration_json, "execution_declaration_json")?,
            runner_executor_public_id: uuid_arg(&body.runner_executor_public_id, "runner_executor_public_id")?,
            tool_names: json_arg(&body.tool_names_json, "tool_names_json")?,
            agent_public_id: uuid_arg(&body.agent_public_id, "agent_public_id")?,
            delivery_mode: match body.delivery_mode.as_str() {
                "" => None,
                word => Some(crate::doors::http::executions::delivery_mode(word).map_err(|r| r.to_status())?),
            },
            variables: json_arg(&body.variables_json, "variables_json")?,
            deliver_at: Some(body.deliver_at.clone()).filter(|text| !text.is_empty()),
            deliver_in: Some(body.deliver_in.clone()).filter(|text| !text.is_empty()),
            budget: json_arg(&body.budget_json, "budget_json")?,
        };
        let admitted = self.api.create_input(&caller, input).await.map_err(|r| r.to_status())?;
        Ok(Response::new(CreateInputReply {
            conversation_public_id: admitted.conversation_public_id.to_string(),
            input_public_id: admitted.input_public_id.to_string(),
            execution_public_id: admitted.execution_public_id.to_string(),
            turn: admitted.turn,
            delivery_mode: admitted.delivery_mode.as_str().to_owned(),
            status: admitted.status.as_str().to_owned(),
            queue_position: i64::try_from(admitted.queue_position).unwrap_or(i64::MAX),
            waits_for_execution_public_id: admitted
                .waits_for_execution_public_id
                .map(|e| e.to_string())
                .unwrap_or_default(),
            deliver_at_ms: admitted.deliver_at.unwrap_or_default(),
        }))
    }

    async fn cancel_input(&self, request: Request<CancelInputRequest>) -> Result<Response<Execution>, Status> {
        let caller = self.caller(&request).await?;
        let id = required_uuid(&request.get_ref().input_public_id, "input_public_id")?;
        let execution = self.api.cancel_input(&caller, id).await.map_err(|r| r.to_status())?;
        Ok(Response::new(execution_message(execution)))
    }

    async fn get_execution(&self, request: Request<GetExecutionRequest>) -> Result<Response<Execution>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = required_uuid(&body.execution_public_id, "execution_public_id")?;
        let tasks_after = Some(body.tasks_after.as_str()).filter(|after| !after.is_empty());
        let execution = self.api.execution_page(&caller, id, tasks_after).await.map_err(|r| r.to_status())?;
        Ok(Response::new(execution_message(execution)))
    }

    async fn list_children(&self, request: Request<GetExecutionRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let id = required_uuid(&request.get_ref().execution_public_id, "execution_public_id")?;
        let listed = self.api.children(&caller, id).await.map_err(|r| r.to_status())?;
        Ok(reply(&listed))
    }

    async fn stream_events(
        &self,
        request: Request<StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = required_uuid(&body.execution_public_id, "execution_public_id")?;
        let feed = crate::doors::api::Feed { transcript: body.transcript, progress: body.progress };
        let events = self.api.watch(&caller, id, &body.after, body.follow, feed).await.map_err(|r| r.to_status())?;
        let stream = futures::StreamExt::map(events, |item| {
            item.map(|event| ExecutionEvent {
                cursor: event.cursor,
                r#type: event.event_type.as_str().to_owned(),
                data_json: event.data.to_string(),
                at_ms: event.at,
            })
            .map_err(|r| r.to_status())
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_prompt_document(
        &self,
        request: Request<PromptDocumentRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        empty_body(&request.get_ref().body_json)?;
        let document = self.api.prompt_document(&caller, &request.get_ref().slot).await.map_err(|r| r.to_status())?;
        Ok(reply(&document))
    }

    async fn put_prompt_document(
        &self,
        request: Request<PromptDocumentRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        // `null` clears the slot, as on the HTTP door.
        let body = json_arg(&request.get_ref().body_json, "body_json")?
            .ok_or_else(|| Refusal::new(ErrorCode::ParameterMissing, "body_json is required").to_status())?;
        let document =
            self.api.put_prompt_document(&caller, &request.get_ref().slot, body).await.map_err(|r| r.to_status())?;
        Ok(reply(&document))
    }

    async fn list_named_definitions(&self, request: Request<JsonRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        empty_body(&request.get_ref().body_json)?;
        Ok(reply(&self.api.named_definitions(&caller).await.map_err(|r| r.to_status())?))
    }

    async fn put_named_definition(
        &self,
        request: Request<NamedDefinitionRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = body_of(&request.get_ref().body_json)?;
        let (created, definition) =
            self.api.put_named_definition(&caller, &request.get_ref().name, body).await.map_err(|r| r.to_status())?;
        Ok(Response::new(JsonReply { body_json: definition.to_string(), created }))
    }

    async fn delete_named_definition(
        &self,
        request: Request<NamedDefinitionRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        empty_body(&request.get_ref().body_json)?;
        self.api.delete_named_definition(&caller, &request.get_ref().name).await.map_err(|r| r.to_status())?;
        Ok(reply(&serde_json::json!({})))
    }

    async fn list_tools(&self, request: Request<JsonRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        empty_body(&request.get_ref().body_json)?;
        Ok(reply(&self.api.tools(&caller)))
    }

    async fn preview_assembly(&self, request: Request<JsonRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = body_of(&request.get_ref().body_json)?;
        Ok(reply(&self.api.assembly_preview(&caller, &body).await.map_err(|r| r.to_status())?))
    }

    async fn list_executors(&self, request: Request<JsonRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = body_arg(&request.get_ref().body_json)?.unwrap_or_default();
        known_fields(&body, &["kind"]).map_err(|r| r.to_status())?;
        let kind = match body.get("kind") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(kind)) => Some(kind.as_str()),
            Some(_) => {
                return Err(
                    Refusal::new(ErrorCode::ParameterInvalid, "kind must be runner or tools_provider").to_status()
                );
            }
        };
        Ok(reply(&self.api.executors(&caller, kind).await.map_err(|r| r.to_status())?))
    }

    async fn get_executor(&self, request: Request<ExecutorRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        Ok(reply(&self.api.executor(&caller, &request.get_ref().executor_public_id).await.map_err(|r| r.to_status())?))
    }

    async fn list_models(&self, request: Request<JsonRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        empty_body(&request.get_ref().body_json)?;
        Ok(reply(&self.api.models(&caller)))
    }

    async fn stop_execution(&self, request: Request<StopExecutionRequest>) -> Result<Response<Execution>, Status> {
        let caller = self.caller(&request).await?;
        let id = required_uuid(&request.get_ref().execution_public_id, "execution_public_id")?;
        let force = request.get_ref().force.unwrap_or(true);
        let execution = self.api.stop(&caller, id, force).await.map_err(|r| r.to_status())?;
        Ok(Response::new(execution_message(execution)))
    }

    async fn pause_execution(&self, request: Request<PauseExecutionRequest>) -> Result<Response<Execution>, Status> {
        let caller = self.caller(&request).await?;
        let id = execution_arg(&request.get_ref().execution_public_id)?;
        let execution = self.api.pause(&caller, id, request.get_ref().force).await.map_err(|r| r.to_status())?;
        Ok(Response::new(execution_message(execution)))
    }

    async fn resume_execution(&self, request: Request<ResumeExecutionRequest>) -> Result<Response<Execution>, Status> {
        let caller = self.caller(&request).await?;
        let id = execution_arg(&request.get_ref().execution_public_id)?;
        let execution = self.api.resume(&caller, id).await.map_err(|r| r.to_status())?;
        Ok(Response::new(execution_message(execution)))
    }

    async fn regenerate_execution(
        &self,
        request: Request<RegenerateExecutionRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = execution_arg(&body.execution_public_id)?;
        let declaration = json_arg(&body.execution_declaration_json, "execution_declaration_json")?;
        let regenerated = self
            .api
            .regenerate(&caller, id, &serde_json::json!({"execution_declaration": declaration}))
            .await
            .map_err(|r| r.to_status())?;
        Ok(Response::new(JsonReply { body_json: regenerated.to_string(), created: true }))
    }

    async fn estimate_context(&self, request: Request<EstimateContextRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = execution_arg(&body.execution_public_id)?;
        let declaration = json_arg(&body.execution_declaration_json, "execution_declaration_json")?;
        let estimate = self
            .api
            .estimate(&caller, id, &serde_json::json!({"execution_declaration": declaration}))
            .await
            .map_err(|r| r.to_status())?;
        Ok(reply(&estimate))
    }

    async fn approve_task(&self, request: Request<TaskDecisionRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = execution_arg(&body.execution_public_id)?;
        empty_body(&body.body_json)?;
        Ok(reply(&self.api.approve_task(&caller, id, &body.task_key).await.map_err(|r| r.to_status())?))
    }

    async fn deny_task(&self, request: Request<TaskDecisionRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = execution_arg(&body.execution_public_id)?;
        let decision = body_arg(&body.body_json)?.unwrap_or_default();
        Ok(reply(&self.api.deny_task(&caller, id, &body.task_key, &decision).await.map_err(|r| r.to_status())?))
    }

    async fn answer_task(&self, request: Request<TaskDecisionRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = execution_arg(&body.execution_public_id)?;
        let answer = body_arg(&body.body_json)?.unwrap_or_default();
        Ok(reply(&self.api.answer_task(&caller, id, &body.task_key, &answer).await.map_err(|r| r.to_status())?))
    }

    async fn retry_task(&self, request: Request<TaskDecisionRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = execution_arg(&body.execution_public_id)?;
        empty_body(&body.body_json)?;
        Ok(reply(&self.api.retry_task(&caller, id, &body.task_key).await.map_err(|r| r.to_status())?))
    }

    async fn abandon_task(&self, request: Request<TaskDecisionRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = execution_arg(&body.execution_public_id)?;
        empty_body(&body.body_json)?;
        Ok(reply(&self.api.abandon_task(&caller, id, &body.task_key).await.map_err(|r| r.to_status())?))
    }

    async fn list_conversations(
        &self,
        request: Request<ListConversationsRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let limit = listing_limit(body.limit.map(u64::from)).map_err(|r| r.to_status())?;
        let after = Some(body.after.as_str()).filter(|after| !after.is_empty());
        Ok(reply(&self.api.list_conversations(&caller, after, limit).await.map_err(|r| r.to_status())?))
    }

    async fn get_conversation(&self, request: Request<GetConversationRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let id = required_uuid(&body.conversation_public_id, "conversation_public_id")?;
        let turns_after = i64::from(body.turns_after);
        Ok(reply(&self.api.conversation(&caller, id, turns_after).await.map_err(|r| r.to_status())?))
    }

    async fn list_executions(&self, request: Request<ListExecutionsRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let limit = listing_limit(body.limit.map(u64::from)).map_err(|r| r.to_status())?;
        let given = |text: &str| Some(text.to_owned()).filter(|text| !text.is_empty());
        let (conversation, status, after) =
            (given(&body.conversation_public_id), given(&body.status), given(&body.after));
        let listed = self
            .api
            .list_executions(&caller, conversation.as_deref(), status.as_deref(), after.as_deref(), limit)
            .await
            .map_err(|r| r.to_status())?;
        Ok(reply(&listed))
    }

    async fn compact_execution(
        &self,
        request: Request<CompactExecutionRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let id = execution_arg(&request.get_ref().execution_public_id)?;
        let accepted = self.api.compact(&caller, id).await.map_err(|r| r.to_status())?;
        Ok(Response::new(JsonReply { body_json: accepted.to_string(), created: true }))
    }

    async fn get_memory(&self, request: Request<MemoryRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        empty_body(&body.body_json)?;
        let mut query = memory_query(body);
        query.revisions = body.revisions.then(|| "true".to_owned());
        let document =
            self.api.get_memory(&caller, &body.binding, &body.path, &query).await.map_err(|r| r.to_status())?;
        Ok(reply(&document))
    }

    async fn put_memory(&self, request: Request<MemoryRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        let document = json_arg(&body.body_json, "body_json")?
            .ok_or_else(|| Refusal::new(ErrorCode::ParameterMissing, "body_json is required").to_status())?;
        let written = self
            .api
            .put_memory(&caller, &body.binding, &body.path, &memory_query(body), &document)
            .await
            .map_err(|r| r.to_status())?;
        let created = written["created"] == true;
        Ok(Response::new(JsonReply { body_json: written.to_string(), created }))
    }

    async fn delete_memory(&self, request: Request<MemoryRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        empty_body(&body.body_json)?;
        let deleted = self
            .api
            .delete_memory(&caller, &body.binding, &body.path, &memory_query(body))
            .await
            .map_err(|r| r.to_status())?;
        Ok(reply(&deleted))
    }

    async fn list_memory(&self, request: Request<MemoryRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = self.caller(&request).await?;
        let body = request.get_ref();
        empty_body(&body.body_json)?;
        let mut query = memory_query(body);
        query.binding = Some(body.binding.clone()).filter(|b| !b.is_empty());
        query.prefix = Some(body.prefix.clone()).filter(|p| !p.is_empty());
        Ok(reply(&self.api.list_memory(&caller, &query).await.map_err(|r| r.to_status())?))
    }
}

/// The root-naming fields of a memory request, as the HTTP doors' query carries them.
fn memory_query(body: &MemoryRequest) -> crate::doors::api::memory::MemoryQuery {
    let given = |text: &str| Some(text.to_owned()).filter(|text| !text.is_empty());
    crate::doors::api::memory::MemoryQuery {
        conversation: given(&body.conversation_public_id),
        agent_public_id: given(&body.agent_public_id),
        ..Default::default()
    }
}

/// A gRPC service whose refusals all carry their word: tonic refuses a request message over the
/// service's decoding bound itself, with a bare `OUT_OF_RANGE` and before any of our code runs;
/// this wrapper answers it as every other oversize body is answered, `content_too_large` in the
/// `nexus-error-code` metadata with a message that says what to do (`docs/protocol.md`,
/// "Refusals"). Every other answer passes through untouched.
#[derive(Clone, Debug)]
pub struct Worded<S> {
    inner: S,
}

impl<S> Worded<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Worded { inner }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Worded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Worded<S>
where
    S: tonic::codegen::Service<
            tonic::codegen::http::Request<B>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
{
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: tonic::codegen::http::Request<B>) -> Self::Future {
        let answer = self.inner.call(request);
        Box::pin(async move { answer.await.map(worded) })
    }
}

/// `response`, or, when it is tonic's own bare refusal of an oversize message (in the headers of
/// a trailers-only answer), the same refusal with its word.
fn worded(
    response: tonic::codegen::http::Response<tonic::body::Body>,
) -> tonic::codegen::http::Response<tonic::body::Body> {
    let headers = response.headers();
    if headers.contains_key("nexus-error-code") {
        return response;
    }
    let Some(status) = Status::from_header_map(headers) else { return response };
    if status.code() != tonic::Code::OutOfRange {
        return response;
    }
    let refusal = crate::doors::body::too_large("the request message");
    Refusal { message: format!("{} ({})", refusal.message, status.message()), ..refusal }.to_status().into_http()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_oversize_refusal_gets_its_word_and_nothing_else_changes() {
        let bare =
            Status::out_of_range("Error, decoded message length too large: found 9 bytes, the limit is: 8 bytes");
        let answer = worded(bare.into_http());
        let refusal = Refusal::from_status(&Status::from_header_map(answer.headers()).expect("a status"));
        assert_eq!(refusal.code, ErrorCode::ContentTooLarge);
        assert!(refusal.message.contains("found 9 bytes"), "{}", refusal.message);
        let ours = Refusal::new(ErrorCode::NotFound, "no execution x").to_status().into_http();
        let passed = worded(ours);
        assert_eq!(
            Refusal::from_status(&Status::from_header_map(passed.headers()).expect("a status")).code,
            ErrorCode::NotFound
        );
        let other: tonic::codegen::http::Response<tonic::body::Body> = Status::internal("boom").into_http();
        assert_eq!(Status::from_header_map(worded(other).headers()).map(|s| s.code()), Some(tonic::Code::Internal));
    }
}
