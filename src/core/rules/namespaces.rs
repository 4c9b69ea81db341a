//! Namespaces: per-prefix room options. A room takes the options of the namespace with
//! the longest prefix its name starts with, and the global options when none matches.
//! Pure: the configuration builds the table once ([`Namespaces::new`]), rooms and the
//! publish path look a room up ([`Namespaces::resolve`]).

use std::time::Duration;

use super::limits::Retention;
use super::names::MAX_ROOM_LEN;

/// What a room takes from its namespace (or from the global keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomOptions {
    pub history_size: usize,
    pub history_ttl_secs: u64,
    pub batch_window_ms: u64,
    /// Whether the room keeps presence (who is subscribed).
    pub presence: bool,
    pub max_event_bytes: usize,
}

impl RoomOptions {
    /// The room's history bound, for its [`SeqLog`](crate::core::delivery::seqlog::SeqLog).
    pub fn retention(&self) -> Retention {
        Retention {
            max_events: self.history_size,
            max_age_ms: self.history_ttl_secs.saturating_mul(1000),
        }
    }

    /// The room's batching window.
    pub fn batch_window(&self) -> Duration {
        Duration::from_millis(self.batch_window_ms)
    }
}

/// A namespace's overrides: each `None` takes the global value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub history_size: Option<usize>,
    pub history_ttl_secs: Option<u64>,
    pub batch_window_ms: Option<u64>,
    pub presence: Option<bool>,
    pub max_event_bytes: Option<usize>,
}

impl Overrides {
    /// These overrides over `global`.
    pub fn over(&self, global: &RoomOptions) -> RoomOptions {
        RoomOptions {
            history_size: self.history_size.unwrap_or(global.history_size),
            history_ttl_secs: self.history_ttl_secs.unwrap_or(global.history_ttl_secs),
            batch_window_ms: self.batch_window_ms.unwrap_or(global.batch_window_ms),
            presence: self.presence.unwrap_or(global.presence),
            max_event_bytes: self.max_event_bytes.unwrap_or(global.max_event_bytes),
        }
    }
}

/// One namespace with its effective options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub prefix: String,
    pub options: RoomOptions,
}

/// Why a namespace table cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    /// Entry `index` (0-based) has a prefix that is not a room-name prefix.
    #[error(
        "prefix must be 1 to {MAX_ROOM_LEN} characters of A-Z a-z 0-9 _ . : - @, got {prefix:?}"
    )]
    BadPrefix { index: usize, prefix: String },
    /// Entry `index` repeats the prefix of entry `first`.
    #[error("prefix {prefix:?} is already the prefix of namespace {}", first + 1)]
    Duplicate { index: usize, first: usize, prefix: String },
}

impl NamespaceError {
    /// The entry the error is about (0-based, in the order given).
    pub fn index(&self) -> usize {
        match self {
            NamespaceError::BadPrefix { index, .. } | NamespaceError::Duplicate { index, .. } => {
                *index
            }
        }
    }
}

/// A prefix a room name can start with: room-name characters (and `@`, which inbox rooms
/// `user:<id>` may hold), at most [`MAX_ROOM_LEN`].
pub fn check_prefix(prefix: &str) -> bool {
    (1..=MAX_ROOM_LEN).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-' | b'@'))
}

/// The namespace table: the global options and the namespaces, longest prefix first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespaces {
    global: RoomOptions,
    /// Longest prefix first (ties: the order given), so the first match is the longest.
    by_length: Vec<Namespace>,
    /// The namespaces in the order given.
    given: Vec<Namespace>,
}

impl Namespaces {
    /// Only the global options: every room takes them.
    pub fn global(global: RoomOptions) -> Namespaces {
        Namespaces { global, by_length: Vec::new(), given: Vec::new() }
    }

    /// The table of `entries` (prefix and overrides, in the order configured) over `global`.
    pub fn new(
        global: RoomOptions,
        entries: Vec<(String, Overrides)>,
    ) -> Result<Namespaces, NamespaceError> {
        let mut given: Vec<Namespace> = Vec::with_capacity(entries.len());
        for (index, (prefix, overrides)) in entries.into_iter().enumerate() {
            if !check_prefix(&prefix) {
                return Err(NamespaceError::BadPrefix { index, prefix });
            }
            if let Some(first) = given.iter().position(|n| n.prefix == prefix) {
                return Err(NamespaceError::Duplicate { index, first, prefix });
            }
            given.push(Namespace { options: overrides.over(&global), prefix });
        }
        let mut by_length = given.clone();
        // Stable: equal lengths keep their order (two of them never match the same room).
        by_length.sort_by_key(|namespace| std::cmp::Reverse(namespace.prefix.len()));
        Ok(Namespaces { global, by_length, given })
    }

    /// The namespace `room` belongs to: the longest prefix it starts with.
    pub fn namespace_of(&self, room: &str) -> Option<&Namespace> {
        self.by_length.iter().find(|n| room.starts_with(n.prefix.as_str()))
    }

    /// The options of `room`: its namespace's, else the global ones.
    pub fn resolve(&self, room: &str) -> &RoomOptions {
        self.namespace_of(room).map_or(&self.global, |n| &n.options)
    }

    /// The global options (rooms in no namespace).
    pub fn global_options(&self) -> &RoomOptions {
        &self.global
    }

    /// The namespaces in the order configured, with their effective options.
    pub fn namespaces(&self) -> &[Namespace] {
        &self.given
    }

    /// The largest `history_size` any room can have: what a shared store of every room's
    /// history (the cluster's stream) must keep per room at least.
    pub fn largest_history_size(&self) -> usize {
        self.given.iter().map(|n| n.options.history_size).fold(self.global.history_size, usize::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global() -> RoomOptions {
        RoomOptions {
            history_size: 1000,
            history_ttl_secs: 86400,
            batch_window_ms: 100,
            presence: true,
            max_event_bytes: 65536,
        }
    }

    fn with(f: impl FnOnce(&mut Overrides)) -> Overrides {
        let mut o = Overrides::default();
        f(&mut o);
        o
    }

    fn table() -> Namespaces {
        Namespaces::new(
            global(),
            vec![
                ("chat:".into(), with(|o| o.history_size = Some(50))),
                (
                    "chat:vip:".into(),
                    with(|o| {
                        o.history_size = Some(5000);
                        o.batch_window_ms = Some(0);
                    }),
                ),
                ("user:".into(), with(|o| o.presence = Some(false))),
                (
                    "scores".into(),
                    with(|o| {
                        o.history_ttl_secs = Some(2);
                        o.max_event_bytes = Some(1024);
                        o.presence = Some(false);
                    }),
                ),
                ("chat:v".into(), with(|o| o.history_ttl_secs = Some(60))),
            ],
        )
        .unwrap()
    }

    #[test]
    fn longest_matching_prefix_wins_else_global() {
        let t = table();
        // (room, namespace prefix or None, history_size, ttl, window, presence, max bytes)
        let cases: &[(&str, Option<&str>, usize, u64, u64, bool, usize)] = &[
            ("lobby", None, 1000, 86400, 100, true, 65536),
            ("chat:general", Some("chat:"), 50, 86400, 100, true, 65536),
            ("chat:", Some("chat:"), 50, 86400, 100, true, 65536),
            ("chat:vip:1", Some("chat:vip:"), 5000, 86400, 0, true, 65536),
            ("chat:vip:", Some("chat:vip:"), 5000, 86400, 0, true, 65536),
            // Longer than chat: but shorter than chat:vip:, and not chat:vip: itself.
            ("chat:vip", Some("chat:v"), 1000, 60, 100, true, 65536),
            ("chat:video", Some("chat:v"), 1000, 60, 100, true, 65536),
            ("chat", None, 1000, 86400, 100, true, 65536),
            ("user:alice", Some("user:"), 1000, 86400, 100, false, 65536),
            ("users", None, 1000, 86400, 100, true, 65536),
            ("scores:m1", Some("scores"), 1000, 2, 100, false, 1024),
            ("scoresheet", Some("scores"), 1000, 2, 100, false, 1024),
            // A prefix matches at the start only.
            ("x:chat:1", None, 1000, 86400, 100, true, 65536),
            ("Chat:1", None, 1000, 86400, 100, true, 65536),
        ];
        for &(
            room,
            prefix,
            history_size,
            history_ttl_secs,
            batch_window_ms,
            presence,
            max_event_bytes,
        ) in cases
        {
            assert_eq!(
                t.namespace_of(room).map(|n| n.prefix.as_str()),
                prefix,
                "namespace of {room}"
            );
            let want = RoomOptions {
                history_size,
                history_ttl_secs,
                batch_window_ms,
                presence,
                max_event_bytes,
            };
            assert_eq!(t.resolve(room), &want, "options of {room}");
        }
    }

    #[test]
    fn the_order_given_does_not_change_the_answer() {
        let t = table();
        let mut reversed: Vec<(String, Overrides)> = vec![
            ("chat:v".into(), with(|o| o.history_ttl_secs = Some(60))),
            (
                "scores".into(),
                with(|o| {
                    o.history_ttl_secs = Some(2);
                    o.max_event_bytes = Some(1024);
                    o.presence = Some(false);
                }),
            ),
            ("user:".into(), with(|o| o.presence = Some(false))),
            (
                "chat:vip:".into(),
                with(|o| {
                    o.history_size = Some(5000);
                    o.batch_window_ms = Some(0);
                }),
            ),
        ];
        reversed.push(("chat:".into(), with(|o| o.history_size = Some(50))));
        let r = Namespaces::new(global(), reversed).unwrap();
        for room in ["lobby", "chat:a", "chat:vip:a", "chat:vx", "user:u", "scores1"] {
            assert_eq!(t.resolve(room), r.resolve(room), "{room}");
        }
        // namespaces() keeps the order configured.
        let prefixes: Vec<&str> = r.namespaces().iter().map(|n| n.prefix.as_str()).collect();
        assert_eq!(prefixes, ["chat:v", "scores", "user:", "chat:vip:", "chat:"]);
    }

    #[test]
    fn overrides_fill_from_global() {
        assert_eq!(Overrides::default().over(&global()), global());
        let all = Overrides {
            history_size: Some(1),
            history_ttl_secs: Some(0),
            batch_window_ms: Some(10_000),
            presence: Some(false),
            max_event_bytes: Some(16),
        };
        let want = RoomOptions {
            history_size: 1,
            history_ttl_secs: 0,
            batch_window_ms: 10_000,
            presence: false,
            max_event_bytes: 16,
        };
        assert_eq!(all.over(&global()), want);
    }

    #[test]
    fn presence_flag_resolves_per_room() {
        let t =
            Namespaces::new(global(), vec![("quiet:".into(), with(|o| o.presence = Some(false)))])
                .unwrap();
        assert!(!t.resolve("quiet:room").presence);
        assert!(t.resolve("loud:room").presence, "default true");
        let off = RoomOptions { presence: false, ..global() };
        let t =
            Namespaces::new(off, vec![("on:".into(), with(|o| o.presence = Some(true)))]).unwrap();
        assert!(t.resolve("on:1").presence);
        assert!(!t.resolve("other").presence);
    }

    #[test]
    fn retention_and_window() {
        let o =
            RoomOptions { history_size: 7, history_ttl_secs: 3, batch_window_ms: 250, ..global() };
        assert_eq!(o.retention(), Retention { max_events: 7, max_age_ms: 3000 });
        assert_eq!(o.batch_window(), Duration::from_millis(250));
        let huge = RoomOptions { history_ttl_secs: u64::MAX, ..global() };
        assert_eq!(huge.retention().max_age_ms, u64::MAX, "saturates");
    }

    #[test]
    fn largest_history_size_counts_global_and_every_namespace() {
        assert_eq!(table().largest_history_size(), 5000);
        assert_eq!(Namespaces::global(global()).largest_history_size(), 1000);
        let small =
            Namespaces::new(global(), vec![("a".into(), with(|o| o.history_size = Some(10)))])
                .unwrap();
        assert_eq!(
            small.largest_history_size(),
            1000,
            "the global size still applies to other rooms"
        );
    }

    #[test]
    fn bad_tables() {
        let cases: Vec<(Vec<&str>, NamespaceError)> = vec![
            (
                vec!["a:", "b:", "a:"],
                NamespaceError::Duplicate { index: 2, first: 0, prefix: "a:".into() },
            ),
            (vec![""], NamespaceError::BadPrefix { index: 0, prefix: "".into() }),
            (
                vec!["ok", "has space"],
                NamespaceError::BadPrefix { index: 1, prefix: "has space".into() },
            ),
            (vec!["x/y"], NamespaceError::BadPrefix { index: 0, prefix: "x/y".into() }),
        ];
        for (prefixes, want) in cases {
            let entries = prefixes.iter().map(|p| (p.to_string(), Overrides::default())).collect();
            let got = Namespaces::new(global(), entries).unwrap_err();
            assert_eq!(got, want, "{prefixes:?}");
            assert_eq!(got.index(), want.index());
        }
        let long = "a".repeat(MAX_ROOM_LEN + 1);
        assert!(!check_prefix(&long));
        assert!(check_prefix(&long[1..]));
        assert!(check_prefix("user:a@b"));
        let msg = Namespaces::new(
            global(),
            vec![("a".into(), Overrides::default()), ("a".into(), Overrides::default())],
        )
        .unwrap_err();
        assert_eq!(msg.to_string(), "prefix \"a\" is already the prefix of namespace 1");
    }
}
