//! Hostile clients (issue 29): each case is one client doing what an attacker would, with
//! or without a token, against a real server on `127.0.0.1:0` with real sockets. Every
//! case asserts that the node stays bounded (RSS read from `/proc`, open descriptors,
//! store size) and keeps serving an honest client meanwhile, with nothing lost.
//!
//! One module per kind of attack; the harness is `tests/it/common`.

mod credentials;
mod http;
mod memory;
mod outbox;
mod rooms;
