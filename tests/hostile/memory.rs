//! Hostile clients: memory under user churn (issue 29, item 11). Nobody needs a bad
//! intent to grow a node: a stream of new users, each a new session that ends, is what a
//! public service sees all day. Against the real binary (`ServeProcess`): cycles of new
//! users, each minting a token over HTTP, connecting a WebSocket, subscribing and
//! leaving, with short session and token lifetimes; after each cycle the test waits
//! until the sweep has deleted every session, then reads the process's resident memory
//! (`/proc/<pid>/status`). The node must come back to what it held after the first cycle
//! (warm caches, arenas), not keep what each departed user left behind, and the tables
//! a user passes through (connections, leased and cached sessions, parked inboxes) must
//! be empty again.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt};

use crate::common::process::{metric, ServeProcess};
use crate::common::*;

const CYCLES: usize = 6;
const USERS_PER_CYCLE: usize = 2_000;
/// Users connecting at once.
const AT_ONCE: usize = 32;
/// Rooms the users subscribe to (a user's inbox is one more, its own).
const ROOMS: usize = 20;
/// Source addresses the users come from (127.0.1.1 and up).
const ADDRESSES: usize = 200;
/// How long a cycle's sessions may take to be swept after they closed (TTL 1 s, swept
/// every 250 ms).
const SWEPT_WITHIN: Duration = Duration::from_secs(15);
/// RSS after the last cycles may exceed RSS after the first by at most this: the first
/// cycle warms what is reused (allocator arenas, sled's cache, table capacity); each new
/// user afterwards must cost nothing that stays. 200 bytes per user (the growth issue 29
/// measured) would be 2 MiB over the last five cycles; RSS readings after a sweep vary by
/// about ±0.5 MiB from run to run, so the lower of the last two readings is compared.
const RSS_MARGIN_KIB: u64 = 1024;

/// One new user: a token over HTTP, a WebSocket from `from`, a subscribe, a polite close.
async fn one_user(server: std::net::SocketAddr, http: Http, user: String, room: String, from: IpAddr) {
    let token = tokio::task::spawn_blocking(move || {
        let (status, body) = http.mint_token_raw(serde_json::json!({"user": user, "device": "web", "ttl_secs": 2}));
        assert_eq!(status, 201, "mint for {user}: {body}");
        body["token"].as_str().expect("token").to_string()
    })
    .await
    .expect("mint");
    let mut ws = match WsClient::try_connect_custom(server, Some(&token), Some(from), &[]).await {
        Ok(ws) => ws,
        Err(refused) => panic!("handshake from {from} refused: {} {}", refused.status, refused.body),
    };
    ws.subscribe_ok(&room).await;
    ws.close().await;
}

fn address(i: usize) -> IpAddr {
    let n = i % ADDRESSES;
    IpAddr::V4(Ipv4Addr::new(127, 0, 1 + (n / 250) as u8, 1 + (n % 250) as u8))
}

/// Ignored: not yet true. Over six cycles RSS after a sweep rises by 40 to 500 bytes per
/// new user from run to run (see issue 29, item 11), while the tables checked here are
/// back to empty after every cycle; run it with `--ignored` to measure. With `CYCLES` at
/// 25 (50,000 users) it rose about 2.5 MiB over the first dozen cycles and then stayed
/// between 23.3 and 24.4 MiB (2026-12-03): a level, not a slope, which is what a test of
/// this should assert once the level is explained.
#[test]
#[ignore = "issue 29 item 11: RSS still creeps under churn (sled and allocator retention), run with --ignored"]
fn memory_returns_to_its_first_cycle_level_under_user_churn() {
    let root = tempfile::tempdir().expect("tempdir");
    let server = ServeProcess::start(
        &root.path().join("data"),
        &root.path().join("serve.log"),
        &[
            "--session-ttl-secs",
            "1",
            "--token-ttl-max-secs",
            "2",
            "--resume-ttl-secs",
            "1",
            "--handshakes-per-ip-per-sec",
            "0",
            "--room-idle-secs",
            "1",
        ],
    );
    let http = server.http();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let started = Instant::now();
    let mut rss = Vec::new();
    for cycle in 0..CYCLES {
        let users = (0..USERS_PER_CYCLE).map(|i| {
            let n = cycle * USERS_PER_CYCLE + i;
            one_user(server.addr, http.clone(), format!("churn-{n}"), format!("churn-room-{}", n % ROOMS), address(n))
        });
        rt.block_on(stream::iter(users).buffer_unordered(AT_ONCE).collect::<Vec<()>>());
        let expired = ((cycle + 1) * USERS_PER_CYCLE) as f64;
        let swept = wait_until(SWEPT_WITHIN, || {
            metric(&http, "livegate_sessions_expired_total").is_some_and(|n| n >= expired)
                && metric(&http, "livegate_sessions_stored") == Some(0.0)
        });
        assert!(swept, "cycle {cycle}: sessions not swept within {SWEPT_WITHIN:?}: stored {:?}", metric(&http, "livegate_sessions_stored"));
        // The in-memory tables a user passes through are back to empty.
        for table in ["livegate_connections_open", "livegate_sessions_live", "livegate_sessions_cached", "livegate_rooms_parked"] {
            assert_eq!(metric(&http, table), Some(0.0), "cycle {cycle}: {table}");
        }
        // The sweep trims the allocator right after it deleted; the purge of the cycle's
        // token nonces runs every 500 ms. Let both happen.
        std::thread::sleep(Duration::from_millis(600));
        rss.push(server.rss_kib());
        eprintln!("cycle {cycle}: RSS {} KiB after the sweep ({:.1} s)", rss[cycle], started.elapsed().as_secs_f64());
    }
    let (first, last) = (rss[0], rss[CYCLES - 2].min(rss[CYCLES - 1]));
    let per_user = (last as f64 - first as f64) * 1024.0 / ((CYCLES - 1) * USERS_PER_CYCLE) as f64;
    eprintln!("RSS after each cycle's sweep (KiB): {rss:?}; growth {per_user:.0} bytes per new user");
    assert!(
        last <= first + RSS_MARGIN_KIB,
        "RSS grew with the users: {first} KiB after the first cycle, {last} KiB after the last two ({per_user:.0} bytes per user); per cycle {rss:?}"
    );
    // Still serving a newcomer.
    rt.block_on(one_user(server.addr, http.clone(), "after-churn".into(), "churn-room-0".into(), address(0)));
}
