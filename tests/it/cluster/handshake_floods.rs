//! Floods of handshakes that cost other users (issue 46, holes 4 and 5): a credential
//! looping on a given-back refusal while avoiding a slow peer must not delay other users'
//! welcomes, and a replayed spent credential must cost no NATS message.

use super::*;

use livegate::core::nodes::heartbeats::NodeInfo;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use common::link::{Condition, Link};

/// The user lock stripes of the directory (`USER_STRIPES`).
const STRIPES: u64 = 64;

/// The stripe a build with fixed hash keys puts `user` on (std's `DefaultHasher` with
/// its default keys, as the directory hashed before its keys were random). Victims
/// chosen on the attacker's stripe by it share a stripe with the attacker on such a
/// build; on a build with random keys only by chance, so every victim is checked.
fn fixed_key_stripe(user: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(user) % STRIPES
}

/// A fake peer `slow`, up in the nodes' view: it heartbeats as a node started an hour
/// ago, and its URL is node b's behind a link of 225 ms each way, so its `/readyz`
/// answers 450 ms late. Its heartbeats stop when it is dropped.
struct SlowPeer {
    link: Link,
    kv: KvSessions,
    stop: Arc<AtomicBool>,
}

impl SlowPeer {
    fn start(cluster: &Cluster, rt: &tokio::runtime::Runtime) -> SlowPeer {
        let link = Link::start();
        let url = format!("http://{}", link.proxy(cluster.addr(1)));
        link.set(Condition::Degraded { one_way: Duration::from_millis(225), loss: 0.0 });
        let (kv, peer) = rt.block_on(async {
            let peer = livegate::cluster::Cluster::connect(&cluster.nats.url(), "slow")
                .await
                .unwrap_or_else(|e| panic!("connect: {e:?}"));
            let kv = KvSessions::open(&peer).await.unwrap_or_else(|e| panic!("open kv: {e:?}"));
            (kv, peer)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let beating = stop.clone();
        let started = now_ms() - 3_600_000;
        let info = NodeInfo {
            connections: Some(0),
            ..NodeInfo::new("slow".into(), "default".into(), url, false, started)
        };
        rt.spawn(async move {
            while !beating.load(Ordering::Relaxed) {
                if let Err(e) = peer.heartbeat(&info).await {
                    eprintln!("slow's heartbeat: {e}");
                }
                pace_async(Duration::from_millis(250), "the fake peer's heartbeats").await;
            }
        });
        let heard = wait_until(Duration::from_secs(10), || {
            cluster.http(0).metric("livegate_cluster_peers_alive") == Some(2.0)
        });
        assert!(
            heard,
            "a does not count slow alive: {:?}",
            cluster.http(0).metric("livegate_cluster_peers_alive")
        );
        SlowPeer { link, kv, stop }
    }

    /// `session` of `user`, recorded as owned by `slow`.
    fn owns(&self, rt: &tokio::runtime::Runtime, user: &str, session: &str) {
        let record = SessionRecord {
            session: session.into(),
            user: user.into(),
            owner: "slow".into(),
            version: 0,
            updated_at_ms: now_ms(),
        };
        rt.block_on(self.kv.write_session(None, &record))
            .unwrap_or_else(|e| panic!("write {session}: {e:?}"));
    }
}

impl Drop for SlowPeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A peer `slow` whose `/readyz` answers 450 ms late ([`SlowPeer`]) owns 8 sessions of
/// `mallory`, whose migration budget is spent. Eight attacker loops connect to a with
/// `session=S&avoid=slow` (10 a second each, under the per-IP handshake limit): a move
/// to a would be charged, the spent budget refuses it (4029), and a session the route
/// sends to b is refused with 4421; either gives the token back, so it loops. Victims, among them users a fixed-key build puts on mallory's
/// stripe, each connect alone to a meanwhile: every welcome within 300 ms. (Before: a's
/// handshake probed `slow`'s `/readyz` under mallory's stripe, 450 ms per loop, and the
/// victims on that stripe waited seconds.)
#[test]
fn victims_on_a_stripe_get_their_welcome_while_a_looping_credential_avoids_a_slow_peer() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &["--handshakes-per-ip-per-sec", "1000"]);
    let a = cluster.addr(0);
    let rt = runtime();
    let slow = SlowPeer::start(&cluster, &rt);
    let attackers = 8;
    let mallory = "mallory";
    // mallory's sessions, owned by slow, and her budget spent.
    let sessions: Vec<String> = (0..attackers).map(|i| format!("mallory-session-{i}")).collect();
    for session in &sessions {
        slow.owns(&rt, mallory, session);
    }
    rt.block_on(slow.kv.set_last_migration(mallory, now_ms()))
        .unwrap_or_else(|e| panic!("spend mallory's budget: {e:?}"));

    // Victims: four a fixed-key build puts on mallory's stripe, and twenty others.
    let stripe = fixed_key_stripe(mallory);
    let mut victims: Vec<String> = (0..)
        .map(|i| format!("victim-{i}"))
        .filter(|u| fixed_key_stripe(u) == stripe)
        .take(4)
        .collect();
    victims.extend((0..20).map(|i| format!("bystander-{i}")));
    let welcome_within = |user: &str| -> Duration {
        let token = try_mint(a, user, "web").unwrap_or_else(|e| panic!("{e}"));
        let started = Instant::now();
        let ws = rt
            .block_on(WsClient::try_connect(a, Some(&token), None))
            .unwrap_or_else(|r| panic!("{user} refused: {} {}", r.status, r.body));
        let took = started.elapsed();
        rt.block_on(ws.close());
        took
    };
    let before: Vec<Duration> = (0..4).map(|i| welcome_within(&format!("before-{i}"))).collect();

    // The attack.
    let stop = Arc::new(AtomicBool::new(false));
    let loops = Arc::new(AtomicUsize::new(0));
    let mut failures = Vec::new();
    let attack: Vec<_> = sessions
        .iter()
        .map(|session| {
            let token = try_mint(a, mallory, "web").unwrap_or_else(|e| panic!("{e}"));
            let url = format!("{}&avoid=slow", ws_url(a, Some(&token), Some(session)));
            let (stop, loops) = (stop.clone(), loops.clone());
            rt.spawn(async move {
                let mut unexpected = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match WsClient::try_connect_url(&url).await {
                        // 4029 (a's route chose a), or 4421 to b (b's chose b): either
                        // gives the token back, and the loop goes on.
                        Err(r) if r.status == 429 || r.status == 421 => {}
                        Err(r) => unexpected.push(format!("{} {}", r.status, r.body)),
                        Ok(ws) => unexpected.push(format!(
                            "an avoided move with a spent budget was allowed: {}",
                            ws.welcome
                        )),
                    }
                    loops.fetch_add(1, Ordering::Relaxed);
                    pace_async(Duration::from_millis(100), "an attacker's handshake rate").await;
                }
                unexpected
            })
        })
        .collect();
    let attacking =
        wait_until(Duration::from_secs(10), || loops.load(Ordering::Relaxed) >= 2 * attackers);
    assert!(
        attacking,
        "the attackers made only {} handshakes in 10 s",
        loops.load(Ordering::Relaxed)
    );
    let attack_started = Instant::now();
    let loops_before = loops.load(Ordering::Relaxed);
    // One victim every 50 ms, so the victims meet the attackers' handshakes (about 80 a
    // second) rather than fall between two of their rounds.
    let during: Vec<(String, Duration)> = victims
        .iter()
        .map(|user| {
            let took = welcome_within(user);
            pace(Duration::from_millis(50), "victims spread over the attack");
            (user.clone(), took)
        })
        .collect();
    let (attack_loops, attack_time) =
        (loops.load(Ordering::Relaxed) - loops_before, attack_started.elapsed());
    if attack_loops < attackers {
        failures.push(format!("the attack made only {attack_loops} handshakes while the victims connected ({attack_time:?})"));
    }
    stop.store(true, Ordering::Relaxed);
    for attacker in attack {
        for e in rt.block_on(attacker).expect("attacker task") {
            if failures.len() < 10 {
                failures.push(format!("attacker: {e}"));
            }
        }
    }

    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let mut sorted: Vec<f64> = during.iter().map(|(_, d)| ms(d)).collect();
    sorted.sort_by(f64::total_cmp);
    eprintln!(
        "welcome before the attack: {:?} ms; during it ({attack_loops} attacker handshakes in {attack_time:?}): p50 {:.1} ms, max {:.1} ms; \
         victims on mallory's fixed-key stripe: {:?} ms",
        before.iter().map(|d| ms(d).round()).collect::<Vec<_>>(),
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
        during.iter().take(4).map(|(_, d)| ms(d).round()).collect::<Vec<_>>(),
    );
    for (user, took) in &during {
        if *took > Duration::from_millis(300) {
            failures.push(format!(
                "{user} waited {took:?} for its welcome during the attack (at most 300 ms)"
            ));
        }
    }
    drop(slow);
    fail_with_logs(&cluster, "victims_on_a_stripe", &failures, &LOG_NEEDLES);
}

/// Eight users whose sessions `slow` owns ([`SlowPeer`], `/readyz` 450 ms late), with
/// their budgets unspent, all connect through a at once with `avoid=slow` (following a
/// wrong-node refusal to b, as livegate.js does): each move is charged (slow says it is
/// ready) and made, and slow is asked once by each node for all of them (at most two
/// connections through its link). (Before: one probe per handshake, 8.)
#[test]
fn a_slow_peer_is_asked_once_for_all_the_handshakes_that_avoid_it_at_once() {
    let _gate = crate::common::gate!();
    let cluster = Cluster::start(2, &["--handshakes-per-ip-per-sec", "1000"]);
    let a = cluster.addr(0);
    let rt = runtime();
    let slow = SlowPeer::start(&cluster, &rt);
    let movers: Vec<(String, String, String)> = (0..8)
        .map(|i| {
            let (user, session) = (format!("mover-{i}"), format!("mover-session-{i}"));
            slow.owns(&rt, &user, &session);
            let token = try_mint(a, &user, "web").unwrap_or_else(|e| panic!("{e}"));
            (user, session, token)
        })
        .collect();
    let probes_before = slow.link.accepted();
    let started = Instant::now();
    let moved: Vec<Result<(String, Duration), String>> = rt.block_on(async {
        let tries = movers.iter().map(|(user, session, token)| async move {
            match connect_avoiding(a, token, session, "slow").await {
                Ok(ws) => {
                    let took = started.elapsed();
                    let got = ws.session().to_string();
                    ws.close().await;
                    if &got == session {
                        Ok((user.clone(), took))
                    } else {
                        Err(format!("{user} asked for {session} and got {got}"))
                    }
                }
                Err(r) => Err(format!("{user}'s avoided move refused: {} {}", r.status, r.body)),
            }
        });
        futures_util::future::join_all(tries).await
    });
    let probes = slow.link.accepted() - probes_before;
    let mut failures: Vec<String> =
        moved.iter().filter_map(|m| m.as_ref().err().cloned()).collect();
    let took: Vec<u128> =
        moved.iter().filter_map(|m| m.as_ref().ok()).map(|(_, d)| d.as_millis()).collect();
    eprintln!(
        "8 avoided moves at once: {probes} probe(s) of slow's /readyz; welcomes after {took:?} ms"
    );
    if probes > 2 {
        failures
            .push(format!("slow was probed {probes} times for 8 handshakes at once (at most 2)"));
    }
    let charged = cluster.http(0).metric_total("livegate_migrations_total")
        + cluster.http(1).metric_total("livegate_migrations_total");
    if charged < 8.0 {
        failures.push(format!(
            "livegate_migrations_total on a and b is {charged}, expected the 8 moves"
        ));
    }
    drop(slow);
    fail_with_logs(&cluster, "a_slow_peer_is_asked_once", &failures, &LOG_NEEDLES);
}

/// `in_msgs` of the NATS server's `/varz` on `monitor`: every message its clients sent.
fn nats_in_msgs(monitor: u16) -> f64 {
    let http = Http::new(SocketAddr::from(([127, 0, 0, 1], monitor)));
    let (status, varz) = http.request("GET", "/varz", Auth::None, Body::None);
    assert_eq!(status, 200, "/varz: {varz}");
    varz["in_msgs"].as_f64().unwrap_or_else(|| panic!("/varz without in_msgs: {varz}"))
}

/// A spent token and a spent resume credential, each replayed 100 times to both nodes
/// (the node that spent it and the other): at most 0.5 NATS messages per replay, counted
/// by the NATS server (`/varz` `in_msgs`, heartbeats included). (Before: the kick and
/// revocation reads and the nonce's create ran for every replay, 4 to 5 messages each.)
#[test]
fn a_replayed_spent_credential_costs_no_nats_message() {
    let _gate = crate::common::gate!();
    let (cluster, monitor) = Cluster::start_monitored(2, &["--handshakes-per-ip-per-sec", "1000"]);
    let rt = runtime();
    let (a, b) = (cluster.addr(0), cluster.addr(1));
    let token = try_mint(a, "replayer", "web").unwrap_or_else(|e| panic!("{e}"));
    let first = rt.block_on(WsClient::connect(a, &token, None));
    let spent_resume = first.welcome["resume"].as_str().expect("resume").to_string();
    let second = rt
        .block_on(WsClient::try_connect_url(&format!("ws://{a}/v1/ws?resume={spent_resume}")))
        .unwrap_or_else(|r| panic!("the resume credential, first use: {} {}", r.status, r.body));
    let replays = 100;
    let mut failures = Vec::new();
    let mut figures = Vec::new();
    let token_url = |addr: SocketAddr| ws_url(addr, Some(&token), None);
    let resume_url = |addr: SocketAddr| format!("ws://{addr}/v1/ws?resume={spent_resume}");
    let kinds: [(&str, &dyn Fn(SocketAddr) -> String, &str); 2] = [
        ("token", &token_url, "token_replayed"),
        ("resume credential", &resume_url, "resume_invalid"),
    ];
    for (kind, url_on, code) in kinds {
        let before = nats_in_msgs(monitor);
        for i in 0..replays {
            let addr = if i % 2 == 0 { a } else { b };
            match rt.block_on(WsClient::try_connect_url(&url_on(addr))) {
                Err(r) if (r.status, error_code(&r.body)) == (401, code) => {}
                Err(r) => failures.push(format!(
                    "spent {kind} replay {i} on {addr}: {} {}, expected 401 {code}",
                    r.status, r.body
                )),
                Ok(ws) => failures.push(format!(
                    "spent {kind} replay {i} on {addr} opened a connection: {}",
                    ws.welcome
                )),
            }
        }
        let per_replay = (nats_in_msgs(monitor) - before) / replays as f64;
        figures.push(format!("{kind}: {per_replay:.2} NATS messages per replay"));
        if per_replay > 0.5 {
            failures.push(format!(
                "a replayed spent {kind} cost {per_replay:.2} NATS messages (at most 0.5)"
            ));
        }
    }
    eprintln!("{}", figures.join("; "));
    rt.block_on(first.close());
    rt.block_on(second.close());
    fail_with_logs(&cluster, "a_replayed_spent_credential", &failures, &LOG_NEEDLES);
}
