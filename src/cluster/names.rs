//! Every NATS subject, stream and bucket name the cluster shares (the listeners' own
//! subjects are built in [`super::bus`], [`super::occupancy`] and [`super::presence`]), and
//! how a room or a cell is written in them.

/// The stream every room's events are stored in.
pub const ROOMS_STREAM: &str = "LG_ROOMS";
pub const LIVE_SUBJECTS: &str = "lg.live.>";
/// Rooms' latest states, one message per room (see [`super::roomlog`]).
pub const STATE_STREAM: &str = "LG_STATE";
/// Where the state stream republishes what it stores, for the other nodes' rooms.
pub const LIVE_STATE_SUBJECTS: &str = "lg.livestate.>";
pub const SESSIONS_BUCKET: &str = "lg_sessions";
pub const NONCES_BUCKET: &str = "lg_nonces";
pub const META_BUCKET: &str = "lg_meta";
pub const HEARTBEAT_SUBJECT: &str = "lg.node.heartbeat";
pub const LEAVE_SUBJECT: &str = "lg.node.leave";
pub const REPLACE_SUBJECT: &str = "lg.user.replace";
pub const KICK_SUBJECT: &str = "lg.user.kick";
/// A node took a user's sessions (a move): the user's connections on the other nodes
/// follow there.
pub const MOVED_SUBJECT: &str = "lg.user.moved";

/// The name of this cell's mirror of `cell`'s stream `stream`.
pub fn mirror_name(stream: &str, cell: &str) -> String {
    format!("{stream}_{cell}")
}

/// A stream's subjects: `lg.<kind>.>`, or with cell domains `lg.<kind>.<cell>.>`.
pub(super) fn cell_subjects(kind: &str, cell: Option<&str>) -> String {
    match cell {
        Some(cell) => format!("lg.{kind}.{cell}.>"),
        None => format!("lg.{kind}.>"),
    }
}

/// A room name as one subject token (and KV key part): lowercase hex of its bytes.
pub fn room_token(room: &str) -> String {
    hex::encode(room)
}

/// The room a subject token names, if it is one [`room_token`] made.
pub fn room_from_token(token: &str) -> Option<String> {
    String::from_utf8(hex::decode(token).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_tokens_round_trip_and_reject_junk() {
        for room in ["a", "user:alice@x.org", "match:2026.final-1_b"] {
            let token = room_token(room);
            assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
            assert_eq!(room_from_token(&token).as_deref(), Some(room));
        }
        for junk in ["6", "zz", "ff", "6g", "+6"] {
            assert_eq!(room_from_token(junk), None, "{junk}");
        }
    }
}
