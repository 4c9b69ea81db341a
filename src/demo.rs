//! Demo mode (`livegate serve --demo`): a match simulator publishing into `match:1..4`
//! through the same [`Publisher`] as the HTTP API, a few events per second in all. The
//! matches are the pure [`MatchSim`]; this module only drives it with time and randomness.
//! Every event carries its match's state (score, minute, status) as the room's state, and
//! a restarted simulator resumes each match from its stored state instead of kicking off
//! again.

use std::sync::Arc;
use std::time::Duration;

use crate::actors::messages::NewEvent;
use crate::actors::publish::Publisher;
use crate::core::matchsim::MatchSim;
use crate::protocol;
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
                if let Some(stored) = view.data.as_deref().and_then(protocol::parse_demo_state) {
                    tracing::info!(%room, minute = stored.minute, status = stored.status.as_str(), "demo match resumed");
                    sim.resume(match_id, stored);
                }
            }
            Err(error) => tracing::warn!(%room, %error, "demo match state unreadable; it starts afresh"),
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
        let data: Arc<str> = protocol::demo_event_data(&event).into();
        let state = sim.state(event.match_id).map(|s| protocol::demo_state_data(event.match_id, event.home, event.away, &s).into());
        if let Err(error) = publisher.publish(&room, NewEvent { id, data, devices: None, from: None, state }).await {
            tracing::warn!(%room, %error, "demo event not published");
        }
    }
}
