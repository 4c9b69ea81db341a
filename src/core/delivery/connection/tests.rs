//! The connection machine driven by tables: inputs at a time, and the actions it asks for.

use super::*;
use crate::core::delivery::testing::Ev;

fn settings() -> Settings {
    Settings {
        max_subscriptions: 2,
        max_outbox_bytes: 1000,
        max_messages_per_sec: 0,
        max_bad_messages: 2,
        max_room_starts_per_sec: 0,
        max_history_limit: 500,
        heartbeat_ms: 1000,
        subscribe_timeout_ms: None,
        close_handshake_ms: 5000,
        reads: true,
        direct: true,
    }
}

fn grants() -> Grants {
    Grants {
        user: "ann".into(),
        device: "phone".into(),
        rooms: Vec::new(),
        publish: vec!["chat:*".to_string()],
    }
}

fn machine(settings: Settings) -> Connection<()> {
    Connection::new(grants(), settings, 0)
}

/// Everything the machine asks for now.
fn drained(conn: &mut Connection<()>) -> Vec<Action<()>> {
    std::iter::from_fn(|| conn.poll()).collect()
}

fn ask(room: &str) -> Ask {
    Ask {
        room: room.to_string(),
        since: None,
        epoch: None,
        state: false,
        presence: false,
        reference: Some(1),
    }
}

fn error(room: Option<&str>, refusal: Refusal, message: &str) -> Action<()> {
    Action::Error {
        reference: Some(1),
        room: room.map(str::to_string),
        refusal,
        message: message.to_string(),
    }
}

fn subscribe_action(room: &str, generation: u64) -> Action<()> {
    Action::Subscribe { generation, ask: ask(room) }
}

fn close(ending: Ending) -> Vec<Action<()>> {
    vec![Action::Close(ending), Action::Arm { timer: Timer::CloseHandshake, after_ms: 5000 }]
}

#[test]
fn the_message_rate_refuses_past_its_burst_and_refills() {
    let mut conn =
        machine(Settings { max_messages_per_sec: 1, max_bad_messages: 10, ..settings() });
    let refused = |publish: bool| {
        let mut actions = vec![Action::LimitHit("message_rate")];
        if publish {
            actions.push(Action::PublishOutcome("rate_limited"));
        }
        actions.push(error(
            Some("chat:a"),
            Refusal::RateLimited,
            "more than 1 messages per second; retry in 1000 ms",
        ));
        actions
    };
    // (now, a publish, let through, actions)
    let table = [
        (0, false, true, vec![]),
        (0, false, true, vec![]),
        (0, false, false, refused(false)),
        (0, true, false, refused(true)),
        (1000, false, true, vec![]),
        (1000, false, false, refused(false)),
    ];
    for (n, (now, publish, through, actions)) in table.into_iter().enumerate() {
        assert_eq!(conn.admit(publish, Some(1), Some("chat:a"), now), through, "row {n}");
        assert_eq!(drained(&mut conn), actions, "row {n}");
    }
}

#[test]
fn one_strike_over_the_max_in_a_minute_closes_with_a_policy_violation() {
    // (now, actions)
    let table = [
        (0, vec![]),
        (10, vec![]),
        // A new minute: the count starts again.
        (60_000, vec![]),
        (60_001, vec![]),
        (60_002, [vec![Action::LimitHit("bad_messages")], close(Ending::TooManyRefused)].concat()),
    ];
    let mut conn = machine(settings());
    for (n, (now, actions)) in table.into_iter().enumerate() {
        conn.strike(now);
        assert_eq!(drained(&mut conn), actions, "row {n}");
    }
    assert!(conn.is_closing());
}

#[test]
fn over_the_bound_for_the_grace_evicts_and_closes_as_a_slow_consumer() {
    enum In {
        MayRead(usize),
        Grace(usize),
    }
    // (input, now, may read, actions)
    let table = [
        (In::MayRead(999), 0, Some(true), vec![]),
        (
            In::MayRead(1000),
            1000,
            Some(false),
            vec![Action::Arm { timer: Timer::Grace, after_ms: 5000 }],
        ),
        // Armed once for the grace.
        (In::MayRead(2000), 2000, Some(false), vec![]),
        // Under again: the grace is forgotten; the timer looks and finds nothing.
        (In::MayRead(10), 3000, Some(true), vec![]),
        (In::Grace(10), 6000, None, vec![Action::WakeReader]),
        (
            In::MayRead(1500),
            7000,
            Some(false),
            vec![Action::Arm { timer: Timer::Grace, after_ms: 5000 }],
        ),
        (
            In::Grace(1500),
            12_000,
            None,
            [
                vec![Action::Evict { held: Some(1500) }],
                close(Ending::SlowConsumer),
                vec![Action::WakeReader],
            ]
            .concat(),
        ),
        // After our Close, reading goes on to see the client's.
        (In::MayRead(5000), 13_000, Some(true), vec![]),
    ];
    let mut conn = machine(settings());
    for (n, (input, now, may_read, actions)) in table.into_iter().enumerate() {
        let read = match input {
            In::MayRead(held) => Some(conn.may_read(held, || now)),
            In::Grace(held) => {
                conn.on_timer(Timer::Grace, held, now);
                None
            }
        };
        assert_eq!(read, may_read, "row {n}");
        assert_eq!(drained(&mut conn), actions, "row {n}");
    }
}

#[test]
fn the_clock_is_read_only_over_the_bound() {
    let mut conn = machine(settings());
    assert!(conn.may_read(999, || panic!("read the clock under the bound")));
}

#[test]
fn too_many_answers_pending_stop_reads_until_one_comes_back() {
    let mut conn = machine(settings());
    for _ in 0..crate::core::delivery::outbox::MAX_ANSWERS_PENDING {
        conn.presence("chat:a".to_string(), Some(1));
    }
    assert_eq!(drained(&mut conn).len(), crate::core::delivery::outbox::MAX_ANSWERS_PENDING);
    assert!(!conn.may_read(0, || 0));
    conn.answered(Pending::Read, 0, || 0);
    assert_eq!(drained(&mut conn), vec![Action::WakeReader]);
    assert!(conn.may_read(0, || 0));
}

#[test]
fn a_silent_client_is_closed_after_three_heartbeats_and_an_sse_one_never() {
    // (reads, last heard, now, actions)
    let table = [
        (true, 0, 1000, vec![Action::Ping]),
        (true, 0, 2999, vec![Action::Ping]),
        (true, 0, 3000, close(Ending::HeartbeatTimeout)),
        (true, 2500, 5000, vec![Action::Ping]),
        (false, 0, 100_000, vec![Action::Ping]),
    ];
    for (n, (reads, heard, now, actions)) in table.into_iter().enumerate() {
        let mut conn = machine(Settings { reads, ..settings() });
        conn.heard(heard);
        conn.heartbeat(0, now);
        assert_eq!(drained(&mut conn), actions, "row {n}");
    }
}

#[test]
fn subscribes_are_checked_counted_and_a_resubscribe_leaves_the_old_generation() {
    let mut conn = machine(settings());
    conn.start(Vec::new(), 0);
    let inbox: Arc<str> = "user:ann".into();
    assert_eq!(
        drained(&mut conn),
        vec![
            Action::SubscribeInbox { room: inbox.clone(), generation: 1 },
            Action::Subscriptions(1)
        ]
    );
    // (room, actions)
    let table = [
        ("chat:a", vec![Action::Subscriptions(1), subscribe_action("chat:a", 2)]),
        (
            "chat:a",
            vec![
                Action::Leave { room: "chat:a".into(), generation: 2, at: None },
                subscribe_action("chat:a", 3),
            ],
        ),
        ("chat:b", vec![Action::Subscriptions(1), subscribe_action("chat:b", 4)]),
        (
            "chat:c",
            vec![
                Action::LimitHit("subscriptions"),
                error(
                    Some("chat:c"),
                    Refusal::TooManySubscriptions,
                    "at most 2 subscriptions per connection",
                ),
            ],
        ),
        // The inbox is never counted.
        (
            "user:ann",
            vec![
                Action::Leave { room: inbox.clone(), generation: 1, at: None },
                subscribe_action("user:ann", 5),
            ],
        ),
        (
            "user:bob",
            vec![error(
                Some("user:bob"),
                Refusal::Forbidden,
                "this connection may not read room user:bob",
            )],
        ),
        (
            "",
            vec![error(
                Some(""),
                Refusal::BadRoom,
                &names::check_room("").unwrap_err().to_string(),
            )],
        ),
    ];
    for (n, (room, actions)) in table.into_iter().enumerate() {
        conn.subscribe(ask(room), true, 0);
        assert_eq!(drained(&mut conn), actions, "row {n}");
    }
    // A room's handle for a generation already replaced is left at once.
    conn.attached("chat:a", 2, ());
    assert_eq!(
        drained(&mut conn),
        vec![Action::Leave { room: "chat:a".into(), generation: 2, at: Some(()) }]
    );
    conn.attached("chat:a", 3, ());
    assert_eq!(drained(&mut conn), vec![]);
    // A refusal of the current generation ends it and tells the client; an older one is ignored.
    conn.refused("chat:b", 1, Some(1), "gone".to_string());
    assert_eq!(drained(&mut conn), vec![]);
    conn.refused("chat:b", 4, Some(1), "gone".to_string());
    assert_eq!(
        drained(&mut conn),
        vec![
            Action::Subscriptions(-1),
            Action::Leave { room: "chat:b".into(), generation: 4, at: None },
            error(Some("chat:b"), Refusal::Unavailable, "gone"),
        ]
    );
    conn.unsubscribe("chat:a".to_string(), Some(1));
    assert_eq!(
        drained(&mut conn),
        vec![
            Action::Subscriptions(-1),
            Action::Leave { room: "chat:a".into(), generation: 3, at: Some(()) },
            Action::Unsubscribed { room: "chat:a".to_string(), reference: Some(1) },
        ]
    );
    // Stopping leaves what is left (the inbox).
    conn.stopped();
    assert_eq!(
        drained(&mut conn),
        vec![Action::Subscriptions(-1), Action::Leave { room: inbox, generation: 5, at: None }]
    );
}

#[test]
fn rooms_not_live_take_a_room_start_and_are_refused_past_the_burst() {
    let mut conn =
        machine(Settings { max_room_starts_per_sec: 1, max_bad_messages: 10, ..settings() });
    let history = |room: &str| Action::ReadHistory {
        room: room.to_string(),
        since: 0,
        limit: 100,
        reference: Some(1),
    };
    let refused = vec![
        Action::LimitHit("room_starts"),
        error(
            Some("chat:c"),
            Refusal::RateLimited,
            "more than 1 new rooms per second; retry in 1000 ms",
        ),
    ];
    // (room, live, now, actions): the burst is max(2 × rate, max_subscriptions) = 2.
    let table = [
        ("chat:a", false, 0, vec![history("chat:a")]),
        ("chat:b", false, 0, vec![history("chat:b")]),
        ("chat:c", false, 0, refused),
        ("chat:c", true, 0, vec![history("chat:c")]),
        ("chat:c", false, 1000, vec![history("chat:c")]),
    ];
    for (n, (room, live, now, actions)) in table.into_iter().enumerate() {
        conn.history(room.to_string(), 0, None, Some(1), live, now);
        assert_eq!(drained(&mut conn), actions, "row {n}");
    }
}

#[test]
fn a_history_limit_over_the_max_is_refused_with_a_strike() {
    let mut conn = machine(Settings { max_bad_messages: 0, ..settings() });
    conn.history("chat:a".to_string(), 0, Some(501), Some(1), true, 0);
    let expected = [
        vec![
            Action::LimitHit("history_limit"),
            error(Some("chat:a"), Refusal::BadRequest, "limit must be at most 500"),
        ],
        vec![Action::LimitHit("bad_messages")],
        close(Ending::TooManyRefused),
    ]
    .concat();
    assert_eq!(drained(&mut conn), expected);
}

#[test]
fn publishes_need_a_grant_and_at_most_so_many_wait_to_be_durable() {
    let mut conn = machine(settings());
    let publish = |room: &str| Action::Publish {
        room: room.to_string(),
        id: None,
        data: "{}".to_string(),
        state: None,
        reference: Some(1),
    };
    conn.publish("news".to_string(), None, "{}".to_string(), None, Some(1));
    assert_eq!(
        drained(&mut conn),
        vec![
            Action::PublishOutcome("forbidden"),
            error(Some("news"), Refusal::Forbidden, "this connection may not publish to room news")
        ]
    );
    for _ in 0..MAX_PUBLISHES_IN_FLIGHT {
        conn.publish("chat:a".to_string(), None, "{}".to_string(), None, Some(1));
        assert_eq!(drained(&mut conn), vec![publish("chat:a")]);
    }
    conn.publish("chat:a".to_string(), None, "{}".to_string(), None, Some(1));
    let message =
        format!("at most {MAX_PUBLISHES_IN_FLIGHT} publishes may wait to be stored at once");
    assert_eq!(
        drained(&mut conn),
        vec![
            Action::PublishOutcome("rate_limited"),
            error(Some("chat:a"), Refusal::RateLimited, &message)
        ]
    );
    conn.answered(Pending::Publish, 0, || 0);
    conn.publish("chat:a".to_string(), None, "{}".to_string(), None, Some(1));
    assert_eq!(drained(&mut conn), vec![Action::WakeReader, publish("chat:a")]);
}

#[test]
fn the_subscribe_deadline_closes_a_client_that_never_subscribed() {
    // (reads, subscribes, actions when the deadline fires)
    let closed = [vec![Action::LimitHit("subscribe_timeout")], close(Ending::NoSubscribe)].concat();
    let table = [(true, false, closed), (true, true, vec![]), (false, false, vec![])];
    for (n, (reads, subscribes, actions)) in table.into_iter().enumerate() {
        let mut conn =
            machine(Settings { reads, subscribe_timeout_ms: Some(10_000), ..settings() });
        conn.start(Vec::new(), 0);
        let started = drained(&mut conn);
        assert_eq!(
            started.last(),
            Some(&Action::Arm { timer: Timer::SubscribeDeadline, after_ms: 10_000 }),
            "row {n}"
        );
        if subscribes {
            conn.subscribe(ask("chat:a"), true, 0);
            drained(&mut conn);
        }
        conn.on_timer(Timer::SubscribeDeadline, 0, 10_000);
        assert_eq!(drained(&mut conn), actions, "row {n}");
    }
}

#[test]
fn a_close_is_sent_once_and_a_second_or_forced_one_stops() {
    let asked = || Ending::Asked { code: 4001, reason: "kicked".to_string() };
    // (force, then a second close, actions)
    let table = [
        (false, false, close(asked())),
        (true, false, vec![Action::Close(asked()), Action::Stop]),
        (false, true, [close(asked()), vec![Action::Stop]].concat()),
    ];
    for (n, (force, twice, actions)) in table.into_iter().enumerate() {
        let mut conn = machine(settings());
        conn.close(asked(), force);
        if twice {
            conn.close(asked(), false);
        }
        assert_eq!(drained(&mut conn), actions, "row {n}");
    }
    let mut conn = machine(settings());
    conn.close(asked(), false);
    drained(&mut conn);
    conn.on_timer(Timer::CloseHandshake, 0, 5000);
    assert_eq!(drained(&mut conn), vec![Action::Stop]);
}

#[test]
fn windows_go_straight_to_the_socket_only_when_nothing_waits_and_never_after_the_close() {
    let epoch: Arc<str> = "e1".into();
    let live = |direct: bool| {
        let mut conn = machine(Settings { direct, ..settings() });
        conn.subscribe(ask("chat:a"), true, 0);
        drained(&mut conn);
        let replay: Vec<Ev> = Vec::new();
        let answer = Answer {
            room: "chat:a",
            generation: 1,
            epoch: &epoch,
            head: 0,
            recovered: None,
            state_seq: None,
            replay: &replay,
        };
        assert!(conn.on_subscribed(answer).is_some());
        conn
    };
    let events = [Ev(1), Ev(2)];
    // (direct, updates waiting in the mailbox, closed, route)
    let table = [
        (true, 0, false, Route::Write(WindowPlan::Shared)),
        (true, 1, false, Route::Post),
        (false, 0, false, Route::Post),
        (true, 0, true, Route::Write(WindowPlan::Nothing)),
    ];
    for (n, (direct, waiting, closed, route)) in table.into_iter().enumerate() {
        let mut conn = live(direct);
        if closed {
            conn.close(Ending::SlowConsumer, false);
        }
        assert_eq!(conn.route_window(waiting, "chat:a", &epoch, &events, false), route, "row {n}");
    }
    // Posted, then taken off the mailbox: the same machine decides.
    let mut conn = live(true);
    assert_eq!(conn.route_window(1, "chat:a", &epoch, &events, false), Route::Post);
    assert_eq!(conn.on_window("chat:a", &epoch, &events, false), WindowPlan::Shared);
    assert_eq!(
        conn.route_window(0, "chat:a", &epoch, &[Ev(2), Ev(3)], false),
        Route::Write(WindowPlan::Own(vec![Ev(3)]))
    );
}

#[test]
fn taking_the_actions_leaves_an_idle_connection_no_queue_capacity() {
    let mut conn = machine(settings());
    conn.start(vec![(ask("chat:1"), true)], 0);
    let taken: Vec<_> = conn.take_actions().into_iter().collect();
    let inbox = names::inbox_room("ann").into();
    assert_eq!(taken[0], Action::SubscribeInbox { room: inbox, generation: 1 });
    assert!(taken.contains(&subscribe_action("chat:1", 2)), "{taken:?}");
    assert_eq!(conn.actions.capacity(), 0, "the queue's buffer left with the actions");
    assert_eq!(conn.poll(), None);
}
