//! Hostile clients: memory under user churn (issue 29, item 11). Nobody needs a bad
//! intent to grow a node: a stream of new users, each a new session that ends, is what a
//! public service sees all day. Against the real binary (`ServeProcess`): cycles of new
//! users, each minting a token over HTTP, connecting a WebSocket, subscribing and
//! leaving, with short session and token lifetimes; after each cycle the test waits
//! until the sweep has deleted every session, then reads the process's resident memory
//! (`/proc/<pid>/status`). After a few cycles of warm-up (caches, arenas) the node must
//! stay at that level, not keep what each departed user left behind, and the tables
//! a user passes through (connections, leased and cached sessions, parked inboxes) must
//! be empty again.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt};

use crate::common::process::{metric, ServeProcess};
use crate::common::*;

/// Cycles of churn, and the cycles after which the node has warmed up: measured, RSS
/// after a sweep rises by 1 to 2.5 MiB over the first three or four cycles (allocator
/// arenas filling, sled's node cache, table capacity) and then moves as a level.
const CYCLES: usize = 16;
/// A longer run for a drift that twelve cycles cannot show:
/// `LIVEGATE_CHURN_CYCLES=100 cargo test --release --test it hostile::memory::`.
const CYCLES_VAR: &str = "LIVEGATE_CHURN_CYCLES";
const WARM_UP: usize = 4;
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
/// The most RSS may grow per user after the warm-up: the least-squares slope of the
/// readings after cycles 4 to 15 (24,000 users). Readings after a sweep jump by ±0.7 MiB
/// from cycle to cycle, so two readings say little and the fit over twelve says more.
/// Measured slopes (bytes per user): this build 20 to 77 in this test (four runs); over any
/// twelve cycles of longer runs 50 to 71 (20 cycles) and 19 to 43 (24 cycles), 0 to 33 with
/// `MALLOC_ARENA_MAX=2`; the build before issue 29 (b617901) 15 to 35; this build with a
/// scratch leak of 200 bytes per connection 187 and 288 (the first leaked chunks fill holes
/// the allocator already held). The drift of short runs stops: 100 cycles (200,000 users,
/// 2026-12-03, commit 758f8de) stayed between 23.4 and 25.8 MiB after the warm-up, with a
/// slope of 3 bytes per user over cycles 4 to 99 (-0.5 over 4 to 51, -2.8 over 52 to 99)
/// while cycles 4 to 15 of the same run alone gave 55.
const MAX_BYTES_PER_USER: f64 = 120.0;

/// One new user: a token over HTTP, a WebSocket from `from`, a subscribe, a polite close.
async fn one_user(
    server: std::net::SocketAddr,
    http: Http,
    user: String,
    room: String,
    from: IpAddr,
) {
    let token = tokio::task::spawn_blocking(move || {
        let (status, body) =
            http.mint_token_raw(serde_json::json!({"user": user, "device": "web", "ttl_secs": 2}));
        assert_eq!(status, 201, "mint for {user}: {body}");
        body["token"].as_str().expect("token").to_string()
    })
    .await
    .expect("mint");
    let mut ws = match WsClient::try_connect_custom(server, Some(&token), Some(from), &[]).await {
        Ok(ws) => ws,
        Err(refused) => {
            panic!("handshake from {from} refused: {} {}", refused.status, refused.body)
        }
    };
    ws.subscribe_ok(&room).await;
    ws.close().await;
}

fn address(i: usize) -> IpAddr {
    let n = i % ADDRESSES;
    IpAddr::V4(Ipv4Addr::new(127, 0, 1 + (n / 250) as u8, 1 + (n % 250) as u8))
}

/// RSS after a sweep is a level, not a slope: after a warm-up of 8,000 users (4 cycles),
/// the next 24,000 add at most 120 bytes each (a fit over the readings). What the node
/// holds after the warm-up is not the users': a heap profile (heaptrack) after 40,000 users
/// shows 3.6 MiB live besides sled's fixed reservations, none of it by user. Of RSS (about
/// 23 MiB) 11 MiB are the binary's file pages, flat from the first cycle; the other 12–14
/// MiB are anonymous, mostly glibc's arenas: what `malloc_trim` after each sweep cannot
/// give back is pages partly in use (fragmentation). Figures (2026-12-03, RSS after each
/// sweep, 2,000 users a cycle, 21.9–22.8 MiB after the first): this test, four runs: 77,
/// 20, 29 and 67 bytes per user, 42 to 48 s each. 24 cycles: 23.1 MiB after cycle 3,
/// 24.4–25.2 over the last four, a fit of 19 to 43 bytes per user over any twelve cycles (a
/// slow drift; an earlier run of 25 cycles levelled off at 23.3–24.4 MiB). With
/// `MALLOC_ARENA_MAX=2` the same run ends 1.5 MiB lower (22.7–23.9) and drifts 0.9 MiB; a
/// smaller sled cache (`--store-cache-mb 8`) changes nothing (the store holds little). The
/// build before issue 29 (b617901), churned side by side with this one over 20 cycles:
/// 21.6–23.1 MiB, 0.90–0.94 of this one.
#[test]
fn memory_is_a_level_not_a_slope_under_user_churn() {
    let _gate = crate::common::gate!();
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let mut rss = Vec::new();
    let cycles = std::env::var(CYCLES_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > WARM_UP + 2)
        .unwrap_or(CYCLES);
    for cycle in 0..cycles {
        let users = (0..USERS_PER_CYCLE).map(|i| {
            let n = cycle * USERS_PER_CYCLE + i;
            one_user(
                server.addr,
                http.clone(),
                format!("churn-{n}"),
                format!("churn-room-{}", n % ROOMS),
                address(n),
            )
        });
        rt.block_on(stream::iter(users).buffer_unordered(AT_ONCE).collect::<Vec<()>>());
        let expired = ((cycle + 1) * USERS_PER_CYCLE) as f64;
        let swept = wait_until(SWEPT_WITHIN, || {
            metric(&http, "livegate_sessions_expired_total").is_some_and(|n| n >= expired)
                && metric(&http, "livegate_sessions_stored") == Some(0.0)
        });
        assert!(
            swept,
            "cycle {cycle}: sessions not swept within {SWEPT_WITHIN:?}: stored {:?}",
            metric(&http, "livegate_sessions_stored")
        );
        // The in-memory tables a user passes through are back to empty.
        for table in [
            "livegate_connections_open",
            "livegate_sessions_live",
            "livegate_sessions_cached",
            "livegate_rooms_parked",
        ] {
            assert_eq!(metric(&http, table), Some(0.0), "cycle {cycle}: {table}");
        }
        // The sweep trims the allocator right after it deleted; the purge of the cycle's
        // token nonces runs every 500 ms. Let both happen.
        let_time_pass(
            Duration::from_millis(600),
            "the allocator trim after the sweep and the 500 ms nonce purge",
        );
        rss.push(server.rss_kib());
        eprintln!(
            "cycle {cycle}: RSS {} KiB after the sweep ({:.1} s)",
            rss[cycle],
            started.elapsed().as_secs_f64()
        );
    }
    // Least-squares slope of RSS over the cycles after the warm-up, in bytes per user.
    let after = &rss[WARM_UP..];
    let n = after.len() as f64;
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = after.iter().sum::<u64>() as f64 / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, &y) in after.iter().enumerate() {
        sxy += (x as f64 - mean_x) * (y as f64 - mean_y);
        sxx += (x as f64 - mean_x).powi(2);
    }
    let per_user = sxy / sxx * 1024.0 / USERS_PER_CYCLE as f64;
    eprintln!(
        "RSS after each cycle's sweep (KiB): {rss:?}; after cycle {WARM_UP} on: {per_user:.0} bytes per user ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert!(
        per_user <= MAX_BYTES_PER_USER,
        "RSS grew with the users after the warm-up: {per_user:.0} bytes per user (at most {MAX_BYTES_PER_USER}) over cycles {WARM_UP} to {}; per cycle (KiB) {rss:?}",
        cycles - 1
    );
    // Still serving a newcomer.
    rt.block_on(one_user(
        server.addr,
        http.clone(),
        "after-churn".into(),
        "churn-room-0".into(),
        address(0),
    ));
}
