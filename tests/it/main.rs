//! The integration tests, as one test binary: one module per behaviour (each was a file
//! of its own under `tests/`, hence a binary of its own, until issue 31) and `common`, the
//! harness they share. One binary compiles and links once instead of some forty times.
//!
//! Run one area with its module path as the filter:
//! `cargo test --release --test it cluster::` (or `hostile::memory::`, ...).
//!
//! Tests of different modules do not run at the same time, as when each was a binary:
//! every test enters `common::concurrency`'s gate first (the rule is written there).

mod common;

mod access;
mod admin;
mod bad_input;
mod book;
mod browser_access;
mod cli;
mod client_library;
mod client_publish;
mod cluster;
mod conformance;
mod crash;
mod descriptors;
mod directory;
mod drain;
mod fan_out;
mod heartbeat;
mod hostile;
mod inbox_and_kick;
mod jwt;
mod layering;
mod limits;
mod namespaces;
mod observability;
mod openapi;
mod presence;
mod process_restart;
mod proxies;
mod recovery_stress;
mod reference;
mod resume;
mod route_cli;
mod routing;
mod scale_out;
mod sessions;
mod slow_consumer;
mod slow_consumers_at_scale;
mod spine_flow;
mod sse;
mod state;
mod tls;
mod tokens;
mod users;
mod webhooks;
