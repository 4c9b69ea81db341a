//! The pure core: decisions without I/O. Nothing here imports actix, sled or serde_json,
//! and nothing reads the clock: time is always a parameter (`lifecycle` holds its phase in
//! a tokio watch channel, which is no I/O either). Actors call into it with `now`
//! and carry out what it returns.

pub mod credentials;
pub mod delivery;
pub mod nodes;
pub mod rules;
