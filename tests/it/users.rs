//! Per-user features of the contract beyond the single-room spine:
//! the automatic inbox room `user:<id>` and messages into it, reading another user's
//! inbox forbidden, exclusive devices (newest wins, 4501), operator kick (4502).

use crate::common;

use common::*;
use serde_json::json;

async fn client_on(server: &TestServer, user: &str, device: &str) -> WsClient {
    let token = server.mint_token(user, device);
    WsClient::connect(server.addr, &token, None).await
}

#[tokio::test]
async fn another_users_inbox_is_forbidden() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let mut c = server.client("alice").await;

    let reply = c.subscribe("user:bob").await;
    assert_eq!(reply["op"], "error", "{reply}");
    assert_eq!(reply["code"], "forbidden", "{reply}");

    let reply = c.history_op("user:bob", 0, 10).await;
    assert_eq!(reply["op"], "error", "{reply}");
    assert_eq!(reply["code"], "forbidden", "{reply}");
    c.assert_alive().await;

    let reply = c.history_op("user:alice", 0, 10).await;
    assert_eq!(reply["op"], "history", "the own inbox is readable: {reply}");
}

#[tokio::test]
async fn messages_reach_every_connection_of_the_user_without_subscribing() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut tab1 = server.client("alice").await;
    let mut tab2 = server.client("alice").await;
    let mut bob = server.client("bob").await;
    // Round trips so the automatic inbox subscriptions are in place.
    tab1.assert_alive().await;
    tab2.assert_alive().await;
    bob.assert_alive().await;

    let (status, reply) = http.request(
        "POST",
        "/v1/users/alice/messages",
        Auth::Key,
        Body::Json(json!({"id": "m-1", "data": {"hi": 1}})),
    );
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply["seq"], 1, "{reply}");
    for tab in [&mut tab1, &mut tab2] {
        let got = tab.next_events(1).await;
        assert_eq!(got[0]["room"], "user:alice", "{got:?}");
        assert_eq!(got[0]["data"], json!({"hi": 1}), "{got:?}");
        tab.assert_quiet(QUIET).await;
    }
    bob.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn messages_for_named_devices_reach_only_those() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut phone = client_on(&server, "alice", "phone").await;
    let mut web = client_on(&server, "alice", "web").await;
    phone.assert_alive().await;
    web.assert_alive().await;

    let body = json!({"id": "m-1", "data": "to the phone", "devices": ["phone"]});
    let (status, reply) =
        http.request("POST", "/v1/users/alice/messages", Auth::Key, Body::Json(body));
    assert_eq!(status, 201, "{reply}");
    assert_eq!(phone.next_events(1).await[0]["data"], "to the phone");
    web.assert_quiet(QUIET).await;
}

#[tokio::test]
async fn exclusive_device_newest_connection_wins_with_4501_and_web_keeps_many_tabs() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let mut old_phone = client_on(&server, "alice", "phone").await;
    let mut new_phone = client_on(&server, "alice", "phone").await;
    assert_eq!(old_phone.close_code().await, Some(4501), "the older phone connection is replaced");
    new_phone.assert_alive().await;

    let mut tab1 = server.client("alice").await;
    let mut tab2 = server.client("alice").await;
    tab1.assert_alive().await;
    tab2.assert_alive().await;
    new_phone.assert_alive().await;
}

#[tokio::test]
async fn operator_kick_closes_the_users_connections_with_4502() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let mut phone = client_on(&server, "alice", "phone").await;
    let mut web = client_on(&server, "alice", "web").await;
    let mut bob = server.client("bob").await;
    phone.assert_alive().await;
    web.assert_alive().await;

    let (status, reply) =
        http.request("DELETE", "/v1/users/alice/connections?device=phone", Auth::Key, Body::None);
    assert_eq!((status, &reply["closed"]), (200, &json!(1)), "{reply}");
    assert_eq!(phone.close_code().await, Some(4502));
    web.assert_alive().await;

    let (status, reply) =
        http.request("DELETE", "/v1/users/alice/connections", Auth::Key, Body::None);
    assert_eq!((status, &reply["closed"]), (200, &json!(1)), "{reply}");
    assert_eq!(web.close_code().await, Some(4502));
    bob.assert_alive().await;

    let (status, reply) =
        http.request("DELETE", "/v1/users/alice/connections", Auth::None, Body::None);
    assert_eq!(status, 401, "{reply}");
}
