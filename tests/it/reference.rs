//! The generated references and the Grafana dashboard (issue 35), checked against the
//! real binary:
//!
//! - each page `docs/src/reference/*.md` is exactly what `livegate reference NAME`
//!   prints; a difference fails with the first differing line and the command that
//!   regenerates the page;
//! - the pages hold what they promise: every configuration key with its variable and
//!   flag, every error code with its HTTP status, every close code, and every metric a
//!   running `livegate serve` exports at `/metrics`;
//! - every metric name a query of `data/grafana/livegate.json` (each `expr`, and the
//!   template variables' `definition`) names is one `/metrics`
//!   of a running single node exports (with its `_total`, `_bucket`, `_sum` or `_count`
//!   sample suffix), on a single node and on a cluster node (a real nats-server), where
//!   the NATS connection gauge must read 1. A family with no series until it is
//!   configured (`livegate_peer_up`: one per configured peer, peers mode;
//!   `livegate_cell_mirror_lag_events`: one per other cell, cells with their own NATS) is
//!   checked against the metrics page instead, whose rows come from the same registry;
//!   the test names the only ones allowed that way. The dashboard shows the process's
//!   threads, connections against capacity and the lag;
//! - the alert rules `data/prometheus/livegate-rules.yml` pass `promtool check rules` and
//!   their unit tests (`tests/prometheus/livegate-rules.test.yml`, `promtool test rules`:
//!   the consumer lag over the seed's 10,000 events for a minute fires, and the others),
//!   and every metric they name is on the metrics page. promtool is Debian's `prometheus`
//!   package (`.ci/test` installs it); a missing promtool fails the test, never skips it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};

use livegate::config::KEY_DOCS;
use livegate::protocol::{CloseCode, ErrorCode};
use livegate::reference::Reference;
use serde_json::Value;

use crate::common::process::{metric, ServeProcess};
use crate::common::REPO;

/// Where the dashboard lives, from the repository's root.
const DASHBOARD: &str = "data/grafana/livegate.json";

/// `livegate reference NAME`'s stdout, asserting it exits 0.
fn printed(reference: Reference) -> String {
    let mut cmd = Command::new(crate::common::livegate_bin());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("LIVEGATE_") {
            cmd.env_remove(name);
        }
    }
    let output = cmd
        .args(["reference", reference.name()])
        .stdin(Stdio::null())
        .output()
        .expect("run livegate reference");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "livegate reference {} exited {}: {stderr}",
        reference.name(),
        output.status
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn page(reference: Reference) -> String {
    let path = Path::new(REPO).join(reference.page());
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Where `page` first differs from `printed`, for the failure message.
fn first_difference(page: &str, printed: &str) -> String {
    let (mut page_lines, mut printed_lines) = (page.lines(), printed.lines());
    for number in 1.. {
        match (page_lines.next(), printed_lines.next()) {
            (Some(a), Some(b)) if a == b => continue,
            (None, None) => return "the line endings differ".to_string(),
            (a, b) => return format!("line {number}:\n  - page:    {a:?}\n  + printed: {b:?}"),
        }
    }
    unreachable!()
}

#[test]
fn each_book_page_is_what_the_binary_prints() {
    let _gate = crate::common::gate!();
    let mut stale = Vec::new();
    for reference in Reference::ALL {
        let (page, printed) = (page(reference), printed(reference));
        if page != printed {
            stale.push(format!(
                "{} differs from `livegate reference {}`, at {}\n  regenerate it: cargo build --release --bin livegate && target/release/livegate reference {} > {}",
                reference.page(),
                reference.name(),
                first_difference(&page, &printed),
                reference.name(),
                reference.page(),
            ));
        }
    }
    assert!(stale.is_empty(), "generated pages out of date:\n{}", stale.join("\n"));
}

#[test]
fn the_pages_hold_every_key_and_code() {
    let _gate = crate::common::gate!();
    let config = page(Reference::Config);
    for key in KEY_DOCS {
        let row = config.lines().find(|line| line.starts_with(&format!("| `{}` |", key.name)));
        let row = row.unwrap_or_else(|| {
            panic!("no row for key {} in {}", key.name, Reference::Config.page())
        });
        let (env, flag) = (
            format!("`LIVEGATE_{}`", key.name.to_uppercase()),
            format!("`--{} ", key.name.replace('_', "-")),
        );
        assert!(row.contains(&env) && row.contains(&flag), "{row}: lacks {env} or {flag}");
        assert!(
            row.contains(&format!("| {} |", key.default)),
            "{row}: lacks the default {}",
            key.default
        );
    }
    let history = config.lines().find(|l| l.starts_with("| `history_size` |")).unwrap();
    assert!(history.contains("| 1 to 1000000 |"), "history_size's bounds: {history}");

    let errors = page(Reference::Errors);
    for code in ErrorCode::ALL {
        let row = format!("| `{}` | {} |", code.as_str(), code.http_status());
        assert!(errors.contains(&row), "{} lacks {row}", Reference::Errors.page());
    }
    assert!(
        errors.contains("| `payload_too_large` | 413 |")
            && errors.contains("| `wrong_node` | 421 |"),
        "{errors}"
    );

    let closes = page(Reference::CloseCodes);
    for code in CloseCode::ALL {
        let reconnect = if code.reconnect() { "yes" } else { "no" };
        let row = closes.lines().find(|l| l.starts_with(&format!("| {} |", code.code())));
        let row = row.unwrap_or_else(|| {
            panic!("{} has no row for {}", Reference::CloseCodes.page(), code.code())
        });
        let cells: Vec<&str> = row.split(" | ").collect();
        assert_eq!(cells.get(3).copied(), Some(reconnect), "the Reconnect column of {row}");
        assert!(
            cells.len() == 5 && row.ends_with(" |") && cells[4].len() > 3,
            "a What the client does column: {row}"
        );
    }
    assert!(
        closes.contains("| 4009 | `SlowConsumer` |") && closes.contains("| 4502 | `Kicked` |"),
        "{closes}"
    );
    // Codes livegate never sends are not in the main table, but a client still learns
    // what 1001 and 1006 mean; 4503 is nowhere (never sent).
    let (sent, other) = closes
        .split_once("## Codes livegate does not send")
        .expect("a section for codes livegate does not send");
    assert!(
        !sent.contains("| 1001 |") && other.contains("| 1001 |") && other.contains("| 1006 |"),
        "{closes}"
    );
    assert!(!closes.contains("4503"), "{closes}");
}

/// The families of a scrape (`# TYPE NAME KIND`) with the names of their samples.
fn scraped(text: &str) -> (Vec<(String, String)>, BTreeSet<String>) {
    let families = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect();
    let samples = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap_or("").to_string())
        .collect();
    (families, samples)
}

/// A real `livegate serve` (single node) and its `/metrics` text.
fn scrape_real_binary() -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let server = ServeProcess::start(&data, &dir.path().join("log"), &[]);
    server.http().metrics_text()
}

#[test]
fn the_metrics_page_lists_every_metric_a_running_server_exports() {
    let _gate = crate::common::gate!();
    let text = scrape_real_binary();
    let (families, _) = scraped(&text);
    assert!(families.len() >= 40, "only {} families on /metrics:\n{text}", families.len());
    let metrics = page(Reference::Metrics);
    for (name, kind) in families {
        let exported = if kind == "counter" { format!("{name}_total") } else { name.clone() };
        let row = format!("| `{exported}` | {kind} |");
        assert!(
            metrics.contains(&row),
            "{} lacks {row} (exported by /metrics)",
            Reference::Metrics.page()
        );
    }
}

/// Every query anywhere in the dashboard's JSON: each `expr` and `definition` string.
fn exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    // A panel's query, or a template variable's (`label_values(...)`).
                    ("expr" | "definition", Value::String(expr)) => out.push(expr.clone()),
                    _ => exprs(inner, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| exprs(item, out)),
        _ => {}
    }
}

/// The `livegate_*` metric names a PromQL expression names.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("livegate_") {
        let before = rest[..at].chars().next_back();
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.insert(name.clone());
        }
        rest = &rest[at + name.len()..];
    }
    names
}

/// The dashboard's JSON, after the checks of its form: the templated datasource and a
/// p99 over the latency histogram's buckets.
fn dashboard() -> Value {
    let path = Path::new(REPO).join(DASHBOARD);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let dashboard: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"));
    assert!(
        text.contains("${DS_PROMETHEUS}"),
        "{DASHBOARD}: panels should use the templated datasource ${{DS_PROMETHEUS}}"
    );
    let templated = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v["type"] == "datasource" && v["query"] == "prometheus");
    assert!(templated, "{DASHBOARD}: no Prometheus datasource variable in templating.list");
    dashboard
}

/// Every metric name the dashboard queries.
fn queried_metrics() -> BTreeSet<String> {
    let mut all = Vec::new();
    exprs(&dashboard(), &mut all);
    assert!(all.len() >= 15, "{DASHBOARD}: only {} queries", all.len());
    let latency = "livegate_delivery_latency_seconds_bucket";
    assert!(
        all.iter().any(|e| e.contains("histogram_quantile(0.99") && e.contains(latency)),
        "{DASHBOARD}: no p99 over {latency}"
    );
    let queried: BTreeSet<String> = all.iter().flat_map(|expr| metric_names(expr)).collect();
    for wanted in [
        "livegate_connections_by_transport",
        "livegate_slow_consumer_closes_total",
        "livegate_limit_hits_total",
        "livegate_cluster_nats_connected",
        "livegate_process_threads",
        "livegate_connection_capacity",
        "livegate_consumer_lag_events",
        "livegate_consumer_lag_seconds",
        "livegate_cell_mirror_lag_events",
    ] {
        assert!(queried.contains(wanted), "{DASHBOARD} does not show {wanted}");
    }
    queried
}

/// The families with no series until configured, which the dashboard may query.
const CONFIGURED_SERIES: [&str; 2] = ["livegate_cell_mirror_lag_events", "livegate_peer_up"];

/// The queried names `scrape` has no sample of: those the metrics page lists, and those
/// it does not either.
fn missing_from(scrape: &str, queried: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let (_, samples) = scraped(scrape);
    let metrics_page = page(Reference::Metrics);
    queried
        .iter()
        .filter(|name| !samples.contains(*name))
        .cloned()
        .partition(|name| metrics_page.contains(&format!("| `{name}` |")))
}

#[test]
fn the_dashboard_queries_only_metrics_a_single_node_exports() {
    let _gate = crate::common::gate!();
    let queried = queried_metrics();
    let (by_page, unknown) = missing_from(&scrape_real_binary(), &queried);
    assert!(
        unknown.is_empty(),
        "{DASHBOARD} queries metrics livegate does not export: {unknown:?}"
    );
    // Only the per-peer and per-cell gauges may be absent from a single node's scrape:
    // they have a series per configured peer (peers mode) or per other cell (cells with
    // their own NATS), and the metrics page lists them.
    assert_eq!(
        by_page,
        CONFIGURED_SERIES,
        "checked against {} instead of /metrics",
        Reference::Metrics.page()
    );
}

/// In cluster mode (one node on a real nats-server), the cluster row's metrics are there
/// with values: the node says it is connected to NATS.
#[test]
fn the_dashboard_queries_only_metrics_a_cluster_node_exports() {
    let _gate = crate::common::gate!();
    let queried = queried_metrics();
    let cluster = crate::common::nats::Cluster::start(1, &[]);
    let http = cluster.http(0);
    let connected = crate::common::wait_until(crate::common::WAIT, || {
        metric(&http, "livegate_cluster_nats_connected") == Some(1.0)
    });
    assert!(
        connected,
        "livegate_cluster_nats_connected is not 1 on a cluster node:\n{}",
        http.metrics_text()
    );
    let (by_page, unknown) = missing_from(&http.metrics_text(), &queried);
    assert!(
        unknown.is_empty(),
        "{DASHBOARD} queries metrics livegate does not export: {unknown:?}"
    );
    assert_eq!(by_page, CONFIGURED_SERIES, "a cluster node lacks these");
}

/// The alert rules and their promtool unit tests, from the repository's root.
const RULES: &str = "data/prometheus/livegate-rules.yml";
const RULES_TESTS: &str = "tests/prometheus/livegate-rules.test.yml";

/// `promtool ARGS` from the repository's root, asserting it exits 0; its output.
fn promtool(args: &[&str]) -> String {
    let program = std::env::var_os("LIVEGATE_PROMTOOL").unwrap_or_else(|| "promtool".into());
    let output = Command::new(&program).args(args).current_dir(REPO).stdin(Stdio::null()).output().unwrap_or_else(|e| {
        panic!("cannot run {program:?} ({e}): install Debian's prometheus package, which carries promtool (.ci/test does), or set LIVEGATE_PROMTOOL")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {} exited {}:\n{text}",
        args.join(" "),
        output.status
    );
    text
}

#[test]
fn the_alert_rules_pass_promtool_and_name_only_metrics_livegate_exports() {
    let _gate = crate::common::gate!();
    let checked = promtool(&["check", "rules", RULES]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", RULES_TESTS]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    let rules = std::fs::read_to_string(Path::new(REPO).join(RULES))
        .unwrap_or_else(|e| panic!("cannot read {RULES}: {e}"));
    assert!(
        rules.contains("expr: livegate_consumer_lag_events > 10000\n        for: 1m"),
        "{RULES}: no alert at the seed's 10,000 events for 1m"
    );
    let named = metric_names(&rules);
    for wanted in [
        "livegate_consumer_lag_events",
        "livegate_consumer_lag_seconds",
        "livegate_cell_mirror_lag_events",
        "livegate_process_open_files",
        "livegate_process_max_open_files",
        "livegate_connections_by_transport",
        "livegate_connection_capacity",
    ] {
        assert!(named.contains(wanted), "{RULES} has no rule on {wanted}");
    }
    let metrics = page(Reference::Metrics);
    for name in &named {
        let family = name.strip_suffix("_bucket").unwrap_or(name);
        assert!(
            metrics.contains(&format!("| `{family}` |")),
            "{RULES} names {name}, which {} does not list",
            Reference::Metrics.page()
        );
    }
}

#[test]
fn metric_names_are_read_from_promql() {
    let _gate = crate::common::gate!();
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(livegate_delivery_latency_seconds_bucket{job="x"}[5m]))) / my_livegate_x + livegate_a:b"#;
    let names: Vec<String> = metric_names(expr).into_iter().collect();
    assert_eq!(names, ["livegate_a:b", "livegate_delivery_latency_seconds_bucket"]);
}
