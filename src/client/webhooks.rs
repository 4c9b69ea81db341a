//! `livegate webhooks`: a node's dead letters (`GET /v1/admin/webhooks/dead`), printed one
//! line each, newest first (id, type, room, attempts, how the last one failed, why it was
//! given up, when), and what a replay or a delete did. Times are relative to the node's
//! own clock (`ts_ms`), so the printing machine's clock does not matter.

use super::cells::ago;
use crate::protocol::{DeadLettersReply, ReplayReply};

/// The text `livegate webhooks --dead` prints for `reply` (ends with a newline).
pub fn render_dead(reply: &DeadLettersReply) -> String {
    let shown = reply.dead_letters.len();
    let plural = if reply.count == 1 { "" } else { "s" };
    let mut out =
        format!("node {}: {} dead letter{plural} (at most {})", reply.node, reply.count, reply.max);
    if shown < reply.count {
        out.push_str(&format!(", the newest {shown} shown"));
    }
    out.push('\n');
    for letter in &reply.dead_letters {
        let attempts = if letter.attempts == 1 {
            "1 attempt".to_string()
        } else {
            format!("{} attempts", letter.attempts)
        };
        out.push_str(&format!(
            "{}  {}  {}  {attempts}, last {} ago: {} ({}); first {} ago\n",
            letter.id,
            letter.kind,
            letter.room,
            ago(reply.ts_ms, letter.last_attempt_ms),
            letter.last_error,
            letter.reason,
            ago(reply.ts_ms, letter.first_attempt_ms),
        ));
    }
    out
}

/// The line `livegate webhooks --replay ID` prints when it was delivered.
pub fn render_replay(reply: &ReplayReply) -> String {
    format!(
        "{} {} ({} attempts in all); it left the dead letters",
        reply.id, reply.outcome, reply.attempts
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::DeadLetterView;
    use serde_json::value::RawValue;

    fn letter(
        id: &str,
        attempts: u64,
        first_ms: u64,
        last_ms: u64,
        error: &str,
        reason: &str,
    ) -> DeadLetterView {
        DeadLetterView {
            id: id.into(),
            kind: "client_published".into(),
            room: "chat:1".into(),
            url: "http://backend/hooks".into(),
            attempts,
            first_attempt_ms: first_ms,
            last_attempt_ms: last_ms,
            last_error: error.into(),
            reason: reason.into(),
            body: RawValue::from_string(format!(r#"{{"id":"{id}"}}"#)).unwrap(),
        }
    }

    #[test]
    fn dead_letters_one_line_each_newest_first() {
        let reply = DeadLettersReply {
            node: "n1".into(),
            ts_ms: 1_000_000,
            count: 3,
            max: 1000,
            dead_letters: vec![
                letter("b2", 1, 999_000, 999_000, "HTTP 410", "rejected"),
                letter("a1", 12, 600_000, 900_000, "timeout", "attempts"),
            ],
        };
        assert_eq!(
            render_dead(&reply),
            "node n1: 3 dead letters (at most 1000), the newest 2 shown
b2  client_published  chat:1  1 attempt, last 1.0s ago: HTTP 410 (rejected); first 1.0s ago
a1  client_published  chat:1  12 attempts, last 1m 40s ago: timeout (attempts); first 6m 40s ago
"
        );
        let empty = DeadLettersReply {
            node: "n1".into(),
            ts_ms: 0,
            count: 0,
            max: 5,
            dead_letters: vec![],
        };
        assert_eq!(render_dead(&empty), "node n1: 0 dead letters (at most 5)\n");
        let replayed = ReplayReply { id: "a1".into(), outcome: "delivered".into(), attempts: 13 };
        assert_eq!(
            render_replay(&replayed),
            "a1 delivered (13 attempts in all); it left the dead letters"
        );
    }
}
