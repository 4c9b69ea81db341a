//! Room state on a single node: a publish may carry the room's state as of
//! its event, stored atomically with it; `PUT`/`GET /v1/rooms/{room}/state`; a subscribe
//! with `"state":true` gets the state at seq S and exactly the retained events after S
//! (also when recovery fails), answered from the room's memory; states survive kill -9
//! for acknowledged publishes; the demo resumes its matches from their stored states.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::process::ServeProcess;
use common::*;
use serde_json::{json, Value};

fn publish_with_state(
    http: &Http,
    room: &str,
    id: &str,
    data: Value,
    state: Option<Value>,
) -> (u16, Value) {
    let mut body = json!({"id": id, "data": data});
    if let Some(state) = state {
        body["state"] = state;
    }
    http.request("POST", &format!("/v1/rooms/{room}/events"), Auth::Key, Body::Json(body))
}

fn get_state(http: &Http, room: &str) -> Value {
    let (status, body) =
        http.request("GET", &format!("/v1/rooms/{room}/state"), Auth::Key, Body::None);
    assert_eq!(status, 200, "GET state of {room}: {body}");
    body
}

fn put_state(http: &Http, room: &str, data: Value) -> (u16, Value) {
    http.request(
        "PUT",
        &format!("/v1/rooms/{room}/state"),
        Auth::Key,
        Body::Json(json!({"data": data})),
    )
}

async fn subscribe_state(client: &mut WsClient, room: &str, since: Option<(u64, &Value)>) -> Value {
    let mut op = json!({"op": "subscribe", "room": room, "state": true});
    if let Some((since, epoch)) = since {
        op["since"] = json!(since);
        op["epoch"] = epoch.clone();
    }
    let reply = client.request(op).await;
    assert_eq!(reply["op"], "subscribed", "{reply}");
    reply
}

/// The ids of the room's events by seq, from the HTTP history.
fn ids_by_seq(http: &Http, room: &str) -> HashMap<u64, String> {
    let history = http.history_ok(room, Some(0), Some(1000));
    history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (seq_of(e), e["id"].as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test]
async fn a_late_subscriber_gets_the_state_at_s_and_exactly_the_events_after_it() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    // 300 events; every 7th carries the state, naming its own event.
    let mut state_seq = 0;
    for i in 1..=300u64 {
        let id = format!("e-{i}");
        let state = (i % 7 == 0).then(|| json!({"last_id": id, "count": i}));
        let (status, body) =
            publish_with_state(&http, "match:9", &id, json!({"i": i}), state.clone());
        assert_eq!(status, 201, "{body}");
        if state.is_some() {
            state_seq = body["seq"].as_u64().unwrap();
        }
    }
    assert_eq!(state_seq, 294);

    let mut late = server.client("late").await;
    let reply = subscribe_state(&mut late, "match:9", None).await;
    assert_eq!(reply["seq"], 300, "{reply}");
    assert_eq!(reply["state"]["seq"], 294, "{reply}");
    assert_eq!(reply["state"]["data"], json!({"last_id": "e-294", "count": 294}), "{reply}");
    assert_eq!(reply.get("recovered"), None, "no since, no recovered: {reply}");
    let events = late.next_events(6).await;
    assert_eq!(seqs(&events), (295..=300).collect::<Vec<_>>(), "exactly the events after S");
    late.assert_quiet(Duration::from_millis(300)).await;

    // Then live, with no gap and no duplicate.
    publish_with_state(
        &http,
        "match:9",
        "e-301",
        json!({"i": 301}),
        Some(json!({"last_id": "e-301"})),
    );
    assert_eq!(seqs(&late.next_events(1).await), [301]);
    // A subscriber without state:true gets no state and no replay.
    let mut plain = server.client("plain").await;
    let reply = plain.subscribe_ok("match:9").await;
    assert_eq!(reply.get("state"), None, "{reply}");
    plain.assert_quiet(Duration::from_millis(300)).await;
    // A room with no state: `state: null`, then every retained event.
    http.publish_ok("quiet", None, json!(1));
    http.publish_ok("quiet", None, json!(2));
    let reply = subscribe_state(&mut plain, "quiet", None).await;
    assert_eq!(reply["state"], Value::Null, "{reply}");
    assert!(reply.as_object().unwrap().contains_key("state"), "state is there, null: {reply}");
    assert_eq!(seqs(&plain.next_events(2).await), [1, 2]);
}

#[tokio::test]
async fn the_state_is_read_once_when_the_room_loads_and_never_rebuilt_from_the_log() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    for i in 1..=50u64 {
        publish_with_state(&http, "r", &format!("e-{i}"), json!(i), Some(json!({"n": i})));
    }
    let dir = server.stop();
    let server = TestServer::start_in(dir, |_| {});
    let http = server.http();
    for n in 0..5 {
        let mut client = server.client(&format!("u{n}")).await;
        let reply = subscribe_state(&mut client, "r", None).await;
        assert_eq!(
            (&reply["state"]["seq"], &reply["state"]["data"]),
            (&json!(50), &json!({"n": 50})),
            "{reply}"
        );
        client.assert_quiet(Duration::from_millis(100)).await;
    }
    assert_eq!(get_state(&http, "r")["seq"], 50);
    assert_eq!(
        http.metric("livegate_state_reads_total"),
        Some(1.0),
        "one store read of the state, at the room's load"
    );
}

#[tokio::test]
async fn a_failed_recovery_brings_the_state_and_the_events_after_it() {
    let _gate = crate::common::gate!();
    // History keeps 50 events: a `since` of 3 is too old once 120 were published.
    let server = TestServer::start(|c| c.history_size = 50);
    let http = server.http();
    let mut first = server.client("first").await;
    let epoch = first.subscribe_ok("room:1").await["epoch"].clone();
    for i in 1..=125u64 {
        // The state is the count of events so far, set with every tenth event.
        let state = (i % 10 == 0).then(|| json!({"count": i}));
        let (status, body) =
            publish_with_state(&http, "room:1", &format!("e-{i}"), json!({"add": 1}), state);
        assert_eq!(status, 201, "{body}");
    }
    let epoch = if epoch.is_null() { get_state(&http, "room:1")["epoch"].clone() } else { epoch };

    let cases: [(&str, u64, Value); 3] = [
        ("since too old", 3, epoch.clone()),
        ("stale epoch", 100, json!("not-the-epoch")),
        ("ahead of the head", 500, epoch.clone()),
    ];
    for (why, since, epoch) in cases {
        let mut client = server.client("again").await;
        let reply = subscribe_state(&mut client, "room:1", Some((since, &epoch))).await;
        assert_eq!(reply["recovered"], false, "{why}: {reply}");
        assert_eq!(reply["state"]["seq"], 120, "{why}: {reply}");
        let events = client.next_events(5).await;
        assert_eq!(seqs(&events), (121..=125).collect::<Vec<_>>(), "{why}");
        client.assert_quiet(Duration::from_millis(200)).await;
        // The client's view (the state plus the events after it) is the server's.
        let view = reply["state"]["data"]["count"].as_u64().unwrap() + events.len() as u64;
        let server_state = get_state(&http, "room:1");
        let server_view = server_state["data"]["count"].as_u64().unwrap()
            + (125 - server_state["seq"].as_u64().unwrap());
        assert_eq!((view, server_view), (125, 125), "{why}");
        assert_eq!(server_state["epoch"], reply["epoch"], "{why}");
    }
    // A recovery that works is the usual replay, with no state.
    let mut client = server.client("ok").await;
    let reply = subscribe_state(&mut client, "room:1", Some((122, &epoch))).await;
    assert_eq!(reply["recovered"], true, "{reply}");
    assert_eq!(reply.get("state"), None, "{reply}");
    assert_eq!(seqs(&client.next_events(3).await), [123, 124, 125]);
    // Without state:true a failed recovery is the old recovered:false and nothing.
    let reply = client.subscribe_since("room:1", 3, &epoch).await;
    assert_eq!((reply["recovered"].clone(), reply.get("state")), (json!(false), None), "{reply}");
    client.assert_quiet(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn concurrent_publishers_every_state_names_the_event_that_produced_it() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.batch_window_ms = 0);
    let http = server.http();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let http = http.clone();
            std::thread::spawn(move || {
                for i in 0..60 {
                    let id = format!("w{w}-{i}");
                    let (status, body) = publish_with_state(
                        &http,
                        "race",
                        &id,
                        json!({"id": id}),
                        Some(json!({"last_id": id})),
                    );
                    assert_eq!(status, 201, "{body}");
                }
            })
        })
        .collect();
    // Subscribers join while the publishers race; each state names the event at its seq.
    let mut joined = Vec::new();
    for n in 0..6 {
        common::pace_async(
            Duration::from_millis(40),
            "subscribers join all through the publishers' race",
        )
        .await;
        let mut client = server.client(&format!("s{n}")).await;
        let reply = subscribe_state(&mut client, "race", None).await;
        joined.push((client, reply));
    }
    for writer in writers {
        writer.join().unwrap();
    }
    let ids = ids_by_seq(&http, "race");
    assert_eq!(ids.len(), 240);
    for (mut client, reply) in joined {
        let Some(seq) = reply["state"]["seq"].as_u64() else {
            assert_eq!(reply["state"], Value::Null, "{reply}");
            continue;
        };
        assert_eq!(
            reply["state"]["data"]["last_id"].as_str(),
            Some(ids[&seq].as_str()),
            "state at {seq}: {reply}"
        );
        // Then every event after S, each once, in order, up to the last.
        let events = client.next_events((240 - seq) as usize).await;
        assert_eq!(seqs(&events), (seq + 1..=240).collect::<Vec<_>>());
        for event in &events {
            assert_eq!(event["data"]["id"], event["id"], "the marker names its own event");
        }
    }
    let state = get_state(&http, "race");
    assert_eq!(state["seq"], 240, "the last event carried a state: {state}");
    assert_eq!(state["data"]["last_id"].as_str(), Some(ids[&240].as_str()), "{state}");
}

#[tokio::test]
async fn put_and_get_round_trip_as_of_the_head() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    // A room never written: seq 0, data null, and the epoch its first write keeps.
    let none = get_state(&http, "board");
    assert!(none["epoch"].is_string(), "{none}");
    assert_eq!(none, json!({"room": "board", "epoch": none["epoch"], "seq": 0, "data": null}));

    let (status, put) = put_state(&http, "board", json!({"a": 1}));
    assert_eq!(status, 200, "{put}");
    assert_eq!(
        (&put["room"], &put["seq"], &put["epoch"]),
        (&json!("board"), &json!(0), &none["epoch"]),
        "{put}"
    );
    let got = get_state(&http, "board");
    assert_eq!(got, json!({"room": "board", "epoch": put["epoch"], "seq": 0, "data": {"a": 1}}));

    for i in 1..=3 {
        http.publish_ok("board", None, json!(i));
    }
    let (status, put) = put_state(&http, "board", json!(["x", 2]));
    assert_eq!((status, &put["seq"]), (200, &json!(3)), "as of the head: {put}");
    assert_eq!(get_state(&http, "board")["data"], json!(["x", 2]));
    let (_, put) = put_state(&http, "board", json!(null));
    assert_eq!(put["seq"], 3);
    let got = get_state(&http, "board");
    assert_eq!(
        (&got["seq"], &got["data"]),
        (&json!(3), &Value::Null),
        "a null state is a state: {got}"
    );

    let mut client = server.client("u").await;
    let reply = subscribe_state(&mut client, "board", None).await;
    assert_eq!(reply["state"], json!({"seq": 3, "data": null}), "{reply}");
    client.assert_quiet(Duration::from_millis(200)).await;

    // Refusals: no key, a body that is not {"data"}, a bad room.
    let (status, _) =
        http.request("PUT", "/v1/rooms/board/state", Auth::None, Body::Json(json!({"data": 1})));
    assert_eq!(status, 401);
    let (status, _) = http.request("GET", "/v1/rooms/board/state", Auth::None, Body::None);
    assert_eq!(status, 401);
    for body in [r#"{"state":1}"#, r#"{"data":1,"seq":9}"#, "not json"] {
        let (status, reply) =
            http.request("PUT", "/v1/rooms/board/state", Auth::Key, Body::Raw(body));
        assert_eq!((status, error_code(&reply)), (400, "bad_request"), "{body}: {reply}");
    }
    let (status, reply) = put_state(&http, "bad%20room", json!(1));
    assert_eq!((status, error_code(&reply)), (400, "bad_room"), "{reply}");
    assert_eq!(get_state(&http, "board")["data"], Value::Null, "nothing refused was stored");
}

#[tokio::test]
async fn too_large_states_are_refused_with_413_and_inboxes_have_none() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.max_state_bytes = 64);
    let http = server.http();
    let big = json!({"text": "x".repeat(80)});
    let (status, reply) = publish_with_state(&http, "r", "e-1", json!(1), Some(big.clone()));
    assert_eq!((status, error_code(&reply)), (413, "payload_too_large"), "{reply}");
    let (status, reply) = put_state(&http, "r", big.clone());
    assert_eq!((status, error_code(&reply)), (413, "payload_too_large"), "{reply}");
    assert_eq!(http.history_ok("r", Some(0), Some(10))["head"], 0, "nothing appended");
    // Exactly at the bound is fine.
    let fits = json!({"t": "x".repeat(64 - 8)});
    assert_eq!(fits.to_string().len(), 64);
    assert_eq!(publish_with_state(&http, "r", "e-2", json!(1), Some(fits.clone())).0, 201);
    assert_eq!(get_state(&http, "r")["data"], fits);

    // The op: an error frame, the connection stays open.
    let (status, token) = http.mint_token_raw(json!({"user": "alice", "publish": ["r"]}));
    assert_eq!(status, 201);
    let mut alice = WsClient::connect(server.addr, token["token"].as_str().unwrap(), None).await;
    let reply = alice.request(json!({"op": "publish", "room": "r", "data": 1, "state": big})).await;
    assert_eq!(
        (&reply["op"], &reply["code"]),
        (&json!("error"), &json!("payload_too_large")),
        "{reply}"
    );
    let reply = alice
        .request(json!({"op": "publish", "room": "r", "data": 2, "state": {"by": "op"}}))
        .await;
    assert_eq!(reply["op"], "published", "{reply}");
    assert_eq!(
        get_state(&http, "r"),
        json!({"room": "r", "epoch": get_state(&http, "r")["epoch"], "seq": 2, "data": {"by": "op"}})
    );

    // Inboxes: no state anywhere.
    let (status, reply) = http.request(
        "POST",
        "/v1/users/bob/messages",
        Auth::Key,
        Body::Json(json!({"data": 1, "state": {"a": 1}})),
    );
    assert_eq!((status, error_code(&reply)), (400, "bad_request"), "{reply}");
    let (status, reply) =
        publish_with_state(&http, "user:bob", "m-1", json!(1), Some(json!({"a": 1})));
    assert_eq!((status, error_code(&reply)), (400, "bad_request"), "{reply}");
    let (status, reply) = put_state(&http, "user:bob", json!(1));
    assert_eq!((status, error_code(&reply)), (400, "bad_request"), "{reply}");
    let (status, reply) = http.request("GET", "/v1/rooms/user:bob/state", Auth::Key, Body::None);
    assert_eq!((status, error_code(&reply)), (400, "bad_request"), "{reply}");
    assert_eq!(
        http.history_ok("user:bob", Some(0), Some(10))["head"],
        0,
        "nothing appended to the inbox"
    );
}

#[tokio::test]
async fn an_acknowledged_state_survives_kill_9() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let serve = ServeProcess::start(&data, &root.path().join("serve-1.log"), &[]);
    let http = Http::new(serve.addr);
    for i in 1..=20u64 {
        let (status, body) = publish_with_state(
            &http,
            "m",
            &format!("e-{i}"),
            json!(i),
            Some(json!({"last_id": format!("e-{i}")})),
        );
        assert_eq!(status, 201, "{body}");
    }
    let (status, _) = put_state(&http, "other", json!({"put": true}));
    assert_eq!(status, 200);
    // No shutdown, no flush: SIGKILL right after the last answer.
    serve.kill9();

    let serve = ServeProcess::start(&data, &root.path().join("serve-2.log"), &[]);
    let http = Http::new(serve.addr);
    let state = get_state(&http, "m");
    assert_eq!(
        (&state["seq"], &state["data"]),
        (&json!(20), &json!({"last_id": "e-20"})),
        "{state}"
    );
    assert_eq!(get_state(&http, "other")["data"], json!({"put": true}));
    let token = http.mint_token("u", "web");
    let mut client = WsClient::connect(serve.addr, &token, None).await;
    let reply = subscribe_state(&mut client, "m", None).await;
    assert_eq!(reply["state"]["seq"], 20, "{reply}");
    client.assert_quiet(Duration::from_millis(200)).await;
}

/// The demo's matches after a restart go on from their stored states: a match that was
/// playing does not kick off again, its minute and score never go back.
#[tokio::test]
async fn the_demo_resumes_each_match_from_its_stored_state() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let serve = ServeProcess::start(&data, &root.path().join("serve-1.log"), &["--demo"]);
    let http = Http::new(serve.addr);
    // Wait until some match is playing, past kick-off.
    let (room, before) =
        common::wait_for_every(Duration::from_secs(60), Duration::from_millis(200), || {
            (1..=4).map(|m| format!("match:{m}")).find_map(|room| {
                let state = get_state(&http, &room);
                (state["data"]["status"] == "playing"
                    && state["data"]["minute"].as_u64() >= Some(5))
                .then_some((room, state))
            })
        })
        .expect("no demo match got going");
    assert_eq!(
        before["data"]["match"],
        json!(room.trim_start_matches("match:").parse::<u64>().unwrap()),
        "{before}"
    );
    // Every event carried its match's state: the state names the head. The demo goes on
    // publishing, so compare only readings with no event between them.
    let settled = (0..50).find_map(|_| {
        let head = http.history_ok(&room, Some(0), Some(1))["head"].clone();
        let state = get_state(&http, &room);
        (http.history_ok(&room, Some(0), Some(1))["head"] == head).then_some((state, head))
    });
    let (state, head) = settled.expect("the demo published between every pair of readings");
    assert_eq!(state["seq"], head, "{state}");
    serve.kill9();

    let serve = ServeProcess::start(&data, &root.path().join("serve-2.log"), &["--demo"]);
    let http = Http::new(serve.addr);
    let stored = get_state(&http, &room);
    let (minute, score) =
        (stored["data"]["minute"].as_u64().unwrap(), stored["data"]["score"].clone());
    let head = stored["seq"].as_u64().unwrap();
    assert!(
        stored["data"]["status"] == "playing" || stored["data"]["status"] == "finished",
        "{stored}"
    );
    // The next event of that match, after the restart.
    let next = common::wait_for_every(Duration::from_secs(60), Duration::from_millis(100), || {
        http.history_ok(&room, Some(head), Some(1))["events"]
            .as_array()
            .and_then(|e| e.first())
            .cloned()
    })
    .unwrap_or_else(|| panic!("the demo did not go on in {room}"));
    if stored["data"]["status"] == "playing" {
        assert_ne!(
            next["data"]["type"], "kickoff",
            "a playing match goes on: {stored} then {next}"
        );
        assert!(next["data"]["minute"].as_u64().unwrap() >= minute, "{stored} then {next}");
        let goals = |s: &Value| s[0].as_u64().unwrap() + s[1].as_u64().unwrap();
        assert!(goals(&next["data"]["score"]) >= goals(&score), "{stored} then {next}");
    } else {
        assert_eq!(
            next["data"]["type"], "kickoff",
            "a finished match rests, then the next one kicks off"
        );
    }
}
