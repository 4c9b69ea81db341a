//! Placement by load (issue 48): nodes report their connections against their limit in
//! force in every heartbeat; a node over the high-water mark (90 %) takes no new session,
//! and new sessions arriving evenly (a round-robin balancer) fill the emptiest nodes, so
//! the nodes end level.

use super::*;

/// Each node's limit in force.
const CAPACITY: usize = 700;
/// Connections opened on a and b before the new sessions come: a is over the 90 % mark.
/// Each node is filled before the next starts (a node much fuller than another sends new
/// sessions on, so a full node cannot be filled while an empty one is up).
const PRELOAD: [usize; 3] = [640, 200, 0];
const NEW_SESSIONS: usize = 1000;

const FLAGS: [&str; 10] = [
    "--max-connections",
    "700",
    "--cluster-heartbeat-ms",
    "250",
    "--probe-up-after",
    "1",
    "--handshakes-per-ip-per-sec",
    "0",
    "--max-connections-per-ip",
    "0",
];

/// Connects a new session through `addr`, following wrong-node refusals as livegate.js
/// does (at most 3 in a row: two nodes whose views of a load differ by a heartbeat may
/// each send it on once); returns the client and the hops taken.
async fn connect_following_hops(addr: SocketAddr, token: &str) -> (WsClient, usize) {
    let mut to = addr;
    for hops in 0..=3 {
        match WsClient::try_connect(to, Some(token), None).await {
            Ok(client) => return (client, hops),
            Err(r) if r.status == 421 => {
                let url = r.body["error"]["url"]
                    .as_str()
                    .unwrap_or_else(|| panic!("421 without url: {}", r.body));
                to = url
                    .trim_start_matches("http://")
                    .trim_end_matches('/')
                    .parse()
                    .expect("node URL host:port");
            }
            Err(r) => panic!("handshake rejected: {} {}", r.status, r.body),
        }
    }
    panic!("still sent on after 3 hops");
}

/// `node`'s load as node `asked` shows it in `/v1/route` (with the API key).
fn load_seen(cluster: &Cluster, asked: usize, node: &str) -> Option<Value> {
    let (status, body) = cluster.http(asked).request(
        "GET",
        "/v1/route?user=probe&nodes=true",
        Auth::Key,
        Body::None,
    );
    (status == 200).then_some(())?;
    body["nodes"].as_array()?.iter().find(|n| n["node"] == node).cloned()
}

/// Three nodes of 700 with 640, 200 and 0 connections open (a over the mark); 1,000 new
/// sessions, each a new user, reach a, b, c in turn and follow a wrong-node refusal as
/// livegate.js does. a takes none; b and c take them until they are level (within the
/// 10-point slack and what a heartbeat period lets through), c more than b. `/v1/route`
/// shows each node's load, headroom and whether it is full.
#[test]
fn new_sessions_fill_the_emptiest_nodes_and_a_full_node_takes_none() {
    let _gate = crate::common::gate!();
    let mut cluster = Cluster::start(1, &FLAGS);
    let rt = runtime();
    let mut held: Vec<WsClient> = Vec::new();
    for (i, &count) in PRELOAD.iter().enumerate() {
        if i > 0 {
            cluster.add_node();
            cluster.wait_peers(Duration::from_secs(20));
        }
        for k in 0..count {
            let token = cluster.http(i).mint_token(&format!("pre-{}-{k}", Cluster::name(i)), "web");
            let client = rt.block_on(WsClient::connect(cluster.addr(i), &token, None));
            assert_eq!(
                client.welcome["node"],
                Cluster::name(i),
                "a preload client landed elsewhere: {}",
                client.welcome
            );
            held.push(client);
        }
    }
    // Every node hears every load, and sees c full.
    let heard = wait_until_every(Duration::from_secs(10), Duration::from_millis(50), || {
        (0..3).all(|asked| {
            (0..3).all(|i| {
                load_seen(&cluster, asked, Cluster::name(i)).is_some_and(|n| {
                    n["connections"] == PRELOAD[i] as u64
                        && n["capacity"] == CAPACITY as u64
                        && n["full"] == (i == 0)
                })
            })
        })
    });
    assert!(heard, "loads not heard everywhere: {:?}", load_seen(&cluster, 2, "a"));
    let seen_a = load_seen(&cluster, 2, "a").unwrap();
    assert_eq!(seen_a["headroom"], (CAPACITY - PRELOAD[0]) as u64, "a as c sees it: {seen_a}");

    let mut landed: BTreeMap<String, usize> = BTreeMap::new();
    let mut redirected = 0;
    let mut most_hops = 0;
    for k in 0..NEW_SESSIONS {
        let reached = k % 3;
        let token = cluster.http(reached).mint_token(&format!("new-{k}"), "web");
        let (client, hops) = rt.block_on(connect_following_hops(cluster.addr(reached), &token));
        redirected += usize::from(hops > 0);
        most_hops = most_hops.max(hops);
        *landed.entry(client.welcome["node"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        held.push(client);
    }
    let got = |node: &str| landed.get(node).copied().unwrap_or(0);
    let total_headroom: usize = PRELOAD.iter().map(|p| CAPACITY - p).sum();
    let proportional: Vec<String> = PRELOAD
        .iter()
        .map(|p| {
            format!("{:.0}", (CAPACITY - p) as f64 / total_headroom as f64 * NEW_SESSIONS as f64)
        })
        .collect();
    eprintln!(
        "FIGURE placement: {NEW_SESSIONS} new sessions over a, b, c (capacity {CAPACITY} each, {PRELOAD:?} open before, mark 90 %): \
         landed a {} b {} c {} ({redirected} sent on by a wrong-node refusal, at most {most_hops} hops); in proportion to headroom would be {proportional:?}; \
         open at the end a {} b {} c {}",
        got("a"),
        got("b"),
        got("c"),
        PRELOAD[0] + got("a"),
        PRELOAD[1] + got("b"),
        PRELOAD[2] + got("c"),
    );
    assert_eq!(got("a"), 0, "the node over the mark took new sessions: {landed:?}");
    assert!(got("c") > got("b"), "the emptier node took fewer: {landed:?}");
    let (b_end, c_end) = ((PRELOAD[1] + got("b")) as i64, (PRELOAD[2] + got("c")) as i64);
    assert!((b_end - c_end).abs() <= 140, "b and c did not end level (within the slack and a heartbeat's worth): b {b_end}, c {c_end}");
    for client in held {
        rt.block_on(client.close());
    }
}
