//! Users and sessions across nodes: tokens (minted and JWTs) spent cluster-wide, the session directory's
//! versioned writes, exclusive devices and kicks on every node, resume credentials, and
//! the session bucket's age limit.

use super::*;

/// Tokens are signed with a secret every node shares, and spent cluster-wide: a token
/// minted on A opens a connection on B, and the same token is then refused on A.
#[test]
fn a_token_minted_on_one_node_works_once_on_any_node() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &[]);
    let rt = runtime();
    let token = cluster.http(0).mint_token("once-user", "web");
    let (on_b, again_on_a) = rt.block_on(async {
        let on_b = WsClient::try_connect(cluster.addr(1), Some(&token), None).await;
        let again_on_a = WsClient::try_connect(cluster.addr(0), Some(&token), None).await;
        (on_b, again_on_a)
    });
    assert!(
        on_b.is_ok(),
        "a token minted on a must open a connection on b: {:?}",
        on_b.err().map(|r| (r.status, r.body))
    );
    match again_on_a {
        Ok(_) => panic!("a spent token opened a second connection on another node"),
        Err(refused) => {
            assert_eq!(refused.status, 401, "{}", refused.body);
            assert_eq!(error_code(&refused.body), "token_replayed", "{}", refused.body);
        }
    }
}

/// A JWT a backend signed is spent cluster-wide like a minted token: its jti opens one
/// connection, on whichever node it reaches first.
#[test]
fn a_jwt_works_once_on_any_node() {
    let _gate = crate::common::gate!();
    let secret = "a-backend-secret-of-at-least-32-bytes!";
    let cluster = Cluster::start(2, &["--jwt-hmac-secret", secret]);
    let rt = runtime();
    let now = now_ms() / 1000;
    let claims = serde_json::json!({"sub": "jwt-user", "exp": now + 300, "iat": now, "jti": format!("cluster-{}", now_ms())});
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).expect("HMAC key");
    let token =
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).expect("sign");
    let (on_b, again_on_a) = rt.block_on(async {
        let on_b = WsClient::try_connect(cluster.addr(1), Some(&token), None).await;
        let again_on_a = WsClient::try_connect(cluster.addr(0), Some(&token), None).await;
        (on_b, again_on_a)
    });
    assert!(
        on_b.is_ok(),
        "the JWT opens a connection on b: {:?}",
        on_b.err().map(|r| (r.status, r.body))
    );
    match again_on_a {
        Ok(_) => panic!("a spent JWT opened a second connection on another node"),
        Err(refused) => {
            assert_eq!(
                (refused.status, error_code(&refused.body)),
                (401, "token_replayed"),
                "{}",
                refused.body
            );
        }
    }
}

#[test]
fn a_stale_directory_write_from_one_node_loses_to_the_other() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let nats = NatsServer::start();
    let url = nats.url();
    let rt = runtime();
    rt.block_on(async {
        let a = livegate::cluster::Cluster::connect(&url, "a").await.unwrap_or_else(|e| panic!("connect a: {e:?}"));
        let b = livegate::cluster::Cluster::connect(&url, "b").await.unwrap_or_else(|e| panic!("connect b: {e:?}"));
        let kv_a = KvSessions::open(&a).await.unwrap_or_else(|e| panic!("open kv on a: {e:?}"));
        let kv_b = KvSessions::open(&b).await.unwrap_or_else(|e| panic!("open kv on b: {e:?}"));
        let kvs = [("a", &kv_a), ("b", &kv_b)];
        let session = "stale-session-1";
        let record = |owner: &str| SessionRecord {
            session: session.into(),
            user: "stale-user".into(),
            owner: owner.into(),
            version: 0,
            updated_at_ms: now_ms(),
        };

        // Both create the same new session at once: one creates it, the other is stale.
        let (rec_a, rec_b) = (record("a"), record("b"));
        let (ra, rb) = tokio::join!(kv_a.write_session(None, &rec_a), kv_b.write_session(None, &rec_b));
        let creator = match (&ra, &rb) {
            (Ok(w), Err(ClusterError::Stale(_))) | (Err(ClusterError::Stale(_)), Ok(w)) => {
                assert_eq!(w.version, 1, "the created record has version 1: {w:?}");
                w.owner.clone()
            }
            other => panic!("racing creates: expected exactly one Ok and one Stale, got {other:?}"),
        };
        let (stored, _) = kv_b.entry(session).await.expect("entry").expect("record exists");
        assert_eq!((stored.version, stored.owner.as_str()), (1, creator.as_str()), "{stored:?}");

        for round in 0..10 {
            // Both read the same version ...
            let (seen_a, rev_a) = kv_a.entry(session).await.expect("entry on a").expect("record");
            let (seen_b, rev_b) = kv_b.entry(session).await.expect("entry on b").expect("record");
            assert_eq!((seen_a.version, rev_a), (seen_b.version, rev_b), "round {round}: both read the same record");
            let read = seen_a.version;
            // ... and race a write from it; alternate who is polled first.
            let (first, second) = if round % 2 == 0 { (kvs[0], kvs[1]) } else { (kvs[1], kvs[0]) };
            let (rec1, rec2) = (record(first.0), record(second.0));
            let (r1, r2) = tokio::join!(first.1.write_session(Some(read), &rec1), second.1.write_session(Some(read), &rec2));
            let (winner, loser, written) = match (r1, r2) {
                (Ok(w), Err(ClusterError::Stale(_))) => (first, second, w),
                (Err(ClusterError::Stale(_)), Ok(w)) => (second, first, w),
                other => panic!("round {round}: racing writes from version {read}: expected one Ok and one Stale, got {other:?}"),
            };
            assert_eq!(written.version, read + 1, "round {round}: the winner's record: {written:?}");
            let (after, rev_after) = loser.1.entry(session).await.expect("entry").expect("record");
            assert_eq!(after.version, read + 1, "round {round}: version advanced by exactly one: {after:?}");
            assert_eq!(after.owner, winner.0, "round {round}: the winner's write is stored: {after:?}");
            // The loser retrying from its stale read loses again and changes nothing.
            match loser.1.write_session(Some(read), &record(loser.0)).await {
                Err(ClusterError::Stale(_)) => {}
                other => panic!("round {round}: stale retry by {}: expected Stale, got {other:?}", loser.0),
            }
            let (unchanged, rev_unchanged) = winner.1.entry(session).await.expect("entry").expect("record");
            assert_eq!((unchanged, rev_unchanged), (after, rev_after), "round {round}: a stale write changed the record");
        }
    });
    eprintln!("stale directory write: test took {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------
// (h) exclusive device across nodes, (i) kick across nodes
// ---------------------------------------------------------------------------------------

#[test]
fn a_newer_phone_on_b_replaces_the_older_phone_on_a_with_4501() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let user = "phone-user";
    let mut old_phone = rt.block_on(WsClient::connect(
        cluster.addr(0),
        &cluster.http(0).mint_token(user, "phone"),
        None,
    ));
    let mut tab = rt.block_on(WsClient::connect(
        cluster.addr(2),
        &cluster.http(2).mint_token(user, "web"),
        None,
    ));
    let mut other = rt.block_on(WsClient::connect(
        cluster.addr(0),
        &cluster.http(0).mint_token("phone-other", "phone"),
        None,
    ));
    let mut new_phone = rt.block_on(WsClient::connect(
        cluster.addr(1),
        &cluster.http(1).mint_token(user, "phone"),
        None,
    ));
    let replaced_at = Instant::now();
    let code = rt.block_on(old_phone.close_code_within(WAIT));
    let took = replaced_at.elapsed();
    let mut failures = Vec::new();
    if code != Some(4501) {
        failures.push(format!("the older phone on a ended with {code:?}, expected 4501"));
    }
    rt.block_on(async {
        new_phone.assert_alive().await;
        tab.assert_alive().await;
        other.assert_alive().await;
    });
    eprintln!(
        "exclusive device across nodes: 4501 after {took:?}; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "exclusive device", &failures, &LOG_NEEDLES);
}

#[test]
fn a_kick_on_b_closes_the_users_connections_on_every_node_and_counts_them() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let user = "kick-user";
    let mut victims: Vec<(usize, WsClient)> = (0..3)
        .map(|i| {
            (
                i,
                rt.block_on(WsClient::connect(
                    cluster.addr(i),
                    &cluster.http(i).mint_token(user, "web"),
                    None,
                )),
            )
        })
        .collect();
    let mut bystander = rt.block_on(WsClient::connect(
        cluster.addr(0),
        &cluster.http(0).mint_token("kick-bystander", "web"),
        None,
    ));
    // The victims read (and answer the Close) while the kick runs, as real clients do.
    let readers: Vec<_> = victims
        .drain(..)
        .map(|(i, mut ws)| {
            rt.spawn(async move {
                let code = ws.close_code_within(WAIT).await;
                let _ = tokio::time::timeout(Duration::from_secs(3), async {
                    while ws.ws.next().await.is_some() {}
                })
                .await;
                (i, code)
            })
        })
        .collect();
    let kicked_at = Instant::now();
    let (status, reply) = cluster.http(1).request(
        "DELETE",
        &format!("/v1/users/{user}/connections"),
        Auth::Key,
        Body::None,
    );
    let replied = kicked_at.elapsed();
    let mut failures = Vec::new();
    if status != 200 || reply["closed"] != 3 {
        failures.push(format!("kick on b: {status} {reply}, expected 200 with closed 3"));
    }
    if replied > Duration::from_secs(3) {
        failures.push(format!(
            "the kick reply took {replied:?} although every client answered its Close at once"
        ));
    }
    for reader in readers {
        let (i, code) = rt.block_on(reader).expect("victim reader");
        if code != Some(4502) {
            failures.push(format!(
                "{user}'s connection on {} ended with {code:?}, expected 4502",
                Cluster::name(i)
            ));
        }
    }
    rt.block_on(bystander.assert_alive());
    // Nobody left: a second kick counts nothing.
    let (status, reply) = cluster.http(2).request(
        "DELETE",
        &format!("/v1/users/{user}/connections"),
        Auth::Key,
        Body::None,
    );
    if status != 200 || reply["closed"] != 0 {
        failures.push(format!("second kick on c: {status} {reply}, expected 200 with closed 0"));
    }
    // A node killed just before a kick: the kick answers with what the live nodes closed
    // once the dead node's heartbeats time out (3 s), not after the 12 s answer wait.
    let mut victim = rt.block_on(WsClient::connect(
        cluster.addr(0),
        &cluster.http(0).mint_token(user, "web"),
        None,
    ));
    let reader = rt.spawn(async move { victim.close_code_within(WAIT).await });
    cluster.take_node(2).kill9();
    let kicked_at = Instant::now();
    let (status, reply) = cluster.http(1).request(
        "DELETE",
        &format!("/v1/users/{user}/connections"),
        Auth::Key,
        Body::None,
    );
    let after_death = kicked_at.elapsed();
    if status != 200 || reply["closed"] != 1 {
        failures.push(format!("kick on b with c dead: {status} {reply}, expected 200 with closed 1 (the connection on a)"));
    }
    if after_death >= Duration::from_secs(8) {
        failures.push(format!(
            "the kick with c dead took {after_death:?}: it waited for the dead node's answer"
        ));
    }
    match rt.block_on(reader).expect("victim reader") {
        Some(4502) => {}
        code => failures.push(format!(
            "{user}'s connection on a ended with {code:?} during the kick with c dead"
        )),
    }
    eprintln!(
        "kick across nodes: reply after {replied:?}, {after_death:?} right after a node died; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "kick", &failures, &LOG_NEEDLES);
}

/// The resume credential of `ws`'s welcome.
fn resume_of(ws: &WsClient) -> String {
    ws.welcome["resume"]
        .as_str()
        .unwrap_or_else(|| panic!("welcome without resume: {}", ws.welcome))
        .to_string()
}

/// A handshake on `addr` with resume credential `resume`.
async fn try_resume(addr: SocketAddr, resume: &str) -> Result<WsClient, Rejected> {
    WsClient::try_connect_url(&format!("ws://{addr}/v1/ws?resume={resume}")).await
}

/// `Err` unless the handshake was refused with 401 resume_invalid.
fn refused_as_invalid(what: &str, attempt: Result<WsClient, Rejected>) -> Result<(), String> {
    match attempt {
        Ok(ws) => Err(format!("{what}: opened a connection: {}", ws.welcome)),
        Err(r) if (r.status, error_code(&r.body)) == (401, "resume_invalid") => Ok(()),
        Err(r) => Err(format!("{what}: {} {}, expected 401 resume_invalid", r.status, r.body)),
    }
}

#[test]
fn a_resume_credential_from_a_works_once_on_b_and_a_kick_through_a_voids_it_on_both() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &SHORT_DRAIN);
    let rt = runtime();
    let (a, b) = (cluster.addr(0), cluster.addr(1));
    let user = "roamer";
    let (status, body) = cluster
        .http(0)
        .mint_token_raw(json!({"user": user, "device": "web", "rooms": ["match:*"]}));
    assert_eq!(status, 201, "{body}");
    let first = rt.block_on(WsClient::connect(a, body["token"].as_str().unwrap(), None));
    let session = first.session().to_string();
    let from_a = resume_of(&first);
    rt.block_on(first.close());
    cluster.http(0).wait_metric_total("livegate_connections_open", 0.0, WAIT);
    cluster.http(0).wait_metric_total("livegate_sessions_live", 0.0, WAIT);

    let mut failures = Vec::new();
    // a is alive and owns the session, so b would send the client there (4421); this
    // client says it cannot reach a, and b takes the session with a's credential.
    let avoiding_a = format!("ws://{b}/v1/ws?resume={from_a}&avoid=a");
    let mut on_b = rt
        .block_on(WsClient::try_connect_url(&avoiding_a))
        .unwrap_or_else(|r| panic!("a's credential on b: {} {}", r.status, r.body));
    if (on_b.session(), on_b.welcome["node"].as_str()) != (session.as_str(), Some(Cluster::name(1)))
    {
        failures.push(format!(
            "the credential from a must open session {session} on b: {}",
            on_b.welcome
        ));
    }
    let (subscribed, refused) =
        rt.block_on(async { (on_b.subscribe("match:1").await, on_b.subscribe("news").await) });
    if subscribed["op"] != "subscribed" || refused["code"] != "forbidden" {
        failures.push(format!("the room patterns must travel with the credential: match:1 {subscribed}, news {refused}"));
    }
    let (status, reply) = cluster.http(1).request(
        "POST",
        &format!("/v1/users/{user}/messages"),
        Auth::Key,
        Body::Json(json!({"data": "hi"})),
    );
    assert_eq!(status, 201, "{reply}");
    let inbox = rt.block_on(on_b.recv_json());
    if !inbox.to_string().contains("\"hi\"") {
        failures.push(format!("the user's inbox must reach the resumed connection: {inbox}"));
    }
    if let Err(e) = refused_as_invalid(
        "a's credential again on a after b spent it",
        rt.block_on(try_resume(a, &from_a)),
    ) {
        failures.push(e);
    }

    // A kick through a of the session now on b: b revokes, and answers a only once the
    // revocation is in NATS, so a refuses b's latest credential as soon as the kick answers.
    let latest = resume_of(&on_b);
    let reader = rt.spawn(async move {
        let code = on_b.close_code_within(WAIT).await;
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            while on_b.ws.next().await.is_some() {}
        })
        .await;
        code
    });
    let (status, reply) = cluster.http(0).request(
        "DELETE",
        &format!("/v1/users/{user}/connections"),
        Auth::Key,
        Body::None,
    );
    if status != 200 || reply["closed"] != 1 {
        failures.push(format!("kick on a: {status} {reply}, expected 200 with closed 1"));
    }
    let code = rt.block_on(reader).expect("reader");
    if code != Some(4502) {
        failures.push(format!("the kicked connection ended with {code:?}, expected 4502"));
    }
    if let Err(e) = refused_as_invalid(
        "the kicked session's credential on a",
        rt.block_on(try_resume(a, &latest)),
    ) {
        failures.push(e);
    }
    if let Err(e) = refused_as_invalid(
        "the kicked session's credential on b",
        rt.block_on(try_resume(b, &latest)),
    ) {
        failures.push(e);
    }
    fail_with_logs(&cluster, "resume across nodes", &failures, &LOG_NEEDLES);
}

#[test]
fn a_kick_on_a_voids_on_b_the_credentials_of_a_user_connected_nowhere() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &SHORT_DRAIN);
    let rt = runtime();
    let (a, b) = (cluster.addr(0), cluster.addr(1));
    let user = "leaver";
    let first = rt.block_on(WsClient::connect(a, &try_mint(a, user, "web").expect("token"), None));
    let kept = resume_of(&first);
    rt.block_on(first.close());
    let saved_token = try_mint(a, user, "web").expect("token");
    let gone =
        wait_until(WAIT, || cluster.http(0).metric_total("livegate_connections_open") == 0.0);
    assert!(gone, "the client's connection on a must be gone before the kick");

    let mut failures = Vec::new();
    let (status, reply) = cluster.http(0).request(
        "DELETE",
        &format!("/v1/users/{user}/connections"),
        Auth::Key,
        Body::None,
    );
    if status != 200 || reply["closed"] != 0 {
        failures.push(format!("kick on a: {status} {reply}, expected 200 with closed 0"));
    }
    if let Err(e) = refused_as_invalid(
        "a's resume credential on b after the kick on a",
        rt.block_on(try_resume(b, &kept)),
    ) {
        failures.push(e);
    }
    match rt.block_on(try_ws(b, saved_token, None)) {
        Err(e) if e.contains("401") && e.contains("invalid_token") => {}
        Err(e) => failures
            .push(format!("a token minted before the kick, on b: {e}, expected 401 invalid_token")),
        Ok(ws) => failures.push(format!(
            "a token minted before the kick opened a connection on b: {}",
            ws.welcome
        )),
    }
    match try_mint(b, user, "web") {
        Ok(token) => {
            if let Err(e) = rt.block_on(try_ws(b, token, None)) {
                failures.push(format!("a token minted after the kick: {e}"));
            }
        }
        Err(e) => failures.push(e),
    }
    fail_with_logs(&cluster, "kick of a user connected nowhere", &failures, &LOG_NEEDLES);
}

#[test]
fn session_records_leave_the_kv_bucket_after_the_ttl_unless_their_node_keeps_them_connected() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &["--session-ttl-secs", "2"]);
    let rt = runtime();
    let (addr, home) = (cluster.addr(1), cluster.addr(0));
    let mut failures = Vec::new();
    rt.block_on(async {
        // The same limits as the node, or connecting would set the bucket's age limit back.
        let day = Duration::from_secs(86_400);
        let limits = StreamLimits {
            history_size: 1000,
            nonce_ttl: day,
            session_ttl: Duration::from_secs(2),
            replicas: None,
        };
        let probe = livegate::cluster::Cluster::connect_with(&cluster.nats.url(), "probe", limits)
            .await
            .unwrap_or_else(|e| panic!("connect: {e:?}"));
        let kv = KvSessions::open(&probe).await.unwrap_or_else(|e| panic!("open kv: {e:?}"));
        // "kept" starts on a and moves to b, so b refreshes a record it got by migration.
        let first = WsClient::connect(home, &cluster.http(0).mint_token("kept", "web"), None).await;
        let kept_session = first.session().to_string();
        first.close().await;
        // (a is alive and owns it: the client says it cannot reach a, so b takes it.)
        let token = cluster.http(1).mint_token("kept", "web");
        let avoiding_a = format!("{}&avoid=a", ws_url(addr, Some(&token), Some(&kept_session)));
        let mut kept = WsClient::try_connect_url(&avoiding_a)
            .await
            .unwrap_or_else(|r| panic!("kept on b: {} {}", r.status, r.body));
        if kept.session() != kept_session {
            failures.push(format!("the session did not move from a to b: {}", kept.welcome));
        }
        let gone = WsClient::connect(addr, &cluster.http(1).mint_token("gone", "web"), None).await;
        let gone_session = gone.session().to_string();
        gone.close().await;
        let closed = Instant::now();
        // The bucket's age limit is twice the TTL: the record goes 2 to 4 s after the close
        // (nats-server expires entries about once a second).
        let (kv, gone_session) = (&kv, &gone_session);
        let vanished = common::wait_for_every_async(
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async move {
                kv.entry(gone_session)
                    .await
                    .expect("read the bucket")
                    .is_none()
                    .then(|| closed.elapsed())
            },
        )
        .await;
        match vanished {
            None => failures.push(
                "a disconnected session's record was still in the bucket 10 s after a 2 s TTL"
                    .to_string(),
            ),
            Some(at) if at < Duration::from_millis(1900) => {
                failures.push(format!("the record went {at:?} after the close, before the TTL"))
            }
            Some(_) => {}
        }
        // Older than the age limit by now, yet refreshed by its node while connected.
        common::let_time_pass_async(Duration::from_secs(3), "past the bucket's age limit").await;
        match kv.entry(&kept_session).await.expect("read the bucket") {
            None => failures.push(format!(
                "the connected session's record left the bucket after {:?}",
                closed.elapsed()
            )),
            Some((record, _)) if record.owner != Cluster::name(1) => {
                failures.push(format!("the record names owner {}", record.owner))
            }
            Some(_) => {}
        }
        kept.assert_alive().await;
        let tab = WsClient::connect(
            addr,
            &cluster.http(1).mint_token("kept", "web"),
            Some(&kept_session),
        )
        .await;
        if tab.session() != kept_session {
            failures.push(format!(
                "a second tab of the connected session got another id: {}",
                tab.welcome
            ));
        }
        let late =
            WsClient::connect(addr, &cluster.http(1).mint_token("gone", "web"), Some(gone_session))
                .await;
        if late.session() == gone_session {
            failures.push(format!("an expired session was reused: {}", late.welcome));
        }
    });
    fail_with_logs(&cluster, "session expiry in cluster mode", &failures, &LOG_NEEDLES);
}

#[test]
fn the_session_bucket_takes_the_age_limit_of_the_last_node_to_open_it() {
    let _gate = crate::common::gate!();
    let nats = NatsServer::start();
    let rt = runtime();
    rt.block_on(async {
        let day = Duration::from_secs(86_400);
        let mut max_ages = Vec::new();
        for session_ttl in [Duration::from_secs(5), Duration::from_secs(30)] {
            let limits =
                StreamLimits { history_size: 1000, nonce_ttl: day, session_ttl, replicas: None };
            let node = livegate::cluster::Cluster::connect_with(&nats.url(), "a", limits)
                .await
                .unwrap_or_else(|e| panic!("connect: {e:?}"));
            let mut bucket =
                node.js.get_stream("KV_lg_sessions").await.expect("the session bucket exists");
            max_ages.push(bucket.info().await.expect("bucket info").config.max_age);
        }
        assert_eq!(
            max_ages,
            [Duration::from_secs(10), Duration::from_secs(60)],
            "twice session_ttl_secs, updated on open"
        );
    });
}

/// Reconcile before traffic, cluster mode: node a is killed (SIGKILL) with two sessions
/// connected and started again under its name after their records have aged 3 s of a 3 s
/// TTL (the bucket keeps a record twice the TTL after its last write). Resume handshakes
/// sent from its listening line on are refused (503 `unavailable`) until `/readyz` is
/// 200; at the start the killed run's records are rewritten as closed then (their
/// `updated_at_ms` is after the kill), so the session nobody resumed is still there, and
/// resumable, past the age limit counted from the crash (kill + 2 TTL + 1.5 s), where
/// before it was gone.
#[test]
fn a_node_restarted_after_kill_9_admits_nobody_before_ready_and_its_orphaned_sessions_count_as_closed_at_the_start(
) {
    let _gate = crate::common::gate!();
    const TTL: Duration = Duration::from_secs(3);
    let mut cluster = Cluster::start(2, &["--session-ttl-secs", "3"]);
    let rt = runtime();
    let mut failures = Vec::new();
    rt.block_on(async {
        // The same limits as the node, or connecting would set the bucket's age limit back.
        let day = Duration::from_secs(86_400);
        let limits = StreamLimits { history_size: 1000, nonce_ttl: day, session_ttl: TTL, replicas: None };
        let probe = livegate::cluster::Cluster::connect_with(&cluster.nats.url(), "probe", limits)
            .await
            .unwrap_or_else(|e| panic!("connect: {e:?}"));
        let kv = KvSessions::open(&probe).await.unwrap_or_else(|e| panic!("open kv: {e:?}"));
        let a = cluster.addr(0);
        let one = WsClient::connect(a, &cluster.http(0).mint_token("u1", "web"), None).await;
        let two = WsClient::connect(a, &cluster.http(0).mint_token("u2", "web"), None).await;
        let (s1, s2) = (one.session().to_string(), two.session().to_string());
        // Tokens minted on b work on any node, once.
        let (back1, back2) = (cluster.http(1).mint_token("u1", "web"), cluster.http(1).mint_token("u2", "web"));
        cluster.take_node(0).kill9();
        let (killed, killed_ms) = (Instant::now(), common::now_ms());
        drop((one, two));
        common::let_time_pass_async(TTL, "the killed run's records age in the bucket before the restart").await;

        cluster.start_node_listening(0);
        let a = cluster.addr(0);
        let start = common::process::handshakes_through_start(a, &back1, &s1, Duration::from_secs(20)).await;
        cluster.node_mut(0).wait_ready();
        failures.extend(start.failures);
        eprintln!("handshakes refused while starting: {}", start.refused_unready);
        // The start reads and rewrites records over NATS (a few ms): the first handshake,
        // waiting in the backlog since the listening line, usually meets it and is refused
        // (2 to 7 refusals a run here); on a loaded machine it may come after, so the count
        // is reported, not required. What is required: nothing admitted before ready.
        match &start.admitted {
            Some(ws) if ws.session() != s1 => failures.push(format!("the first admitted handshake did not resume {s1}: {}", ws.welcome)),
            _ => {}
        }
        match kv.entry(&s2).await.expect("read the bucket") {
            Some((record, _)) if record.updated_at_ms < killed_ms => {
                failures.push(format!("the killed run's record was not released at the start: written {} ms before the kill", killed_ms - record.updated_at_ms))
            }
            Some((record, _)) if record.owner != Cluster::name(0) => failures.push(format!("the record names owner {}", record.owner)),
            Some(_) => {}
            None => failures.push("the unresumed session's record was gone after the restart".to_string()),
        }
        let status = cluster.http(0).request("GET", "/v1/admin/status", Auth::Key, Body::None).1;
        if status["sessions_live"] != 1 {
            failures.push(format!("only the resumed session is connected on a: {status}"));
        }
        // Past the age limit counted from the crash (last write at the kill at the
        // latest, nats-server expiring about once a second): only the release kept it.
        let past = (2 * TTL + Duration::from_millis(1500)).saturating_sub(killed.elapsed());
        common::let_time_pass_async(past, "past the bucket's age limit counted from the kill").await;
        match WsClient::try_connect(a, Some(&back2), Some(&s2)).await {
            Ok(ws) if ws.session() == s2 => {}
            Ok(ws) => failures.push(format!("the session left connected at the kill expired {:?} after it: {}", killed.elapsed(), ws.welcome)),
            Err(r) => failures.push(format!("resume of {s2} refused: {} {}", r.status, r.body)),
        }
    });
    fail_with_logs(&cluster, "reconcile before traffic in cluster mode", &failures, &LOG_NEEDLES);
}

/// The close a client gets within `within`: its code and reason (`None`: the stream ended
/// without a Close frame, or nothing came).
async fn close_within(ws: &mut WsClient, within: Duration) -> Option<(Option<u16>, String)> {
    let deadline = Instant::now() + within;
    loop {
        match ws.read_incoming(deadline.saturating_duration_since(Instant::now())).await {
            Incoming::Json(_) => continue,
            Incoming::Close(code, reason) => return Some((code, reason)),
            Incoming::Ended(_) | Incoming::Timeout => return None,
        }
    }
}

/// The user is the unit of migration (issue 48, seed `000`): user u has three tabs (three
/// sessions) on a; the client of one of them cannot reach a and reconnects through b with
/// `avoid=a`, a move charged to u's budget. Within 3 s u's two other tabs on a are closed
/// with 4421 naming b's URL, and reconnecting there they keep their sessions, now b's (no
/// move and no charge: none is refused). u's budget holds that one move: another move of
/// u is refused (429 `migration_budget`), while v, whose session is on a too, still
/// moves. Before, u's other tabs stayed on a, where their records no longer pointed.
/// (Moves of a cluster's first 10 s are forced, not charged: the test waits them out.)
#[test]
fn when_a_session_moves_the_users_other_connections_follow_it_charged_once() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &[]);
    let cluster_ready = Instant::now();
    let rt = runtime();
    let mut failures = Vec::new();
    rt.block_on(async {
        let (a, b) = (cluster.addr(0), cluster.addr(1));
        // (Avoiding a node that just started is believed without charge: it was restarting.)
        common::let_time_pass_until(cluster_ready + Duration::from_millis(RESTART_GRACE_MS + 500), "the nodes outlive the restart grace");
        let mut tabs = Vec::new();
        for _ in 0..3 {
            tabs.push(WsClient::connect(a, &cluster.http(0).mint_token("u", "web"), None).await);
        }
        let sessions: Vec<String> = tabs.iter().map(|t| t.session().to_string()).collect();
        let v = WsClient::connect(a, &cluster.http(0).mint_token("v", "web"), None).await;
        let v_session = v.session().to_string();
        // The first tab's client lost a (its socket there is gone with it).
        drop(tabs.remove(0));
        let moved = match connect_avoiding(b, &cluster.http(1).mint_token("u", "web"), &sessions[0], "a").await {
            Ok(ws) => ws,
            Err(r) => panic!("the move to b was refused: {} {}", r.status, r.body),
        };
        let moved_at = Instant::now();
        assert_eq!((moved.session(), moved.welcome["node"].as_str()), (sessions[0].as_str(), Some("b")), "{}", moved.welcome);
        let b_url = format!("http://{b}");
        for (tab, session) in tabs.iter_mut().zip(&sessions[1..]) {
            match close_within(tab, Duration::from_secs(3)).await {
                Some((Some(4421), reason)) if reason == b_url => {}
                other => failures.push(format!("u's tab of {session} on a: {other:?} within 3 s of the move, expected 4421 {b_url}")),
            }
        }
        let followed_after = moved_at.elapsed();
        // Where the close sends them: their sessions, on b, without a charge.
        for session in &sessions[1..] {
            match WsClient::try_connect(b, Some(&cluster.http(1).mint_token("u", "web")), Some(session)).await {
                Ok(ws) if ws.session() == session && ws.welcome["node"] == "b" => {}
                Ok(ws) => failures.push(format!("{session} reconnecting on b got {}", ws.welcome)),
                Err(r) => failures.push(format!("{session} reconnecting on b refused: {} {}", r.status, r.body)),
            }
        }
        // One move charged: u's next avoided move is refused; v's budget is its own.
        match connect_avoiding(a, &cluster.http(0).mint_token("u", "web"), &sessions[0], "b").await {
            Err(r) if r.status == 429 && error_code(&r.body) == "migration_budget" => {}
            Err(r) => failures.push(format!("u's second move: {} {}, expected 429 migration_budget", r.status, r.body)),
            Ok(ws) => failures.push(format!("u's second move within the window was made: {}", ws.welcome)),
        }
        drop(v);
        match connect_avoiding(b, &cluster.http(1).mint_token("v", "web"), &v_session, "a").await {
            Ok(ws) if ws.session() == v_session => {}
            Ok(ws) => failures.push(format!("v's move gave another session: {}", ws.welcome)),
            Err(r) => failures.push(format!("v's move refused: {} {}", r.status, r.body)),
        }
        let refusals = cluster.http(0).metric_total("livegate_migration_refusals_total") + cluster.http(1).metric_total("livegate_migration_refusals_total");
        if refusals != 1.0 {
            failures.push(format!("livegate_migration_refusals_total on a and b is {refusals}, expected u's second move only"));
        }
        eprintln!("u's other tabs followed within {followed_after:?}");
    });
    fail_with_logs(&cluster, "the user moves as one", &failures, &LOG_NEEDLES);
}
