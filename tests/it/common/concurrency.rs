//! Which integration tests run at the same time.
//!
//! The integration tests are one binary (`tests/it/main.rs`) so that they compile and link
//! once. libtest runs a binary's tests on `--test-threads` threads (by default one per
//! core). When every file under `tests/` was a binary of its own, cargo ran the binaries
//! one after another, so only tests of the same file ever ran at the same time; the
//! timing- and resource-sensitive ones (clusters of real nodes and a nats-server, drains,
//! rate limits, 9,500 connections, RSS and descriptor counts, rolling releases) were
//! written and tuned under that rule.
//!
//! The one binary keeps that rule: every test enters the gate first,
//! `let _gate = crate::common::gate!();`, with its top-level module (the former file, or
//! directory for `hostile` and `cluster`) as its group. Tests of one group run together,
//! as many at a time as the group's width: one per core, as libtest ran them, unless
//! [`WIDER`] names the group; a test of another group waits until the group inside has
//! left. Waiting tests are served first come, first served, so no group waits for ever.
//! A module's own `serial()` lock (drain, limits) still runs that module's tests one at a
//! time. libtest orders tests by name, so a module's tests come one after another and the
//! gate rarely has to switch groups. `.cargo/config.toml` sets `RUST_TEST_THREADS` to the
//! widest group's width, so libtest offers the gate that many tests at once.
//!
//! The test `every_test_enters_the_gate` checks that no test in `tests/it/` skips it.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

/// Groups that run more tests at once than there are cores, and how many: tests that spend
/// their time waiting on the wall clock, each with servers, dirs and ports of its own.
/// The cluster tests start a nats-server and two to four nodes each and wait on
/// heartbeats, drains, TTLs and outages: one at a time, they kept about 5 % of this 2-core
/// machine busy for five minutes. Four at a time they were still 950 test-seconds in 242 s
/// of the suite's 522 s (all four slots busy throughout); six at a time, 169 s with the
/// same per-test times. The webhook tests each start their own receiver and
/// server and wait on retry backoffs and the vacated delay, or wait to see that nothing
/// more arrives; none measures a time, rate or resource.
pub const WIDER: &[(&str, usize)] = &[("cluster", 6), ("webhooks", 4)];

/// How many tests of `group` run at once.
fn width_of(group: &str) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    WIDER.iter().find(|(name, _)| *name == group).map_or(cores, |&(_, width)| width.max(cores))
}

struct State {
    /// The group whose tests are running; `None` when no test is.
    group: Option<&'static str>,
    /// How many of its tests are running.
    inside: usize,
    /// Tickets of the tests waiting, in arrival order.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

static STATE: Mutex<State> =
    Mutex::new(State { group: None, inside: 0, queue: VecDeque::new(), next_ticket: 0 });
static CHANGED: Condvar = Condvar::new();

/// Held for the length of a test; leaving the gate lets the next group in.
pub struct Pass {
    /// When the test got in: with `LIVEGATE_TEST_TIMES=FILE` set, each test appends
    /// `SECONDS<TAB>NAME` there as it leaves, to see where the suite's time goes.
    entered: std::time::Instant,
}

/// The group of a test: the first module under the crate root (`it::hostile::memory` is
/// `hostile`, as `tests/hostile/` was one binary).
fn group_of(module_path: &'static str) -> &'static str {
    module_path.split("::").nth(1).unwrap_or(module_path)
}

/// Waits (unbounded: the tests ahead are themselves bounded) until the test of
/// `module_path` may run; `gate!()` passes the caller's `module_path!()`.
pub fn enter(module_path: &'static str) -> Pass {
    let group = group_of(module_path);
    // A std Mutex, not a tokio one: nothing async happens while it is held.
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let ticket = state.next_ticket;
    state.next_ticket += 1;
    state.queue.push_back(ticket);
    loop {
        let first = state.queue.front() == Some(&ticket);
        let fits =
            state.group.is_none() || (state.group == Some(group) && state.inside < width_of(group));
        if first && fits {
            state.queue.pop_front();
            state.group = Some(group);
            state.inside += 1;
            // The next in the queue may be of the same group.
            CHANGED.notify_all();
            return Pass { entered: std::time::Instant::now() };
        }
        state = CHANGED.wait(state).unwrap_or_else(|e| e.into_inner());
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        if let Some(path) = std::env::var_os("LIVEGATE_TEST_TIMES") {
            use std::io::Write;
            let name = std::thread::current().name().unwrap_or("?").to_owned();
            let line = format!("{:.2}\t{name}\n", self.entered.elapsed().as_secs_f64());
            if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = file.write_all(line.as_bytes());
            }
        }
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        state.inside -= 1;
        if state.inside == 0 {
            state.group = None;
        }
        CHANGED.notify_all();
    }
}

/// Enters the gate as a test of the calling module; hold the result for the whole test:
/// `let _gate = crate::common::gate!();`.
macro_rules! gate {
    () => {
        $crate::common::concurrency::enter(module_path!())
    };
}
pub(crate) use gate;

/// Every test function under `tests/it/` enters the gate: as many `gate!()` lines as test
/// attributes in each file.
#[test]
fn every_test_enters_the_gate() {
    let _gate = crate::common::gate!();
    fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read tests/it") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    rust_files(&std::path::Path::new(crate::common::REPO).join("tests/it"), &mut files);
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read test file");
        let tests = text
            .lines()
            .filter(|l| {
                l.trim_start().starts_with("#[test]") || l.trim_start().starts_with("#[tokio::test")
            })
            .count();
        let gates =
            text.lines().filter(|l| l.trim() == "let _gate = crate::common::gate!();").count();
        if tests != gates {
            missing.push(format!("{}: {tests} tests, {gates} gate!() lines", file.display()));
        }
    }
    assert!(files.len() > 40, "found only {} files under tests/it", files.len());
    assert!(
        missing.is_empty(),
        "tests that do not enter the gate (see tests/it/common/concurrency.rs):\n  {}",
        missing.join("\n  ")
    );
}
