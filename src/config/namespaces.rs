//! `[[namespace]]` tables, from the config file only: a room-name `prefix` and overrides
//! of the per-room keys ([`ROOM_KEYS`]), each checked with the bounds of its global key.
//! Errors name the table by its number in the file and its prefix. The table of effective
//! options rooms use is [`crate::core::rules::namespaces::Namespaces`] ([`Config::room_namespaces`]).

use std::path::Path;

use super::validate::bound_problem;
use super::value::{parse, Raw};
use super::{bounds_of, Config, ConfigError, Origin};
use crate::core::nodes::routing::RoomHomes;
use crate::core::rules::namespaces::{NamespaceError, Namespaces, Overrides, RoomOptions};

/// The keys a `[[namespace]]` table may hold besides `prefix`.
pub const ROOM_KEYS: &[&str] =
    &["history_size", "history_ttl_secs", "batch_window_ms", "presence", "max_event_bytes"];

/// A `[[namespace]]` key that is no room option: the cell the namespace's rooms are homed
/// in (`cluster_cell_domains`), one of `cells`.
pub const HOME_CELL_KEY: &str = "home_cell";

/// One `[[namespace]]` table as configured: `None` takes the global key's value.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct NamespaceTable {
    pub prefix: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_ttl_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_window_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_event_bytes: Option<usize>,
    /// With `cluster_cell_domains`: the cell every room of the namespace is homed in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home_cell: Option<String>,
}

impl NamespaceTable {
    fn overrides(&self) -> Overrides {
        Overrides {
            history_size: self.history_size,
            history_ttl_secs: self.history_ttl_secs,
            batch_window_ms: self.batch_window_ms,
            presence: self.presence,
            max_event_bytes: self.max_event_bytes,
        }
    }

    /// A table holding every option, as `options` has them.
    fn effective(prefix: &str, options: &RoomOptions, home_cell: Option<String>) -> NamespaceTable {
        NamespaceTable {
            home_cell,
            prefix: prefix.to_string(),
            history_size: Some(options.history_size),
            history_ttl_secs: Some(options.history_ttl_secs),
            batch_window_ms: Some(options.batch_window_ms),
            presence: Some(options.presence),
            max_event_bytes: Some(options.max_event_bytes),
        }
    }
}

/// How an error names table `index` (0-based): `[[namespace]] number N (prefix "P")`.
fn label(index: usize, prefix: Option<&str>) -> String {
    match prefix {
        Some(prefix) => format!("[[namespace]] number {} (prefix {prefix:?})", index + 1),
        None => format!("[[namespace]] number {}", index + 1),
    }
}

fn problem(index: usize, prefix: Option<&str>, problem: String) -> ConfigError {
    ConfigError::Namespace { path: None, table: label(index, prefix), problem }
}

/// The file's `namespace` value: an array of tables, each read and type-checked (bounds
/// and prefixes are [`check`]ed with the rest of the configuration).
pub(super) fn read(path: &Path, value: &toml::Value) -> Result<Vec<NamespaceTable>, ConfigError> {
    let in_file = |e: ConfigError| e.in_file(path);
    let Some(tables) = value.as_array().filter(|items| items.iter().all(toml::Value::is_table))
    else {
        let problem = "must be written as [[namespace]] tables, each with a prefix".to_string();
        return Err(in_file(ConfigError::Namespace {
            path: None,
            table: "namespace".into(),
            problem,
        }));
    };
    tables
        .iter()
        .enumerate()
        .map(|(index, table)| read_table(path, index, table).map_err(in_file))
        .collect()
}

fn read_table(
    path: &Path,
    index: usize,
    value: &toml::Value,
) -> Result<NamespaceTable, ConfigError> {
    let table = value.as_table().expect("checked by read");
    let prefix = table.get("prefix").and_then(toml::Value::as_str);
    let fail = |text: String| problem(index, prefix, text);
    let Some(prefix) = prefix else {
        return Err(match table.get("prefix") {
            None => fail("prefix is required (a room-name prefix such as \"chat:\")".into()),
            Some(other) => fail(format!("prefix: expected text, got {other}")),
        });
    };
    let mut out = NamespaceTable { prefix: prefix.to_string(), ..NamespaceTable::default() };
    for (name, value) in table {
        if name == HOME_CELL_KEY {
            let Some(cell) = value.as_str() else {
                return Err(fail(format!("{HOME_CELL_KEY}: expected text, got {value}")));
            };
            out.home_cell = Some(cell.to_string());
            continue;
        }
        let Some(&key) = ROOM_KEYS.iter().find(|key| *key == name) else {
            if name == "prefix" {
                continue;
            }
            return Err(fail(format!(
                "unknown key `{name}` (known keys: prefix, {}, {HOME_CELL_KEY})",
                ROOM_KEYS.join(", ")
            )));
        };
        // The global key's value form; the message names the table instead of the key's origin.
        let origin = Origin::File { path: path.to_path_buf(), key };
        let typed = |e: ConfigError| match e {
            ConfigError::BadValue { expected, got, .. } => {
                fail(format!("{key}: expected {expected}, got {got}"))
            }
            other => other,
        };
        let raw = Raw::Toml(value);
        match key {
            "history_size" => out.history_size = Some(parse(key, raw, &origin).map_err(typed)?),
            "history_ttl_secs" => {
                out.history_ttl_secs = Some(parse(key, raw, &origin).map_err(typed)?)
            }
            "batch_window_ms" => {
                out.batch_window_ms = Some(parse(key, raw, &origin).map_err(typed)?)
            }
            "presence" => out.presence = Some(parse(key, raw, &origin).map_err(typed)?),
            "max_event_bytes" => {
                out.max_event_bytes = Some(parse(key, raw, &origin).map_err(typed)?)
            }
            _ => unreachable!("{key} is in ROOM_KEYS"),
        }
    }
    Ok(out)
}

/// Every table's overrides within their global key's bounds, and the prefixes valid and
/// distinct.
pub(super) fn check(tables: &[NamespaceTable]) -> Result<(), ConfigError> {
    for (index, table) in tables.iter().enumerate() {
        let values = [
            ("history_size", table.history_size.map(|n| n as u64)),
            ("history_ttl_secs", table.history_ttl_secs),
            ("batch_window_ms", table.batch_window_ms),
            ("max_event_bytes", table.max_event_bytes.map(|n| n as u64)),
        ];
        for (key, value) in values {
            let Some(value) = value else { continue };
            let Some((min, max)) = bounds_of(key) else { continue };
            if let Some(text) = bound_problem(value, min, max) {
                return Err(problem(index, Some(&table.prefix), format!("{key} {text}")));
            }
        }
    }
    // Prefix rules and duplicates: the core's table decides, over any global options.
    let global = RoomOptions {
        history_size: 1,
        history_ttl_secs: 0,
        batch_window_ms: 0,
        presence: true,
        max_event_bytes: 16,
    };
    Namespaces::new(global, tables.iter().map(|t| (t.prefix.clone(), t.overrides())).collect())
        .map(|_| ())
        .map_err(|e: NamespaceError| {
            problem(e.index(), Some(&tables[e.index()].prefix), e.to_string())
        })
}

impl Config {
    /// Where rooms are homed with `cluster_cell_domains`: the configured cells and each
    /// namespace's `home_cell`.
    pub fn room_homes(&self) -> RoomHomes {
        RoomHomes::new(
            self.configured_cells(),
            self.namespaces.iter().map(|t| (t.prefix.clone(), t.home_cell.clone())).collect(),
        )
    }

    /// A `home_cell` needs cell domains and names a configured cell.
    pub(super) fn check_home_cells(&self) -> Result<(), ConfigError> {
        for (index, table) in self.namespaces.iter().enumerate() {
            let Some(cell) = &table.home_cell else { continue };
            if !self.cluster_cell_domains {
                return Err(problem(index, Some(&table.prefix), format!("{HOME_CELL_KEY} needs cluster_cell_domains: only cells with their own NATS home rooms")));
            }
            if !self.cells.contains(cell) {
                return Err(problem(
                    index,
                    Some(&table.prefix),
                    format!(
                        "{HOME_CELL_KEY} {cell:?} is not one of cells ({})",
                        self.cells.join(",")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The options rooms take: the global keys, and each `[[namespace]]` over them.
    pub fn room_namespaces(&self) -> Result<Namespaces, ConfigError> {
        check(&self.namespaces)?;
        let global = RoomOptions {
            history_size: self.history_size,
            history_ttl_secs: self.history_ttl_secs,
            batch_window_ms: self.batch_window_ms,
            presence: true,
            max_event_bytes: self.max_event_bytes,
        };
        let entries = self.namespaces.iter().map(|t| (t.prefix.clone(), t.overrides())).collect();
        Namespaces::new(global, entries).map_err(|e| {
            problem(e.index(), Some(&self.namespaces[e.index()].prefix), e.to_string())
        })
    }

    /// The `[[namespace]]` tables with every option filled in (an override, else the
    /// global key's value), as check-config prints them.
    pub fn effective_namespaces(&self) -> Result<Vec<NamespaceTable>, ConfigError> {
        let table = self.room_namespaces()?;
        let pins = self.namespaces.iter().map(|t| t.home_cell.clone());
        Ok(table
            .namespaces()
            .iter()
            .zip(pins)
            .map(|(n, pin)| NamespaceTable::effective(&n.prefix, &n.options, pin))
            .collect())
    }
}
