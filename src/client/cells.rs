//! `livegate cells`: the cells' breakers as one node sees them (`GET /v1/admin/cells`),
//! printed for an operator watching a drill: one block per cell, with its breaker's state
//! and how long it has held it, its probe rounds as a line of marks (`✓` passed, `✗`
//! failed, oldest to newest) and the nodes that failed the last round, and its recent
//! transitions. Times are relative to the node's own clock (`ts_ms`), so the printing
//! machine's clock does not matter.

use crate::protocol::{CellStatus, CellsReply, PromoteReply};

/// A passed round in the probe line.
pub const PASSED: char = '✓';
/// A failed round in the probe line.
pub const FAILED: char = '✗';

/// The text `livegate cells` prints for `reply` (ends with a newline).
pub fn render(reply: &CellsReply) -> String {
    let mut out = format!("cells as node {} (cell {}) sees them:\n", reply.node, reply.cell);
    for cell in &reply.cells {
        render_cell(&mut out, cell, reply.ts_ms);
    }
    if reply.cells.is_empty() {
        out.push_str("  (no configured cell)\n");
    }
    out
}

/// The text `livegate cells --promote CELL` prints for `reply` (ends with a newline).
pub fn render_promotion(reply: &PromoteReply) -> String {
    let lost = match reply.missing {
        0 => "none: the mirror had every event the cell announced".to_string(),
        n => format!(
            "{n} (the cell announced stream seq {}, the mirror had {})",
            reply.origin_head_seen, reply.mirror_head
        ),
    };
    format!(
        "cell {}'s rooms moved to cell {}: {} rooms, new epoch {}
  mirror had up to stream seq {}
  events lost: {lost}
  clients resuming these rooms get recovered:false and reload their state
",
        reply.cell, reply.to, reply.rooms, reply.epoch, reply.mirror_head
    )
}

fn render_cell(out: &mut String, cell: &CellStatus, now_ms: u64) {
    let held = ago(now_ms, cell.since_ms);
    out.push_str(&format!("{}  {} for {held}\n", cell.cell, cell.breaker));
    let marks: String =
        cell.probes.iter().map(|p| if p.passed { PASSED } else { FAILED }).collect();
    let last = match cell.probes.last() {
        None => "no report yet".to_string(),
        Some(p) if p.passed => format!(
            "last round {} ago: {} of {} nodes passed",
            ago(now_ms, p.at_ms),
            p.reports,
            p.reports
        ),
        Some(p) => {
            let more = p.failures as usize - p.failed.len().min(p.failures as usize);
            let named = if more > 0 {
                format!("{} and {more} more", p.failed.join(", "))
            } else {
                p.failed.join(", ")
            };
            format!(
                "last round {} ago: {} of {} nodes failed ({named})",
                ago(now_ms, p.at_ms),
                p.failures,
                p.reports
            )
        }
    };
    let rounds = cell.probes.len();
    if rounds == 0 {
        out.push_str(&format!("  probes       {last}\n"));
    } else {
        out.push_str(&format!("  probes       {marks}  ({rounds} rounds, oldest first; {last})\n"));
    }
    if cell.transitions.is_empty() {
        out.push_str("  transitions  none\n");
    }
    for (i, t) in cell.transitions.iter().enumerate() {
        let label = if i == 0 { "transitions" } else { "" };
        out.push_str(&format!(
            "  {label:<11}  {} → {}  {} ago\n",
            t.from,
            t.to,
            ago(now_ms, t.at_ms)
        ));
    }
}

/// How long before `now_ms` `at_ms` was, for a person: `850ms`, `4.2s`, `3m 04s`,
/// `2h 05m` (a time ahead of `now_ms` counts as now).
pub fn ago(now_ms: u64, at_ms: u64) -> String {
    let ms = now_ms.saturating_sub(at_ms);
    let secs = ms / 1000;
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{}.{}s", secs, (ms % 1000) / 100),
        60_000..=3_599_999 => format!("{}m {:02}s", secs / 60, secs % 60),
        _ => format!("{}h {:02}m", secs / 3600, (secs / 60) % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{CellProbe, CellTransition};

    fn probe(at_ms: u64, passed: bool, reports: u32, failed: &[&str], failures: u32) -> CellProbe {
        CellProbe {
            at_ms,
            passed,
            reports,
            failures,
            failed: failed.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn transition(at_ms: u64, from: &str, to: &str) -> CellTransition {
        CellTransition { at_ms, from: from.into(), to: to.into() }
    }

    #[test]
    fn durations() {
        let cases: &[(u64, &str)] = &[
            (0, "0ms"),
            (850, "850ms"),
            (1000, "1.0s"),
            (4250, "4.2s"),
            (59_999, "59.9s"),
            (184_000, "3m 04s"),
            (7_500_000, "2h 05m"),
        ];
        for &(ms, text) in cases {
            assert_eq!(ago(10_000_000, 10_000_000 - ms), text, "{ms} ms");
        }
        assert_eq!(ago(5, 9), "0ms", "a time ahead counts as now");
    }

    #[test]
    fn one_block_per_cell() {
        let reply = CellsReply {
            node: "a".into(),
            cell: "east".into(),
            ts_ms: 100_000,
            cells: vec![
                CellStatus {
                    cell: "east".into(),
                    breaker: "closed".into(),
                    since_ms: 40_000,
                    probes: vec![probe(98_000, true, 2, &[], 0), probe(99_000, true, 2, &[], 0)],
                    transitions: vec![],
                },
                CellStatus {
                    cell: "west".into(),
                    breaker: "open".into(),
                    since_ms: 95_800,
                    probes: vec![
                        probe(93_000, true, 1, &[], 0),
                        probe(94_000, false, 1, &["c"], 1),
                        probe(95_000, false, 1, &["c"], 1),
                        probe(95_800, false, 10, &["c", "d"], 3),
                    ],
                    transitions: vec![
                        transition(60_000, "half_open", "closed"),
                        transition(95_800, "closed", "open"),
                    ],
                },
                CellStatus {
                    cell: "north".into(),
                    breaker: "closed".into(),
                    since_ms: 0,
                    probes: vec![],
                    transitions: vec![],
                },
            ],
        };
        let expected = "\
cells as node a (cell east) sees them:
east  closed for 1m 00s
  probes       ✓✓  (2 rounds, oldest first; last round 1.0s ago: 2 of 2 nodes passed)
  transitions  none
west  open for 4.2s
  probes       ✓✗✗✗  (4 rounds, oldest first; last round 4.2s ago: 3 of 10 nodes failed (c, d and 1 more))
  transitions  half_open → closed  40.0s ago
               closed → open  4.2s ago
north  closed for 1m 40s
  probes       no report yet
  transitions  none
";
        assert_eq!(render(&reply), expected);
        let empty = CellsReply { node: "a".into(), cell: "east".into(), ts_ms: 0, cells: vec![] };
        assert_eq!(
            render(&empty),
            "cells as node a (cell east) sees them:\n  (no configured cell)\n"
        );
    }
}
