//! Demo mode (`livegate serve --demo`): a match simulator publishing into `match:1..4`
//! through the same [`Publisher`] as the HTTP API, a few events per second in all. The
//! matches are the pure [`MatchSim`]; this module only drives it with time and randomness,
//! and writes its events and states as JSON (the demo's own, not the wire format).
//! Every event carries its match's state (score, minute, status) as the room's state, and
//! a restarted simulator resumes each match from its stored state instead of kicking off
//! again.

pub mod matchsim;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use self::matchsim::{MatchEvent, MatchSim, MatchState, Status};
use crate::actors::messages::NewEvent;
use crate::actors::publish::Publisher;
use crate::world::random_u64;

/// One simulator step this often (about half of the steps produce an event).
const STEP: Duration = Duration::from_millis(200);
pub const MATCHES: usize = 4;

/// Publish simulated match events until the task is dropped.
pub async fn run_simulator(publisher: Publisher) {
    let mut sim = MatchSim::new(MATCHES);
    for match_id in 1..=MATCHES as u32 {
        let room = format!("match:{match_id}");
        match publisher.state(&room).await {
            Ok(view) => {
                if let Some(stored) = view.data.as_deref().and_then(parse_state) {
                    tracing::info!(%room, minute = stored.minute, status = stored.status.as_str(), "demo match resumed");
                    sim.resume(match_id, stored);
                }
            }
            Err(error) => {
                tracing::warn!(%room, %error, "demo match state unreadable; it starts afresh")
            }
        }
    }
    // Ids must not collide with those a previous run left in history.
    let run = format!("{:08x}", random_u64() as u32);
    let mut n = 0u64;
    loop {
        actix_web::rt::time::sleep(STEP).await;
        let Some(event) = sim.step(random_u64()) else { continue };
        n += 1;
        let room = format!("match:{}", event.match_id);
        let id: Arc<str> = format!("demo-{run}-{n}").into();
        let data: Arc<str> = event_data(&event).into();
        let state = sim
            .state(event.match_id)
            .map(|s| state_data(event.match_id, event.home, event.away, &s).into());
        if let Err(error) =
            publisher.publish(&room, NewEvent { id, data, devices: None, from: None, state }).await
        {
            tracing::warn!(%room, %error, "demo event not published");
        }
    }
}

/// The `data` of a demo match event.
fn event_data(event: &MatchEvent) -> String {
    serde_json::json!({
        "type": event.kind.as_str(),
        "match": event.match_id,
        "home": event.home,
        "away": event.away,
        "minute": event.minute,
        "team": event.team.map(|side| if side == 0 { "home" } else { "away" }),
        "score": event.score,
        "text": event.text,
    })
    .to_string()
}

/// The room state of a demo match: what the score page shows on load and
/// what a restarted simulator resumes from.
fn state_data(match_id: u32, home: &str, away: &str, state: &MatchState) -> String {
    serde_json::json!({
        "match": match_id,
        "home": home,
        "away": away,
        "minute": state.minute,
        "score": state.score,
        "status": state.status.as_str(),
    })
    .to_string()
}

/// A demo match's stored state, if it reads as one.
fn parse_state(text: &str) -> Option<MatchState> {
    #[derive(Deserialize)]
    struct Stored {
        minute: u32,
        score: [u32; 2],
        status: String,
    }
    let stored: Stored = serde_json::from_str(text).ok()?;
    let status = Status::parse(&stored.status)?;
    Some(MatchState { minute: stored.minute, score: stored.score, status })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_states_read_back() {
        let state = MatchState { minute: 61, score: [3, 2], status: Status::Playing };
        let text = state_data(2, "Harbour FC", "City Rovers", &state);
        assert_eq!(parse_state(&text), Some(state), "{text}");
        for bad in [
            "null",
            "{}",
            r#"{"minute":1,"score":[0,0],"status":"halftime"}"#,
            r#"{"minute":-1,"score":[0,0],"status":"playing"}"#,
        ] {
            assert_eq!(parse_state(bad), None, "{bad}");
        }
    }
}
