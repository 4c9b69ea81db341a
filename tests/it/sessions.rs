//! Session ids across reconnects: a handshake naming
//! `session=S` keeps S when S belongs to the token's user; for anyone else the handshake
//! still succeeds, with a new session, and S is left untouched.

use crate::common;

use common::*;

#[tokio::test]
async fn handshake_keeps_a_session_of_the_same_user_only() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let first = server.client("alice").await;
    let session = first.session().to_string();
    drop(first);

    let token = server.mint_token("alice", "web");
    let again = WsClient::connect(server.addr, &token, Some(&session)).await;
    assert_eq!(again.session(), session, "the same user's session must be kept: {}", again.welcome);

    let token = server.mint_token("mallory", "web");
    let other = WsClient::connect(server.addr, &token, Some(&session)).await;
    assert!(!other.session().is_empty());
    assert_ne!(
        other.session(),
        session,
        "another user's session must not be handed over: {}",
        other.welcome
    );

    // Mallory's attempt left it untouched: it is still Alice's.
    let token = server.mint_token("alice", "web");
    let back = WsClient::connect(server.addr, &token, Some(&session)).await;
    assert_eq!(back.session(), session, "{}", back.welcome);
}

#[tokio::test]
async fn unknown_session_gets_a_fresh_one() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let token = server.mint_token("alice", "web");
    let c = WsClient::connect(server.addr, &token, Some("no-such-session")).await;
    assert!(!c.session().is_empty());
    assert_ne!(c.session(), "no-such-session", "{}", c.welcome);
}
