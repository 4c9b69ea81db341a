//! The cells drill of the book (`docs/src/cells.md`, section "Drill"), run as written
//! against two cells of the test's own (`common::cells`: cells `a` and `b`, each with its
//! own nats-server and two nodes, heartbeats every 250 ms).
//!
//! The section's `sh` block exports the drill's variables; its three `console` blocks are
//! the steps "look", "watch the breaker open and the route move" and "watch the trial and
//! the route come home". Each `$ ` line of a block (with `\` continuation lines) is a
//! command, the lines after it up to the next `$ ` line are what it prints. Every command
//! must be a `livegate …` or `curl …` line; it is run by `bash -u` with the exported
//! variables set (`LIVEGATE_API_KEY` the nodes' key, `NODE_A` node a1's URL, `DRILL_USER` a
//! user homed in b) and the `livegate` under test first on `PATH`, so a command that names
//! a variable the section does not export fails. Between the blocks the test does what the
//! section says the operator does: it fills cell b's JetStream store (a stream of its own
//! until a write is refused), then deletes that stream. A block is run again and again, as
//! the operator repeats the commands, until every command prints what the block shows
//! (bounded: 5 s, 10 s for the opening, 25 s for the closing, which waits out the 10 s
//! cool-down; the whole test under a minute).
//!
//! Shown output matches line by line, the same number of lines: `…` stands for any text, a
//! duration (`850ms`, `4.2s`, `3m 04s`, `2h 05m`) for any duration, and a run of probe
//! marks (`✓✗`) for a run as long that ends in the same run of equal marks (`…✗✗✗`: the
//! last three rounds failed); everything else is literal. So a renamed flag (the command
//! fails), a changed line the book quotes, or a breaker that does not open or close fails
//! the test, naming the book's line.
//!
//! Figures (`FIGURE` lines): when the breaker opened after the store filled, when it went
//! half-open and closed (from the node's own transitions), and when the drill's commands
//! first showed each step.

use super::*;
use common::cells::Cells;
use common::nats::CellNatsConfig;
use livegate::core::nodes::breaker::{CLOSE_AFTER, COOL_DOWN_MS, HISTORY_ROUNDS};
use livegate::core::nodes::routing::rendezvous;
use livegate::core::rules::names::inbox_room;
use std::process::{Command, Stdio};

/// The page and the heading of the section the test runs.
const PAGE: &str = "docs/src/cells.md";
const SECTION: &str = "## Drill";
/// The variables the section's setup exports, all of which the test sets.
const VARIABLES: [&str; 3] = ["LIVEGATE_API_KEY", "NODE_A", "DRILL_USER"];
/// The steps the section shows output for, in order.
const STEPS: [&str; 3] = [
    "look",
    "watch the breaker open and the route move",
    "watch the trial and the route come home",
];

const FLAGS: [&str; 4] = ["--cluster-heartbeat-ms", "250", "--probe-up-after", "1"];
/// Node a1, the node the drill watches from (`NODE_A`).
const A1: usize = 0;

/// One command of a `console` block and what the book shows it prints.
#[derive(Debug, Clone)]
struct Step {
    /// The command's line in the page (from 1).
    line: usize,
    command: String,
    shown: Vec<String>,
}

/// The drill as the page writes it.
#[derive(Debug)]
struct Drill {
    /// The names the `sh` blocks export.
    exports: Vec<String>,
    /// Each `console` block's steps, in order.
    blocks: Vec<Vec<Step>>,
}

/// The section under `## Drill` of `page` (up to the next `## ` heading): its exports and
/// its `console` blocks; an error when there is no such section.
fn drill(page: &str) -> Result<Drill, String> {
    let lines: Vec<&str> = page.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_end() == SECTION)
        .ok_or_else(|| format!("{PAGE} has no `{SECTION}` section"))?;
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |n| start + 1 + n);
    let mut drill = Drill { exports: Vec::new(), blocks: Vec::new() };
    let mut fence: Option<&str> = None;
    let mut continued = false;
    for (i, line) in lines.iter().enumerate().take(end).skip(start + 1) {
        let trimmed = line.trim();
        match fence {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    fence = Some(info);
                    if info == "console" {
                        drill.blocks.push(Vec::new());
                    }
                }
                continue;
            }
            Some(_) if trimmed == "```" => {
                fence = None;
                continue;
            }
            Some("sh") => {
                if let Some((name, _)) =
                    trimmed.strip_prefix("export ").and_then(|rest| rest.split_once('='))
                {
                    drill.exports.push(name.to_string());
                }
            }
            Some("console") => {
                let block = drill.blocks.last_mut().expect("a console block");
                if let Some(command) = line.strip_prefix("$ ") {
                    block.push(Step {
                        line: i + 1,
                        command: command.trim_end_matches('\\').trim().to_string(),
                        shown: Vec::new(),
                    });
                    continued = line.ends_with('\\');
                } else if continued {
                    let step = block.last_mut().expect("a continued command");
                    step.command.push(' ');
                    step.command.push_str(line.trim_end_matches('\\').trim());
                    continued = line.ends_with('\\');
                } else {
                    let step = block.last_mut().ok_or_else(|| {
                        format!("{PAGE}:{}: output before any `$ ` command", i + 1)
                    })?;
                    step.shown.push(line.to_string());
                }
            }
            Some(_) => {}
        }
    }
    Ok(drill)
}

/// What is wrong with the drill's shape for this test: the exports, the number of blocks,
/// the commands (only `livegate` and `curl`).
fn shape_problems(drill: &Drill) -> Vec<String> {
    let mut problems = Vec::new();
    let mut exports = drill.exports.clone();
    exports.sort();
    let mut want: Vec<String> = VARIABLES.iter().map(|v| v.to_string()).collect();
    want.sort();
    if exports != want {
        problems.push(format!("the setup exports {exports:?}; the test sets {want:?}"));
    }
    if drill.blocks.len() != STEPS.len() {
        problems.push(format!(
            "{} console blocks; the test runs {} ({})",
            drill.blocks.len(),
            STEPS.len(),
            STEPS.join("; ")
        ));
    }
    for (block, name) in drill.blocks.iter().zip(STEPS) {
        if block.is_empty() {
            problems.push(format!("the block of step \"{name}\" has no command"));
        }
        for step in block {
            if !(step.command.starts_with("livegate ") || step.command.starts_with("curl ")) {
                problems.push(format!(
                    "{PAGE}:{}: `{}` is neither a livegate nor a curl command",
                    step.line, step.command
                ));
            }
            if step.shown.is_empty() {
                problems.push(format!("{PAGE}:{}: `{}` shows no output", step.line, step.command));
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------
// Shown output against printed output
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(char),
    /// `…`: any text.
    Any,
    /// A duration as `livegate cells` prints one.
    Duration,
    /// A run of `total` probe marks ending in `tail` × `mark`.
    Marks {
        total: usize,
        mark: char,
        tail: usize,
    },
}

fn is_mark(c: char) -> bool {
    c == '✓' || c == '✗'
}

/// The length of the duration starting at `at` in `s` (`850ms`, `4.2s`, `3m 04s`,
/// `2h 05m`), not glued to a word or number on either side.
fn duration_at(s: &[char], at: usize) -> Option<usize> {
    if at > 0 && (s[at - 1].is_alphanumeric() || s[at - 1] == '.') {
        return None;
    }
    let digits =
        |from: usize| s[from.min(s.len())..].iter().take_while(|c| c.is_ascii_digit()).count();
    let is = |i: usize, c: char| s.get(i) == Some(&c);
    let n = digits(at);
    if n == 0 {
        return None;
    }
    let after = at + n;
    let len = if is(after, 'm') && is(after + 1, 's') {
        n + 2
    } else if is(after, '.') && digits(after + 1) == 1 && is(after + 2, 's') {
        n + 3
    } else if (is(after, 'm') && is(after + 1, ' ') && digits(after + 2) == 2 && is(after + 4, 's'))
        || (is(after, 'h') && is(after + 1, ' ') && digits(after + 2) == 2 && is(after + 4, 'm'))
    {
        n + 5
    } else {
        return None;
    };
    let glued = s.get(at + len).is_some_and(|c| c.is_alphanumeric());
    (!glued).then_some(len)
}

/// A shown line as pieces.
fn pieces(shown: &str) -> Vec<Piece> {
    let s: Vec<char> = shown.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if s[i] == '…' {
            out.push(Piece::Any);
            i += 1;
        } else if is_mark(s[i]) {
            let total = s[i..].iter().take_while(|c| is_mark(**c)).count();
            let mark = s[i + total - 1];
            let tail = s[i..i + total].iter().rev().take_while(|c| **c == mark).count();
            out.push(Piece::Marks { total, mark, tail });
            i += total;
        } else if let Some(len) = duration_at(&s, i) {
            out.push(Piece::Duration);
            i += len;
        } else {
            out.push(Piece::Text(s[i]));
            i += 1;
        }
    }
    out
}

/// Whether `actual` (from `at`) is what `pieces` describe, to its end.
fn matches_from(pieces: &[Piece], actual: &[char], at: usize) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return at == actual.len();
    };
    match first {
        Piece::Text(c) => actual.get(at) == Some(c) && matches_from(rest, actual, at + 1),
        Piece::Any => (at..=actual.len()).any(|next| matches_from(rest, actual, next)),
        Piece::Duration => {
            duration_at(actual, at).is_some_and(|len| matches_from(rest, actual, at + len))
        }
        Piece::Marks { total, mark, tail } => {
            let run = actual[at.min(actual.len())..].iter().take_while(|c| is_mark(**c)).count();
            let ends = actual[at..at + run].iter().rev().take_while(|c| *c == mark).count();
            run == *total && ends >= *tail && matches_from(rest, actual, at + run)
        }
    }
}

fn line_matches(shown: &str, actual: &str) -> bool {
    let actual: Vec<char> = actual.chars().collect();
    matches_from(&pieces(shown), &actual, 0)
}

/// Where `actual` differs from `shown`, or `None` when it is what the book shows.
fn output_differs(shown: &[String], actual: &str) -> Option<String> {
    let actual: Vec<&str> = actual.trim_end().lines().collect();
    let shown: Vec<&str> = shown.iter().map(|s| s.trim_end()).collect();
    if actual.len() != shown.len() {
        return Some(format!("{} lines printed, {} shown", actual.len(), shown.len()));
    }
    let (n, (want, got)) =
        shown.iter().zip(&actual).enumerate().find(|(_, (want, got))| !line_matches(want, got))?;
    Some(format!("shown line {} {want:?} does not match the printed {got:?}", n + 1))
}

// ---------------------------------------------------------------------------------------
// Running the commands
// ---------------------------------------------------------------------------------------

/// Runs `command` as the operator does: `bash -u`, the drill's `variables` set, the
/// `livegate` under test first on `PATH`, none of the test's own `LIVEGATE_*` variables.
/// Its stdout, or why it failed. Bounded: killed after 30 s.
fn run_command(command: &str, variables: &[(&str, String)]) -> Result<String, String> {
    use std::io::Read;
    let bin = common::livegate_bin();
    let path = format!(
        "{}:{}",
        bin.parent().expect("the binary's dir").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("LIVEGATE_") {
            cmd.env_remove(name);
        }
    }
    cmd.args(["-u", "-o", "pipefail", "-c", command]).env("PATH", path).env("RUST_LOG", "warn");
    cmd.envs(variables.iter().map(|(k, v)| (*k, v.as_str())));
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("run bash: {e}"))?;
    let status = wait_for_every(Duration::from_secs(30), Duration::from_millis(10), || {
        child.try_wait().expect("try_wait")
    });
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("did not exit within 30 s".into());
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read stdout");
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
    if status.success() {
        Ok(out)
    } else {
        Err(format!(
            "exited with {status}: {}{}",
            err.trim(),
            if out.is_empty() { String::new() } else { format!(" (stdout: {})", out.trim()) }
        ))
    }
}

/// One run of `block`: every command's failure or difference from the book, by line (empty:
/// the block printed what the book shows), and what each command printed.
fn run_block(block: &[Step], variables: &[(&str, String)]) -> (Vec<String>, Vec<String>) {
    let mut problems = Vec::new();
    let mut printed = Vec::new();
    for step in block {
        match run_command(&step.command, variables) {
            Ok(out) => {
                if let Some(difference) = output_differs(&step.shown, &out) {
                    problems
                        .push(format!("{PAGE}:{}: `{}`: {difference}", step.line, step.command));
                }
                printed.push(format!("$ {}\n{}", step.command, out.trim_end()));
            }
            Err(e) => {
                problems.push(format!("{PAGE}:{}: `{}` {e}", step.line, step.command));
                printed.push(format!("$ {}\n(failed: {e})", step.command));
            }
        }
    }
    (problems, printed)
}

/// Runs `block` again and again, as an operator repeats the commands, until it prints what
/// the book shows; how long that took, or every problem of the last run and its output.
fn repeat_until_shown(
    block: &[Step],
    variables: &[(&str, String)],
    within: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    let mut last = (Vec::new(), Vec::new());
    let shown = wait_until_every(within, Duration::from_millis(20), || {
        last = run_block(block, variables);
        last.0.is_empty()
    });
    if shown {
        eprintln!(
            "the drill printed, {:?} after the step began:\n{}",
            started.elapsed(),
            last.1.join("\n")
        );
        Ok(started.elapsed())
    } else {
        Err(format!(
            "not shown within {within:?}:\n  {}\nlast printed:\n{}",
            last.0.join("\n  "),
            last.1.join("\n")
        ))
    }
}

/// A user homed in b (no claim) whose route names b1 at home and a1 in a, the nodes the
/// book's route answers show.
fn drill_user() -> String {
    (0..100_000)
        .map(|i| format!("drill-u{i}"))
        .find(|u| {
            let inbox = inbox_room(u);
            rendezvous(u, ["a", "b"]) == Some("b")
                && rendezvous(&inbox, ["b1", "b2"]) == Some("b1")
                && rendezvous(&inbox, ["a1", "a2"]) == Some("a1")
        })
        .expect("a user among 100,000")
}

/// Cell `cell`'s breaker transitions as node `i` sees them: (from, to, at_ms), oldest first.
fn transitions(cells: &Cells, i: usize, cell: &str) -> Vec<(String, String, u64)> {
    let (status, body) = cells.http(i).request("GET", "/v1/admin/cells", Auth::Key, Body::None);
    assert_eq!(status, 200, "GET /v1/admin/cells: {body}");
    let view = body["cells"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["cell"] == cell))
        .cloned()
        .unwrap_or_default();
    view["transitions"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    (
                        t["from"].as_str().unwrap_or("").to_string(),
                        t["to"].as_str().unwrap_or("").to_string(),
                        t["at_ms"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether node `i` has [`HISTORY_ROUNDS`] probe rounds of every cell (the book's
/// `(20 rounds` of a deployment that has run a while).
fn history_full(cells: &Cells, i: usize) -> bool {
    match cells.http(i).try_request("GET", "/v1/admin/cells", Auth::Key, Body::None) {
        Ok((200, body)) => body["cells"].as_array().is_some_and(|cs| {
            cs.len() == 2
                && cs
                    .iter()
                    .all(|c| c["probes"].as_array().is_some_and(|p| p.len() == HISTORY_ROUNDS))
        }),
        _ => false,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as u64
}

fn read_page() -> String {
    let path = std::path::Path::new(common::REPO).join(PAGE);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The page's drill has the shape the test runs, and the matching of shown output says no
/// where it must (no deployment: this fails fast when the section changes shape).
#[test]
fn the_books_drill_has_three_steps_of_livegate_and_curl_commands_and_its_output_patterns_match_strictly(
) {
    let _gate = crate::common::gate!();
    let drill = drill(&read_page()).unwrap_or_else(|e| panic!("{e}"));
    let problems = shape_problems(&drill);
    assert!(problems.is_empty(), "the drill in {PAGE}:\n  {}", problems.join("\n  "));
    // Durations: any duration for a duration, never for a name or a count.
    assert!(line_matches("b  open for 700ms", "b  open for 1.2s"));
    assert!(line_matches("a  closed for 6.1s", "a  closed for 3m 04s"));
    assert!(!line_matches("b  open for 700ms", "b  closed for 700ms"));
    assert!(!line_matches("b  open for 700ms", "b  open for ever"));
    assert!(!line_matches("(20 rounds, oldest first", "(19 rounds, oldest first"));
    assert!(!line_matches("nodes failed (b1, b2))", "nodes failed (b2, b3))"));
    // Marks: as many, ending in the same run.
    assert!(line_matches("  probes       ✓✓✓✓✗✗✗  (", "  probes       ✓✗✗✗✗✗✗  ("));
    assert!(
        !line_matches("  probes       ✓✓✓✓✗✗✗  (", "  probes       ✓✓✓✓✓✗✗  ("),
        "two failures are not three"
    );
    assert!(
        !line_matches("  probes       ✓✓✓✓✗✗✗  (", "  probes       ✓✓✓✗✗✗  ("),
        "six rounds are not seven"
    );
    // `…`: any text, the rest literal.
    let shown = r#"{"node":"a1","url":"http://…","cell":"a","home":"b"}"#;
    assert!(line_matches(
        shown,
        r#"{"node":"a1","url":"http://127.0.0.1:4567","cell":"a","home":"b"}"#
    ));
    assert!(!line_matches(
        shown,
        r#"{"node":"b1","url":"http://127.0.0.1:4567","cell":"b","home":"b"}"#
    ));
    // Whole outputs: line by line, as many lines.
    let shown: Vec<String> = vec!["b  closed for 1.0s".into(), "  transitions  none".into()];
    assert_eq!(output_differs(&shown, "b  closed for 2.5s\n  transitions  none\n"), None);
    assert!(output_differs(&shown, "b  closed for 2.5s\n").is_some());
    assert!(output_differs(&shown, "b  closed for 2.5s\n  transitions  closed → open  1.0s ago\n")
        .is_some());
}

/// The drill, as the book writes it, against two cells: look (both closed, b's user routed
/// home to b1), fill b's store, watch (b open after three failed rounds by b1 and b2, the
/// user routed to a1 with home b, a untouched), free b's store, watch (b closed after the
/// cool-down and the trial, the user home again). Then the same commands with a renamed
/// flag, and a changed line, fail.
#[test]
fn the_books_cells_drill_runs_as_written_against_two_cells() {
    let _gate = crate::common::gate!();
    let drill = drill(&read_page()).unwrap_or_else(|e| panic!("{e}"));
    let problems = shape_problems(&drill);
    assert!(problems.is_empty(), "the drill in {PAGE}:\n  {}", problems.join("\n  "));
    let small = CellNatsConfig { max_file_store: Some("8MB".into()), ..CellNatsConfig::default() };
    let cells =
        Cells::start(&FLAGS, |c| if c == 1 { small.clone() } else { CellNatsConfig::default() });
    let rt = runtime();
    let user = drill_user();
    let variables: Vec<(&str, String)> = vec![
        ("LIVEGATE_API_KEY", common::API_KEY.to_string()),
        ("NODE_A", format!("http://{}", cells.addr(A1))),
        ("DRILL_USER", user.clone()),
    ];
    // A deployment that has run a while: a1 has every cell's full probe history.
    assert!(
        wait_until_every(Duration::from_secs(10), Duration::from_millis(50), || history_full(
            &cells, A1
        )),
        "a1 has no {HISTORY_ROUNDS} probe rounds of each cell after 10 s"
    );

    // 1. Look.
    if let Err(e) = repeat_until_shown(&drill.blocks[0], &variables, Duration::from_secs(15)) {
        panic!("step \"{}\": {e}", STEPS[0]);
    }

    // 2. Take cell b out: fill its store.
    let messages = rt.block_on(cells.fill_store("b"));
    let (full_at, full_ms) = (Instant::now(), now_ms());

    // 3. Watch the breaker open and the route move.
    let seen_open = repeat_until_shown(&drill.blocks[1], &variables, Duration::from_secs(10))
        .unwrap_or_else(|e| {
            panic!(
                "step \"{}\" (b's store full after {messages} messages of 64 KiB): {e}",
                STEPS[1]
            )
        });
    let opened = transitions(&cells, A1, "b");
    let open_ms = match opened.as_slice() {
        [(from, to, at)] if from == "closed" && to == "open" => *at,
        other => panic!("b's transitions on a1 once open: {other:?}"),
    };
    let to_open = Duration::from_millis(open_ms.saturating_sub(full_ms));
    assert!(to_open < Duration::from_secs(5), "b's breaker opened {to_open:?} after the store filled: the book says 3-4 heartbeat periods");
    assert!(
        transitions(&cells, A1, "a").is_empty(),
        "cell a's breaker moved: {:?}",
        transitions(&cells, A1, "a")
    );

    // 4. Bring cell b back.
    rt.block_on(cells.free_store("b"));
    let (freed_at, freed_ms) = (Instant::now(), now_ms());

    // 5. Watch the trial and the route come home.
    let seen_home = repeat_until_shown(&drill.blocks[2], &variables, Duration::from_secs(25))
        .unwrap_or_else(|e| panic!("step \"{}\": {e}", STEPS[2]));
    let changes = transitions(&cells, A1, "b");
    let at =
        |from: &str, to: &str| changes.iter().find(|(f, t, _)| f == from && t == to).map(|c| c.2);
    let (Some(half_ms), Some(closed_ms)) = (at("open", "half_open"), at("half_open", "closed"))
    else {
        panic!("b's transitions on a1 once closed: {changes:?}");
    };
    assert!(
        half_ms >= open_ms + COOL_DOWN_MS,
        "half-open {} ms after opening: before the {COOL_DOWN_MS} ms cool-down",
        half_ms - open_ms
    );
    // The trial's first pass makes it half-open; CLOSE_AFTER - 1 more passing rounds close it.
    assert!(
        closed_ms > half_ms,
        "closed at {closed_ms}, not after half-open at {half_ms} (a trial of {CLOSE_AFTER} passes)"
    );
    assert!(
        transitions(&cells, A1, "a").is_empty(),
        "cell a's breaker moved: {:?}",
        transitions(&cells, A1, "a")
    );

    // The same commands with a renamed flag, and a line the book quotes changed, fail.
    let mut renamed = drill.blocks[2].clone();
    renamed[0].command = renamed[0].command.replacen("--url", "--node-url", 1);
    let (problems, _) = run_block(&renamed, &variables);
    assert!(
        problems.iter().any(|p| p.contains("--node-url") && p.contains("exited with")),
        "a renamed flag went unnoticed: {problems:?}"
    );
    let mut changed = drill.blocks[2].clone();
    let header = changed[0]
        .shown
        .iter_mut()
        .find(|l| l.starts_with("b  closed for"))
        .expect("b's header in the last step");
    *header = header.replacen("closed", "healthy", 1);
    let (problems, _) = run_block(&changed, &variables);
    assert!(
        problems.iter().any(|p| p.contains("\"b  healthy for")),
        "a changed line went unnoticed: {problems:?}"
    );

    eprintln!(
        "FIGURE cell_drill: b's store full after {messages} × 64 KiB; breaker open {to_open:?} after it (drill showed it {seen_open:?} after), \
         half-open {} ms after opening, closed {} ms after the store was freed (drill showed b closed and the user home {seen_home:?} after; \
         {:?} from open to the route home); full-to-freed {:?}",
        half_ms - open_ms,
        closed_ms.saturating_sub(freed_ms),
        Duration::from_millis(closed_ms.saturating_sub(open_ms)),
        freed_at.duration_since(full_at),
    );
}
