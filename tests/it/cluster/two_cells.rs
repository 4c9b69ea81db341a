//! The two-cell harness (`common::cells`) proves itself: two cells come up, each with its
//! own NATS in its own JetStream domain, two nodes and a balancer; every node hears the
//! four nodes' heartbeats across the leaf; and each of the harness's failures does what
//! it says (a cut parts the cells' heartbeats until the heal, a killed cell is gone and
//! comes back on its ports and data, a filled store refuses writes in its cell only).
//! The failure tests of issue 47 build on these.

use super::*;
use async_nats::jetstream;
use common::nats::port_open;
use common::cells::{Cells, CellsOptions, CELLS_HEARTBEAT_MS, CELLS_PEERS_LIMIT, CELL_NAMES, NODES_PER_CELL};

/// Every node name of the two cells, sorted.
fn all_node_names(cells: &Cells) -> Vec<String> {
    let mut names: Vec<String> = cells.cells.iter().flat_map(|c| (0..NODES_PER_CELL).map(move |i| c.node_name(i))).collect();
    names.sort();
    names
}

/// The `livegate_cluster_peers_alive` of every running node, by name.
fn peers_alive(cells: &Cells) -> Vec<(String, Option<f64>)> {
    cells.running().into_iter().map(|(c, i)| (cells.cells[c].node_name(i), cells.cells[c].http(i).metric("livegate_cluster_peers_alive"))).collect()
}

/// How long a node may take to count a peer down: three heartbeats, and margin.
fn peer_down_limit() -> Duration {
    Duration::from_millis(3 * CELLS_HEARTBEAT_MS) + Duration::from_secs(10)
}

/// A JetStream write in the cell's own domain: a publish to a stream of the test's own
/// (`W`, on `w.<cell>.>`), acknowledged or not.
async fn write_in(cells: &Cells, cell: &str) -> Result<u64, String> {
    let client = async_nats::connect(cells.cell(cell).nats.url()).await.map_err(|e| e.to_string())?;
    let js = jetstream::new(client);
    let config = jetstream::stream::Config { name: "W".into(), subjects: vec![format!("w.{cell}.>")], ..Default::default() };
    js.get_or_create_stream(config).await.map_err(|e| e.to_string())?;
    let ack = js.publish(format!("w.{cell}.x"), "w".into()).await.map_err(|e| e.to_string())?;
    ack.await.map(|a| a.sequence).map_err(|e| e.to_string())
}

#[test]
fn two_cells_come_up_and_every_node_hears_the_four_nodes_across_the_leaf() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let cells = Cells::start(CellsOptions::default());
    eprintln!("two cells up in {:?} (cell-domain keys passed: {})", started.elapsed(), cells.cell_domains());
    // Each cell's NATS is a JetStream domain of its own, and the leaf is up.
    for cell in &cells.cells {
        let jsz = cells.cell(cell.name).nats.monitor("jsz").expect("/jsz");
        assert_eq!(jsz["config"]["domain"], cell.name, "cell {}'s NATS: {jsz}", cell.name);
    }
    assert!(cells.leaf_up(), "the leaf connection between the cells");
    // Every node answers, and knows all four nodes (its overview lists them).
    let want = all_node_names(&cells);
    for (c, i) in cells.running() {
        let http = cells.cells[c].http(i);
        let (status, _) = http.request("GET", "/healthz", Auth::None, Body::None);
        assert_eq!(status, 200, "/healthz of {}", cells.cells[c].node_name(i));
        let mut known = None;
        let all = wait_until(Duration::from_secs(10), || {
            known = cells.known_nodes(c, i);
            known.as_ref() == Some(&want)
        });
        assert!(all, "{} knows {known:?}, want {want:?}", cells.cells[c].node_name(i));
    }
    // Each cell's balancer reaches its nodes.
    for cell in &cells.cells {
        assert_eq!(cell.balancer.backends().len(), NODES_PER_CELL, "cell {}'s balancer", cell.name);
        for _ in 0..NODES_PER_CELL {
            let (status, _) = cell.balanced().request("GET", "/healthz", Auth::None, Body::None);
            assert_eq!(status, 200, "/healthz through cell {}'s balancer", cell.name);
        }
    }
    assert_eq!(cells.cells.iter().map(|c| c.name).collect::<Vec<_>>(), CELL_NAMES);
}

#[test]
fn the_cells_harness_cuts_heals_kills_restarts_and_fills_a_cell() {
    let _gate = crate::common::gate!();
    let options = CellsOptions { max_file_store: Some("8MB".into()), ..Default::default() };
    let mut cells = Cells::start(options);
    let rt = runtime();

    // A cut: heartbeats stop crossing, each node hears only its cell mate; the servers
    // close the leaf within seconds. The heal brings both back.
    cells.cut();
    let cut = Instant::now();
    let parted = wait_until_every(peer_down_limit(), Duration::from_millis(50), || peers_alive(&cells).iter().all(|(_, p)| *p == Some(1.0)));
    assert!(parted, "peers alive {:?} after the cut, want 1 each (the cell mate)", peers_alive(&cells));
    let heard_apart = cut.elapsed();
    assert!(wait_until_every(Duration::from_secs(15), Duration::from_millis(20), || cells.leaf_down()), "the leaf still up 15 s into the cut");
    let leaf_closed = cut.elapsed();
    cells.heal();
    let healed = Instant::now();
    cells.wait_leaf_up(Duration::from_secs(15));
    cells.wait_peers(CELLS_PEERS_LIMIT);
    eprintln!("cut: nodes apart after {heard_apart:?}, leaf closed after {leaf_closed:?}; heal: all four nodes again after {:?}", healed.elapsed());

    // kill -9 of cell a: its nodes and its NATS gone, b's nodes hear only each other;
    // restarted on the same ports, store and data dirs.
    cells.kill_cell("a");
    let killed = Instant::now();
    let a = cells.index("a");
    assert!(cells.cells[a].running().is_empty() && cells.cells[a].balancer.backends().is_empty(), "cell a's nodes after the kill");
    assert!(!port_open(cells.cells[a].nats.port), "cell a's NATS still accepts after the kill");
    let alone = wait_until_every(peer_down_limit(), Duration::from_millis(50), || peers_alive(&cells).iter().all(|(_, p)| *p == Some(1.0)));
    assert!(alone, "b's peers alive {:?} after cell a was killed, want 1 each", peers_alive(&cells));
    let b_alone = killed.elapsed();
    let (status, _) = cells.cell("b").balanced().request("GET", "/healthz", Auth::None, Body::None);
    assert_eq!(status, 200, "cell b's balancer while a is dead");
    let restarting = Instant::now();
    cells.restart_cell("a");
    eprintln!("kill of cell a: b's nodes alone after {b_alone:?}; restart of a: all four nodes again after {:?}", restarting.elapsed());
    assert_eq!(cells.cells[a].balancer.backends().len(), NODES_PER_CELL, "cell a's balancer after the restart");

    // A full store in b: JetStream writes fail there, a's still work; freed, b's work.
    assert!(rt.block_on(write_in(&cells, "b")).is_ok(), "a write in b before the fill: {:?}", rt.block_on(write_in(&cells, "b")));
    let filled = rt.block_on(cells.fill_store("b"));
    assert!(filled > 0, "the store of b took no message");
    let refused = rt.block_on(write_in(&cells, "b"));
    assert!(refused.is_err(), "a write in b with its store full: {refused:?}");
    assert!(port_open(cells.cell("b").nats.port), "b's NATS port with its store full");
    let in_a = rt.block_on(write_in(&cells, "a"));
    assert!(in_a.is_ok(), "a write in a while b's store is full: {in_a:?}");
    rt.block_on(cells.free_store("b"));
    let again = rt.block_on(wait_for_every_async(Duration::from_secs(10), Duration::from_millis(50), || async { write_in(&cells, "b").await.ok() }));
    assert!(again.is_some(), "a write in b after its store was freed: {:?}", rt.block_on(write_in(&cells, "b")));
    eprintln!("fill: b's store full after {filled} messages of 64 KiB; refused: {refused:?}");
}
