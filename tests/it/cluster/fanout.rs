//! Events across nodes: fan-out from one node to all, a client that moves and recovers
//! what it missed, two writers making one sequence, history limits on every node, and a
//! client's publish forwarded to the room's writer.

use super::*;

#[test]
fn publish_on_a_reaches_subscribers_on_a_b_and_c_in_order_exactly_once() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    const EVENTS: usize = 300;
    let room = "fan:1";
    // One subscriber on A, four on B, four on C.
    let placement = [0usize, 1, 1, 1, 1, 2, 2, 2, 2];
    let mut failures = Vec::new();
    let mut subscribers = Vec::new();
    let mut epochs = Vec::new();
    for (i, &node) in placement.iter().enumerate() {
        let token = cluster.http(node).mint_token(&format!("fan-u{i}"), "web");
        let addr = cluster.addr(node);
        let (ws, sub) = rt.block_on(async move {
            let mut ws = WsClient::connect(addr, &token, None).await;
            let sub = ws.subscribe_ok(room).await;
            (ws, sub)
        });
        if sub["seq"] != 0 {
            failures.push(format!(
                "subscriber {i} on {}: fresh room has head {}",
                Cluster::name(node),
                sub["seq"]
            ));
        }
        assert_eq!(
            ws.welcome["node"],
            Cluster::name(node),
            "welcome names the node: {}",
            ws.welcome
        );
        epochs.push(sub["epoch"].clone());
        subscribers.push((i, node, ws));
    }
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|(i, node, mut ws)| {
            rt.spawn(async move {
                let (got, mut other) =
                    collect_events(&mut ws, room, EVENTS, Duration::from_secs(20)).await;
                if other.is_empty() {
                    if let Some(extra) = ws.recv_within(QUIET).await {
                        other.push(format!("something after the {EVENTS} events: {extra}"));
                    }
                }
                (i, node, got, other)
            })
        })
        .collect();

    let a = cluster.http(0);
    let publish_started = Instant::now();
    let mut acks = Vec::new();
    for n in 0..EVENTS {
        let id = format!("fan-{n}");
        let (status, reply) = a.publish(room, Some(&id), json!({"n": n}));
        if status != 201 || reply["duplicate"] != false {
            failures.push(format!("publish {id} on a: {status} {reply}"));
        }
        acks.push((id, reply["seq"].as_u64().unwrap_or(0), reply["epoch"].clone()));
    }
    let publish_took = publish_started.elapsed();
    if acks.iter().map(|a| a.1).collect::<Vec<_>>() != (1..=EVENTS as u64).collect::<Vec<_>>() {
        failures.push(format!(
            "acknowledged seqs are not 1..={EVENTS}: first ones {:?}",
            &acks[..acks.len().min(10)]
        ));
    }
    for (i, e) in epochs.iter().enumerate() {
        if e.is_null() || *e != acks[0].2 {
            failures.push(format!(
                "subscriber {i} was told epoch {e}, the publish replies carry {}",
                acks[0].2
            ));
        }
    }
    let results = rt.block_on(async {
        let mut out = Vec::new();
        for r in readers {
            out.push(
                tokio::time::timeout(Duration::from_secs(40), r)
                    .await
                    .expect("reader finished")
                    .expect("reader"),
            );
        }
        out
    });
    for (i, node, got, other) in results {
        let who = format!("subscriber {i} on {}", Cluster::name(node));
        let seqs = seqs(&got);
        if seqs != (1..=EVENTS as u64).collect::<Vec<_>>() {
            let dup = seqs.len() - seqs.iter().collect::<HashSet<_>>().len();
            failures.push(format!(
                "{who}: {} events, {dup} duplicate seqs, not 1..={EVENTS} in order",
                seqs.len()
            ));
        }
        for e in &got {
            let s = seq_of(e) as usize;
            if (1..=EVENTS).contains(&s) && e["id"] != acks[s - 1].0.as_str() {
                failures.push(format!(
                    "{who}: seq {s} carries id {} instead of {}",
                    e["id"],
                    acks[s - 1].0
                ));
                break;
            }
        }
        failures.extend(other.into_iter().map(|o| format!("{who}: {o}")));
    }
    eprintln!(
        "fan-out: {EVENTS} events published on a in {:.2} s, {} subscribers on a/b/c; test took {:.1} s",
        publish_took.as_secs_f64(),
        placement.len(),
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "fan-out", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (b) a client moves from A to C and recovers exactly what it missed
// ---------------------------------------------------------------------------------------

#[test]
fn a_client_that_cannot_reach_its_owner_moves_once_and_recovers_exactly_the_missed_events() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    let cluster_ready = Instant::now();
    let rt = runtime();
    let room = "move:1";
    let b = cluster.http(1);
    let mut failures = Vec::new();

    let token = cluster.http(0).mint_token("mover", "web");
    let mut ws = rt.block_on(WsClient::connect(cluster.addr(0), &token, None));
    let session = ws.session().to_string();
    let sub = rt.block_on(ws.subscribe_ok(room));
    let epoch = sub["epoch"].clone();
    let mut ids = Vec::new();
    for n in 0..50 {
        let id = format!("mv-{n}");
        let reply = b.publish_ok(room, Some(&id), json!({"n": n}));
        assert_eq!(reply["seq"], n + 1, "publish {id}: {reply}");
        ids.push(id);
    }
    let before = rt.block_on(ws.next_events(50));
    assert_eq!(seqs(&before), (1..=50).collect::<Vec<_>>(), "live events on a");
    rt.block_on(ws.close());

    // Published while the client is away.
    for n in 50..80 {
        let id = format!("mv-{n}");
        let reply = b.publish_ok(room, Some(&id), json!({"n": n}));
        assert_eq!(reply["seq"], n + 1, "publish {id}: {reply}");
        ids.push(id);
    }

    // Through c, with the same session: a is alive and owns it, so c sends the client
    // there (4421 naming a), spending nothing. The client says it cannot reach a
    // (`avoid=a`), and the session moves to the route's choice among b and c: a move the
    // route did not choose, charged to the budget.
    // A client that says it cannot reach a node started moments ago is believed without
    // charge (it was restarting): wait until the nodes are older than that grace.
    common::let_time_pass_until(
        cluster_ready + Duration::from_millis(RESTART_GRACE_MS + 500),
        "the nodes outlive the restart grace",
    );
    let token = cluster.http(2).mint_token("mover", "web");
    match rt.block_on(WsClient::try_connect(cluster.addr(2), Some(&token), Some(&session))) {
        Err(r) if r.status == 421 && r.body["error"]["node"] == "a" => {}
        Err(r) => failures.push(format!(
            "reconnect on c with a's session: expected 4421 naming a, got {} {}",
            r.status, r.body
        )),
        Ok(ws) => failures.push(format!(
            "reconnect on c with a's session was accepted although a is alive: {}",
            ws.welcome
        )),
    }
    let mut ws = match rt.block_on(connect_avoiding(cluster.addr(2), &token, &session, "a")) {
        Ok(ws) => ws,
        Err(r) => panic!("reconnect through c with session {session} avoiding a (same token, still unspent): {} {}", r.status, r.body),
    };
    // The route's choice among b and c: the client may have been sent on once more.
    let here = ws.welcome["node"].as_str().unwrap_or_default().to_string();
    if !["b", "c"].contains(&here.as_str()) {
        failures.push(format!("avoiding a, the session must land on b or c: {}", ws.welcome));
    }
    if ws.session() != session {
        failures.push(format!(
            "session {session} (recorded on a) was not kept on {here}: welcome {}",
            ws.welcome
        ));
    }
    let resub = rt.block_on(ws.subscribe_since(room, 50, &epoch));
    if resub["op"] != "subscribed" || resub["recovered"] != true || resub["epoch"] != epoch {
        failures.push(format!("resubscribe on c with since 50, epoch {epoch}: {resub}"));
    }
    let (missed, other) = rt.block_on(collect_events(&mut ws, room, 30, WAIT));
    failures.extend(other);
    if seqs(&missed) != (51..=80).collect::<Vec<_>>() {
        failures.push(format!("recovered on c: seqs {:?}, expected 51..=80", seqs(&missed)));
    }
    for e in &missed {
        let s = seq_of(e) as usize;
        if (51..=80).contains(&s) && e["id"] != ids[s - 1].as_str() {
            failures.push(format!("recovered seq {s} has id {}, expected {}", e["id"], ids[s - 1]));
        }
    }
    if let Some(extra) = rt.block_on(ws.recv_within(QUIET)) {
        failures.push(format!("more than the missed events after recovery: {extra}"));
    }
    // And live again, published on A this time.
    let reply = cluster.http(0).publish_ok(room, Some("mv-live"), json!({"live": true}));
    assert_eq!(reply["seq"], 81, "{reply}");
    let (live, other) = rt.block_on(collect_events(&mut ws, room, 1, WAIT));
    failures.extend(other);
    if seqs(&live) != vec![81] || live.first().map(|e| &e["id"]) != Some(&json!("mv-live")) {
        failures.push(format!("live event after the move: {live:?}"));
    }
    // Away from its new node again, through a: a second move the route did not choose
    // inside the migration window is refused with 4029 (retry-after seconds in the
    // reason), and the token stays unspent.
    rt.block_on(ws.close());
    let token = cluster.http(0).mint_token("mover", "web");
    match rt.block_on(connect_avoiding(cluster.addr(0), &token, &session, &here)) {
        Err(r) if r.status == 429 && r.header("close-code") == Some("4029") => {
            let secs: u64 = r.header("retry-after").and_then(|s| s.parse().ok()).unwrap_or(0);
            if !(1..=600).contains(&secs) {
                failures.push(format!(
                    "4029's reason must be the seconds to wait (1..=600), got {:?}",
                    r.header("retry-after")
                ));
            }
        }
        Err(r) => failures.push(format!(
            "second avoided move: expected close 4029, got {} {} {:?}",
            r.status, r.body, r.headers
        )),
        Ok(ws) => failures
            .push(format!("a second avoided move inside the window was allowed: {}", ws.welcome)),
    }
    let (back, sent_to) =
        rt.block_on(WsClient::connect_following(cluster.addr(0), &token, Some(&session)));
    if back.session() != session
        || back.welcome["node"] != here.as_str()
        || sent_to.as_deref() != Some(here.as_str())
    {
        failures.push(format!("the refused token, used again through a, must be sent to {here} and keep the session: sent to {sent_to:?}, {}", back.welcome));
    }
    eprintln!("move away from a: test took {:.1} s", started.elapsed().as_secs_f64());
    fail_with_logs(&cluster, "move away from a", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (c) two nodes publish to one room at once
// ---------------------------------------------------------------------------------------

#[test]
fn two_nodes_publishing_to_one_room_at_once_make_one_contiguous_sequence() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    const EACH: usize = 200;
    let room = "race:1";
    let mut failures = Vec::new();
    let go = Arc::new(std::sync::Barrier::new(2));
    let results: Vec<(usize, Vec<(String, u16, Value)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|node| {
                let http = cluster.http(node);
                let go = go.clone();
                s.spawn(move || {
                    go.wait();
                    let mut out = Vec::new();
                    for n in 0..EACH {
                        let id = format!("{}-{n}", Cluster::name(node));
                        let (status, reply) = http.publish(room, Some(&id), json!({"n": n}));
                        out.push((id, status, reply));
                    }
                    (node, out)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("publisher thread")).collect()
    });
    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut epochs = HashSet::new();
    for (node, out) in &results {
        for (id, status, reply) in out {
            match (status, reply["seq"].as_u64()) {
                (201, Some(seq)) if reply["duplicate"] == false => {
                    acked.insert(id.clone(), seq);
                    epochs.insert(reply["epoch"].to_string());
                }
                _ => failures
                    .push(format!("publish {id} on {}: {status} {reply}", Cluster::name(*node))),
            }
        }
    }
    let mut seqs_acked: Vec<u64> = acked.values().copied().collect();
    seqs_acked.sort_unstable();
    if seqs_acked != (1..=(2 * EACH) as u64).collect::<Vec<_>>() {
        let distinct = seqs_acked.iter().collect::<HashSet<_>>().len();
        failures.push(format!(
            "acknowledged seqs are not a permutation of 1..={}: {} acks, {distinct} distinct, max {:?}",
            2 * EACH,
            seqs_acked.len(),
            seqs_acked.last()
        ));
    }
    if epochs.len() != 1 {
        failures.push(format!("the two nodes acknowledged with different epochs: {epochs:?}"));
    }
    // The history, read on the third node.
    let (events, _epoch, head) = full_history(&cluster.http(2), room, 0);
    if head != (2 * EACH) as u64 || seqs(&events) != (1..=head).collect::<Vec<_>>() {
        failures.push(format!(
            "history on c: head {head}, {} events, not 1..={}",
            events.len(),
            2 * EACH
        ));
    }
    let mut seen = HashSet::new();
    for e in &events {
        let id = e["id"].as_str().unwrap_or("").to_string();
        if !seen.insert(id.clone()) {
            failures.push(format!("id {id} twice in history"));
        }
        if let Some(&seq) = acked.get(&id) {
            if seq != seq_of(e) {
                failures.push(format!(
                    "{id} acknowledged with seq {seq}, history has it at {}",
                    seq_of(e)
                ));
            }
        }
    }
    // The same id again on the other node: a duplicate with the first seq.
    for (id, node) in [("a-7", 1usize), ("b-13", 0usize)] {
        let (status, reply) = cluster.http(node).publish(room, Some(id), json!({"again": true}));
        let first = acked.get(id).copied();
        if status != 200 || reply["duplicate"] != true || reply["seq"].as_u64() != first {
            failures.push(format!(
                "{id} again on {}: {status} {reply}, expected 200 duplicate with seq {first:?}",
                Cluster::name(node)
            ));
        }
    }
    let (_, _, head_after) = full_history(&cluster.http(0), room, 0);
    if head_after != (2 * EACH) as u64 {
        failures.push(format!("head after the duplicates is {head_after}, expected {}", 2 * EACH));
    }
    eprintln!(
        "concurrent publish: 2 x {EACH} events from a and b; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "concurrent publish", &failures, &LOG_NEEDLES);
}

/// A quiet room whose events are all older than `history_ttl_secs` keeps its head on every
/// node: the stream keeps its newest event, so a node that never held the room reads the
/// same head, expired events are not served, and the next event continues the sequence.
#[test]
fn a_room_whose_history_expired_keeps_its_head_on_every_node() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(3, &["--history-ttl-secs", "1"]);
    let room = "ttl:1";
    for i in 1..=3 {
        cluster.http(0).publish_ok(room, Some(&format!("ttl-{i}")), json!({"i": i}));
    }
    // No node but the writer may read the room before it expires: nothing to poll.
    common::let_time_pass(Duration::from_millis(2500), "the 1 s history TTL runs out");
    // Only the room's writer holds it in memory; the other nodes read the stream now.
    for node in 0..3 {
        let page = cluster.http(node).history_ok(room, None, None);
        assert_eq!(page["head"], 3, "head on {}: {page}", Cluster::name(node));
        assert_eq!(
            page["events"].as_array().map(Vec::len),
            Some(0),
            "expired events served on {}: {page}",
            Cluster::name(node)
        );
    }
    let next = cluster.http(1).publish_ok(room, Some("ttl-4"), json!({"i": 4}));
    assert_eq!(next["seq"], 4, "{next}");
}

/// Namespaces in cluster mode: the rooms stream keeps the largest
/// namespace's history per room, not just the global `history_size`, and each room
/// keeps its own namespace's size, on its writer and on a node that reads the stream.
#[test]
fn a_namespace_history_size_applies_on_every_node() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("namespaces.toml");
    let text = "history_size = 4\n[[namespace]]\nprefix = \"long:\"\nhistory_size = 30\n[[namespace]]\nprefix = \"short:\"\nhistory_size = 2\n";
    std::fs::write(&config, text).expect("write config");
    let cluster = Cluster::start(2, &["--config", &config.display().to_string()]);
    let rt = runtime();
    // (room, seqs kept of 12)
    let rooms: [(&str, Vec<u64>); 3] = [
        ("long:1", (1..=12).collect()),
        ("short:1", vec![11, 12]),
        ("other:1", (9..=12).collect()),
    ];
    for (room, _) in &rooms {
        for i in 1..=12 {
            cluster.http(0).publish_ok(room, Some(&format!("{room}-{i}")), json!({"i": i}));
        }
    }
    let mut failures = Vec::new();
    for node in 0..2 {
        let http = cluster.http(node);
        let token = http.mint_token("reader", "web");
        let mut ws = rt.block_on(WsClient::connect(cluster.addr(node), &token, None));
        for (room, kept) in &rooms {
            let page = http.history_ok(room, Some(0), Some(100));
            let got = seqs(page["events"].as_array().map(Vec::as_slice).unwrap_or_default());
            if (&got, &page["head"]) != (kept, &json!(12)) {
                failures.push(format!(
                    "{room} on {}: kept {got:?} (head {}), want {kept:?}",
                    Cluster::name(node),
                    page["head"]
                ));
            }
            let reply = rt.block_on(ws.subscribe_since(room, 0, &page["epoch"]));
            if reply["recovered"] != json!(kept.len() == 12) {
                failures.push(format!(
                    "{room} on {}: recovery from 0 answered {reply}",
                    Cluster::name(node)
                ));
            }
            if reply["recovered"] == json!(true) {
                let replayed = seqs(&rt.block_on(ws.next_events(12)));
                if &replayed != kept {
                    failures
                        .push(format!("{room} on {}: replayed {replayed:?}", Cluster::name(node)));
                }
            }
        }
    }
    fail_with_logs(&cluster, "namespace history in a cluster", &failures, &LOG_NEEDLES);
}

/// Client publish in a cluster: a client on B publishes to a room whose
/// writer is A. The event is forwarded to A (with its `from`), appended to the stream
/// and answered `published` on B once stored; A's and C's subscribers get it with
/// `from`, and every node's history has it; a backend's later publish with the client's
/// id is an event of its own.
#[test]
fn a_client_publish_on_b_to_a_room_written_by_a_reaches_a_with_from() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(3, &[]);
    let rt = runtime();
    let names: Vec<&str> = (0..3).map(Cluster::name).collect();
    let room = (0..1000)
        .map(|i| format!("chat:{i}"))
        .find(|room| {
            livegate::core::nodes::routing::room_writer(room, &names) == Some(Cluster::name(0))
        })
        .expect("some room is written by a");
    let mut failures = Vec::new();
    rt.block_on(async {
        let mut on_a = WsClient::connect(
            cluster.addr(0),
            &cluster.http(0).mint_token("reader-a", "web"),
            None,
        )
        .await;
        let mut on_c = WsClient::connect(
            cluster.addr(2),
            &cluster.http(2).mint_token("reader-c", "web"),
            None,
        )
        .await;
        on_a.subscribe_ok(&room).await;
        on_c.subscribe_ok(&room).await;
        let (status, body) =
            cluster.http(1).mint_token_raw(json!({"user": "writer-b", "publish": ["chat:*"]}));
        assert_eq!(status, 201, "{body}");
        let mut on_b =
            WsClient::connect(cluster.addr(1), body["token"].as_str().unwrap(), None).await;
        let reply = on_b
            .request(json!({"op": "publish", "room": room, "id": "c-1", "data": {"text": "hi"}}))
            .await;
        if reply["op"] != "published" || reply["seq"] != 1 || reply["duplicate"] != false {
            failures.push(format!("publish on b: {reply}"));
        }
        let again = on_b
            .request(json!({"op": "publish", "room": room, "id": "c-1", "data": {"text": "hi"}}))
            .await;
        if again["duplicate"] != true || again["seq"] != 1 {
            failures
                .push(format!("the same id again on b: {again}, expected duplicate with seq 1"));
        }
        let refused = on_b.request(json!({"op": "publish", "room": "news:1", "data": {}})).await;
        if refused["code"] != "forbidden" {
            failures.push(format!("a room outside the patterns on b: {refused}"));
        }
        // A backend's publish with the client's id (through c, so forwarded to a) is a
        // new event: a client's ids are its user's (issue 29), on the stream too.
        let (status, backend) =
            cluster.http(2).publish(&room, Some("c-1"), json!({"text": "backend"}));
        if status != 201 || backend["seq"] != 2 || backend["duplicate"] != false {
            failures.push(format!("a backend publish with the client's id: {status} {backend}"));
        }
        for (name, ws) in [("a", &mut on_a), ("c", &mut on_c)] {
            let (events, other) = collect_events(ws, &room, 2, Duration::from_secs(10)).await;
            let seen: Vec<(&Value, &Value, Option<&Value>)> =
                events.iter().map(|e| (&e["seq"], &e["id"], e.get("from"))).collect();
            if seen
                != [
                    (&json!(1), &json!("c-1"), Some(&json!("writer-b"))),
                    (&json!(2), &json!("c-1"), None),
                ]
                || events[0]["data"]["text"] != "hi"
            {
                failures.push(format!("subscriber on {name}: {events:?}, also {other:?}"));
            }
        }
    });
    for node in 0..3 {
        let page = cluster.http(node).history_ok(&room, Some(0), Some(10));
        if page["head"] != 2
            || page["events"][0]["from"] != "writer-b"
            || page["events"][1]["id"] != "c-1"
        {
            failures.push(format!("history on {}: {page}", Cluster::name(node)));
        }
    }
    fail_with_logs(&cluster, "cluster client publish", &failures, &LOG_NEEDLES);
}

/// Ids are per room in cluster mode too (JetStream deduplicates per stream, and one
/// stream holds every room): the same id in two rooms is two events, and in one room a
/// duplicate with the first seq, whichever node it is published through.
#[test]
fn the_same_id_in_two_rooms_is_two_events_and_in_one_room_a_duplicate() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &SHORT_DRAIN);
    let mut failures = Vec::new();
    for (room, via) in [("ids:one", 0), ("ids:two", 1), ("ids:three", 0)] {
        let (status, reply) =
            cluster.http(via).publish(room, Some("shared-id"), json!({ "room": room }));
        if status != 201 || reply["seq"] != 1 || reply["duplicate"] != false {
            failures.push(format!("first publish of shared-id to {room}: {status} {reply}"));
        }
    }
    for via in [0, 1] {
        let (status, reply) =
            cluster.http(via).publish("ids:two", Some("shared-id"), json!({ "again": via }));
        if status != 200 || reply["seq"] != 1 || reply["duplicate"] != true {
            failures.push(format!(
                "shared-id again in ids:two through {}: {status} {reply}",
                Cluster::name(via)
            ));
        }
    }
    for room in ["ids:one", "ids:two", "ids:three"] {
        let page = cluster.http(1).history_ok(room, Some(0), None);
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.len() != 1 || events[0]["id"] != "shared-id" || events[0]["data"]["room"] != room
        {
            failures.push(format!("history of {room}: {page}"));
        }
    }
    fail_with_logs(&cluster, "ids per room", &failures, &["WARN", "ERROR"]);
}
