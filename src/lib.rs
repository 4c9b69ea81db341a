//! livegate: a real-time push gateway in one binary.
//!
//! # Layout
//!
//! - [`core`]: pure decisions (sequence log, batching window, tokens, names); no I/O, no clock.
//! - [`store`]: the embedded sled store, a typed facade per subsystem; the only module
//!   that touches sled.
//! - [`cluster`]: cluster mode on NATS JetStream: room logs, the KV session directory,
//!   heartbeats and cross-node user commands; the only module that knows NATS.
//! - [`protocol`]: the JSON wire format; the only module that knows it.
//! - [`actors`]: connection, room and registry actors and the messages between them; a
//!   connection's transport (WebSocket or Server-Sent Events).
//! - [`http`]: thin actix-web handlers for `/v1/*`, health, the WebSocket upgrade and the
//!   SSE stream.
//! - [`server`]: `run(listener, config, shutdown)`; its `Node` wires it all together
//!   (`build`), serves, and stops it in order (`shutdown`).
//! - [`metrics`]: counters and gauges behind `/metrics`.
//! - [`demo`]: the `--demo` match simulator.
//! - [`tasks`]: background tasks with an owner that ends them at its stop.
//! - [`world`]: the wall clock and the OS random source, read only by actors and handlers.
//! - [`config`]: typed configuration from file, environment and flags.
//! - [`client`]: clients of a running server: the HTTP client and the reconnecting
//!   terminal subscriber behind `token`, `publish`, `status` and `subscribe`.
//! - [`reference`]: the Markdown references `livegate reference` prints (configuration,
//!   metrics, error and close codes), generated from their definitions.
//! - [`cli`]: the command-line front end (`serve`, `token`, `publish`, `subscribe`).

pub mod actors;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod config;
pub mod core;
pub mod demo;
pub mod http;
pub mod metrics;
pub mod protocol;
pub mod reference;
pub mod server;
pub mod store;
pub mod tasks;
pub mod world;
