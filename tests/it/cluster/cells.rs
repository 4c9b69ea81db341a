//! Home cells (issue 47, step 1): three configured cells, one node in each, `--cells` on
//! every node. A user's home is the token's `cell` claim or a rendezvous hash over the
//! configured cells, never over the cells alive: when its cell's only node is killed the
//! route falls back to the first healthy cell by name and still names the same home, and
//! when that node is back the user's new sessions go home again (a handshake elsewhere is
//! sent there with 4421). A claim routes its user to the claimed cell (resume credentials
//! carry it); an unknown cell is refused.

use super::*;
use livegate::core::nodes::routing::rendezvous;

/// The configured cells, and node `i`'s cell (a: east, b: north, c: west).
const CELLS: [&str; 3] = ["east", "north", "west"];

/// Three nodes, node `i` in `CELLS[i]`, each told every cell; heartbeats every 250 ms,
/// so a killed node is down in under a second. The cells are set by `LIVEGATE_CELL` and
/// `LIVEGATE_CELLS`, which an earlier build ignores: run on it, the test shows what it
/// answers, not a refused flag.
fn three_cells() -> Cluster {
    let flags = ["--cluster-heartbeat-ms", "250", "--probe-up-after", "1"];
    Cluster::start_with_env(3, &flags, |i| {
        vec![
            ("LIVEGATE_CELL".to_string(), CELLS[i].to_string()),
            ("LIVEGATE_CELLS".to_string(), CELLS.join(",")),
        ]
    })
}

/// `GET /v1/route?<query>` on `http`: (node, cell, home), a field missing as "(none)", or
/// what came instead.
fn route_answer(http: &Http, query: &str) -> Result<(String, String, String), String> {
    match http.try_request("GET", &format!("/v1/route?{query}"), Auth::Key, Body::None) {
        Ok((200, body)) => {
            let field = |name: &str| body[name].as_str().unwrap_or("(none)").to_string();
            Ok((field("node"), field("cell"), field("home")))
        }
        Ok((status, body)) => Err(format!("{status} {body}")),
        Err(e) => Err(e),
    }
}

fn answer(node: &str, cell: &str, home: &str) -> Result<(String, String, String), String> {
    Ok((node.to_string(), cell.to_string(), home.to_string()))
}

/// The first user `pick` accepts among `prefix0`, `prefix1`, ...
fn user_where(prefix: &str, pick: impl Fn(&str) -> bool) -> String {
    (0..10_000).map(|i| format!("{prefix}{i}")).find(|u| pick(u)).expect("a user among 10,000")
}

#[test]
fn a_users_home_cell_is_configuration_and_its_loss_falls_back_to_the_first_healthy_cell_by_name() {
    let _gate = crate::common::gate!();
    let mut cluster = three_cells();
    let mut failures = Vec::new();
    // Homed in west by the configured cells; over the cells alive without west, the hash
    // would say north (what routing over the alive cells answered): the fallback must be
    // east, the first healthy cell by name.
    let user = user_where("cells-u", |u| {
        rendezvous(u, CELLS) == Some("west") && rendezvous(u, ["east", "north"]) == Some("north")
    });
    let query = format!("user={user}");
    let everywhere =
        |cluster: &Cluster, nodes: &[usize], want: &Result<(String, String, String), String>| {
            nodes.iter().all(|&i| route_answer(&cluster.http(i), &query) == *want)
        };
    let home = answer("c", "west", "west");
    if !wait_until(Duration::from_secs(10), || everywhere(&cluster, &[0, 1, 2], &home)) {
        let seen: Vec<_> = (0..3).map(|i| route_answer(&cluster.http(i), &query)).collect();
        failures
            .push(format!("before: {user} should route to c in west on every node, got {seen:?}"));
    }
    cluster.take_node(2).kill9();
    let killed = Instant::now();
    let fallback = answer("a", "east", "west");
    let mut rehomed = Vec::new();
    let fell_back = wait_until(Duration::from_secs(10), || {
        let seen: Vec<_> = [0, 1].iter().map(|&i| route_answer(&cluster.http(i), &query)).collect();
        let to_north = seen.iter().filter(|a| a.as_ref().is_ok_and(|(node, ..)| node == "b"));
        rehomed
            .extend(to_north.map(|a| format!("{a:?}")).take(3usize.saturating_sub(rehomed.len())));
        seen.iter().all(|a| *a == fallback)
    });
    if !fell_back {
        let seen: Vec<_> = [0, 1].iter().map(|&i| route_answer(&cluster.http(i), &query)).collect();
        failures.push(format!("west killed: {user} should route to a in east (home still west) on a and b, got {seen:?}"));
    } else {
        eprintln!("west's node killed: {user} routed to east {:?} later", killed.elapsed());
    }
    if !rehomed.is_empty() {
        failures.push(format!("west killed: {user} was routed to north, a cell chosen by hash over the alive ones: {rehomed:?}"));
    }
    // A handshake in east is served there meanwhile.
    let rt = runtime();
    let token = cluster.http(0).mint_token(&user, "web");
    match rt.block_on(WsClient::try_connect(cluster.addr(0), Some(&token), None)) {
        Ok(ws) => rt.block_on(ws.close()),
        Err(r) => failures.push(format!(
            "west killed: a handshake of {user} on a: {} {}, expected a welcome",
            r.status, r.body
        )),
    }
    // The fallback holds while west is down: the same answer over 20 questions.
    for i in 0..20 {
        let got = route_answer(&cluster.http(i % 2), &query);
        if got != fallback {
            failures.push(format!("question {i} while west is down: {got:?}"));
            break;
        }
    }
    cluster.start_node(2);
    cluster.wait_peers(common::nats::PEERS_LIMIT);
    if !wait_until(Duration::from_secs(10), || everywhere(&cluster, &[0, 1, 2], &home)) {
        let seen: Vec<_> = (0..3).map(|i| route_answer(&cluster.http(i), &query)).collect();
        failures
            .push(format!("west back: {user}'s new sessions should go home to c, got {seen:?}"));
    }
    let token = cluster.http(0).mint_token(&user, "web");
    match rt.block_on(WsClient::try_connect(cluster.addr(0), Some(&token), None)) {
        Err(r) if r.status == 421 && r.body["error"]["node"] == "c" => {}
        Err(r) => failures.push(format!(
            "west back: a handshake of {user} on a: {} {}, expected 421 naming c",
            r.status, r.body
        )),
        Ok(ws) => failures.push(format!(
            "west back: a handshake of {user} on a was served there: {}",
            ws.welcome
        )),
    }
    fail_with_logs(&cluster, "home cells", &failures, &LOG_NEEDLES);
}

#[test]
fn a_tokens_cell_claim_routes_its_user_there_and_an_unknown_cell_is_refused() {
    let _gate = crate::common::gate!();
    let cluster = three_cells();
    let rt = runtime();
    let mut failures = Vec::new();
    // Homed in west by hash; the backend claims north.
    let user = user_where("claim-u", |u| rendezvous(u, CELLS) == Some("west"));
    let http = cluster.http(0);
    let by_hash = answer("c", "west", "west");
    let claimed = answer("b", "north", "north");
    let ok = wait_until(Duration::from_secs(10), || {
        route_answer(&http, &format!("user={user}")) == by_hash
            && route_answer(&http, &format!("user={user}&cell=north")) == claimed
    });
    if !ok {
        failures.push(format!(
            "/v1/route for {user}: without a claim {:?} (want {by_hash:?}), with cell=north {:?} (want {claimed:?})",
            route_answer(&http, &format!("user={user}")),
            route_answer(&http, &format!("user={user}&cell=north"))
        ));
    }
    // Unknown cells: refused, with the code.
    let (status, body) = http.request(
        "POST",
        "/v1/tokens",
        Auth::Key,
        Body::Json(json!({"user": user, "cell": "mars"})),
    );
    if (status, error_code(&body)) != (400, "unknown_cell") {
        failures.push(format!(
            "POST /v1/tokens with cell mars: {status} {body}, expected 400 unknown_cell"
        ));
    }
    match route_answer(&http, &format!("user={user}&cell=mars")) {
        Err(e) if e.starts_with("400 ") && e.contains("unknown_cell") => {}
        other => {
            failures.push(format!("/v1/route with cell=mars: {other:?}, expected 400 unknown_cell"))
        }
    }
    // A token claiming north: a handshake on a (east) is sent to b (north) without
    // spending the token, which then opens the session on b. Its resume credential
    // carries the claim: resumed on c by a client that cannot reach b, it is sent to the
    // first healthy cell by name (east, a), not to west (c), the home the hash would give.
    let (status, body) = http.request(
        "POST",
        "/v1/tokens",
        Auth::Key,
        Body::Json(json!({"user": user, "cell": "north"})),
    );
    let token = body["token"].as_str().map(str::to_string);
    match (status, token) {
        (201, Some(token)) => {
            match rt.block_on(WsClient::try_connect(cluster.addr(0), Some(&token), None)) {
                Err(r) if r.status == 421 && r.body["error"]["node"] == "b" => {}
                Err(r) => failures.push(format!(
                    "claimed token on a: {} {}, expected 421 naming b (north)",
                    r.status, r.body
                )),
                Ok(ws) => {
                    failures.push(format!("claimed token on a was served in east: {}", ws.welcome))
                }
            }
            match rt.block_on(WsClient::try_connect(cluster.addr(1), Some(&token), None)) {
                Ok(ws) => {
                    let resume = ws.welcome["resume"].as_str().unwrap_or_default().to_string();
                    rt.block_on(ws.close());
                    let url = format!("ws://{}/v1/ws?resume={resume}&avoid=b", cluster.addr(2));
                    match rt.block_on(WsClient::try_connect_url(&url)) {
                        Err(r) if r.status == 421 && r.body["error"]["node"] == "a" => {}
                        Err(r) => failures.push(format!(
                            "resume on c avoiding b: {} {}, expected 421 naming a (east)",
                            r.status, r.body
                        )),
                        Ok(ws) => failures.push(format!(
                            "resume on c avoiding b was served in west: {}",
                            ws.welcome
                        )),
                    }
                }
                Err(r) => failures.push(format!(
                    "claimed token on b, after the 421 gave it back: {} {}",
                    r.status, r.body
                )),
            }
        }
        (status, _) => failures.push(format!("POST /v1/tokens with cell north: {status} {body}")),
    }
    fail_with_logs(&cluster, "cell claims", &failures, &LOG_NEEDLES);
}

/// nats-server's configuration for a cell whose store holds at most `max_file_store`.
fn small_store_config(dir: &std::path::Path, max_file_store: &str) -> std::path::PathBuf {
    let path = dir.join("small-store.conf");
    std::fs::write(&path, format!("jetstream {{\n  max_file_store: {max_file_store}\n}}\n"))
        .expect("write the NATS config");
    path
}

/// Fills the JetStream store of the server at `url` with a stream of the test's own until
/// a write is refused; returns how many 64 KiB messages it took.
pub(super) async fn fill_store(url: &str) -> usize {
    let client = async_nats::connect(url).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "FILL".into(),
        subjects: vec!["fill.>".into()],
        ..Default::default()
    })
    .await
    .expect("the filler stream");
    let payload = vec![b'x'; 64 * 1024];
    for i in 0..1000 {
        let acked = match js.publish(format!("fill.{i}"), payload.clone().into()).await {
            Ok(ack) => ack.await.is_ok(),
            Err(_) => false,
        };
        if !acked {
            return i;
        }
    }
    panic!("the store took 1000 messages of 64 KiB: not full");
}

pub(super) async fn drop_filler(url: &str) {
    let client = async_nats::connect(url).await.expect("connect to NATS");
    async_nats::jetstream::new(client)
        .delete_stream("FILL")
        .await
        .expect("delete the filler stream");
}

/// `livegate ARGS` as an operator runs it (the test's own `LIVEGATE_*` variables, no
/// configuration keys of the command's, removed; quiet logs): (exit status 0, stdout,
/// stderr). Bounded: killed after 30 s.
pub(crate) fn livegate_cli(args: &[&str]) -> (bool, String, String) {
    use std::io::Read;
    let mut cmd = std::process::Command::new(common::livegate_bin());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("LIVEGATE_") {
            cmd.env_remove(name);
        }
    }
    cmd.args(args).env("RUST_LOG", "warn").stdin(std::process::Stdio::null());
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("run livegate");
    let status = wait_for_every(Duration::from_secs(30), Duration::from_millis(20), || {
        child.try_wait().expect("try_wait")
    });
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("livegate {args:?} did not exit within 30 s");
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read stdout");
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
    (status.success(), out, err)
}

/// `livegate cells --url URL --api-key KEY` against node `i` ([`livegate_cli`]).
fn livegate_cells(cluster: &Cluster, i: usize) -> (bool, String, String) {
    let url = format!("http://{}", cluster.addr(i));
    livegate_cli(&["cells", "--url", &url, "--api-key", common::API_KEY])
}

/// The block `livegate cells` printed for `cell`: its header line and the indented lines
/// under it.
fn cell_block(out: &str, cell: &str) -> String {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(&format!("{cell}  ")));
    let header = lines.next().unwrap_or_default();
    std::iter::once(header)
        .chain(lines.take_while(|l| l.starts_with(' ')))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The seed's incident, staged on the one NATS the test has: the processes are up, the
/// ports answer, heartbeats flow, but JetStream cannot write (its store is full). Each
/// node's probe (a KV put and read of its own key) fails, so each cell's breaker opens
/// within a few probes and the route answers "no healthy cell" instead of sending users
/// to a cell that cannot serve them; once the store has room again, the breakers close
/// only after the cool-down and three passes, and the route sends users home again.
/// Both cells share the NATS here, so both open: one NATS per cell (users moving to the
/// live cell) is the next step. The drill's view: `livegate cells` run against a node
/// shows west's breaker open with its failed rounds (and b, the node that failed them),
/// then closed after the trial, and `GET /v1/admin/cells` answers as openapi.json says.
#[test]
fn a_cell_whose_store_cannot_write_opens_its_breaker_and_closes_after_the_cool_down() {
    let _gate = crate::common::gate!();
    let cells = ["east", "west"];
    let flags = ["--cluster-heartbeat-ms", "250", "--probe-up-after", "1"];
    let cluster = Cluster::start_with_nats_and_env(
        2,
        &flags,
        |dir| {
            let config = small_store_config(dir, "8MB");
            NatsServer::start_with_config(dir, &config, &[])
        },
        |i| {
            vec![
                ("LIVEGATE_CELL".to_string(), cells[i].to_string()),
                ("LIVEGATE_CELLS".to_string(), cells.join(",")),
            ]
        },
    );
    let rt = runtime();
    let http = cluster.http(0);
    let state =
        |cell: &str| http.metric(&format!("livegate_cell_breaker_state{{cell=\"{cell}\"}}"));
    let user = user_where("breaker-u", |u| rendezvous(u, cells) == Some("west"));
    let query = format!("user={user}");
    let closed_both = wait_until_every(Duration::from_secs(10), Duration::from_millis(50), || {
        cells.iter().all(|c| state(c) == Some(0.0))
            && route_answer(&http, &query) == answer("b", "west", "west")
    });
    assert!(
        closed_both,
        "breakers closed and the user routed home: {:?} {:?} {:?}",
        state("east"),
        state("west"),
        route_answer(&http, &query)
    );

    let filled = rt.block_on(fill_store(&cluster.nats.url()));
    let full_at = Instant::now();
    let opened = wait_until_every(Duration::from_secs(10), Duration::from_millis(50), || {
        cells.iter().all(|c| state(c) == Some(2.0))
    });
    let to_open = full_at.elapsed();
    assert!(
        opened,
        "breakers still {:?} {:?} 10 s after the store filled ({filled} messages)",
        state("east"),
        state("west")
    );
    assert!(
        to_open < Duration::from_secs(5),
        "opened {to_open:?} after the store filled: more than 5 s"
    );
    // Its own code, naming the home cell (never an empty name), on the route and on a
    // handshake that would open a new session.
    let (status, body) = http.request("GET", &format!("/v1/route?{query}"), Auth::Key, Body::None);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        (status, error_code(&body)),
        (503, "no_healthy_cell"),
        "route while every breaker is open: {body}"
    );
    assert_eq!(message, "no healthy cell (the user's home cell is west)", "{body}");
    let token = http.mint_token(&user, "web");
    match rt.block_on(WsClient::try_connect(cluster.addr(0), Some(&token), None)) {
        Err(r) if r.status == 503 && error_code(&r.body) == "no_healthy_cell" => {}
        Err(r) => panic!(
            "a handshake while every breaker is open: {} {}, expected 503 no_healthy_cell",
            r.status, r.body
        ),
        Ok(ws) => panic!("a handshake while every breaker is open was served: {}", ws.welcome),
    }
    let transitions =
        http.metric(r#"livegate_cell_breaker_transitions_total{cell="west",to="open"}"#);
    assert_eq!(transitions, Some(1.0), "one transition to open counted");
    assert!(
        http.metric(r#"livegate_cell_probes_total{outcome="failed"}"#).unwrap_or(0.0) >= 3.0,
        "failed probes counted"
    );
    let (status, overview) = http.request("GET", "/v1/admin/overview", Auth::Key, Body::None);
    assert_eq!(status, 200, "{overview}");
    assert_eq!(
        overview["cells"],
        serde_json::json!([{"cell": "east", "breaker": "open"}, {"cell": "west", "breaker": "open"}]),
        "the admin overview's cells"
    );
    // The drill's view from a: west open, its last rounds failed by b, the transition.
    let (ok, out, err) = livegate_cells(&cluster, 0);
    assert!(ok, "livegate cells failed: {err}");
    assert!(out.starts_with("cells as node a (cell east) sees them:\n"), "{out}");
    let west = cell_block(&out, "west");
    assert!(west.starts_with("west  open for "), "west's block while the store is full:\n{out}");
    let probes = west.lines().find(|l| l.trim_start().starts_with("probes")).unwrap_or_default();
    assert!(
        probes.contains("✗✗✗") && probes.contains("nodes failed (b)"),
        "west's probe line shows the failed rounds and b:\n{out}"
    );
    assert!(west.contains("closed → open"), "west's transition:\n{out}");
    assert!(cell_block(&out, "east").starts_with("east  open for "), "east's block:\n{out}");
    eprintln!("livegate cells while the store is full:\n{out}");
    // The same, as JSON, is what openapi.json documents.
    let (status, cells_body) = http.request("GET", "/v1/admin/cells", Auth::Key, Body::None);
    assert_eq!(status, 200, "{cells_body}");
    let west_json = &cells_body["cells"][1];
    assert_eq!(
        (west_json["cell"].as_str(), west_json["breaker"].as_str()),
        (Some("west"), Some("open")),
        "{cells_body}"
    );
    assert!(
        west_json["probes"].as_array().is_some_and(|p| p.len() <= 20
            && p.iter()
                .rev()
                .take(3)
                .all(|r| r["passed"] == false && r["failed"] == serde_json::json!(["b"]))),
        "{cells_body}"
    );
    let (_, doc) = http.request("GET", "/openapi.json", Auth::None, Body::None);
    let documented = crate::openapi::answer(
        "GET",
        "/v1/admin/cells",
        (200, "application/json".into(), cells_body.to_string()),
    );
    let dir = tempfile::tempdir().expect("a scratch dir");
    let (valid, report) = crate::openapi::check_answers(&doc, &[documented], dir.path(), "cells");
    assert!(valid, "GET /v1/admin/cells does not match openapi.json:\n{report}");

    rt.block_on(drop_filler(&cluster.nats.url()));
    let freed_at = Instant::now();
    let closed = wait_until_every(Duration::from_secs(30), Duration::from_millis(50), || {
        cells.iter().all(|c| state(c) == Some(0.0))
    });
    let to_close = freed_at.elapsed();
    assert!(
        closed,
        "breakers still {:?} {:?} 30 s after the store was freed",
        state("east"),
        state("west")
    );
    // Never closed before the cool-down measured from the opening.
    assert!(
        full_at.elapsed() >= Duration::from_millis(livegate::core::nodes::breaker::COOL_DOWN_MS),
        "closed before the cool-down"
    );
    let home = wait_until_every(Duration::from_secs(5), Duration::from_millis(50), || {
        route_answer(&http, &query) == answer("b", "west", "west")
    });
    assert!(home, "the user is not routed home again: {:?}", route_answer(&http, &query));
    // The drill's view after the recovery, from a (whose breakers the test watched close;
    // b's may be a round behind): closed, after the trial, the last rounds passing.
    let (ok, out, err) = livegate_cells(&cluster, 0);
    assert!(ok, "livegate cells failed: {err}");
    let west = cell_block(&out, "west");
    assert!(west.starts_with("west  closed for "), "west's block once recovered:\n{out}");
    assert!(
        west.contains("open → half_open") && west.contains("half_open → closed"),
        "west's trial in its transitions:\n{out}"
    );
    let probes = west.lines().find(|l| l.trim_start().starts_with("probes")).unwrap_or_default();
    assert!(
        probes.contains("✓✓✓  ("),
        "west's probe line ends with the passes that closed it:\n{out}"
    );
    eprintln!("livegate cells after the recovery:\n{out}");
    // The refused handshake gave its token back: it opens the session at home now, once b
    // (whose rounds run on their own clock, and may be one behind a's) has closed its
    // breakers too.
    let http_b = cluster.http(1);
    let b_closed = wait_until_every(Duration::from_secs(5), Duration::from_millis(50), || {
        cells.iter().all(|c| {
            http_b.metric(&format!("livegate_cell_breaker_state{{cell=\"{c}\"}}")) == Some(0.0)
        })
    });
    assert!(b_closed, "b's breakers are not closed 5 s after a's");
    match rt.block_on(WsClient::try_connect(cluster.addr(1), Some(&token), None)) {
        Ok(ws) => rt.block_on(ws.close()),
        Err(r) => {
            panic!("the refused token on b once the breakers closed: {} {}", r.status, r.body)
        }
    }
    eprintln!("breaker: store full after {filled} messages; opened in {to_open:?}; closed {to_close:?} after the store was freed");
}
