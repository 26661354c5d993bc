//! The actors (ractor on tokio): [`root`] supervises and finds the others; [`profile`] is the
//! only writer of an Agent's standing declaration; [`executor`] owns a runner's inbox and
//! [`connection`] one live stream to it; [`execution`] drives one execution's rounds. See
//! `docs/architecture.md` for what each owns and how one tool call crosses them.

pub mod connection;
pub mod execution;
pub mod executor;
pub mod fabric;
pub mod handle;
pub mod profile;
pub mod progress;
pub mod root;
