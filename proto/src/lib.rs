//! The wire contract of nexus, and the only language that the server and the runner share.
//!
//! Owns: the generated `nexus.runner.v1` and `nexus.agent.v1` modules (tonic and prost), the
//! encoded file descriptor set that server reflection serves, and [`ErrorCode`]: the stable
//! refusal words of spec/REFERENCE.md with their HTTP status and gRPC code.
//!
//! Does not own: actors, I/O or any domain logic. Generated types are converted to domain types
//! at the edge of each crate and go no further.

pub mod error;

pub use error::{ErrorCode, Refusal};

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
