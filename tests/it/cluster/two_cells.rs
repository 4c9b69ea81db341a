//! The two-cell harness (`common::cells`) proves itself: two cells come up, each with its
//! own NATS in its own JetStream domain, two nodes and a balancer; every node hears the
//! four nodes' heartbeats across the leaf; and each of the harness's failures does what
//! it says (a cut parts the cells' heartbeats until the heal, a killed cell is gone and
//! comes back on its ports and data, a filled store refuses writes in its cell only).
//! The failure tests of issue 47 build on these.

use super::*;
use async_nats::jetstream;
use common::cells::{binary_knows_cell_domains, Cells, CELLS_FORM_LIMIT, CELL_NAMES, CELL_NODES};
use common::nats::{port_open, CellNatsConfig};

/// Heartbeats every 250 ms: a node is down after 750 ms.
const FLAGS: [&str; 4] = ["--cluster-heartbeat-ms", "250", "--probe-up-after", "1"];
/// How long a node may take to count a peer down: three heartbeats, and margin.
const PEER_DOWN_LIMIT: Duration = Duration::from_secs(10);

/// The cells of the harness's own tests: with the cell-domain flags when the binary
/// knows them (so the harness runs on builds before and after them).
fn start(nats: impl Fn(usize) -> CellNatsConfig) -> Cells {
    Cells::start_with(&FLAGS, nats, binary_knows_cell_domains())
}

/// Every node name of the two cells, sorted.
fn all_node_names() -> Vec<String> {
    let mut names: Vec<String> = (0..CELL_NAMES.len() * CELL_NODES).map(Cells::name).collect();
    names.sort();
    names
}

/// The `livegate_cluster_peers_alive` of every running node, by name.
fn peers_alive(cells: &Cells) -> Vec<(String, Option<f64>)> {
    cells
        .running()
        .into_iter()
        .map(|i| (Cells::name(i), cells.http(i).metric("livegate_cluster_peers_alive")))
        .collect()
}

/// A JetStream write in the cell's own domain: a publish to a stream of the test's own
/// (`W`, on `w.<cell>.>`), acknowledged or not.
async fn write_in(cells: &Cells, cell: &str) -> Result<u64, String> {
    let client = async_nats::connect(cells.nats[Cells::cell_index(cell)].url())
        .await
        .map_err(|e| e.to_string())?;
    let js = jetstream::new(client);
    let config = jetstream::stream::Config {
        name: "W".into(),
        subjects: vec![format!("w.{cell}.>")],
        ..Default::default()
    };
    js.get_or_create_stream(config).await.map_err(|e| e.to_string())?;
    let ack = js.publish(format!("w.{cell}.x"), "w".into()).await.map_err(|e| e.to_string())?;
    ack.await.map(|a| a.sequence).map_err(|e| e.to_string())
}

#[test]
fn two_cells_come_up_and_every_node_hears_the_four_nodes_across_the_leaf() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let cells = start(|_| CellNatsConfig::default());
    eprintln!(
        "two cells up in {:?} (--cluster-cell-domains: {})",
        started.elapsed(),
        cells.cell_domains()
    );
    // Each cell's NATS is a JetStream domain of its own, and the leaf is up.
    for (c, cell) in CELL_NAMES.iter().enumerate() {
        let jsz = cells.nats[c].monitor("jsz").expect("/jsz");
        assert_eq!(jsz["config"]["domain"], *cell, "cell {cell}'s NATS: {jsz}");
    }
    assert!(cells.leaf_up(), "the leaf connection between the cells");
    // Every node answers, and knows all four nodes (its overview lists them).
    let want = all_node_names();
    for i in cells.running() {
        let (status, _) = cells.http(i).request("GET", "/healthz", Auth::None, Body::None);
        assert_eq!(status, 200, "/healthz of {}", Cells::name(i));
        let mut known = None;
        let all = wait_until(Duration::from_secs(10), || {
            known = cells.known_nodes(i);
            known.as_ref() == Some(&want)
        });
        assert!(all, "{} knows {known:?}, want {want:?}", Cells::name(i));
    }
    // Each cell's balancer reaches its nodes, in turn.
    for cell in CELL_NAMES {
        assert_eq!(cells.balancer(cell).backends().len(), CELL_NODES, "cell {cell}'s balancer");
        assert_eq!(cells.urls(cell).len(), CELL_NODES, "cell {cell}'s node URLs");
        for _ in 0..CELL_NODES {
            let (status, _) =
                cells.balanced(cell).request("GET", "/healthz", Auth::None, Body::None);
            assert_eq!(status, 200, "/healthz through cell {cell}'s balancer");
        }
    }
}

#[test]
fn the_cells_harness_cuts_heals_kills_restarts_and_fills_a_cell() {
    let _gate = crate::common::gate!();
    let small = CellNatsConfig { max_file_store: Some("8MB".into()), ..Default::default() };
    let mut cells = start(|_| small.clone());
    let rt = runtime();

    // A cut: heartbeats stop crossing, each node hears only its cell mate; the servers
    // close the leaf within seconds. The heal brings both back.
    cells.cut();
    let cut = Instant::now();
    let parted = wait_until_every(PEER_DOWN_LIMIT, Duration::from_millis(50), || {
        peers_alive(&cells).iter().all(|(_, p)| *p == Some(1.0))
    });
    assert!(
        parted,
        "peers alive {:?} after the cut, want 1 each (the cell mate)",
        peers_alive(&cells)
    );
    let heard_apart = cut.elapsed();
    cells.wait_leaf(false, Duration::from_secs(15));
    let leaf_closed = cut.elapsed();
    cells.heal();
    let healed = Instant::now();
    cells.wait_leaf(true, Duration::from_secs(15));
    cells.wait_formed(CELLS_FORM_LIMIT);
    eprintln!("cut: nodes apart after {heard_apart:?}, leaf closed after {leaf_closed:?}; heal: all four nodes again after {:?}", healed.elapsed());

    // kill -9 of cell a: its nodes and its NATS gone, b's nodes hear only each other;
    // restarted on the same ports, store and data dirs.
    cells.kill_cell("a");
    let killed = Instant::now();
    assert_eq!(cells.running(), Cells::nodes_of("b"), "nodes running after the kill of cell a");
    assert!(cells.balancer("a").backends().is_empty(), "cell a's balancer after the kill");
    assert!(!port_open(cells.nats[0].port), "cell a's NATS still accepts after the kill");
    let alone = wait_until_every(PEER_DOWN_LIMIT, Duration::from_millis(50), || {
        peers_alive(&cells).iter().all(|(_, p)| *p == Some(1.0))
    });
    assert!(
        alone,
        "b's peers alive {:?} after cell a was killed, want 1 each",
        peers_alive(&cells)
    );
    let b_alone = killed.elapsed();
    let (status, _) = cells.balanced("b").request("GET", "/healthz", Auth::None, Body::None);
    assert_eq!(status, 200, "cell b's balancer while a is dead");
    let restarting = Instant::now();
    cells.restart_cell("a");
    cells.wait_leaf(true, Duration::from_secs(15));
    cells.wait_formed(CELLS_FORM_LIMIT);
    eprintln!("kill of cell a: b's nodes alone after {b_alone:?}; restart of a: all four nodes again after {:?}", restarting.elapsed());
    assert_eq!(
        cells.balancer("a").backends().len(),
        CELL_NODES,
        "cell a's balancer after the restart"
    );

    // A full store in b: JetStream writes fail there, a's still work; freed, b's work.
    assert!(
        rt.block_on(write_in(&cells, "b")).is_ok(),
        "a write in b before the fill: {:?}",
        rt.block_on(write_in(&cells, "b"))
    );
    let filled = rt.block_on(cells.fill_store("b"));
    assert!(filled > 0, "the store of b took no message");
    let refused = rt.block_on(write_in(&cells, "b"));
    assert!(refused.is_err(), "a write in b with its store full: {refused:?}");
    assert!(port_open(cells.nats[1].port), "b's NATS port with its store full");
    let in_a = rt.block_on(write_in(&cells, "a"));
    assert!(in_a.is_ok(), "a write in a while b's store is full: {in_a:?}");
    rt.block_on(cells.free_store("b"));
    let again = rt.block_on(wait_for_every_async(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { write_in(&cells, "b").await.ok() },
    ));
    assert!(
        again.is_some(),
        "a write in b after its store was freed: {:?}",
        rt.block_on(write_in(&cells, "b"))
    );
    eprintln!("fill: b's store full after {filled} messages of 64 KiB; refused: {refused:?}");
}
