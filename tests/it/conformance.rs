//! WebSocket conformance (issue 8): Autobahn|Testsuite's fuzzingclient, cases 1.* to 10.*
//! (12.* and 13.* need permessage-deflate, which livegate does not offer), against the
//! real binary's test-only echo socket `/v1/echo` (config `ws_echo`), which reads frames
//! with the same code, limits and close codes as `/v1/ws`.
//!
//! The suite is Python 2.7 only; `.ci/test` sets up its virtualenv and exports
//! `LIVEGATE_WSTEST` (the path of its `wstest`). Without it this test fails — it never
//! skips. The verdict comes from the suite's `index.json`, not from wstest's exit code:
//! every case must be OK, NON-STRICT or INFORMATIONAL, and so must its close behaviour.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::process::ServeProcess;
use serde_json::Value;

/// The spec template: `@OUTDIR@` and `@ADDR@` are filled in.
const SPEC_TEMPLATE: &str = include_str!("../autobahn/fuzzingclient.json");
/// The whole suite run is bounded; it normally takes a few minutes (9.* sends messages of
/// up to 16 MiB from Python).
const SUITE_LIMIT: Duration = Duration::from_secs(20 * 60);
/// Cases 1.* to 10.* of autobahntestsuite 25.10.1; fewer in `index.json` means the run
/// did not complete.
const MIN_CASES: usize = 300;
/// Frame and message limit for the run: 9.* sends single frames and messages of 16 MiB.
const SIZE_LIMIT: &str = "20000000";
const PASSING: [&str; 3] = ["OK", "NON-STRICT", "INFORMATIONAL"];

/// The wstest child, killed (with its process group's leader) if the test ends early.
struct Wstest(Child);

impl Drop for Wstest {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wstest_path() -> PathBuf {
    let hint = "set it up with .ci/test (it builds the Autobahn|Testsuite virtualenv in \
                target/autobahn-venv and exports LIVEGATE_WSTEST=target/autobahn-venv/bin/wstest)";
    let Some(value) = std::env::var_os("LIVEGATE_WSTEST").filter(|v| !v.is_empty()) else {
        panic!("LIVEGATE_WSTEST is not set: {hint}");
    };
    let path = PathBuf::from(value);
    let path = if path.is_relative() { Path::new(crate::common::REPO).join(path) } else { path };
    assert!(path.is_file(), "LIVEGATE_WSTEST={} does not exist: {hint}", path.display());
    path
}

/// Runs `wstest -m fuzzingclient -s spec` to its end (bounded); returns its output.
fn run_suite(
    wstest: &Path,
    spec: &Path,
    dir: &Path,
) -> (std::process::ExitStatus, String, Duration) {
    let log_path = dir.join("wstest.log");
    let log = std::fs::File::create(&log_path).expect("wstest log");
    let started = Instant::now();
    let child = Command::new(wstest)
        .args(["-m", "fuzzingclient", "-s"])
        .arg(spec)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().expect("log handle")))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", wstest.display()));
    let mut child = Wstest(child);
    let Some(status) = common::wait_for_every(SUITE_LIMIT, Duration::from_millis(200), || {
        child.0.try_wait().expect("try_wait wstest")
    }) else {
        drop(child);
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        panic!(
            "wstest did not finish within {SUITE_LIMIT:?}; its output ends:\n{}",
            tail(&text, 40)
        );
    };
    (status, std::fs::read_to_string(&log_path).unwrap_or_default(), started.elapsed())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sorts case ids ("9.10.2" after "9.2.1") by their numeric parts.
fn case_key(id: &str) -> Vec<u64> {
    id.split('.').map(|p| p.parse().unwrap_or(u64::MAX)).collect()
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// A per-case report, for its texts only. Python writes the payloads of the UTF-8 cases
/// with lone surrogate escapes (`\udc80`), which are not JSON; they become U+FFFD.
fn read_case_report(path: &Path) -> Value {
    let Ok(text) = std::fs::read_to_string(path) else { return Value::Null };
    if let Ok(value) = serde_json::from_str(&text) {
        return value;
    }
    let mut clean = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("\\u") {
        let escape = rest.get(at + 2..at + 6).unwrap_or("");
        let surrogate = escape.len() == 4
            && u16::from_str_radix(escape, 16).is_ok_and(|unit| (0xD800..0xE000).contains(&unit));
        clean.push_str(&rest[..at]);
        clean.push_str(if surrogate { "\\ufffd" } else { &rest[at..at + 2] });
        rest = &rest[at + if surrogate { 6 } else { 2 }..];
    }
    clean.push_str(rest);
    serde_json::from_str(&clean).unwrap_or(Value::Null)
}

#[test]
fn autobahn_fuzzingclient_cases_1_to_10_pass() {
    let _gate = crate::common::gate!();
    let wstest = wstest_path();
    let dir = tempfile::Builder::new().prefix("livegate-autobahn-").tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let outdir = dir.path().join("reports");

    // Only the socket under test and its size limits differ from the defaults; the
    // rate limits are abuse defences, not protocol, and the suite opens some 300
    // connections in a row and sends bursts of up to 1000 messages on one.
    let server = ServeProcess::start(
        &data,
        &dir.path().join("server.log"),
        &[
            "--ws-echo",
            "true",
            "--max-frame-bytes",
            SIZE_LIMIT,
            "--max-message-bytes",
            SIZE_LIMIT,
            "--handshakes-per-ip-per-sec",
            "100000",
            "--max-messages-per-sec",
            "100000",
        ],
    );

    let spec = SPEC_TEMPLATE
        .replace("@OUTDIR@", outdir.to_str().expect("UTF-8 temp path"))
        .replace("@ADDR@", &server.addr.to_string());
    let spec_path = dir.path().join("fuzzingclient.json");
    std::fs::write(&spec_path, spec).expect("write spec");

    let (status, output, took) = run_suite(&wstest, &spec_path, dir.path());
    eprintln!("wstest fuzzingclient took {:.0} s (exit {status})", took.as_secs_f64());

    let index_path = outdir.join("index.json");
    assert!(
        index_path.is_file(),
        "wstest (exit {status}) wrote no {}; its output ends:\n{}\nserver log ends:\n{}",
        index_path.display(),
        tail(&output, 40),
        tail(&server.log_text(), 40)
    );
    let index = read_json(&index_path);
    let cases = index
        .get("livegate")
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("index.json has no results for agent livegate: {index:.400}"));

    let mut by_outcome: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut ids: Vec<&String> = cases.keys().collect();
    ids.sort_by_key(|id| case_key(id));
    for id in ids {
        let case = &cases[id.as_str()];
        let behavior = case["behavior"].as_str().unwrap_or("MISSING");
        let close = case.get("behaviorClose").and_then(Value::as_str);
        *by_outcome.entry(behavior.to_string()).or_default() += 1;
        let close_ok = close.is_none_or(|c| c == "OK" || c == "INFORMATIONAL");
        if PASSING.contains(&behavior) && close_ok {
            continue;
        }
        // The per-case report says what was expected and what happened.
        let detail = case["reportfile"]
            .as_str()
            .map(|file| read_case_report(&outdir.join(file)))
            .map(|report| {
                format!(
                    "{}\n      expected: {}\n      result: {}\n      close: {}\n      remote close code: {}",
                    report["description"].as_str().unwrap_or("").trim(),
                    report["expectation"].as_str().unwrap_or("").trim(),
                    report["result"].as_str().unwrap_or("").trim(),
                    report["resultClose"].as_str().unwrap_or("").trim(),
                    case["remoteCloseCode"],
                )
            })
            .unwrap_or_default();
        failures.push((
            id.clone(),
            format!("behavior {behavior}, close {}: {detail}", close.unwrap_or("-")),
        ));
    }

    let summary: Vec<String> =
        by_outcome.iter().map(|(outcome, n)| format!("{outcome} {n}")).collect();
    eprintln!(
        "autobahn summary: {} cases: {} ({} failing; {:.0} s)",
        cases.len(),
        summary.join(", "),
        failures.len(),
        took.as_secs_f64()
    );
    let listing: Vec<String> = failures.iter().map(|(id, why)| format!("  {id}: {why}")).collect();
    if !failures.is_empty() {
        // Keep the reports (index.html, one JSON per case with its wire log) to look at.
        drop(server);
        let kept = dir.keep();
        panic!(
            "{} Autobahn cases failed (reports kept in {}):\n{}",
            failures.len(),
            kept.join("reports").display(),
            listing.join("\n")
        );
    }
    assert!(
        cases.len() >= MIN_CASES,
        "index.json has {} cases, expected at least {MIN_CASES}; wstest output ends:\n{}",
        cases.len(),
        tail(&output, 40)
    );
}
