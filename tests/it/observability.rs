//! Observability and operations (issue 6): `/metrics`, `/v1/admin/status`, the logs and
//! `livegate check-config` / `livegate status`, checked from the outside.
//!
//! - A run (connect, subscribe, publish with a duplicate, refuse a bad token, kick,
//!   reconnect with recovery) moves every counter by exactly what it did, and the
//!   histograms have samples that agree with the counters.
//! - Disconnects are counted under the code the connection really ended with: 1006 for a
//!   socket that just ended, never 1002 (protocol error) for a client that left.
//! - The real binary drained with SIGTERM shows the drain in `/metrics` and
//!   `/v1/admin/status`; restarted on the same data dir its counters start from zero and
//!   warm-up is on.
//! - Every scrape in this file goes through a strict OpenMetrics text parser written here
//!   (no crate: `prometheus-parse` skips lines and values it cannot read and knows neither
//!   `# UNIT` nor `# EOF`; `openmetrics-parser` is LGPL-3.0). It checks every line, HELP
//!   and TYPE for each family, sample names per type, histogram buckets, units in names,
//!   bounded labels (never a user or a room) and `# EOF` last.
//! - The logs of a full run at `RUST_LOG=debug` (pretty and JSON) hold neither the API
//!   key, a wrong key that was tried, nor any token; nor does `check-config` output.
//! - `check-config` on the example config and on bad files (a TOML syntax error names its
//!   line); precedence file < env < flag.
//! - `livegate status` against a running server.
//!
//! Every wait is bounded.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::process::ServeProcess;
use common::*;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

// =======================================================================================
// A strict OpenMetrics 1.0 text parser (the subset a scrape can contain)
// =======================================================================================

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    /// Sorted by label name.
    labels: Vec<(String, String)>,
    value: f64,
}

#[derive(Debug, Default)]
struct Family {
    kind: Option<String>,
    help: Option<String>,
    unit: Option<String>,
    samples: Vec<Sample>,
}

#[derive(Debug, Default)]
struct Exposition {
    families: BTreeMap<String, Family>,
}

impl Exposition {
    fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.families.values().flat_map(|f| f.samples.iter())
    }

    /// The sample `name` with exactly `labels` (in any order).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut want: Vec<(String, String)> =
            labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        want.sort();
        self.samples().find(|s| s.name == name && s.labels == want).map(|s| s.value)
    }

    /// An unlabelled sample that must be there.
    fn one(&self, name: &str) -> f64 {
        self.get(name, &[]).unwrap_or_else(|| panic!("no sample {name} in /metrics"))
    }

    /// A labelled series; 0 when that label value was never used.
    fn of(&self, name: &str, label: &str, value: &str) -> f64 {
        self.get(name, &[(label, value)]).unwrap_or(0.0)
    }

    /// The sum of `name` over all its label sets.
    fn sum(&self, name: &str) -> f64 {
        self.samples().filter(|s| s.name == name).map(|s| s.value).sum()
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().skip(1).all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with("__")
}

/// An OpenMetrics number: a decimal or exponent form, `+Inf`, `-Inf` or `NaN` (not Rust's
/// `inf`, `infinity`, `nan`).
fn parse_number(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ if !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
            && s.bytes().any(|b| b.is_ascii_digit()) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}

/// The sample names a family of `kind` may hold, as suffixes of the family name.
fn sample_suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "histogram" => &["_bucket", "_count", "_sum", "_created"],
        "gaugehistogram" => &["_bucket", "_gcount", "_gsum"],
        "summary" => &["", "_count", "_sum", "_created"],
        "info" => &["_info"],
        "gauge" | "stateset" | "unknown" => &[""],
        _ => &[],
    }
}

/// HELP text: `\\`, `\n` and `\"` are the only escapes.
fn check_escapes(text: &str) -> Result<(), String> {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && !matches!(chars.next(), Some('\\' | 'n' | '"')) {
            return Err("bad escape sequence".into());
        }
    }
    Ok(())
}

/// One sample line: `name{l="v",...} value [timestamp]`.
fn parse_sample_line(line: &str) -> Result<(String, Vec<(String, String)>, f64), String> {
    let name_end = line.find(['{', ' ']).ok_or("a sample needs a value")?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err(format!("{name:?} is not a metric name"));
    }
    let mut rest = &line[name_end..];
    let mut labels: Vec<(String, String)> = Vec::new();
    if let Some(mut r) = rest.strip_prefix('{') {
        if let Some(after) = r.strip_prefix('}') {
            r = after;
        } else {
            loop {
                let eq = r.find('=').ok_or("label without =")?;
                let label = &r[..eq];
                if !is_label_name(label) {
                    return Err(format!("{label:?} is not a label name"));
                }
                r = r[eq + 1..].strip_prefix('"').ok_or("label value must be quoted")?;
                let mut value = String::new();
                let mut chars = r.char_indices();
                let end = loop {
                    match chars.next() {
                        None => return Err("unterminated label value".into()),
                        Some((j, '"')) => break j,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => value.push('\\'),
                            Some((_, '"')) => value.push('"'),
                            Some((_, 'n')) => value.push('\n'),
                            _ => return Err("bad escape in a label value".into()),
                        },
                        Some((_, c)) => value.push(c),
                    }
                };
                r = &r[end + 1..];
                if labels.iter().any(|(l, _)| l == label) {
                    return Err(format!("label {label} given twice"));
                }
                labels.push((label.to_string(), value));
                if let Some(after) = r.strip_prefix(',') {
                    r = after;
                    continue;
                }
                r = r.strip_prefix('}').ok_or("expected , or } after a label")?;
                break;
            }
        }
        rest = r;
    }
    let rest = rest.strip_prefix(' ').ok_or("expected one space before the value")?;
    let mut parts = rest.split(' ');
    let value_text = parts.next().unwrap_or("");
    let value =
        parse_number(value_text).ok_or_else(|| format!("{value_text:?} is not a number"))?;
    if let Some(ts) = parts.next() {
        parse_number(ts)
            .filter(|t| t.is_finite())
            .ok_or_else(|| format!("{ts:?} is not a timestamp"))?;
    }
    if let Some(extra) = parts.next() {
        return Err(format!("unexpected {extra:?} after value and timestamp"));
    }
    labels.sort();
    Ok((name.to_string(), labels, value))
}

/// Parses a whole exposition; the first problem is the error, with its line number.
fn parse_exposition(text: &str) -> Result<Exposition, String> {
    if text.contains('\r') {
        return Err("carriage return in the exposition".into());
    }
    let body = text
        .strip_suffix("# EOF\n")
        .or_else(|| text.strip_suffix("# EOF"))
        .ok_or("the exposition does not end with `# EOF`")?;
    if !body.is_empty() && !body.ends_with('\n') {
        return Err("`# EOF` is not on a line of its own".into());
    }
    let mut exp = Exposition::default();
    let mut current: Option<String> = None;
    let mut series: HashSet<(String, Vec<(String, String)>)> = HashSet::new();
    for (i, line) in body.lines().enumerate() {
        let bad = |why: String| format!("line {}: {why}: {line:?}", i + 1);
        if line.is_empty() {
            return Err(bad("empty line".into()));
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest
                .strip_prefix(' ')
                .ok_or_else(|| bad("comment without a space after #".into()))?;
            if rest == "EOF" {
                return Err(bad("`# EOF` before the end".into()));
            }
            let (keyword, rest) =
                rest.split_once(' ').ok_or_else(|| bad("metadata without a metric name".into()))?;
            let (name, value) =
                rest.split_once(' ').ok_or_else(|| bad("metadata without a value".into()))?;
            if !is_metric_name(name) {
                return Err(bad(format!("{name:?} is not a metric name")));
            }
            if current.as_deref() != Some(name) {
                if exp.families.contains_key(name) {
                    return Err(bad(format!(
                        "family {name} is declared twice (families must not interleave)"
                    )));
                }
                exp.families.insert(name.to_string(), Family::default());
                current = Some(name.to_string());
            }
            let family = exp.families.get_mut(name).expect("just inserted");
            if !family.samples.is_empty() {
                return Err(bad("metadata after the family's samples".into()));
            }
            let slot = match keyword {
                "HELP" => {
                    check_escapes(value).map_err(&bad)?;
                    &mut family.help
                }
                "TYPE" => {
                    if sample_suffixes(value).is_empty() {
                        return Err(bad(format!("unknown type {value:?}")));
                    }
                    &mut family.kind
                }
                "UNIT" => {
                    if value.is_empty()
                        || !value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                    {
                        return Err(bad(format!("bad unit {value:?}")));
                    }
                    &mut family.unit
                }
                other => return Err(bad(format!("unknown metadata `# {other}`"))),
            };
            if slot.is_some() {
                return Err(bad(format!("second # {keyword} for {name}")));
            }
            *slot = Some(value.to_string());
            continue;
        }
        let (name, labels, value) = parse_sample_line(line).map_err(&bad)?;
        let family_name =
            current.clone().ok_or_else(|| bad("sample before any metadata".into()))?;
        let family = exp.families.get_mut(&family_name).expect("current family exists");
        let kind = family
            .kind
            .clone()
            .ok_or_else(|| bad(format!("sample of {family_name}, which has no # TYPE")))?;
        let suffix = name
            .strip_prefix(family_name.as_str())
            .ok_or_else(|| bad(format!("sample {name} outside its family {family_name}")))?;
        if !sample_suffixes(&kind).contains(&suffix) {
            return Err(bad(format!(
                "a {kind} family ({family_name}) cannot hold a sample named {name}"
            )));
        }
        if !series.insert((name.clone(), labels.clone())) {
            return Err(bad("the same series twice".into()));
        }
        family.samples.push(Sample { name, labels, value });
    }
    for (name, family) in &exp.families {
        let kind = family.kind.as_deref().ok_or_else(|| format!("family {name} has no # TYPE"))?;
        if family.help.is_none() {
            return Err(format!("family {name} has no # HELP"));
        }
        if let Some(unit) = &family.unit {
            if !name.ends_with(&format!("_{unit}")) {
                return Err(format!(
                    "family {name} has # UNIT {unit} but its name does not end in _{unit}"
                ));
            }
        }
        match kind {
            "counter" => {
                for s in family.samples.iter().filter(|s| s.name.ends_with("_total")) {
                    if !(s.value.is_finite() && s.value >= 0.0) {
                        return Err(format!(
                            "counter sample {} {:?} = {}",
                            s.name, s.labels, s.value
                        ));
                    }
                }
            }
            "histogram" => check_histogram(name, family)?,
            _ => {}
        }
    }
    Ok(exp)
}

/// Per label set: buckets with ascending `le` ending at `+Inf`, cumulative counts, and
/// `_count` equal to the `+Inf` bucket, and a `_sum`.
fn check_histogram(name: &str, family: &Family) -> Result<(), String> {
    let mut groups: BTreeMap<Vec<(String, String)>, (Vec<(f64, f64)>, Option<f64>, Option<f64>)> =
        BTreeMap::new();
    for s in &family.samples {
        let le = s.labels.iter().find(|(l, _)| l == "le").map(|(_, v)| v.clone());
        let rest: Vec<(String, String)> =
            s.labels.iter().filter(|(l, _)| l != "le").cloned().collect();
        let group = groups.entry(rest).or_default();
        let suffix = &s.name[name.len()..];
        match (suffix, le) {
            ("_bucket", Some(le)) => {
                let bound = parse_number(&le)
                    .ok_or_else(|| format!("{name}: le={le:?} is not a number"))?;
                group.0.push((bound, s.value));
            }
            ("_bucket", None) => return Err(format!("{name}: bucket without le")),
            (_, Some(_)) => return Err(format!("{name}: {} with an le label", s.name)),
            ("_count", None) => group.1 = Some(s.value),
            ("_sum", None) => group.2 = Some(s.value),
            _ => {}
        }
    }
    for (labels, (buckets, count, sum)) in &groups {
        let what = format!("{name}{labels:?}");
        let last = buckets.last().ok_or_else(|| format!("{what}: no buckets"))?;
        if last.0 != f64::INFINITY {
            return Err(format!("{what}: the last bucket is le={}, not +Inf", last.0));
        }
        for pair in buckets.windows(2) {
            if pair[0].0 >= pair[1].0 || pair[0].1 > pair[1].1 {
                return Err(format!("{what}: buckets {pair:?} are not ascending and cumulative"));
            }
        }
        if buckets.iter().any(|b| !(b.1 >= 0.0 && b.1.is_finite())) {
            return Err(format!("{what}: negative or non-finite bucket count"));
        }
        match count {
            Some(c) if *c == last.1 => {}
            other => {
                return Err(format!(
                    "{what}: _count {other:?} differs from the +Inf bucket {}",
                    last.1
                ))
            }
        }
        if sum.is_none_or(|s| s.is_nan()) {
            return Err(format!("{what}: no _sum"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// What livegate's exposition must hold
// ---------------------------------------------------------------------------------------

/// Every family: name, type, unit, label names.
const FAMILIES: &[(&str, &str, Option<&str>, &[&str])] = &[
    ("livegate_connections_open", "gauge", None, &["device"]),
    ("livegate_connections_by_transport", "gauge", None, &["transport"]),
    ("livegate_connects", "counter", None, &[]),
    ("livegate_disconnects", "counter", None, &["code"]),
    ("livegate_handshake_rejections", "counter", None, &["reason"]),
    ("livegate_handshakes", "counter", None, &["credential"]),
    ("livegate_tokens_minted", "counter", None, &[]),
    ("livegate_limit_hits", "counter", None, &["limit"]),
    ("livegate_subscriptions", "gauge", None, &[]),
    ("livegate_rooms_live", "gauge", None, &[]),
    ("livegate_rooms_parked", "gauge", None, &[]),
    ("livegate_events_published", "counter", None, &[]),
    ("livegate_events_delivered", "counter", None, &[]),
    ("livegate_duplicates_rejected", "counter", None, &[]),
    ("livegate_client_publishes", "counter", None, &["outcome"]),
    ("livegate_delivery_latency_seconds", "histogram", Some("seconds"), &[]),
    ("livegate_batch_events", "histogram", None, &[]),
    ("livegate_frames_written", "counter", None, &[]),
    ("livegate_outbox_high_water_bytes", "gauge", Some("bytes"), &[]),
    ("livegate_slow_consumer_closes", "counter", None, &[]),
    ("livegate_history_trimmed", "counter", None, &[]),
    ("livegate_state_reads", "counter", None, &[]),
    ("livegate_recoveries", "counter", None, &["result"]),
    ("livegate_directory_writes", "counter", None, &["result"]),
    ("livegate_migrations", "counter", None, &[]),
    ("livegate_migration_refusals", "counter", None, &[]),
    ("livegate_peer_up", "gauge", None, &["peer"]),
    ("livegate_warmup_active", "gauge", None, &[]),
    ("livegate_warmup_reconnect_attempts", "counter", None, &[]),
    ("livegate_warmup_reconnect_successes", "counter", None, &[]),
    ("livegate_drain_phase", "gauge", None, &[]),
    ("livegate_drain_connections_left", "gauge", None, &[]),
    ("livegate_store_flush_latency_seconds", "histogram", Some("seconds"), &[]),
    ("livegate_store_size_bytes", "gauge", Some("bytes"), &[]),
];

const CLOSE_CODES: &[&str] = &[
    "1000", "1001", "1002", "1005", "1006", "1007", "1008", "1009", "1012", "4008", "4009", "4029",
    "4421", "4501", "4502", "other",
];
const REASONS: &[&str] = &[
    "missing_token",
    "invalid_token",
    "token_expired",
    "token_replayed",
    "unavailable",
    "migration_budget",
    "wrong_node",
    "bad_request",
    "internal",
    "too_many_connections",
    "rate_limited",
    "forbidden_origin",
    "directory_unavailable",
    "resume_invalid",
    "bad_room",
    "too_many_subscriptions",
    "forbidden",
];
/// The abuse limits `livegate_limit_hits_total` counts.
const LIMITS: &[&str] = &[
    "connections",
    "connections_per_ip",
    "handshake_rate",
    "message_rate",
    "bad_messages",
    "subscriptions",
    "history_limit",
    "subscribe_timeout",
    "frame_size",
    "message_size",
    "origin",
    "handshake_timeout",
    "room_starts",
    "http_connections",
];
/// Label names that would make cardinality unbounded (one series per user, room, ...).
const UNBOUNDED_LABELS: &[&str] = &[
    "user",
    "user_id",
    "room",
    "room_id",
    "session",
    "session_id",
    "token",
    "conn",
    "connection",
    "ip",
    "addr",
    "event",
    "id",
];

/// Checks livegate's families on a parsed exposition: every expected family with its
/// type, unit and label names; units in names; bounded label values. `devices`: the
/// configured exclusive device kinds (reported as themselves besides `web` and `other`).
fn check_livegate(exp: &Exposition, devices: &[&str]) {
    for (name, kind, unit, labels) in FAMILIES {
        // prometheus-client leaves out a labelled family until its first label set is
        // used (see the report); unlabelled families are always there.
        let Some(family) = exp.families.get(*name) else {
            assert!(!labels.is_empty(), "/metrics has no family {name}");
            continue;
        };
        assert_eq!(family.kind.as_deref(), Some(*kind), "type of {name}");
        assert_eq!(family.unit.as_deref(), *unit, "# UNIT of {name}");
        for s in &family.samples {
            for (label, value) in &s.labels {
                if label == "le" && *kind == "histogram" {
                    continue;
                }
                assert!(
                    labels.contains(&label.as_str()),
                    "{} has label {label}={value:?}; {name} may only have {labels:?}",
                    s.name
                );
                let allowed: Option<Vec<&str>> = match (*name, label.as_str()) {
                    ("livegate_connections_open", "device") => {
                        Some(devices.iter().copied().chain(["web", "other"]).collect())
                    }
                    ("livegate_disconnects", "code") => Some(CLOSE_CODES.to_vec()),
                    ("livegate_handshake_rejections", "reason") => Some(REASONS.to_vec()),
                    ("livegate_handshakes", "credential") => Some(vec!["token", "jwt", "resume"]),
                    ("livegate_connections_by_transport", "transport") => {
                        Some(vec!["websocket", "sse"])
                    }
                    ("livegate_limit_hits", "limit") => Some(LIMITS.to_vec()),
                    ("livegate_recoveries", "result") => Some(vec!["recovered", "not_recovered"]),
                    ("livegate_directory_writes", "result") => Some(vec!["ok", "stale", "error"]),
                    _ => None,
                };
                if let Some(allowed) = allowed {
                    assert!(
                        allowed.contains(&value.as_str()),
                        "{}{{{label}={value:?}}}: value outside {allowed:?}",
                        s.name
                    );
                }
            }
        }
    }
    for (name, family) in &exp.families {
        assert!(name.starts_with("livegate_"), "family {name} lacks the livegate_ prefix");
        for s in &family.samples {
            for (label, value) in &s.labels {
                assert!(
                    !UNBOUNDED_LABELS.contains(&label.as_str()),
                    "{} has an unbounded label {label}={value:?}",
                    s.name
                );
            }
        }
        // Units in names: time in seconds, sizes in bytes, and no other unit.
        let timeish = ["latency", "duration", "seconds", "_time"].iter().any(|w| name.contains(w));
        let sizeish = ["bytes", "_size"].iter().any(|w| name.contains(w));
        if timeish {
            assert!(
                name.ends_with("_seconds") && family.unit.as_deref() == Some("seconds"),
                "{name}: a time must be in _seconds with # UNIT seconds"
            );
        }
        if sizeish {
            assert!(
                name.ends_with("_bytes") && family.unit.as_deref() == Some("bytes"),
                "{name}: a size must be in _bytes with # UNIT bytes"
            );
        }
        for other in [
            "_ms",
            "_millis",
            "_milliseconds",
            "_secs",
            "_sec",
            "_us",
            "_ns",
            "_minutes",
            "_hours",
            "_kb",
            "_kib",
            "_mb",
            "_mib",
        ] {
            assert!(
                !name.ends_with(other),
                "{name}: use base units (_seconds, _bytes), not {other}"
            );
        }
    }
}

/// GET /metrics, parsed strictly and checked against livegate's families.
fn scrape(http: &Http, devices: &[&str]) -> Exposition {
    let text = http.metrics_text();
    let exp = parse_exposition(&text)
        .unwrap_or_else(|e| panic!("/metrics is not valid OpenMetrics text: {e}\n---\n{text}"));
    check_livegate(&exp, devices);
    exp
}

/// The default exclusive devices.
const DEVICES: &[&str] = &["phone", "pc"];

/// Polls `/metrics` until `series` (name plus exact labels) has `want`; panics after 5 s.
fn wait_metric(http: &Http, name: &str, labels: &[(&str, &str)], want: f64) -> Exposition {
    let mut got = 0.0;
    common::wait_for(Duration::from_secs(5), || {
        let exp = scrape(http, DEVICES);
        got = exp.get(name, labels).unwrap_or(0.0);
        (got == want).then_some(exp)
    })
    .unwrap_or_else(|| {
        panic!("{name}{labels:?} is {got}, expected {want} within 5 s\n{}", http.metrics_text())
    })
}

/// Every `_total` sample is 0 and every histogram empty.
fn assert_counters_zero(exp: &Exposition, when: &str) {
    for s in exp.samples() {
        if s.name.ends_with("_total") || s.name.ends_with("_count") || s.name.ends_with("_bucket") {
            assert_eq!(s.value, 0.0, "{when}: {} {:?} must be 0", s.name, s.labels);
        }
    }
}

// =======================================================================================
// The parser itself is strict
// =======================================================================================

#[test]
fn strict_parser_rejects_malformed_expositions() {
    let _gate = crate::common::gate!();
    let good = [
        "# HELP a_x Things.",
        "# TYPE a_x counter",
        "a_x_total{k=\"v\\\"q\"} 3",
        "# HELP a_h_seconds Hist.",
        "# TYPE a_h_seconds histogram",
        "# UNIT a_h_seconds seconds",
        "a_h_seconds_bucket{le=\"0.5\"} 1",
        "a_h_seconds_bucket{le=\"+Inf\"} 2",
        "a_h_seconds_count 2",
        "a_h_seconds_sum 1.5",
        "# EOF",
        "",
    ]
    .join("\n");
    let exp =
        parse_exposition(&good).unwrap_or_else(|e| panic!("a valid exposition was refused: {e}"));
    assert_eq!(exp.get("a_x_total", &[("k", "v\"q")]), Some(3.0));
    assert_eq!(exp.one("a_h_seconds_count"), 2.0);

    let bad: &[(&str, String)] = &[
        ("no EOF", good.replace("# EOF\n", "")),
        ("EOF not last", good.replace("# EOF\n", "# EOF\nx 1\n")),
        ("empty line", good.replacen('\n', "\n\n", 1)),
        ("no HELP", good.replace("# HELP a_x Things.\n", "")),
        ("no TYPE", good.replace("# TYPE a_x counter\n", "")),
        ("counter without _total", good.replace("a_x_total{", "a_x{")),
        ("value not a number", good.replace("} 3\n", "} three\n")),
        ("Rust-only number", good.replace("} 3\n", "} inf\n")),
        ("two spaces", good.replace("} 3\n", "}  3\n")),
        ("trailing garbage", good.replace("} 3\n", "} 3 4 5\n")),
        ("bad escape", good.replace("v\\\"q", "v\\q")),
        ("unquoted label", good.replace("k=\"v\\\"q\"", "k=v")),
        ("trailing comma", good.replace("k=\"v\\\"q\"}", "k=\"v\\\"q\",}")),
        ("duplicate label", good.replace("k=\"v\\\"q\"", "k=\"a\",k=\"b\"")),
        ("bad label name", good.replace("k=", "1k=")),
        ("sample of another family", good.replace("a_x_total{", "b_x_total{")),
        ("interleaved family", good.replace("# EOF\n", "# HELP a_x again\n# EOF\n")),
        (
            "metadata after samples",
            good.replace("a_h_seconds_count 2\n", "a_h_seconds_count 2\n# HELP a_h_seconds late\n"),
        ),
        (
            "unit not in name",
            good.replace("# UNIT a_h_seconds seconds", "# UNIT a_h_seconds bytes"),
        ),
        ("buckets not cumulative", good.replace("le=\"0.5\"} 1", "le=\"0.5\"} 5")),
        ("no +Inf bucket", good.replace("a_h_seconds_bucket{le=\"+Inf\"} 2\n", "")),
        ("count differs", good.replace("a_h_seconds_count 2", "a_h_seconds_count 3")),
        (
            "unknown comment",
            good.replace("# TYPE a_x counter", "# TYPE a_x counter\n# NOTE a_x hi"),
        ),
        ("negative counter", good.replace("} 3\n", "} -3\n")),
        (
            "duplicate series",
            good.replace(
                "a_x_total{k=\"v\\\"q\"} 3\n",
                "a_x_total{k=\"v\\\"q\"} 3\na_x_total{k=\"v\\\"q\"} 4\n",
            ),
        ),
    ];
    for (what, text) in bad {
        assert_ne!(text, &good, "case {what} changed nothing");
        assert!(parse_exposition(text).is_err(), "case {what:?} was accepted:\n{text}");
    }
}

// =======================================================================================
// 1. Counters move by exactly what a run did
// =======================================================================================

const ROOM: &str = "obs:room";

#[tokio::test]
async fn counters_move_by_exactly_what_a_run_did() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|c| c.history_size = 4);
    let http = server.http();
    let fresh = scrape(&http, DEVICES);
    assert_counters_zero(&fresh, "a fresh server");
    assert_eq!(fresh.sum("livegate_connections_open"), 0.0);
    assert_eq!(
        (fresh.one("livegate_warmup_active"), fresh.one("livegate_drain_phase")),
        (0.0, 0.0)
    );

    // Three connections: alice on web and phone, bob on web; all on ROOM.
    let mut alice_web =
        WsClient::connect(server.addr, &http.mint_token("alice", "web"), None).await;
    let mut alice_phone =
        WsClient::connect(server.addr, &http.mint_token("alice", "phone"), None).await;
    let mut bob = WsClient::connect(server.addr, &http.mint_token("bob", "web"), None).await;
    let mut epoch = Value::Null;
    for c in [&mut alice_web, &mut alice_phone, &mut bob] {
        epoch = c.subscribe_ok(ROOM).await["epoch"].clone();
    }

    // Five events, then one of them again (a duplicate, not a sixth event).
    for i in 1..=5 {
        http.publish_ok(ROOM, Some(&format!("e{i}")), json!({ "i": i }));
    }
    let (status, again) = http.publish(ROOM, Some("e5"), json!({ "i": 5 }));
    assert_eq!(
        (status, &again["duplicate"], &again["seq"]),
        (200, &json!(true), &json!(5)),
        "{again}"
    );
    for c in [&mut alice_web, &mut alice_phone, &mut bob] {
        assert_eq!(seqs(&c.next_events(5).await), vec![1, 2, 3, 4, 5]);
    }

    let m = scrape(&http, DEVICES);
    assert_eq!(m.one("livegate_connects_total"), 3.0);
    assert_eq!(m.of("livegate_connections_open", "device", "web"), 2.0);
    assert_eq!(m.of("livegate_connections_open", "device", "phone"), 1.0);
    assert_eq!(m.of("livegate_connections_by_transport", "transport", "websocket"), 3.0);
    assert_eq!(m.of("livegate_connections_by_transport", "transport", "sse"), 0.0);
    assert_eq!(m.one("livegate_events_published_total"), 5.0);
    assert_eq!(m.one("livegate_duplicates_rejected_total"), 1.0);
    assert_eq!(m.one("livegate_events_delivered_total"), 15.0, "5 events × 3 subscribers");
    assert_eq!(m.one("livegate_subscriptions"), 6.0, "3 inboxes + 3 on {ROOM}");
    assert_eq!(m.one("livegate_history_trimmed_total"), 1.0, "history_size 4, 5 events");
    assert!(m.one("livegate_outbox_high_water_bytes") > 0.0);

    // A refused handshake is counted by its reason and is no connect.
    match WsClient::try_connect(server.addr, Some("not-a-token"), None).await {
        Ok(_) => panic!("a garbage token must be refused"),
        Err(r) => assert_eq!((r.status, error_code(&r.body)), (401, "invalid_token"), "{}", r.body),
    }

    // Kick alice's web connection (her phone stays): Close 4502.
    let h = http.clone();
    let kick = tokio::task::spawn_blocking(move || {
        h.request("DELETE", "/v1/users/alice/connections?device=web", Auth::Key, Body::None)
    });
    assert_eq!(alice_web.close_code_within(Duration::from_secs(5)).await, Some(4502));
    let _ = alice_web.read_incoming(Duration::from_secs(2)).await; // answers the Close
    let (status, body) =
        tokio::time::timeout(WAIT, kick).await.expect("kick reply").expect("kick thread");
    assert_eq!((status, &body), (200, &json!({"closed": 1})));

    // Bob leaves politely (1000), misses e6 and e7, comes back with his session and
    // recovers them; and asks for a room with an epoch it never had (not recovered).
    let bob_session = bob.session().to_string();
    close_politely(bob).await;
    wait_metric(&http, "livegate_disconnects_total", &[("code", "1000")], 1.0);
    for i in 6..=7 {
        http.publish_ok(ROOM, Some(&format!("e{i}")), json!({ "i": i }));
    }
    assert_eq!(seqs(&alice_phone.next_events(2).await), vec![6, 7]);
    let mut bob =
        WsClient::connect(server.addr, &http.mint_token("bob", "web"), Some(&bob_session)).await;
    assert_eq!(bob.session(), bob_session, "bob keeps his session");
    let reply = bob.subscribe_since(ROOM, 5, &epoch).await;
    assert_eq!(
        (&reply["op"], &reply["recovered"]),
        (&json!("subscribed"), &json!(true)),
        "{reply}"
    );
    assert_eq!(seqs(&bob.next_events(2).await), vec![6, 7]);
    let reply = bob.subscribe_since("obs:other", 3, &json!("not-this-rooms-epoch")).await;
    assert_eq!(
        (&reply["op"], &reply["recovered"]),
        (&json!("subscribed"), &json!(false)),
        "{reply}"
    );

    let m = scrape(&http, DEVICES);
    let expect = [
        ("livegate_connects_total", 4.0),
        ("livegate_events_published_total", 7.0),
        ("livegate_duplicates_rejected_total", 1.0),
        // 5 × 3 first, then e6 and e7 to alice's phone live and to bob as a replay.
        ("livegate_events_delivered_total", 19.0),
        ("livegate_history_trimmed_total", 3.0),
        // alice's phone: inbox + ROOM; bob: inbox + ROOM + obs:other.
        ("livegate_subscriptions", 5.0),
        // ROOM and obs:other; the two inboxes never got a message, so they have no actor.
        ("livegate_rooms_live", 2.0),
        ("livegate_rooms_parked", 2.0),
        ("livegate_slow_consumer_closes_total", 0.0),
        ("livegate_migrations_total", 0.0),
        ("livegate_migration_refusals_total", 0.0),
        ("livegate_warmup_active", 0.0),
        ("livegate_warmup_reconnect_attempts_total", 0.0),
        ("livegate_warmup_reconnect_successes_total", 0.0),
        ("livegate_drain_phase", 0.0),
        ("livegate_drain_connections_left", 0.0),
    ];
    let got: Vec<(&str, f64)> = expect.iter().map(|(name, _)| (*name, m.one(name))).collect();
    assert_eq!(got, expect.to_vec(), "\n{}", http.metrics_text());
    let labelled = [
        (m.of("livegate_disconnects_total", "code", "4502"), 1.0, "disconnects 4502 (the kick)"),
        (m.of("livegate_disconnects_total", "code", "1000"), 1.0, "disconnects 1000 (bob's close)"),
        (m.sum("livegate_disconnects_total"), 2.0, "disconnects in all"),
        (
            m.of("livegate_handshake_rejections_total", "reason", "invalid_token"),
            1.0,
            "invalid_token rejections",
        ),
        (m.sum("livegate_handshake_rejections_total"), 1.0, "rejections in all"),
        (m.of("livegate_connections_open", "device", "web"), 1.0, "open web"),
        (m.of("livegate_connections_open", "device", "phone"), 1.0, "open phone"),
        (m.sum("livegate_connections_open"), 2.0, "open in all"),
        (m.of("livegate_recoveries_total", "result", "recovered"), 1.0, "recovered"),
        (m.of("livegate_recoveries_total", "result", "not_recovered"), 1.0, "not recovered"),
        // One new session per first connection; bob's reconnect reuses his.
        (m.of("livegate_directory_writes_total", "result", "ok"), 3.0, "directory writes ok"),
        (m.sum("livegate_directory_writes_total"), 3.0, "directory writes in all"),
    ];
    for (got, want, what) in labelled {
        assert_eq!(got, want, "{what}\n{}", http.metrics_text());
    }

    // The histograms agree with the counters.
    let delivered = m.one("livegate_events_delivered_total");
    let frames = m.one("livegate_frames_written_total");
    // Both histograms are sampled once per room window, never per event per connection.
    let windows = m.one("livegate_batch_events_count");
    assert_eq!(
        m.one("livegate_delivery_latency_seconds_count"),
        windows,
        "one latency sample per room window"
    );
    assert!(m.one("livegate_delivery_latency_seconds_sum") >= 0.0);
    let windowed = m.one("livegate_batch_events_sum");
    assert!(
        (1.0..=7.0).contains(&windowed),
        "each published event leaves in at most one window: {windowed}"
    );
    assert!(windows >= 1.0 && windows <= frames, "room windows {windows}, frames written {frames}");
    assert!((4.0..=delivered).contains(&frames), "frames written: {frames}");
    assert!(m.one("livegate_store_flush_latency_seconds_count") > 0.0, "store flushes observed");
    assert!(m.one("livegate_store_size_bytes") > 0.0);

    // /v1/admin/status tells the same.
    let (status, s) = http.request("GET", "/v1/admin/status", Auth::Key, Body::None);
    assert_eq!(status, 200, "{s}");
    assert_eq!(
        (
            &s["phase"],
            &s["warmup"],
            &s["connections"],
            &s["subscriptions"],
            &s["rooms_live"],
            &s["rooms_parked"]
        ),
        (&json!("ready"), &json!(false), &json!(2), &json!(5), &json!(2), &json!(2)),
        "{s}"
    );

    alice_phone.close().await;
    bob.close().await;
}

/// Sends Close 1000 and reads on until the server's Close and the end of the stream: the
/// whole closing handshake, as a browser does.
async fn close_politely(mut c: WsClient) {
    let frame = CloseFrame { code: CloseCode::Normal, reason: "bye".into() };
    c.send_message(Message::Close(Some(frame))).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match c.read_incoming(deadline.saturating_duration_since(Instant::now())).await {
            Incoming::Ended(_) => return,
            Incoming::Timeout => {
                panic!("the server did not finish the closing handshake within 5 s")
            }
            Incoming::Json(_) | Incoming::Close(..) => continue,
        }
    }
}

/// How a connection ended is counted under the right code: a client whose socket just
/// ends (no Close frame: a dropped network, a killed app) is 1006, as src/metrics.rs
/// documents; a client that sends Close 1000 and leaves without waiting for the server's
/// Close (as many non-browser clients do) is 1000, or 1006 if its frame went down with
/// the socket. Neither is a protocol error (1002).
#[tokio::test]
async fn disconnects_count_the_clients_close_code_and_1006_for_a_vanished_socket() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    for i in 0..3 {
        let mut c =
            WsClient::connect(server.addr, &http.mint_token(&format!("leaver{i}"), "web"), None)
                .await;
        c.subscribe_ok("leave:room").await;
        c.close().await; // Close 1000, then the socket is dropped
    }
    for i in 0..3 {
        let mut c =
            WsClient::connect(server.addr, &http.mint_token(&format!("vanisher{i}"), "web"), None)
                .await;
        c.subscribe_ok("leave:room").await;
        drop(c); // TCP closed, no Close frame
    }
    common::wait_until(Duration::from_secs(5), || {
        scrape(&http, DEVICES).sum("livegate_disconnects_total") == 6.0
    });
    let m = scrape(&http, DEVICES);
    let by_code: BTreeMap<String, f64> = m
        .samples()
        .filter(|s| s.name == "livegate_disconnects_total" && s.value > 0.0)
        .map(|s| (s.labels[0].1.clone(), s.value))
        .collect();
    // The quick closers' Close frame may be lost with the socket (actix-web-actors reports
    // the payload's end before the frames still buffered), so 1000 or 1006 both do for
    // them; the vanished sockets are 1006; a protocol error it is not.
    let code = |c: &str| by_code.get(c).copied().unwrap_or(0.0);
    assert!(
        code("1006") >= 3.0 && code("1000") + code("1006") == 6.0,
        "3 clients sent Close 1000 and left, 3 sockets just ended; counted by code: {by_code:?}"
    );
    assert_eq!(m.sum("livegate_connections_open"), 0.0);
}

// =======================================================================================
// 1b. Drain and restart of the real binary
// =======================================================================================

#[tokio::test]
async fn drain_shows_in_metrics_and_a_restart_starts_counting_from_zero() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let flags = ["--drain-wait-secs", "1", "--drain-spread-secs", "0", "--drain-grace-secs", "3"];
    let mut serve = ServeProcess::start(&data, &root.path().join("serve-1.log"), &flags);
    let http = serve.http();

    let mut client = WsClient::connect(serve.addr, &http.mint_token("dora", "web"), None).await;
    let session = client.session().to_string();
    let epoch = client.subscribe_ok("drain:room").await["epoch"].clone();
    for i in 1..=3 {
        http.publish_ok("drain:room", Some(&format!("d{i}")), json!(i));
    }
    assert_eq!(seqs(&client.next_events(3).await), vec![1, 2, 3]);
    let m = scrape(&http, DEVICES);
    assert_eq!(
        (
            m.one("livegate_connects_total"),
            m.one("livegate_events_published_total"),
            m.one("livegate_events_delivered_total")
        ),
        (1.0, 3.0, 3.0)
    );
    assert_eq!(m.one("livegate_drain_phase"), 0.0);

    // SIGTERM: during the 1 s drain wait the node is not ready, but still answers
    // /metrics and /v1/admin/status.
    serve.signal("TERM");
    let (phase, status) = common::wait_for(Duration::from_secs(5), || {
        let Ok((200, Value::String(text))) =
            http.try_request("GET", "/metrics", Auth::None, Body::None)
        else {
            return None;
        };
        let exp = parse_exposition(&text)
            .unwrap_or_else(|e| panic!("/metrics during the drain: {e}\n{text}"));
        check_livegate(&exp, DEVICES);
        let phase = exp.one("livegate_drain_phase");
        (phase >= 1.0)
            .then(|| (phase, http.try_request("GET", "/v1/admin/status", Auth::Key, Body::None)))
    })
    .expect("livegate_drain_phase never rose above 0 within 5 s of SIGTERM");
    eprintln!("drain phase seen: {phase}; status then: {status:?}");
    match status {
        Ok((200, s)) => assert_eq!(s["phase"], "draining", "{s}"),
        other => panic!("/v1/admin/status during the drain: {other:?}"),
    }
    assert_eq!(
        client.close_code_within(Duration::from_secs(10)).await,
        Some(1012),
        "drain closes with 1012"
    );
    let _ = client.read_incoming(Duration::from_secs(2)).await; // answers the Close
    drop(client);
    let exit = serve.wait_exit(Duration::from_secs(15)).expect("drained process exits within 15 s");
    assert!(exit.success(), "a drained server exits 0, got {exit}; log:\n{}", serve.log_text());

    // Restart on the same data: counters start from zero, warm-up is on (a session exists).
    let mut serve = ServeProcess::start(&data, &root.path().join("serve-2.log"), &flags);
    let http = serve.http();
    let m = scrape(&http, DEVICES);
    assert_counters_zero(&m, "after a restart");
    assert_eq!(m.sum("livegate_connections_open"), 0.0);
    assert_eq!(
        m.one("livegate_warmup_active"),
        1.0,
        "a restart that finds sessions is in warm-up\n{}",
        http.metrics_text()
    );
    assert_eq!(m.one("livegate_drain_phase"), 0.0);
    let (code, s) = http.request("GET", "/v1/admin/status", Auth::Key, Body::None);
    assert_eq!(
        (code, &s["phase"], &s["warmup"], &s["connections"]),
        (200, &json!("ready"), &json!(true), &json!(0)),
        "{s}"
    );

    // The client comes back with its session during warm-up and recovers nothing missed.
    let mut client =
        WsClient::connect(serve.addr, &http.mint_token("dora", "web"), Some(&session)).await;
    assert_eq!(client.session(), session, "the session survives the restart");
    let reply = client.subscribe_since("drain:room", 3, &epoch).await;
    assert_eq!(reply["recovered"], true, "{reply}");
    http.publish_ok("drain:room", Some("d4"), json!(4));
    assert_eq!(seqs(&client.next_events(1).await), vec![4]);
    let m = scrape(&http, DEVICES);
    let got = [
        m.one("livegate_connects_total"),
        m.one("livegate_warmup_reconnect_attempts_total"),
        m.one("livegate_warmup_reconnect_successes_total"),
        m.of("livegate_recoveries_total", "result", "recovered"),
        m.one("livegate_events_published_total"),
        m.one("livegate_events_delivered_total"),
    ];
    assert_eq!(
        got,
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        "connects, warm-up attempts/successes, recoveries, published, delivered\n{}",
        http.metrics_text()
    );

    serve.signal("TERM");
    assert_eq!(client.close_code_within(Duration::from_secs(10)).await, Some(1012));
    let _ = client.read_incoming(Duration::from_secs(2)).await;
    let exit = serve.wait_exit(Duration::from_secs(15)).expect("second process exits within 15 s");
    assert!(exit.success(), "exit {exit}; log:\n{}", serve.log_text());
}

// =======================================================================================
// 2. The exposition is strict OpenMetrics, with bounded labels
// =======================================================================================

#[tokio::test]
async fn exposition_is_strict_openmetrics_with_bounded_labels() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();

    // Even before anything happened.
    let fresh = scrape(&http, DEVICES);
    let unlabelled = FAMILIES.iter().filter(|f| f.3.is_empty()).count();
    assert!(
        fresh.families.len() >= unlabelled,
        "families: {:?}",
        fresh.families.keys().collect::<Vec<_>>()
    );

    // Content type and `# EOF` as the last line, from the raw response.
    let url = format!("http://{}/metrics", server.addr);
    let response = ureq::get(&url).timeout(WAIT).call().expect("GET /metrics");
    let content_type = response.header("Content-Type").unwrap_or("").to_string();
    assert!(
        content_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "Content-Type: {content_type}"
    );
    let text = response.into_string().expect("body");
    assert_eq!(text.lines().last(), Some("# EOF"));

    // Traffic with distinctive user, room and device names.
    let user = "zed-cardinality-probe";
    let room = "probe:cardinality-room";
    let mut odd =
        WsClient::connect(server.addr, &http.mint_token(user, "toaster-9000"), None).await;
    let mut phone = WsClient::connect(server.addr, &http.mint_token(user, "phone"), None).await;
    odd.subscribe_ok(room).await;
    http.publish_ok(room, Some("probe-event-id"), json!({"x": 1}));
    odd.next_events(1).await;
    let _ = WsClient::try_connect(server.addr, None, None).await.err().expect("no token: refused");
    let _ = WsClient::try_connect(server.addr, Some("garbage"), None)
        .await
        .err()
        .expect("garbage: refused");
    let h = http.clone();
    let kick = tokio::task::spawn_blocking(move || {
        h.request("DELETE", &format!("/v1/users/{user}/connections"), Auth::Key, Body::None)
    });
    for c in [&mut odd, &mut phone] {
        assert_eq!(c.close_code_within(Duration::from_secs(5)).await, Some(4502));
        let _ = c.read_incoming(Duration::from_secs(2)).await;
    }
    assert_eq!(
        tokio::time::timeout(WAIT, kick).await.expect("kick").expect("kick thread").1,
        json!({"closed": 2})
    );

    let m = wait_metric(&http, "livegate_disconnects_total", &[("code", "4502")], 2.0);
    assert_eq!(m.of("livegate_handshake_rejections_total", "reason", "missing_token"), 1.0);
    assert_eq!(m.of("livegate_handshake_rejections_total", "reason", "invalid_token"), 1.0);
    assert_eq!(m.one("livegate_connects_total"), 2.0);
    let text = http.metrics_text();
    for needle in [user, room, "probe-event-id", "toaster", "cardinality"] {
        assert!(
            !text.contains(needle),
            "/metrics mentions {needle:?}: per-user/room/device data\n{text}"
        );
    }
    // The unknown device was counted as `other`, the phone as itself (both now closed).
    assert!(
        m.get("livegate_connections_open", &[("device", "other")]).is_some(),
        "unknown device kinds count as other\n{text}"
    );
    assert!(m.get("livegate_connections_open", &[("device", "phone")]).is_some(), "{text}");
    assert_eq!(m.sum("livegate_connections_open"), 0.0);
    // Every histogram has its full set of buckets even with samples.
    for name in [
        "livegate_delivery_latency_seconds",
        "livegate_batch_events",
        "livegate_store_flush_latency_seconds",
    ] {
        let buckets =
            m.families[name].samples.iter().filter(|s| s.name.ends_with("_bucket")).count();
        assert!(buckets >= 2, "{name} has {buckets} buckets");
        assert!(m.one(&format!("{name}_count")) > 0.0, "{name} has samples");
    }
}

// =======================================================================================
// 3. No secret in the logs of a full run, nor in check-config output
// =======================================================================================

const WRONG_KEY: &str = "wrong-api-key-ffffeeee1111";

/// A full run against the real binary at RUST_LOG=debug; returns everything it printed
/// and the tokens minted during it.
async fn full_run_output(format: &str) -> (String, Vec<String>) {
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let log = root.path().join("serve.log");
    let flags = [
        "--log-format",
        format,
        "--drain-wait-secs",
        "0",
        "--drain-spread-secs",
        "0",
        "--drain-grace-secs",
        "3",
    ];
    let mut serve = ServeProcess::start_with_env(&data, &log, &flags, &[("RUST_LOG", "debug")]);
    let http = serve.http();
    let mut tokens = Vec::new();
    let mut mint = |user: &str, device: &str, ttl: u64| {
        let (status, body) =
            http.mint_token_raw(json!({"user": user, "device": device, "ttl_secs": ttl}));
        assert_eq!(status, 201, "{body}");
        let token = body["token"].as_str().expect("token").to_string();
        tokens.push(token.clone());
        token
    };
    let short_lived = mint("erin", "web", 1);
    let minted_at = Instant::now();
    let alice_web = mint("alice", "web", 60);
    let alice_phone = mint("alice", "phone", 60);
    let bob_web = mint("bob", "web", 60);
    let unused = mint("carol", "web", 60);

    // Connect with the token in the query string; subscribe; publish; receive.
    let mut a1 = WsClient::connect(serve.addr, &alice_web, None).await;
    let mut a2 = WsClient::connect(serve.addr, &alice_phone, None).await;
    let mut b = WsClient::connect(serve.addr, &bob_web, None).await;
    let bob_session = b.session().to_string();
    for c in [&mut a1, &mut a2, &mut b] {
        c.subscribe_ok("leak:room").await;
    }
    http.publish_ok("leak:room", Some("l1"), json!({"text": "hello"}));
    http.publish_ok("leak:room", None, json!({"text": "world"}));
    for c in [&mut a1, &mut a2, &mut b] {
        c.next_events(2).await;
    }
    let (status, _) = http.request(
        "POST",
        "/v1/users/bob/messages",
        Auth::Key,
        Body::Json(json!({"data": {"dm": 1}})),
    );
    assert_eq!(status, 201);

    // A wrong API key, on three endpoints.
    let wrong = format!("Bearer {WRONG_KEY}");
    for (method, path, body) in [
        ("POST", "/v1/rooms/leak:room/events", Body::Json(json!({"data": 1}))),
        ("POST", "/v1/tokens", Body::Json(json!({"user": "mallory", "device": "web"}))),
        ("GET", "/v1/admin/status", Body::None),
    ] {
        let (status, reply) = http.request(method, path, Auth::Header(&wrong), body);
        assert_eq!(status, 401, "{method} {path} with a wrong key: {reply}");
    }
    // Replayed, tampered, expired and missing tokens.
    let rejected = |r: Result<WsClient, Rejected>| r.err().expect("handshake must be refused");
    let replay = rejected(WsClient::try_connect(serve.addr, Some(&alice_web), None).await);
    assert_eq!(error_code(&replay.body), "token_replayed");
    let mut tampered = unused.clone();
    let last = tampered.pop().expect("non-empty token");
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    tokens.push(tampered.clone());
    assert_eq!(
        error_code(&rejected(WsClient::try_connect(serve.addr, Some(&tampered), None).await).body),
        "invalid_token"
    );
    common::let_time_pass_async(
        Duration::from_millis(1100).saturating_sub(minted_at.elapsed()),
        "the 1 s token's expiry",
    )
    .await;
    assert_eq!(
        error_code(
            &rejected(WsClient::try_connect(serve.addr, Some(&short_lived), None).await).body
        ),
        "token_expired"
    );
    assert_eq!(
        error_code(
            &rejected(WsClient::try_connect(serve.addr, None, Some(&bob_session)).await).body
        ),
        "missing_token"
    );

    // Kick alice everywhere.
    let h = http.clone();
    let kick = tokio::task::spawn_blocking(move || {
        h.request("DELETE", "/v1/users/alice/connections", Auth::Key, Body::None)
    });
    for c in [&mut a1, &mut a2] {
        assert_eq!(c.close_code_within(Duration::from_secs(5)).await, Some(4502));
        let _ = c.read_incoming(Duration::from_secs(2)).await;
    }
    assert_eq!(
        tokio::time::timeout(WAIT, kick).await.expect("kick").expect("kick thread").1,
        json!({"closed": 2})
    );

    // SIGTERM drains bob.
    serve.signal("TERM");
    assert_eq!(b.close_code_within(Duration::from_secs(10)).await, Some(1012));
    let _ = b.read_incoming(Duration::from_secs(2)).await;
    let exit = serve.wait_exit(Duration::from_secs(15)).expect("process exits after the drain");
    assert!(exit.success(), "exit {exit}");
    let mut output = serve.stdout_to_end(Duration::from_secs(5)).join("\n");
    output.push('\n');
    output.push_str(&serve.log_text());
    (output, tokens)
}

/// Each secret, and each `.`-separated part of it (a token's body or MAC alone) of 16
/// characters or more, is nowhere in `output`.
fn assert_no_secret(output: &str, secrets: &[String], what: &str) {
    for secret in secrets {
        let parts =
            std::iter::once(secret.as_str()).chain(secret.split('.').filter(|p| p.len() >= 16));
        for part in parts {
            if let Some(at) = output.find(part) {
                let line = output[..at].rsplit('\n').next().unwrap_or("").to_string()
                    + output[at..].lines().next().unwrap_or("");
                panic!("{what} contains a secret ({}…): {line}", &part[..8.min(part.len())]);
            }
        }
    }
}

fn secrets(tokens: &[String]) -> Vec<String> {
    let mut all = vec![API_KEY.to_string(), WRONG_KEY.to_string()];
    all.extend(tokens.iter().cloned());
    all
}

#[tokio::test]
async fn debug_logs_of_a_full_run_hold_no_key_and_no_token_pretty() {
    let _gate = crate::common::gate!();
    let (output, tokens) = full_run_output("pretty").await;
    assert_no_secret(&output, &secrets(&tokens), "the pretty debug log");
    // The log is not empty by accident: lifecycle lines at debug, drain lines at info.
    let count = |pred: &dyn Fn(&str) -> bool| output.lines().filter(|l| pred(l)).count();
    let connected =
        count(&|l| l.contains("DEBUG") && l.contains("connected") && !l.contains("disconnected"));
    let disconnected = count(&|l| l.contains("DEBUG") && l.contains("disconnected"));
    let drain = count(&|l| l.contains("INFO") && l.contains("drain"));
    assert!(
        connected >= 3 && disconnected >= 3 && drain >= 1,
        "connected {connected}, disconnected {disconnected}, drain {drain}:\n{output}"
    );
}

#[tokio::test]
async fn debug_logs_of_a_full_run_hold_no_key_and_no_token_json() {
    let _gate = crate::common::gate!();
    let (output, tokens) = full_run_output("json").await;
    assert_no_secret(&output, &secrets(&tokens), "the JSON debug log");
    let mut messages: Vec<(String, String)> = Vec::new();
    for line in output.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        let level = v["level"].as_str().unwrap_or_else(|| panic!("no level: {line}")).to_string();
        let message = v["fields"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no fields.message: {line}"))
            .to_string();
        messages.push((level, message));
    }
    let stray: Vec<&str> = output
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('{') && !l.starts_with("livegate "))
        .collect();
    assert!(
        stray.is_empty(),
        "with --log-format json every log line is a JSON object; others: {stray:?}"
    );
    let count =
        |level: &str, msg: &str| messages.iter().filter(|(l, m)| l == level && m == msg).count();
    assert!(count("DEBUG", "connected") >= 3, "{messages:?}");
    assert!(count("DEBUG", "disconnected") >= 3, "{messages:?}");
    assert!(
        messages.iter().any(|(l, m)| l == "INFO" && m.starts_with("drain:")),
        "drain phases at info: {messages:?}"
    );
}

// =======================================================================================
// 4. check-config
// =======================================================================================

pub(crate) struct Ran {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs the binary with `args` in `cwd`, without the test's `LIVEGATE_*` and `RUST_LOG`
/// variables, plus `env`; at most 20 s.
pub(crate) fn livegate(args: &[&str], env: &[(&str, &str)], cwd: &Path) -> Ran {
    let mut cmd = Command::new(crate::common::livegate_bin());
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("LIVEGATE_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let child = cmd.spawn().expect("spawn livegate");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(out)) => Ran {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("livegate {args:?}: {e}"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("livegate {args:?} did not finish within 20 s");
        }
    }
}

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/livegate.example.toml");

/// check-config succeeded: exit 0, nothing on stderr, the note line, then TOML.
pub(crate) fn effective(ran: &Ran, what: &str) -> toml::Table {
    assert_eq!(ran.code, Some(0), "{what}: exit code; stderr: {}", ran.stderr);
    assert!(ran.stderr.is_empty(), "{what}: stderr: {}", ran.stderr);
    assert!(ran.stdout.starts_with("# configuration is valid; "), "{what}: {}", ran.stdout);
    ran.stdout
        .parse()
        .unwrap_or_else(|e| panic!("{what}: output is not TOML ({e}):\n{}", ran.stdout))
}

/// check-config failed as a bad configuration: exit 2, nothing on stdout, one line.
pub(crate) fn refused(ran: &Ran, what: &str) -> String {
    assert_eq!(
        ran.code,
        Some(2),
        "{what}: exit code; stdout: {} stderr: {}",
        ran.stdout,
        ran.stderr
    );
    assert!(ran.stdout.is_empty(), "{what}: nothing on stdout when invalid: {}", ran.stdout);
    let line = ran.stderr.strip_suffix('\n').unwrap_or(&ran.stderr);
    assert!(!line.contains('\n'), "{what}: one line on stderr, got:\n{}", ran.stderr);
    assert!(line.starts_with("livegate: "), "{what}: {line}");
    line.to_string()
}

#[test]
fn check_config_accepts_the_example_and_refuses_bad_files_clearly() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let cwd = dir.path();

    // The example is valid and is what check-config prints back, key masked.
    let ran = livegate(&["check-config", "--config", EXAMPLE, "--api-key", API_KEY], &[], cwd);
    let table = effective(&ran, "example with --api-key");
    assert!(
        ran.stdout.lines().next().unwrap().contains("api_key is set (masked below)"),
        "{}",
        ran.stdout
    );
    assert_eq!(table["api_key"].as_str(), Some("********"), "{}", ran.stdout);
    assert!(!ran.stdout.contains(API_KEY));
    let example: toml::Table =
        std::fs::read_to_string(EXAMPLE).expect("read example").parse().expect("example is TOML");
    for (key, value) in &example {
        assert_eq!(table.get(key), Some(value), "{key} as printed vs the example file");
    }
    // Every key check-config prints is in the example (set, or commented out with its default).
    let example_text = std::fs::read_to_string(EXAMPLE).unwrap();
    for key in table.keys() {
        let documented = example_text.lines().any(|l| {
            let l = l.trim_start_matches('#').trim_start();
            l.starts_with(&format!("{key} =")) || l.starts_with(&format!("{key}="))
        });
        assert!(documented, "key {key} is missing from data/livegate.example.toml");
    }
    // Without a key: no api_key line, and the note says where serve finds one.
    let ran = livegate(&["check-config", "--config", EXAMPLE], &[], cwd);
    let table = effective(&ran, "example without a key");
    assert!(!table.contains_key("api_key"), "{}", ran.stdout);
    assert!(ran.stdout.lines().next().unwrap().contains("api_key is not set"), "{}", ran.stdout);

    // Bad files: exit 2 and one line naming the key (or the problem) and the file.
    let write = |name: &str, text: &str| {
        let path = cwd.join(name);
        std::fs::write(&path, text).expect("write config");
        path.display().to_string()
    };
    let unknown = write("unknown.toml", "heartbeat_secs = 10\nheartbeat = 5\n");
    let bad_type = write("type.toml", "heartbeat_secs = \"fast\"\n");
    let invalid = write("invalid.toml", "history_size = 0\n");
    let broken = write("broken.toml", "batch_window_ms = 100\nlisten = \"127.0.0.1:7070\n");
    let missing = cwd.join("missing.toml").display().to_string();
    let cases: Vec<(&str, &String, String)> = vec![
        ("unknown key", &unknown, format!("livegate: config file {unknown}: unknown key `heartbeat` (known keys: ")),
        ("bad type", &bad_type, format!("livegate: heartbeat_secs in {bad_type}: expected a whole number of seconds, got \"fast\"")),
        ("invalid value", &invalid, format!("livegate: history_size must be at least 1, got 0 (set by history_size in {invalid})")),
        ("unparsable", &broken, format!("livegate: config file {broken} is not valid TOML: ")),
        ("missing file", &missing, format!("livegate: cannot read config file {missing}: ")),
    ];
    for (what, path, want) in &cases {
        let line = refused(&livegate(&["check-config", "--config", path], &[], cwd), what);
        assert!(line.starts_with(want.as_str()), "{what}:\n got: {line}\nwant: {want}…");
        assert!(
            line.len() > want.len() || !want.ends_with(": "),
            "{what}: no reason after the colon: {line}"
        );
    }
    // The same bad value from a flag or the environment names the flag or the variable.
    let line = refused(&livegate(&["check-config", "--heartbeat-secs", "0"], &[], cwd), "flag");
    assert_eq!(
        line,
        "livegate: heartbeat_secs must be at least 1, got 0 (set by --heartbeat-secs)"
    );
    let line =
        refused(&livegate(&["check-config"], &[("LIVEGATE_HEARTBEAT_SECS", "0")], cwd), "env");
    assert_eq!(
        line,
        "livegate: heartbeat_secs must be at least 1, got 0 (set by LIVEGATE_HEARTBEAT_SECS)"
    );

    // Precedence: file < environment < flag, visible in the printed TOML.
    let layered =
        write("layered.toml", "batch_window_ms = 5\nhistory_size = 10\nheartbeat_secs = 20\n");
    let env = [("LIVEGATE_BATCH_WINDOW_MS", "7"), ("LIVEGATE_HISTORY_SIZE", "11")];
    let table = effective(
        &livegate(&["check-config", "--config", &layered, "--history-size", "12"], &env, cwd),
        "layers",
    );
    let got: Vec<Option<i64>> = ["batch_window_ms", "history_size", "heartbeat_secs"]
        .iter()
        .map(|k| table[*k].as_integer())
        .collect();
    assert_eq!(
        got,
        vec![Some(7), Some(12), Some(20)],
        "batch_window_ms env over file, history_size flag over env, heartbeat_secs from the file"
    );
    // LIVEGATE_CONFIG names the file as --config does.
    let table = effective(
        &livegate(&["check-config"], &[("LIVEGATE_CONFIG", &layered)], cwd),
        "LIVEGATE_CONFIG",
    );
    assert_eq!(table["batch_window_ms"].as_integer(), Some(5));
}

/// A syntax error in a config file of some length is only actionable with its place:
/// the line (and column) the TOML parser stopped at.
#[test]
fn check_config_names_the_line_of_a_toml_syntax_error() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.toml");
    std::fs::write(&path, "batch_window_ms = 100\nheartbeat_secs = 30\nlisten = \"127.0.0.1:7070\nhistory_size = 10\n").unwrap();
    let line = refused(
        &livegate(&["check-config", "--config", &path.display().to_string()], &[], dir.path()),
        "broken",
    );
    assert!(line.contains(&format!("config file {} is not valid TOML", path.display())), "{line}");
    assert!(
        line.contains("line 3"),
        "the error should name line 3, where the string is left open: {line}"
    );
}

#[test]
fn check_config_never_prints_the_api_key() {
    let _gate = crate::common::gate!();
    let dir = tempfile::tempdir().expect("tempdir");
    let cwd = dir.path();
    let in_file = cwd.join("key.toml");
    let file_key = "file-api-key-aaaabbbbcccc";
    std::fs::write(&in_file, format!("api_key = \"{file_key}\"\n")).unwrap();
    let in_file = in_file.display().to_string();
    let keys = [API_KEY.to_string(), file_key.to_string()];
    let runs: Vec<(&str, Ran)> = vec![
        ("flag", livegate(&["check-config", "--api-key", API_KEY], &[], cwd)),
        ("env", livegate(&["check-config"], &[("LIVEGATE_API_KEY", API_KEY)], cwd)),
        ("file", livegate(&["check-config", "--config", &in_file], &[], cwd)),
        (
            "flag over file",
            livegate(&["check-config", "--config", &in_file, "--api-key", API_KEY], &[], cwd),
        ),
        // Invalid configurations with a key set: the error line must not carry it either.
        (
            "invalid + key",
            livegate(&["check-config", "--api-key", API_KEY, "--heartbeat-secs", "0"], &[], cwd),
        ),
        (
            "bad file + key",
            livegate(&["check-config", "--config", &in_file, "--history-size", "x"], &[], cwd),
        ),
        // A key that is too short is refused without echoing it.
        ("short key", livegate(&["check-config", "--api-key", "sh0rt-k3y"], &[], cwd)),
    ];
    for (what, ran) in &runs {
        let all = format!("{}\n{}", ran.stdout, ran.stderr);
        assert_no_secret(&all, &keys, &format!("check-config ({what})"));
        assert!(!all.contains("sh0rt-k3y"), "check-config ({what}) echoes a short key: {all}");
    }
    for (what, ran) in &runs[..4] {
        assert_eq!(effective(ran, what)["api_key"].as_str(), Some("********"), "{what}");
    }
    for (what, ran) in &runs[4..] {
        refused(ran, what);
    }
    assert_eq!(
        refused(&runs[6].1, "short key"),
        "livegate: api_key must be at least 16 characters long, got 9 (set by --api-key)"
    );
}

// =======================================================================================
// 5. livegate status and /v1/admin/status
// =======================================================================================

/// `/v1/admin/status` until its `connections` is `n` (registration is asynchronous).
fn status_with_connections(http: &Http, n: u64) -> Value {
    let mut last = Value::Null;
    common::wait_for(Duration::from_secs(5), || {
        let (code, s) = http.request("GET", "/v1/admin/status", Auth::Key, Body::None);
        assert_eq!(code, 200, "{s}");
        last = s;
        (last["connections"] == n).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("status never showed {n} connections: {last}"))
}

#[tokio::test]
async fn status_command_reports_what_is_connected() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    let http = server.http();
    let cwd = tempfile::tempdir().expect("tempdir");
    let url = format!("http://{}", server.addr);

    let mut a = WsClient::connect(server.addr, &http.mint_token("sam", "web"), None).await;
    let b = WsClient::connect(server.addr, &http.mint_token("tia", "phone"), None).await;
    a.subscribe_ok("status:room").await;
    status_with_connections(&http, 2);

    let ran = livegate(&["status", "--url", &url, "--api-key", API_KEY], &[], cwd.path());
    assert_eq!(ran.code, Some(0), "stderr: {}", ran.stderr);
    assert_eq!(ran.stdout.lines().count(), 1, "one JSON line: {}", ran.stdout);
    let s: Value = serde_json::from_str(ran.stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", ran.stdout));
    assert_eq!(
        (&s["node"], &s["version"], &s["phase"], &s["warmup"], &s["connections"]),
        (
            &json!(NODE),
            &json!(env!("CARGO_PKG_VERSION")),
            &json!("ready"),
            &json!(false),
            &json!(2)
        ),
        "{s}"
    );
    let m = scrape(&http, DEVICES);
    assert_eq!(s["subscriptions"], 3, "2 inboxes + status:room: {s}");
    assert_eq!(s["subscriptions"].as_f64(), Some(m.one("livegate_subscriptions")), "{s}");
    assert_eq!(s["connections"].as_f64(), Some(m.sum("livegate_connections_open")), "{s}");
    assert_eq!(s["rooms_live"].as_f64(), Some(m.one("livegate_rooms_live")), "{s}");
    assert_eq!(s["rooms_live"], 1, "status:room; the inboxes have no actor: {s}");
    assert_eq!(s["rooms_parked"], 2, "the two users' inboxes: {s}");
    assert_eq!(s["rooms_parked"].as_f64(), Some(m.one("livegate_rooms_parked")), "{s}");
    assert!(s["store_bytes"].as_u64().is_some_and(|b| b > 0), "{s}");
    assert_eq!(
        (&s["sessions_live"], &s["sessions_cached"], &s["sessions_stored"]),
        (&json!(2), &json!(0), &json!(2)),
        "{s}"
    );
    assert_eq!(s["sessions_stored"].as_f64(), Some(m.one("livegate_sessions_stored")), "{s}");
    assert!(s["uptime_secs"].as_u64().is_some_and(|u| u < 120), "{s}");
    let keys: BTreeSet<&str> = s.as_object().expect("object").keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = [
        "node",
        "version",
        "uptime_secs",
        "phase",
        "warmup",
        "connections",
        "subscriptions",
        "rooms_live",
        "rooms_parked",
    ]
    .into_iter()
    .chain(["sessions_live", "sessions_cached", "sessions_stored", "store_bytes"])
    .collect();
    assert_eq!(keys, want);

    // The key may come from the environment as well.
    let ran = livegate(&["status", "--url", &url], &[("LIVEGATE_API_KEY", API_KEY)], cwd.path());
    assert_eq!(ran.code, Some(0), "stderr: {}", ran.stderr);

    // One client leaves: the count follows.
    a.close().await;
    status_with_connections(&http, 1);
    let ran = livegate(&["status", "--url", &url, "--api-key", API_KEY], &[], cwd.path());
    let s: Value = serde_json::from_str(ran.stdout.trim()).expect("JSON");
    assert_eq!(s["connections"], 1, "{s}");

    // Without the key, or with a wrong one: 401; the CLI says so without echoing the key.
    let (code, body) = http.request("GET", "/v1/admin/status", Auth::None, Body::None);
    assert_eq!((code, error_code(&body)), (401, "unauthorized"), "{body}");
    let (code, body) = http.request(
        "GET",
        "/v1/admin/status",
        Auth::Header(&format!("Bearer {WRONG_KEY}")),
        Body::None,
    );
    assert_eq!((code, error_code(&body)), (401, "unauthorized"), "{body}");
    let ran = livegate(&["status", "--url", &url, "--api-key", WRONG_KEY], &[], cwd.path());
    assert_eq!(ran.code, Some(1), "stdout {} stderr {}", ran.stdout, ran.stderr);
    assert!(ran.stdout.is_empty());
    assert!(
        ran.stderr.starts_with("livegate: GET /v1/admin/status: server answered 401"),
        "{}",
        ran.stderr
    );
    assert!(!ran.stderr.contains(WRONG_KEY) && !ran.stderr.contains(API_KEY), "{}", ran.stderr);
    drop(b);
}

/// The process's own figures are on `/metrics`, read from the system at each scrape (a
/// real `livegate serve`, alone in its process): CPU time and resident memory above zero,
/// the open-file limit that bounds connections, and open files that follow the
/// connections (each a socket) up and back down.
#[tokio::test]
async fn the_process_cpu_memory_and_open_files_are_metrics() {
    let _gate = crate::common::gate!();
    let root = tempfile::tempdir().expect("tempdir");
    let serve = ServeProcess::start(&root.path().join("data"), &root.path().join("serve.log"), &[]);
    let http = Http::new(serve.addr);
    let value =
        |name: &str| http.metric(name).unwrap_or_else(|| panic!("{name} is not on /metrics"));
    let (cpu, rss) =
        (value("livegate_process_cpu_seconds"), value("livegate_process_resident_memory_bytes"));
    let (idle, limit) =
        (value("livegate_process_open_files"), value("livegate_process_max_open_files"));
    assert!(
        cpu > 0.0 && rss > 1e6 && idle > 0.0 && limit >= 1024.0,
        "cpu {cpu} s, rss {rss} B, open {idle} of {limit}"
    );
    let mut clients = Vec::new();
    for i in 0..50 {
        clients.push(
            WsClient::connect(serve.addr, &http.mint_token(&format!("fd{i}"), "web"), None).await,
        );
    }
    let busy = value("livegate_process_open_files");
    // Other descriptors come and go beside the sockets (an earlier request's socket not yet
    // closed, sled's files), so the count follows the 50 connections within a few.
    assert!(busy >= idle + 45.0, "50 connections open: open files {idle} → {busy}");
    drop(clients);
    let back = wait_until(Duration::from_secs(10), || {
        http.metric("livegate_process_open_files").is_some_and(|n| n < busy - 40.0)
    });
    assert!(
        back,
        "50 connections closed: open files still {:?} (were {busy})",
        http.metric("livegate_process_open_files")
    );
    assert!(value("livegate_process_cpu_seconds") >= cpu, "CPU time never goes back");
}
