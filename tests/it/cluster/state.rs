//! Room state and presence across nodes.

use super::*;

// ---------------------------------------------------------------------------------------
// Room state
// ---------------------------------------------------------------------------------------

fn publish_state(http: &Http, room: &str, id: &str, state: Option<Value>) -> Value {
    let mut body = json!({"id": id, "data": {"id": id}});
    if let Some(state) = state {
        body["state"] = state;
    }
    let (status, reply) =
        http.request("POST", &format!("/v1/rooms/{room}/events"), Auth::Key, Body::Json(body));
    assert_eq!(status, 201, "publish {id} to {room}: {reply}");
    reply
}

fn state_of(http: &Http, room: &str) -> Value {
    let (status, body) =
        http.request("GET", &format!("/v1/rooms/{room}/state"), Auth::Key, Body::None);
    assert_eq!(status, 200, "GET state of {room}: {body}");
    body
}

/// The state rides in its event's JetStream message: every node serves it, a subscriber
/// with `state:true` on any node gets it and exactly the retained events after it; the
/// latest-state record keeps it once the stream's history dropped its event (a restarted
/// node loads it from there); a `PUT` on a node that is not the writer is written by the
/// writer and reaches the other nodes; a kill -9 of the writer loses no acknowledged state.
#[test]
fn room_state_travels_with_its_event_outlives_trimming_and_a_killed_writer() {
    let _gate = crate::common::gate!();
    let mut cluster = Cluster::start(3, &["--history-size", "20"]);
    cluster.wait_peers(Duration::from_secs(20));
    let rt = runtime();
    let names: Vec<&str> = (0..3).map(Cluster::name).collect();
    let room = (0..1000)
        .map(|i| format!("score:{i}"))
        .find(|room| {
            livegate::core::nodes::routing::room_writer(room, &names) == Some(Cluster::name(0))
        })
        .expect("some room is written by a");
    let mut failures = Vec::new();

    // Published on B (forwarded to A, the writer); every tenth event carries the state.
    for i in 1..=60 {
        let id = format!("e-{i}");
        let state = (i % 10 == 0).then(|| json!({"last_id": id}));
        let reply = publish_state(&cluster.http(1), &room, &id, state);
        assert_eq!(reply["seq"], i, "{reply}");
    }
    for i in 61..=65 {
        publish_state(&cluster.http(1), &room, &format!("e-{i}"), None);
    }
    for node in 0..3 {
        let got = state_of(&cluster.http(node), &room);
        if got["seq"] != 60 || got["data"] != json!({"last_id": "e-60"}) {
            failures.push(format!("state on {}: {got}", Cluster::name(node)));
        }
    }
    rt.block_on(async {
        for node in 0..3 {
            let token = cluster.http(node).mint_token(&format!("late-{node}"), "web");
            let mut ws = WsClient::connect(cluster.addr(node), &token, None).await;
            let reply = ws.request(json!({"op": "subscribe", "room": room, "state": true})).await;
            if reply["state"] != json!({"seq": 60, "data": {"last_id": "e-60"}})
                || reply["seq"] != 65
            {
                failures.push(format!("subscribe with state on {}: {reply}", Cluster::name(node)));
            }
            let (events, other) = collect_events(&mut ws, &room, 5, WAIT).await;
            failures.extend(other);
            if seqs(&events) != (61..=65).collect::<Vec<_>>() {
                failures.push(format!(
                    "events after the state on {}: {:?}",
                    Cluster::name(node),
                    seqs(&events)
                ));
            }
            if let Some(extra) = ws.recv_within(QUIET).await {
                failures.push(format!(
                    "more than the events after the state on {}: {extra}",
                    Cluster::name(node)
                ));
            }
        }
    });

    // 30 more without a state: the stream keeps 20 (76..=95), the state's event is gone.
    for i in 66..=95 {
        publish_state(&cluster.http(2), &room, &format!("e-{i}"), None);
    }
    cluster.take_node(2).kill9();
    cluster.start_node(2);
    let got = state_of(&cluster.http(2), &room);
    if got["seq"] != 60 || got["data"] != json!({"last_id": "e-60"}) {
        failures.push(format!("state on c restarted after the history dropped its event: {got}"));
    }
    rt.block_on(async {
        let token = cluster.http(2).mint_token("after-trim", "web");
        let mut ws = WsClient::connect(cluster.addr(2), &token, None).await;
        let reply = ws.request(json!({"op": "subscribe", "room": room, "state": true})).await;
        if reply["state"]["seq"] != 60 {
            failures.push(format!("subscribe with state on c after the trim: {reply}"));
        }
        let (events, other) = collect_events(&mut ws, &room, 20, WAIT).await;
        failures.extend(other);
        if seqs(&events) != (76..=95).collect::<Vec<_>>() {
            failures.push(format!("retained events after the state on c: {:?}", seqs(&events)));
        }
    });

    // PUT on C: the writer (A) sets it as of the head; every node serves it.
    let (status, put) = cluster.http(2).request(
        "PUT",
        &format!("/v1/rooms/{room}/state"),
        Auth::Key,
        Body::Json(json!({"data": {"put": 1}})),
    );
    if status != 200 || put["seq"] != 95 {
        failures.push(format!("PUT on c: {status} {put}"));
    }
    for node in 0..3 {
        let http = cluster.http(node);
        let seen = wait_until(Duration::from_secs(5), || {
            state_of(&http, &room)["data"] == json!({"put": 1})
        });
        if !seen {
            failures.push(format!(
                "PUT state on {}: {}",
                Cluster::name(node),
                state_of(&http, &room)
            ));
        }
    }

    // One more state from B, acknowledged, then the writer dies hard.
    let reply = publish_state(&cluster.http(1), &room, "e-96", Some(json!({"last_id": "e-96"})));
    assert_eq!(reply["seq"], 96, "{reply}");
    cluster.take_node(0).kill9();
    let b = cluster.http(1);
    if !wait_until(Duration::from_secs(5), || {
        state_of(&b, &room)["data"] == json!({"last_id": "e-96"})
    }) {
        failures.push(format!("state on b after a's kill -9: {}", state_of(&b, &room)));
    }
    let reply = publish_state(&b, &room, "e-97", Some(json!({"last_id": "e-97"})));
    let c = cluster.http(2);
    let want = json!({"seq": 97, "data": {"last_id": "e-97"}});
    let seen = wait_until(Duration::from_secs(5), || {
        let got = state_of(&c, &room);
        json!({"seq": got["seq"], "data": got["data"]}) == want
    });
    if reply["seq"] != 97 || !seen {
        failures.push(format!(
            "a state published without a: {reply}, state on c: {}",
            state_of(&c, &room)
        ));
    }
    fail_with_logs(&cluster, "cluster room state", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// Presence across nodes
// ---------------------------------------------------------------------------------------

const PRESENCE_INTERVAL_MS: u64 = 300;

/// `GET /v1/rooms/{room}/presence` on node `i`: the count and the members.
fn presence_on(cluster: &Cluster, i: usize, room: &str) -> (Value, Value) {
    let (status, body) = cluster.http(i).request(
        "GET",
        &format!("/v1/rooms/{room}/presence"),
        Auth::Key,
        Body::None,
    );
    assert_eq!(status, 200, "presence on {}: {body}", Cluster::name(i));
    (body["count"].clone(), body["members"].clone())
}

/// Presence frames on `ws` until one has `count`; `None` after `within`.
async fn presence_until(ws: &mut WsClient, count: u64, within: Duration) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let frame = ws.recv_within(deadline.saturating_duration_since(Instant::now())).await?;
        if frame["op"] == "presence" && frame["count"] == count {
            return Some(frame);
        }
    }
}

#[test]
fn presence_counts_converge_across_three_nodes_and_a_killed_nodes_members_leave() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut flags = SHORT_DRAIN.to_vec();
    let interval = PRESENCE_INTERVAL_MS.to_string();
    flags.extend(["--presence-interval-ms", &interval]);
    let mut cluster = Cluster::start(3, &flags);
    let rt = runtime();
    let room = "stage:1";
    let member = |user: &str, device: &str| json!({"user": user, "device": device});
    let mut failures = Vec::new();
    // ann's web on a (watching) and again on b (one member), bob on b, cy twice on c.
    let placement = [
        (0, "ann", "web", true),
        (1, "ann", "web", false),
        (1, "bob", "web", false),
        (2, "cy", "web", false),
        (2, "cy", "phone", false),
    ];
    let mut clients: Vec<(usize, WsClient)> = Vec::new();
    for (node, user, device, presence) in placement {
        let token = cluster.http(node).mint_token(user, device);
        let addr = cluster.addr(node);
        let ws = rt.block_on(async move {
            let mut ws = WsClient::connect(addr, &token, None).await;
            let reply =
                ws.request(json!({"op": "subscribe", "room": room, "presence": presence})).await;
            assert_eq!(reply["op"], "subscribed", "{reply}");
            ws
        });
        clients.push((node, ws));
    }
    let everyone = json!([
        member("ann", "web"),
        member("bob", "web"),
        member("cy", "phone"),
        member("cy", "web")
    ]);
    let joined_at = Instant::now();
    for i in 0..3 {
        let converged = wait_until(Duration::from_secs(10), || {
            presence_on(&cluster, i, room) == (json!(4), everyone.clone())
        });
        if !converged {
            failures.push(format!(
                "presence on {}: {:?}, expected 4 members {everyone}",
                Cluster::name(i),
                presence_on(&cluster, i, room)
            ));
        }
    }
    let converged_after = joined_at.elapsed();
    let watcher = &mut clients[0].1;
    if rt.block_on(presence_until(watcher, 4, Duration::from_secs(5))).is_none() {
        failures.push("the watcher on a got no presence frame with count 4".into());
    }

    // kill -9 of c: its members leave within its heartbeat timeout (3 periods of 1 s).
    clients.retain(|(node, _)| *node != 2);
    cluster.take_node(2).kill9();
    let killed_at = Instant::now();
    let two = json!([member("ann", "web"), member("bob", "web")]);
    let left = wait_until(Duration::from_secs(8), || {
        presence_on(&cluster, 0, room) == (json!(2), two.clone())
            && presence_on(&cluster, 1, room) == (json!(2), two.clone())
    });
    let left_after = killed_at.elapsed();
    if !left {
        failures.push(format!(
            "after kill -9 of c: a {:?}, b {:?}",
            presence_on(&cluster, 0, room),
            presence_on(&cluster, 1, room)
        ));
    } else if left_after > Duration::from_secs(5) {
        failures.push(format!("c's members left {left_after:?} after its kill, later than its heartbeat timeout (3 s) and a period"));
    }
    let watcher = &mut clients[0].1;
    match rt.block_on(presence_until(watcher, 2, Duration::from_secs(5))) {
        Some(frame) => {
            if frame["left"] != json!([member("cy", "phone"), member("cy", "web")]) {
                failures.push(format!("the watcher's frame after c died: {frame}"));
            }
        }
        None => failures.push("the watcher on a got no frame with count 2 after c died".into()),
    }

    // c comes back empty: it says hello and learns a's and b's members at once.
    cluster.start_node(2);
    let restarted_at = Instant::now();
    let learned = wait_until(Duration::from_secs(5), || {
        presence_on(&cluster, 2, room) == (json!(2), two.clone())
    });
    let learned_after = restarted_at.elapsed();
    if !learned {
        failures.push(format!("restarted c: {:?}, expected {two}", presence_on(&cluster, 2, room)));
    }
    eprintln!(
        "presence across nodes: converged after {converged_after:?}; a killed node's members left after {left_after:?}; \
         a restarted node learned the others' after {learned_after:?}; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "presence", &failures, &LOG_NEEDLES);
}
