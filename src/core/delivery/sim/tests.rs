//! The proptest over the simulation, the bugs it must find when planted in the room's or
//! the connection's machine, and a few cases played by hand.

use super::wire::EVENT_BYTES;
use super::*;

type Setup = (usize, u64, usize, usize, Vec<Kind>, Vec<Step>);

fn setup() -> impl Strategy<Value = Setup> {
    (
        2usize..30,
        1u64..40,
        // Bounds of whole events too, which windows can fill to the byte.
        prop_oneof![300usize..3000, (3usize..30).prop_map(|events| events * EVENT_BYTES)],
        1usize..5,
        proptest::collection::vec(any::<Kind>(), 1..4),
        proptest::collection::vec(step(), 1..200),
    )
}

/// Run `steps` with `plants` in the machines, checking after every step.
fn play((keep, max_recovery, max_outbox, window_events, clients, steps): Setup, plants: Plants) {
    let mut sim = Sim::planted(keep, max_recovery, max_outbox, window_events, &clients, plants);
    for step in steps {
        let step = match step {
            Step::ConnTakes(n)
            | Step::ClientReads(n)
            | Step::Resubscribe(n, _)
            | Step::Drop(n)
            | Step::Reconnect(n)
                if n >= sim.clients.len() =>
            {
                continue
            }
            step => step,
        };
        sim.run(step);
        sim.check();
    }
    sim.settle();
    sim.check();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn every_client_gets_every_durable_event_once_and_in_order(setup in setup()) {
        play(setup, Plants::default());
    }
}

/// The smallest case proptest finds with `plants` in the machines, if any.
fn found(plants: Plants) -> Option<String> {
    let config =
        ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    match runner.run(&setup(), |setup| {
        play(setup, plants);
        Ok(())
    }) {
        Ok(()) => None,
        Err(error) => Some(error.to_string()),
    }
}

#[test]
fn a_bug_planted_in_the_rooms_window_or_eviction_is_found() {
    for room in [RoomPlant::WindowDropsLast, RoomPlant::EvictionKeeps] {
        let failure = found(Plants { room, ..Plants::default() });
        eprintln!("{room:?}: {failure:?}");
        assert!(failure.is_some(), "{room:?} went unnoticed");
    }
}

#[test]
fn a_bug_planted_in_the_connections_grace_or_direct_writes_is_found() {
    for conn in [ConnPlant::GraceNeverEnds, ConnPlant::WriteOvertakes] {
        let failure = found(Plants { conn, ..Plants::default() });
        eprintln!("{conn:?}: {failure:?}");
        assert!(failure.is_some(), "{conn:?} went unnoticed");
    }
}

#[test]
fn a_client_that_does_not_read_is_closed_after_the_grace() {
    // Its subscribe's replay (500 bytes) takes it over its 300-byte bound at once.
    let mut sim = Sim::new(100, 100, 300, 1, &[(true, false)]);
    sim.run(Step::Publish(5));
    sim.run(Step::Durable);
    sim.run(Step::RoomTakes);
    sim.run(Step::ConnTakes(0));
    let conn = sim.clients[0].conn.as_ref().unwrap();
    assert!(!conn.closed, "over the bound, but within the grace");
    assert_eq!(conn.backlog.held(), 500);
    sim.run(Step::Tick(4_999));
    assert!(!sim.clients[0].conn.as_ref().unwrap().closed);
    sim.run(Step::Tick(1));
    assert!(sim.clients[0].conn.as_ref().unwrap().closed);
    sim.run(Step::Publish(1));
    sim.run(Step::Durable);
    sim.run(Step::CloseWindow);
    sim.run(Step::ConnTakes(0));
    sim.check();
    assert_eq!(sim.clients[0].last, 5);
    // The client never answers the Close: the connection stops and leaves the room.
    sim.run(Step::Tick(5_000));
    assert!(sim.clients[0].conn.is_none());
}

#[test]
fn a_closed_connection_writes_nothing_more() {
    for direct in [false, true] {
        let mut sim = Sim::new(100, 100, 300, 1, &[(true, direct)]);
        sim.run(Step::RoomTakes);
        sim.run(Step::ConnTakes(0));
        // Two windows wait in its mailbox (or were written at once) when a large reply
        // takes it over the bound.
        sim.run(Step::Publish(2));
        sim.run(Step::Durable);
        sim.run(Step::CloseWindow);
        let conn = sim.clients[0].conn.as_ref().unwrap();
        conn.backlog.set_queued(400);
        sim.run(Step::Tick(1));
        sim.run(Step::Tick(5_000));
        assert!(sim.clients[0].conn.as_ref().unwrap().closed, "direct: {direct}");
        let last = sim.clients[0].last;
        sim.run(Step::ConnTakes(0));
        sim.run(Step::ConnTakes(0));
        sim.run(Step::Publish(1));
        sim.run(Step::Durable);
        sim.run(Step::CloseWindow);
        sim.check();
        assert_eq!(sim.clients[0].last, last, "direct: {direct}");
    }
}
