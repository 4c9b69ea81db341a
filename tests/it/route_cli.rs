//! `livegate route` run as two separate processes on 1000 sessions prints the same bytes,
//! even with the node list reordered and repeated: routing depends only on its inputs.

use std::process::Command;

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn route(nodes: &std::path::Path, sessions: &std::path::Path) -> Vec<u8> {
    let out = Command::new(crate::common::livegate_bin())
        .args(["route", "--nodes"])
        .arg(nodes)
        .arg("--sessions")
        .arg(sessions)
        .output()
        .expect("run livegate route");
    assert!(out.status.success(), "route failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

#[test]
fn two_processes_route_1000_sessions_identically() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().unwrap();
    let names = ["node-c", "node-a", "node-f", "node-b", "node-e", "node-d", "node-g"];
    let down = ["node-a", "node-e"];
    let line = |n: &&str| if down.contains(n) { format!("{n} down\n") } else { format!("{n}\n") };
    let nodes_a = dir.path().join("nodes-a");
    std::fs::write(&nodes_a, names.iter().map(line).collect::<String>()).unwrap();
    // Same nodes, reversed and with repeats.
    let nodes_b = dir.path().join("nodes-b");
    std::fs::write(
        &nodes_b,
        names.iter().rev().chain(names.iter().take(3)).map(line).collect::<String>(),
    )
    .unwrap();

    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut sessions = String::new();
    let mut recorded = Vec::new();
    for i in 0..1000 {
        let owner = match xorshift(&mut seed) % 10 {
            0..=6 => Some(names[(xorshift(&mut seed) % names.len() as u64) as usize]),
            7 => Some("node-gone"),
            _ => None,
        };
        sessions
            .push_str(&format!("s-{i:04}{}\n", owner.map(|o| format!(" {o}")).unwrap_or_default()));
        recorded.push(owner);
    }
    let sessions_file = dir.path().join("sessions");
    std::fs::write(&sessions_file, &sessions).unwrap();

    let first = route(&nodes_a, &sessions_file);
    let second = route(&nodes_b, &sessions_file);
    assert_eq!(first, second, "two processes disagree");

    let text = String::from_utf8(first).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1000);
    let alive: Vec<&str> = names.iter().copied().filter(|n| !down.contains(n)).collect();
    let mut spread = std::collections::BTreeMap::new();
    for (line, owner) in lines.iter().zip(&recorded) {
        let (session, node) = line.split_once(' ').unwrap();
        assert!(names.contains(&node) && !down.contains(&node), "{line}: not an alive node");
        match owner {
            Some(o) if names.contains(o) && !down.contains(o) => {
                assert_eq!(node, *o, "{line}: alive owner not kept")
            }
            _ => {
                let expected =
                    livegate::core::nodes::routing::rendezvous(session, alive.iter().copied());
                assert_eq!(
                    Some(node),
                    expected,
                    "{line}: without a live owner, the rendezvous choice among the alive nodes"
                );
                *spread.entry(node).or_insert(0) += 1;
            }
        }
    }
    // Sessions without a live owner spread over the alive nodes instead of piling onto one.
    assert!(
        spread.len() == alive.len() && spread.values().all(|n| *n > 0),
        "no spread: {spread:?}"
    );
}

#[test]
fn route_reports_errors_per_session_and_rejects_bad_files() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes");
    std::fs::write(&nodes, "a down\nb down\n").unwrap();
    let sessions = dir.path().join("sessions");
    std::fs::write(&sessions, "s1 a\n").unwrap();
    assert_eq!(String::from_utf8(route(&nodes, &sessions)).unwrap(), "s1 error: no alive owner\n");

    std::fs::write(&nodes, "a sideways\n").unwrap();
    let out = Command::new(crate::common::livegate_bin())
        .args(["route", "--nodes"])
        .arg(&nodes)
        .arg("--sessions")
        .arg(&sessions)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad node line"));
}
