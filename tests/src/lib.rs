//! The nexus test harness: a real server and real or scripted runners on 127.0.0.1:0.
//!
//! Owns: [`TestServer`] (nexus in-process with a temporary data dir and scripted models),
//! [`RawRunner`] (a scripted fake runner that speaks the stream frame by frame), [`TcpProxy`]
//! (cuts, black-holes or delays streams on demand), helpers to find and start the `runner-agent`
//! and `nexus` binaries ([`processes`]), the chaos suite's seed, fault plans and observing
//! runner ([`chaos`]) with the invariants every chaos scenario ends with ([`invariants`]), a
//! fake model provider speaking the OpenAI and Anthropic wires ([`FakeProvider`]), and a
//! bearer-authorized gRPC Agent API client ([`client`]).
//! Production code lives elsewhere; nothing here is used by the server.

pub mod chaos;
pub mod client;
pub mod fake_provider;
pub mod http;
pub mod invariants;
pub mod probe;
pub mod processes;
pub mod proxy;
pub mod raw_runner;
pub mod server;

pub use client::{agent_client, authed};
pub use fake_provider::{Act, FakeProvider, FakeRequest, Wire};
pub use http::{Answer, Http};
pub use proxy::{Direction, TcpProxy};
pub use raw_runner::{OfferTally, RawRunner, Reply};
pub use server::{
    DEFAULT_TEST_POSTGRES_URL, Minted, TestDatabase, TestServer, agent_config, key, mcp_fixture_binary, nexus_binary,
    runner_agent_binary, test_store_backend, wait_until,
};
