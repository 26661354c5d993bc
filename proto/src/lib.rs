//! The wire contract of nexus, and the only language that the server and the runner share.
//!
//! Owns: the generated `nexus.runner.v1` and `nexus.agent.v1` modules (tonic and prost), the
//! encoded file descriptor set that server reflection serves, [`ErrorCode`] (the stable refusal
//! words with their HTTP status and gRPC code), and the typed vocabulary both sides share: id
//! newtypes ([`ids`]), statuses and kinds ([`status`]) and task keys ([`TaskKey`]).
//!
//! Does not own: actors, I/O or any domain logic. Generated types are converted to domain types
//! at the edge of each crate and go no further.

pub mod error;
pub mod ids;
pub mod status;
pub mod task_key;
#[doc(hidden)]
pub mod words;

pub use error::{ErrorCode, Refusal};
pub use ids::{ConversationId, ExecutionId, InputId, MalformedId, MemberId, RunnerId};
pub use status::{
    AssignmentScope, AttentionReason, ChildDisposition, ChildKind, ChildLifetime, ChildWake, DeliveryMode,
    ExecutorKind, ExecutorStatus, GrantRole, InboxKind, JoinLosers, JoinPolicy, LifecycleEvent, MemberKind,
    MemberStatus, Presence, RunStatus, SteerOutcome, TaskKind, TaskStatus,
};
pub use task_key::{InvalidTaskKey, TaskKey};
pub use words::UnknownWord;

/// `nexus.runner.v1`: the runner stream (`RunnerService/Connect`).
pub mod runner {
    /// Version 1 of the runner protocol.
    pub mod v1 {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("nexus.runner.v1");
    }
}

/// `nexus.agent.v1`: the client API (profiles, inputs, executions, events).
pub mod agent {
    /// Version 1 of the client API.
    pub mod v1 {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("nexus.agent.v1");
    }
}

/// The encoded `FileDescriptorSet` of every `.proto` file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("nexus_descriptor");

/// The runner protocol version this build speaks (`Hello.protocol_version`).
pub const RUNNER_PROTOCOL_VERSION: u32 = 1;
