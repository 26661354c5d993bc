//! The integration suites in one test binary: each module drives a real server (in this process
//! or as a child) with real or scripted runners on 127.0.0.1. One binary links the server once;
//! the chaos suite is its own binary because it runs serialized and time-boxed.

mod approval;
mod approval_runner_agent;
mod ask;
mod assignment;
mod batches;
mod bounds;
mod budgets;
mod compaction;
mod conformance;
mod conformance_props;
mod control;
mod conversations;
mod delegation;
mod discovery;
mod executions;
mod fabric;
mod hooks;
mod http_executions;
mod listing;
mod mcp_hub;
mod memory;
mod models;
mod people;
mod pressure;
mod queue;
mod quickstart;
mod refusals;
mod resources;
mod round_driver;
mod runner_tools;
mod scheduled;
mod sessions;
mod store;
mod tls;
mod transcript;
