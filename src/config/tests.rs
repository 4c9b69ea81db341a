//! The configuration's table tests: one case per layer, value form and validation rule.

use super::validate::NAME_KEYS;
use super::*;

/// What a case expects: values of the loaded config (key, TOML text of the value),
/// or the exact error message, or its beginning. `FILE` stands for the file's path.
enum Expect {
    Values(Vec<(&'static str, &'static str)>),
    Error(String),
    ErrorStarts(&'static str),
}
use Expect::*;

struct Case {
    name: &'static str,
    file: Option<&'static str>,
    env: Vec<(&'static str, &'static str)>,
    flags: Vec<(&'static str, &'static str)>,
    expect: Expect,
}

fn case(name: &'static str, expect: Expect) -> Case {
    Case { name, file: None, env: vec![], flags: vec![], expect }
}

impl Case {
    fn file(mut self, text: &'static str) -> Self {
        self.file = Some(text);
        self
    }
    fn env(mut self, var: &'static str, value: &'static str) -> Self {
        self.env.push((var, value));
        self
    }
    fn flag(mut self, key: &'static str, value: &'static str) -> Self {
        self.flags.push((key, value));
        self
    }
}

/// Loads one case and returns the config as a TOML table, or the error message with
/// the config file's path replaced by `FILE`.
fn check(case: &Case) -> Result<toml::Table, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("livegate.toml");
    if let Some(text) = case.file {
        std::fs::write(&path, text).unwrap();
    }
    let env = case.env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    let flags = case.flags.iter().fold(ConfigFlags::default(), |f, (k, v)| f.with(k, *v));
    match Config::load(case.file.map(|_| path.as_path()), env, &flags) {
        Ok(config) => Ok(toml::Table::try_from(&config).unwrap()),
        Err(e) => Err(e.to_string().replace(&path.display().to_string(), "FILE")),
    }
}

#[test]
fn load_cases() {
    let known = known_keys();
    let cases = vec![
        // Defaults and precedence: file < env < flag.
        case("defaults", Values(vec![
            ("listen", "\"127.0.0.1:7070\""),
            ("batch_window_ms", "100"),
            ("exclusive_devices", "[\"phone\", \"pc\"]"),
            ("data_dir", "\"./data\""),
        ])),
        case("file", Values(vec![("batch_window_ms", "5"), ("heartbeat_secs", "30")]))
            .file("batch_window_ms = 5"),
        case("env over file", Values(vec![("batch_window_ms", "7"), ("history_size", "10")]))
            .file("batch_window_ms = 5\nhistory_size = 10")
            .env("LIVEGATE_BATCH_WINDOW_MS", "7"),
        case("flag over env", Values(vec![("batch_window_ms", "0")]))
            .file("batch_window_ms = 5")
            .env("LIVEGATE_BATCH_WINDOW_MS", "7")
            .flag("batch_window_ms", "0"),
        case("flag over file", Values(vec![("data_dir", "\"/tmp/x\"")]))
            .file("data_dir = \"/srv/livegate\"")
            .flag("data_dir", "/tmp/x"),
        case("every kind from env", Values(vec![
            ("listen", "\"0.0.0.0:0\""),
            ("data_dir", "\"/var/lib/livegate\""),
            ("api_key", "\"0123456789abcdef\""),
            ("node", "\"n-1.a_b\""),
            ("exclusive_devices", "[\"tv\", \"watch\"]"),
            ("max_outbox_bytes", "4096"),
        ]))
            .env("LIVEGATE_LISTEN", "0.0.0.0:0")
            .env("LIVEGATE_DATA_DIR", "/var/lib/livegate")
            .env("LIVEGATE_API_KEY", "0123456789abcdef")
            .env("LIVEGATE_NODE", "n-1.a_b")
            .env("LIVEGATE_EXCLUSIVE_DEVICES", "tv, watch")
            .env("LIVEGATE_MAX_OUTBOX_BYTES", "4096"),
        case("empty list", Values(vec![("exclusive_devices", "[]")]))
            .flag("exclusive_devices", ""),
        case("list in file as array", Values(vec![("exclusive_devices", "[\"phone\"]")]))
            .file("exclusive_devices = [\"phone\"]"),
        case("list in file as text", Values(vec![("exclusive_devices", "[\"phone\", \"tv\"]")]))
            .file("exclusive_devices = \"phone,tv\""),
        case("IPv6 listen", Values(vec![("listen", "\"[::1]:8080\"")]))
            .file("listen = \"[::1]:8080\""),
        case("bounds are inclusive", Values(vec![
            ("batch_window_ms", "10000"), ("max_event_bytes", "16777216"), ("history_size", "1000000"),
        ]))
            .flag("batch_window_ms", "10000")
            .flag("max_event_bytes", "16777216")
            .flag("history_size", "1000000"),
        case("presence bounds", Values(vec![("presence_interval_ms", "60000"), ("presence_members_max", "5000")]))
            .flag("presence_interval_ms", "60000")
            .flag("presence_members_max", "5000"),
        case("presence interval too short", Error(
            "presence_interval_ms must be at least 50, got 10 (set by LIVEGATE_PRESENCE_INTERVAL_MS)".into()))
            .env("LIVEGATE_PRESENCE_INTERVAL_MS", "10"),
        case("too many presence members", Error(
            "presence_members_max must be at most 5000, got 5001 (set by --presence-members-max)".into()))
            .flag("presence_members_max", "5001"),
        case("small bounds", Values(vec![("max_event_bytes", "16"), ("heartbeat_secs", "1")]))
            .env("LIVEGATE_MAX_EVENT_BYTES", "16")
            .env("LIVEGATE_HEARTBEAT_SECS", "1"),
        // Unknown and unrelated variables.
        case("unknown env var ignored", Values(vec![("batch_window_ms", "100")]))
            .env("LIVEGATE_BATCH_WINDOW", "fast")
            .env("LIVEGATE_", "x")
            .env("LIVEGATE_CONFIG", "/nonexistent.toml")
            .env("LIVEGATE_LOG_FORMAT", "json")
            .env("livegate_batch_window_ms", "fast")
            .env("PATH", "/usr/bin"),
        // The file.
        case("unknown file key", Error(format!("config file FILE: unknown key `batch_window` (known keys: {known})")))
            .file("batch_window = 5"),
        case("section in file", Error(format!("config file FILE: unknown key `server` (known keys: {known})")))
            .file("[server]\nlisten = \"127.0.0.1:1\""),
        case("not TOML", ErrorStarts("config file FILE is not valid TOML: "))
            .file("batch_window_ms = "),
        case("text for a number in file", Error(
            "batch_window_ms in FILE: expected a whole number of milliseconds, got \"100\"".into()))
            .file("batch_window_ms = \"100\""),
        case("negative in file", Error("history_size in FILE: expected a whole number, got -5".into()))
            .file("history_size = -5"),
        case("bad listen in file", Error(
            "listen in FILE: expected an IP address and port such as 127.0.0.1:7070, got \"localhost:80\"".into()))
            .file("listen = \"localhost:80\""),
        case("number list in file", Error(
            "exclusive_devices in FILE: expected a comma-separated list, got [1]".into()))
            .file("exclusive_devices = [1]"),
        case("number for text in file", Error("node in FILE: expected text, got 5".into()))
            .file("node = 5"),
        case("empty data dir in file", Error("data_dir in FILE: expected a path, got \"\"".into()))
            .file("data_dir = \"\""),
        // Bad text values name the variable or the flag.
        case("env not a number", Error(
            "LIVEGATE_BATCH_WINDOW_MS: expected a whole number of milliseconds, got \"fast\"".into()))
            .env("LIVEGATE_BATCH_WINDOW_MS", "fast"),
        case("flag negative", Error("--heartbeat-secs: expected a whole number of seconds, got \"-1\"".into()))
            .flag("heartbeat_secs", "-1"),
        case("env too big", Error(
            "LIVEGATE_MAX_OUTBOX_BYTES: expected a whole number of bytes, got \"18446744073709551615\"".into()))
            .env("LIVEGATE_MAX_OUTBOX_BYTES", "18446744073709551615"),
        case("env bad listen", Error(
            "LIVEGATE_LISTEN: expected an IP address and port such as 127.0.0.1:7070, got \"127.0.0.1\"".into()))
            .env("LIVEGATE_LISTEN", "127.0.0.1"),
        case("flag empty data dir", Error("--data-dir: expected a path, got \"\"".into()))
            .flag("data_dir", ""),
        case("bad flag wins over good env", Error("--history-size: expected a whole number, got \"ten\"".into()))
            .env("LIVEGATE_HISTORY_SIZE", "10")
            .flag("history_size", "ten"),
        // Validation names the key and what set it.
        case("batch window too long", Error(
            "batch_window_ms must be at most 10000 (10 seconds), got 10001 (set by --batch-window-ms)".into()))
            .flag("batch_window_ms", "10001"),
        case("heartbeat zero", Error("heartbeat_secs must be at least 1, got 0 (set by LIVEGATE_HEARTBEAT_SECS)".into()))
            .env("LIVEGATE_HEARTBEAT_SECS", "0"),
        case("history zero", Error("history_size must be at least 1, got 0 (set by history_size in FILE)".into()))
            .file("history_size = 0"),
        case("history too big", Error("history_size must be at most 1000000, got 1000001 (set by --history-size)".into()))
            .flag("history_size", "1000001"),
        case("recovery zero", Error("recovery_max_events must be at least 1, got 0 (set by --recovery-max-events)".into()))
            .flag("recovery_max_events", "0"),
        case("event bytes too small", Error("max_event_bytes must be at least 16, got 15 (set by --max-event-bytes)".into()))
            .flag("max_event_bytes", "15"),
        case("event bytes too big", Error(
            "max_event_bytes must be at most 16777216 (16 MiB), got 16777217 (set by --max-event-bytes)".into()))
            .flag("max_event_bytes", "16777217"),
        case("state bytes too small", Error("max_state_bytes must be at least 16, got 15 (set by --max-state-bytes)".into()))
            .flag("max_state_bytes", "15"),
        case("state bytes too big", Error(
            "max_state_bytes must be at most 16777216 (16 MiB), got 16777217 (set by LIVEGATE_MAX_STATE_BYTES)".into()))
            .env("LIVEGATE_MAX_STATE_BYTES", "16777217"),
        case("state bytes from the file", Values(vec![("max_state_bytes", "1024")])).file("max_state_bytes = 1024"),
        case("subscriptions zero", Error("max_subscriptions must be at least 1, got 0 (set by --max-subscriptions)".into()))
            .flag("max_subscriptions", "0"),
        case("token ttl zero", Error("token_ttl_max_secs must be at least 1, got 0 (set by --token-ttl-max-secs)".into()))
            .flag("token_ttl_max_secs", "0"),
        case("outbox too small", Error("max_outbox_bytes must be at least 4096, got 4095 (set by --max-outbox-bytes)".into()))
            .flag("max_outbox_bytes", "4095"),
        case("empty node", Error("node must be 1 to 64 characters from A-Z a-z 0-9 _ . -, got \"\" (set by LIVEGATE_NODE)".into()))
            .env("LIVEGATE_NODE", ""),
        case("node with space", Error(
            "node must be 1 to 64 characters from A-Z a-z 0-9 _ . -, got \"my node\" (set by --node)".into()))
            .flag("node", "my node"),
        case("node too long", ErrorStarts("node must be 1 to 64 characters from A-Z a-z 0-9 _ . -, got \"nnnn"))
            .flag("node", "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"),
        case("short api key, not echoed", Error(
            "api_key must be at least 16 characters long, got 6 (set by LIVEGATE_API_KEY)".into()))
            .env("LIVEGATE_API_KEY", "secret"),
        case("mistyped key, not echoed", Error(
            "api_key in FILE: expected text, got a value that is not shown (a secret)".into()))
            .file("api_key = [\"0123456789abcdef-secret\"]"),
        case("bool from env", Values(vec![("ws_echo", "true")])).env("LIVEGATE_WS_ECHO", "true"),
        case("bool from file", Values(vec![("ws_echo", "false")])).file("ws_echo = false"),
        case("bad bool", Error("--ws-echo: expected true or false, got \"yes\"".into())).flag("ws_echo", "yes"),
        case("frame too small", Error("max_frame_bytes must be at least 1024, got 10 (set by --max-frame-bytes)".into()))
            .flag("max_frame_bytes", "10"),
        case("message too big", Error(
            "max_message_bytes must be at most 67108864 (64 MiB), got 67108865 (set by LIVEGATE_MAX_MESSAGE_BYTES)".into()))
            .env("LIVEGATE_MAX_MESSAGE_BYTES", "67108865"),
        case("short previous key, not echoed", Error(
            "previous_api_keys entries must be at least 16 characters long (set by previous_api_keys in FILE)".into()))
            .file("previous_api_keys = [\"0123456789abcdef\", \"hunter2\"]"),
        case("trusted proxies", Values(vec![("trusted_proxies", "[\"127.0.0.1\", \"10.0.0.0/8\"]")]))
            .env("LIVEGATE_TRUSTED_PROXIES", "127.0.0.1,10.0.0.0/8"),
        case("bad proxy block", Error(
            "trusted_proxies entries are addresses or blocks such as 10.0.0.0/8 or ::1/128, got \"10.0.0.0/33\" (set by --trusted-proxies)".into()))
            .flag("trusted_proxies", "10.0.0.0/33"),
        case("store cache zero", Error("store_cache_mb must be at least 1, got 0 (set by store_cache_mb in FILE)".into()))
            .file("store_cache_mb = 0"),
        case("origin with path", Error(
            "allowed_origins entries are scheme://host[:port] without a path, got \"https://a.example/\" (set by --allowed-origins)".into()))
            .flag("allowed_origins", "https://a.example/"),
        case("tls cert without key", Error("tls_cert and tls_key must be set together (set by --tls-cert)".into()))
            .flag("tls_cert", "/etc/cert.pem"),
        // Cluster mode: one NATS URL or several seeds, and the replicas.
        case("nats seeds", Values(vec![("cluster_nats_url", "\"nats://n1:4222, nats://n2:4222,nats://n3:4222\""), ("cluster_replicas", "3")]))
            .flag("cluster_nats_url", "nats://n1:4222, nats://n2:4222,nats://n3:4222")
            .env("LIVEGATE_CLUSTER_REPLICAS", "3"),
        case("one nats url", Values(vec![("cluster_nats_url", "\"tls://n1:4222\"")])).file("cluster_nats_url = \"tls://n1:4222\""),
        case("a bad nats seed", ErrorStarts("cluster_nats_url must be nats://HOST:PORT or tls://HOST:PORT, or several"))
            .flag("cluster_nats_url", "nats://n1:4222,n2:4222"),
        // Logging in to NATS: a user with its password, or a token; secrets never echoed.
        case("nats user and password", Values(vec![("cluster_nats_user", "\"livegate\""), ("cluster_nats_password", "\"s3cret\"")]))
            .flag("cluster_nats_url", "nats://n1:4222")
            .file("cluster_nats_user = \"livegate\"")
            .env("LIVEGATE_CLUSTER_NATS_PASSWORD", "s3cret"),
        case("nats token", Values(vec![("cluster_nats_token", "\"t0ken\"")]))
            .flag("cluster_nats_url", "nats://n1:4222")
            .env("LIVEGATE_CLUSTER_NATS_TOKEN", "t0ken"),
        case("nats user without password", Error(
            "cluster_nats_user and cluster_nats_password must be set together (set by --cluster-nats-user)".into()))
            .flag("cluster_nats_url", "nats://n1:4222")
            .flag("cluster_nats_user", "livegate"),
        case("nats password without user", Error("cluster_nats_user and cluster_nats_password must be set together".into()))
            .flag("cluster_nats_url", "nats://n1:4222")
            .env("LIVEGATE_CLUSTER_NATS_PASSWORD", "s3cret"),
        case("nats user and token", Error(
            "cluster_nats_token and cluster_nats_user are two ways to log in: set one (set by LIVEGATE_CLUSTER_NATS_TOKEN)".into()))
            .flag("cluster_nats_url", "nats://n1:4222")
            .flag("cluster_nats_user", "livegate")
            .flag("cluster_nats_password", "s3cret")
            .env("LIVEGATE_CLUSTER_NATS_TOKEN", "t0ken"),
        case("nats login without cluster mode", Error(
            "cluster_nats_password needs cluster_nats_url: only cluster mode logs in to NATS (set by --cluster-nats-password)".into()))
            .flag("cluster_nats_password", "s3cret"),
        case("empty nats token", Error("cluster_nats_token must not be empty (set by LIVEGATE_CLUSTER_NATS_TOKEN)".into()))
            .flag("cluster_nats_url", "nats://n1:4222")
            .env("LIVEGATE_CLUSTER_NATS_TOKEN", ""),
        case("nats credentials in the url, not echoed", Error(
            "cluster_nats_url must not carry credentials (USER:PASSWORD@): set cluster_nats_user and cluster_nats_password, or cluster_nats_token (set by --cluster-nats-url)".into()))
            .flag("cluster_nats_url", "nats://n1:4222,nats://livegate:hunter2@n2:4222"),
        case("nats password mistyped, not echoed", Error(
            "cluster_nats_password in FILE: expected text, got a value that is not shown (a secret)".into()))
            .file("cluster_nats_password = 12345"),
        // Cells with their own NATS: cells listed as domains, and a shared token key.
        case("cell domains", Values(vec![("cluster_cell_domains", "true"), ("cells", "[\"a\", \"b\"]")]))
            .flag("cluster_nats_url", "nats://n1:4222")
            .flag("cell", "a")
            .flag("cells", "a,b")
            .flag("cluster_cell_domains", "true")
            .env("LIVEGATE_CLUSTER_TOKEN_SECRET", "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"),
        case("cell domains without a token secret", ErrorStarts("cluster_token_secret must be set with cluster_cell_domains"))
            .flag("cluster_nats_url", "nats://n1:4222")
            .flag("cell", "a")
            .flag("cells", "a,b")
            .flag("cluster_cell_domains", "true"),
        case("cell domains without cells", ErrorStarts("cluster_cell_domains needs cells"))
            .flag("cluster_nats_url", "nats://n1:4222")
            .flag("cluster_cell_domains", "true")
            .env("LIVEGATE_CLUSTER_TOKEN_SECRET", "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"),
        case("a cell domain with a dot", ErrorStarts("cells entries name JetStream domains with cluster_cell_domains: no '.', got \"eu.west\""))
            .flag("cluster_nats_url", "nats://n1:4222")
            .flag("cell", "a")
            .flag("cells", "a,eu.west")
            .flag("cluster_cell_domains", "true")
            .env("LIVEGATE_CLUSTER_TOKEN_SECRET", "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"),
        case("a short token secret, not echoed", Error(
            "cluster_token_secret must be at least 32 characters long, got 6 (set by LIVEGATE_CLUSTER_TOKEN_SECRET)".into()))
            .flag("cluster_nats_url", "nats://n1:4222")
            .env("LIVEGATE_CLUSTER_TOKEN_SECRET", "hunter"),
        case("a short JWT secret, not echoed", Error(
            "jwt_hmac_secret must be at least 32 bytes long (HS256 needs a key as long as its hash), got 6 (set by LIVEGATE_JWT_HMAC_SECRET)".into()))
            .env("LIVEGATE_JWT_HMAC_SECRET", "hunter"),
        case("an empty JWT issuer", ErrorStarts("jwt_issuer must not be empty when set")).flag("jwt_issuer", ""),
        case("cell domains outside cluster mode", ErrorStarts("cluster_cell_domains needs cluster_nats_url"))
            .flag("cell", "a")
            .flag("cells", "a,b")
            .flag("cluster_cell_domains", "true"),
        case("two replicas", Error("cluster_replicas must be 1 or 3, got 2 (set by --cluster-replicas)".into()))
            .flag("cluster_replicas", "2"),
        // Webhooks.
        case("webhook defaults", Values(vec![
            ("webhook_url", "\"\""), ("webhook_secret", "\"\""), ("webhook_queue_max", "10000"), ("webhook_timeout_ms", "5000"),
        ])),
        case("webhooks on", Values(vec![
            ("webhook_url", "\"https://backend.example/hooks?k=1\""), ("webhook_queue_max", "5"), ("webhook_timeout_ms", "100"),
        ]))
            .file("webhook_url = \"https://backend.example/hooks?k=1\"\nwebhook_secret = \"s3cret\"")
            .env("LIVEGATE_WEBHOOK_QUEUE_MAX", "5")
            .flag("webhook_timeout_ms", "100"),
        case("webhook over plain http", Values(vec![("webhook_url", "\"http://127.0.0.1:9000/h\"")]))
            .flag("webhook_url", "http://127.0.0.1:9000/h")
            .env("LIVEGATE_WEBHOOK_SECRET", "s"),
        case("webhook url without secret", Error(
            "webhook_secret must be set when webhook_url is: every webhook is signed with it".into()))
            .flag("webhook_url", "http://127.0.0.1:9000/h"),
        case("webhook url with an empty secret", Error(
            "webhook_secret must be set when webhook_url is: every webhook is signed with it (set by LIVEGATE_WEBHOOK_SECRET)".into()))
            .flag("webhook_url", "http://127.0.0.1:9000/h")
            .env("LIVEGATE_WEBHOOK_SECRET", ""),
        case("webhook url of another scheme, not echoed", Error(
            "webhook_url must be an http:// or https:// URL with a host, such as https://backend.example/hooks (set by webhook_url in FILE)".into()))
            .file("webhook_url = \"ftp://token@backend.example/hooks\"\nwebhook_secret = \"s\""),
        case("webhook url without a host", Error(
            "webhook_url must be an http:// or https:// URL with a host, such as https://backend.example/hooks (set by --webhook-url)".into()))
            .flag("webhook_url", "http:///hooks")
            .flag("webhook_secret", "s"),
        case("webhook url without a scheme", ErrorStarts("webhook_url must be an http:// or https:// URL"))
            .flag("webhook_url", "backend.example/hooks")
            .flag("webhook_secret", "s"),
        case("webhook secret alone is harmless", Values(vec![("webhook_url", "\"\"")])).flag("webhook_secret", "s"),
        case("webhook queue zero", Error("webhook_queue_max must be at least 1, got 0 (set by --webhook-queue-max)".into()))
            .flag("webhook_queue_max", "0"),
        case("webhook queue too big", Error(
            "webhook_queue_max must be at most 10000000, got 10000001 (set by LIVEGATE_WEBHOOK_QUEUE_MAX)".into()))
            .env("LIVEGATE_WEBHOOK_QUEUE_MAX", "10000001"),
        case("webhook timeout too short", Error("webhook_timeout_ms must be at least 100, got 99 (set by --webhook-timeout-ms)".into()))
            .flag("webhook_timeout_ms", "99"),
        case("webhook timeout too long", Error(
            "webhook_timeout_ms must be at most 600000 (10 minutes), got 600001 (set by --webhook-timeout-ms)".into()))
            .flag("webhook_timeout_ms", "600001"),
        case("webhook secret mistyped, not echoed", Error(
            "webhook_secret in FILE: expected text, got a value that is not shown (a secret)".into()))
            .file("webhook_secret = [\"hunter2\"]"),
        case("bad device name", Error(
            "exclusive_devices entries must be 1 to 32 characters from A-Z a-z 0-9 _ . -, got \"tv remote\" (set by --exclusive-devices)".into()))
            .flag("exclusive_devices", "phone,tv remote"),
        case("cells listed", Values(vec![("cells", "[\"east\", \"north\", \"west\"]"), ("cell", "\"north\"")]))
            .flag("cells", "east,north,west")
            .flag("cell", "north"),
        case("cells in a file", Values(vec![("cells", "[\"east\", \"west\"]")]))
            .file("cell = \"west\"\ncells = [\"east\", \"west\"]"),
        case("cells without the node's own", Error(
            "cells must list this node's cell \"default\" (cell), got east,west (set by --cells)".into()))
            .flag("cells", "east,west"),
        case("a cell twice", Error("cells lists \"east\" twice (set by LIVEGATE_CELLS)".into()))
            .env("LIVEGATE_CELLS", "east,default,east"),
        case("a bad cell name", Error(
            "cells entries must be 1 to 64 characters from A-Z a-z 0-9 _ . -, got \"east coast\" (set by --cells)".into()))
            .flag("cells", "default,east coast"),
        case("a peer in a cell not listed", Error(
            "cells must list peer b's cell \"west\", got default,east (set by --cells)".into()))
            .flag("cells", "default,east")
            .flag("peers", "b@west=http://127.0.0.1:7071"),
    ];
    let mut failures = vec![];
    for case in &cases {
        let got = check(case);
        let ok = match (&case.expect, &got) {
            (Values(values), Ok(table)) => values.iter().all(|(key, want)| {
                table.get(*key).map(|v| v.to_string()).as_deref() == Some(*want)
            }),
            (Error(want), Err(msg)) => msg == want,
            (ErrorStarts(want), Err(msg)) => msg.starts_with(want),
            _ => false,
        };
        if !ok {
            failures.push(format!("case {:?}: got {got:?}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn keys_match_config_fields() {
    let config = Config {
        api_key: Some("x".repeat(16)),
        public_url: Some("http://x".into()),
        tls_cert: Some("cert.pem".into()),
        tls_key: Some("key.pem".into()),
        cluster_nats_url: Some("nats://127.0.0.1:4222".into()),
        cluster_replicas: Some(3),
        cluster_nats_user: Some("livegate".into()),
        cluster_nats_password: Some("pw".into()),
        cluster_nats_token: Some("token".into()),
        cluster_token_secret: Some("s".repeat(32)),
        jwt_hmac_secret: Some("s".repeat(32)),
        jwt_public_key_file: Some("backend.pem".into()),
        jwt_jwks_file: Some("backend.jwks.json".into()),
        jwt_issuer: Some("backend".into()),
        jwt_audience: Some("livegate".into()),
        ..Config::default()
    };
    let table = toml::Table::try_from(&config).unwrap();
    let fields: Vec<&str> = table.keys().map(String::as_str).collect();
    let mut keys: Vec<&str> = KEYS.to_vec();
    keys.sort();
    assert_eq!(keys, fields, "KEYS must list exactly the fields of Config");
    let flags = <ConfigFlags as clap::Args>::augment_args(clap::Command::new("livegate"));
    let help = |key: &str| {
        let arg = flags
            .get_arguments()
            .find(|arg| arg.get_id() == key)
            .unwrap_or_else(|| panic!("no flag for {key}"));
        assert_eq!(arg.get_long(), Some(key.replace('_', "-").as_str()), "flag of {key}");
        arg.get_help().map(|help| help.to_string()).unwrap_or_default()
    };
    let default_table = toml::Table::try_from(Config::default()).unwrap();
    for &key in KEYS {
        // The type accepts the value as check-config prints it: what it prints loads back.
        let mut loaded = Config::default();
        loaded
            .set(key, Raw::Toml(&table[key]), &Origin::Flag { key })
            .unwrap_or_else(|e| panic!("the type of {key} does not fit its default: {e}"));
        assert_eq!(toml::Table::try_from(&loaded).unwrap()[key], table[key], "{key} loaded back");
        // The help text states the real default (a key with none, such as
        // cluster_replicas, says in words what happens without it).
        if let (toml::Value::Integer(_) | toml::Value::Boolean(_), true) =
            (&table[key], default_table.contains_key(key))
        {
            let n = &table[key];
            assert!(
                help(key).ends_with(&format!("[default: {n}]")),
                "help of {key} must end with [default: {n}]"
            );
        }
    }
    let defaults = Config::default();
    assert!(help("listen").ends_with(&format!("[default: {}]", defaults.listen)));
    assert!(help("data_dir").ends_with(&format!("[default: {}]", defaults.data_dir.display())));
    assert!(help("cell").ends_with(&format!("[default: {}]", defaults.cell)));
    assert!(help("exclusive_devices")
        .ends_with(&format!("[default: {}]", defaults.exclusive_devices.join(","))));
}

#[test]
fn durations_are_in_the_unit_their_key_names() {
    for &(key, duration) in DURATIONS {
        let mut config = Config::default();
        config.set(key, Raw::Text("7"), &Origin::Flag { key }).unwrap();
        let unit =
            if key.ends_with("_ms") { Duration::from_millis(1) } else { Duration::from_secs(1) };
        assert!(key.ends_with("_ms") || key.ends_with("_secs"), "{key} names no unit");
        assert_eq!(duration(&config), unit * 7, "{key}");
    }
}

#[test]
fn defaults_are_valid() {
    Config::default().validate().unwrap();
}

#[derive(clap::Parser, Debug)]
struct TestCli {
    #[command(flatten)]
    config: ConfigFlags,
    #[command(subcommand)]
    command: Option<TestCommand>,
}

#[derive(clap::Subcommand, Debug)]
enum TestCommand {
    Sub,
}

#[test]
fn flags_parse_before_and_after_a_subcommand() {
    use clap::{CommandFactory, Parser};
    TestCli::command().debug_assert();
    let cli = TestCli::try_parse_from([
        "livegate",
        "--batch-window-ms",
        "0",
        "sub",
        "--data-dir",
        "/d",
        "--exclusive-devices",
        "phone,pc",
        "--config",
        "c.toml",
    ])
    .unwrap();
    let expected = ConfigFlags::default()
        .with("batch_window_ms", "0")
        .with("data_dir", "/d")
        .with("exclusive_devices", "phone,pc");
    assert_eq!(cli.config, ConfigFlags { config: Some("c.toml".into()), ..expected });
    assert!(TestCli::try_parse_from(["livegate", "--batch-window", "0"]).is_err());
}

#[test]
fn config_file_from_flag_or_env() {
    let env = vec![("LIVEGATE_CONFIG".to_string(), "/etc/livegate.toml".to_string())];
    assert_eq!(ConfigFlags::default().config_file(&env), Some(PathBuf::from("/etc/livegate.toml")));
    let flags = ConfigFlags { config: Some("mine.toml".into()), ..ConfigFlags::default() };
    assert_eq!(flags.config_file(&env), Some(PathBuf::from("mine.toml")));
    assert_eq!(ConfigFlags::default().config_file(&[]), None);
}

#[test]
fn api_key_generated_once_then_reused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = Config { data_dir: dir.path().join("not/yet/there"), ..Config::default() };
    assert_eq!(config.existing_api_key().unwrap(), None, "clients find no key");
    assert!(!config.data_dir.exists(), "looking for a key creates nothing");

    let first = config.resolve_api_key().unwrap();
    let path = config.api_key_path();
    assert_eq!(first.generated_at.as_deref(), Some(path.as_path()));
    assert_eq!(first.key.len(), 43, "32 bytes in base64url without padding");
    assert!(first.key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let second = config.resolve_api_key().unwrap();
    assert_eq!(second, ResolvedApiKey { key: first.key.clone(), generated_at: None });
    assert_eq!(config.existing_api_key().unwrap(), Some(first.key.clone()));

    let configured = Config { api_key: Some("configured-key-0123".into()), ..config.clone() };
    assert_eq!(configured.resolve_api_key().unwrap().key, "configured-key-0123");

    std::fs::write(&path, "  spaced-key-0123456789 \n").unwrap();
    assert_eq!(config.resolve_api_key().unwrap().key, "spaced-key-0123456789");
}

#[test]
fn api_key_file_problems() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config { data_dir: dir.path().to_path_buf(), ..Config::default() };
    let path = config.api_key_path();
    for (content, problem) in
        [("\n", "is empty"), ("short", "holds a key shorter than 16 characters")]
    {
        std::fs::write(&path, content).unwrap();
        let error = config.resolve_api_key().unwrap_err();
        assert!(
            matches!(&error, ConfigError::StoredApiKey { path: p, problem: got } if *p == path && *got == problem),
            "{error:?}"
        );
        let message = format!("{problem}: delete it to have a new key generated, or set api_key");
        assert_eq!(error.to_string(), format!("API key file {}: {message}", path.display()));
    }
}

/// `[[namespace]]` tables: what loads, and every refusal naming the table.
#[test]
fn namespace_tables() {
    let ok = "history_size = 100\n\
        [[namespace]]\nprefix = \"chat:\"\nhistory_size = 5\nbatch_window_ms = 0\n\
        [[namespace]]\nprefix = \"chat:vip:\"\npresence = false\nmax_event_bytes = 1024\nhistory_ttl_secs = 2\n\
        [[namespace]]\nprefix = \"user:\"\n";
    let cases: Vec<(&str, &str, Result<Vec<NamespaceTable>, String>)> = vec![
        ("none", "history_size = 5", Ok(vec![])),
        ("three", ok, Ok(vec![
            NamespaceTable { prefix: "chat:".into(), history_size: Some(5), batch_window_ms: Some(0), ..Default::default() },
            NamespaceTable {
                prefix: "chat:vip:".into(),
                presence: Some(false),
                max_event_bytes: Some(1024),
                history_ttl_secs: Some(2),
                ..Default::default()
            },
            NamespaceTable { prefix: "user:".into(), ..Default::default() },
        ])),
        ("bounds are inclusive",
            "[[namespace]]\nprefix = \"a\"\nhistory_size = 1000000\nbatch_window_ms = 10000\nmax_event_bytes = 16\nhistory_ttl_secs = 0",
            Ok(vec![NamespaceTable {
                prefix: "a".into(), history_size: Some(1_000_000), batch_window_ms: Some(10_000),
                max_event_bytes: Some(16), history_ttl_secs: Some(0), ..Default::default()
            }])),
        ("no prefix", "[[namespace]]\nhistory_size = 5",
            Err("config file FILE: [[namespace]] number 1: prefix is required (a room-name prefix such as \"chat:\")".into())),
        ("empty prefix", "[[namespace]]\nprefix = \"a\"\n[[namespace]]\nprefix = \"\"",
            Err("config file FILE: [[namespace]] number 2 (prefix \"\"): prefix must be 1 to 128 characters of A-Z a-z 0-9 _ . : - @, got \"\"".into())),
        ("prefix not text", "[[namespace]]\nprefix = 5",
            Err("config file FILE: [[namespace]] number 1: prefix: expected text, got 5".into())),
        ("bad prefix", "[[namespace]]\nprefix = \"a b\"",
            Err("config file FILE: [[namespace]] number 1 (prefix \"a b\"): prefix must be 1 to 128 characters of A-Z a-z 0-9 _ . : - @, got \"a b\"".into())),
        ("duplicate prefix", "[[namespace]]\nprefix = \"chat:\"\n[[namespace]]\nprefix = \"x\"\n[[namespace]]\nprefix = \"chat:\"\nhistory_size = 3",
            Err("config file FILE: [[namespace]] number 3 (prefix \"chat:\"): prefix \"chat:\" is already the prefix of namespace 1".into())),
        ("unknown key", "[[namespace]]\nprefix = \"chat:\"\nhistory = 5",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): unknown key `history` (known keys: prefix, history_size, history_ttl_secs, batch_window_ms, presence, max_event_bytes, home_cell)".into())),
        ("global key not per room", "[[namespace]]\nprefix = \"chat:\"\nheartbeat_secs = 5",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): unknown key `heartbeat_secs` (known keys: prefix, history_size, history_ttl_secs, batch_window_ms, presence, max_event_bytes, home_cell)".into())),
        ("wrong type", "[[namespace]]\nprefix = \"chat:\"\nbatch_window_ms = \"fast\"",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): batch_window_ms: expected a whole number of milliseconds, got \"fast\"".into())),
        ("wrong bool", "[[namespace]]\nprefix = \"chat:\"\npresence = \"no\"",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): presence: expected true or false, got \"no\"".into())),
        ("negative", "[[namespace]]\nprefix = \"chat:\"\nhistory_ttl_secs = -1",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): history_ttl_secs: expected a whole number of seconds, got -1".into())),
        ("history zero", "[[namespace]]\nprefix = \"chat:\"\nhistory_size = 0",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): history_size must be at least 1, got 0".into())),
        ("history too big", "[[namespace]]\nprefix = \"a\"\n[[namespace]]\nprefix = \"b\"\nhistory_size = 1000001",
            Err("config file FILE: [[namespace]] number 2 (prefix \"b\"): history_size must be at most 1000000, got 1000001".into())),
        ("window too long", "[[namespace]]\nprefix = \"chat:\"\nbatch_window_ms = 10001",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): batch_window_ms must be at most 10000 (10 seconds), got 10001".into())),
        ("event bytes too small", "[[namespace]]\nprefix = \"chat:\"\nmax_event_bytes = 15",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): max_event_bytes must be at least 16, got 15".into())),
        ("event bytes too big", "[[namespace]]\nprefix = \"chat:\"\nmax_event_bytes = 16777217",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): max_event_bytes must be at most 16777216 (16 MiB), got 16777217".into())),
        ("not tables", "namespace = [\"chat:\"]",
            Err("config file FILE: namespace: must be written as [[namespace]] tables, each with a prefix".into())),
        ("a single table", "[namespace]\nprefix = \"chat:\"",
            Err("config file FILE: namespace: must be written as [[namespace]] tables, each with a prefix".into())),
        ("home cell not text", "[[namespace]]\nprefix = \"chat:\"\nhome_cell = 5",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): home_cell: expected text, got 5".into())),
        ("home cell without cell domains", "[[namespace]]\nprefix = \"chat:\"\nhome_cell = \"eu\"",
            Err("config file FILE: [[namespace]] number 1 (prefix \"chat:\"): home_cell needs cluster_cell_domains: only cells with their own NATS home rooms".into())),
    ];
    let mut failures = vec![];
    for (name, file, want) in &cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("livegate.toml");
        std::fs::write(&path, file).unwrap();
        let got = Config::load(Some(&path), Vec::new(), &ConfigFlags::default())
            .map(|c| c.namespaces)
            .map_err(|e| e.to_string().replace(&path.display().to_string(), "FILE"));
        if &got != want {
            failures.push(format!("case {name:?}:\n  got {got:?}\n want {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A namespace's `home_cell` pins its rooms (cells with their own NATS), and must name a
/// configured cell.
#[test]
fn a_namespaces_home_cell_pins_its_rooms_to_a_configured_cell() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("livegate.toml");
    let cells = "cell = \"eu\"\ncells = [\"eu\", \"us\"]\ncluster_nats_url = \"nats://n1:4222\"\ncluster_cell_domains = true\n\
        cluster_token_secret = \"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\"\n";
    std::fs::write(
        &path,
        format!("{cells}[[namespace]]\nprefix = \"score:\"\nhome_cell = \"us\"\n"),
    )
    .unwrap();
    let config = Config::load(Some(&path), Vec::new(), &ConfigFlags::default()).unwrap();
    assert_eq!(config.room_homes().home("score:final"), Some("us"));
    std::fs::write(
        &path,
        format!("{cells}[[namespace]]\nprefix = \"score:\"\nhome_cell = \"ap\"\n"),
    )
    .unwrap();
    let refused = Config::load(Some(&path), Vec::new(), &ConfigFlags::default())
        .map(|_| ())
        .map_err(|e| e.to_string().replace(&path.display().to_string(), "FILE"));
    assert_eq!(refused, Err("config file FILE: [[namespace]] number 1 (prefix \"score:\"): home_cell \"ap\" is not one of cells (eu,us)".into()));
}

/// The effective options: overrides over the global keys, whichever layer set those.
#[test]
fn namespace_options_resolve_over_the_global_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("livegate.toml");
    std::fs::write(&path, "[[namespace]]\nprefix = \"chat:\"\nhistory_size = 5\n[[namespace]]\nprefix = \"chat:vip:\"\npresence = false\n").unwrap();
    let env = vec![("LIVEGATE_BATCH_WINDOW_MS".to_string(), "7".to_string())];
    let config =
        Config::load(Some(&path), env, &ConfigFlags::default().with("history_size", "40")).unwrap();
    let table = config.room_namespaces().unwrap();
    let options = |room: &str| table.resolve(room).clone();
    assert_eq!(
        (
            options("chat:1").history_size,
            options("chat:1").batch_window_ms,
            options("chat:1").presence
        ),
        (5, 7, true)
    );
    assert_eq!((options("chat:vip:1").history_size, options("chat:vip:1").presence), (40, false));
    assert_eq!(
        (
            options("lobby").history_size,
            options("lobby").presence,
            options("lobby").max_event_bytes
        ),
        (40, true, 65536)
    );
    assert_eq!(table.largest_history_size(), 40);
    let effective = config.effective_namespaces().unwrap();
    assert_eq!(
        effective[0],
        NamespaceTable {
            prefix: "chat:".into(),
            history_size: Some(5),
            history_ttl_secs: Some(86400),
            batch_window_ms: Some(7),
            presence: Some(true),
            max_event_bytes: Some(65536),
            home_cell: None,
        }
    );
    // What check-config prints loads back to the same options.
    let printed =
        toml::to_string(&Config { namespaces: effective.clone(), ..config.clone() }).unwrap();
    std::fs::write(&path, &printed).unwrap();
    let again = Config::load(Some(&path), Vec::new(), &ConfigFlags::default()).unwrap();
    assert_eq!(again.namespaces, effective);
    assert_eq!(again.room_namespaces().unwrap(), table);
    // A config built in code is checked by validate too.
    let dup = Config {
        namespaces: vec![
            NamespaceTable { prefix: "a".into(), ..Default::default() },
            NamespaceTable { prefix: "a".into(), ..Default::default() },
        ],
        ..Config::default()
    };
    assert_eq!(
        dup.validate().unwrap_err().to_string(),
        "[[namespace]] number 2 (prefix \"a\"): prefix \"a\" is already the prefix of namespace 1"
    );
}

/// Every bound of `BOUNDS` is what validation enforces: the least and the largest value
/// load, one past either is refused naming the key. So the reference, which prints the
/// table, tells the truth.
#[test]
fn every_bound_in_the_table_is_enforced() {
    let load = |key: &str, value: u64| {
        Config::load(None, Vec::new(), &ConfigFlags::default().with(key, value.to_string()))
    };
    for &(key, min, max) in BOUNDS {
        assert!(KEYS.contains(&key), "{key} in BOUNDS is not a key");
        assert!(
            load(key, min).is_ok(),
            "{key} = {min} (its least) is refused: {:?}",
            load(key, min).err()
        );
        if min > 0 {
            let error = load(key, min - 1).expect_err(key).to_string();
            assert!(
                error.starts_with(&format!("{key} must be at least {min}")),
                "{key} = {}: {error}",
                min - 1
            );
        }
        if let Some((max, _)) = max {
            assert!(
                load(key, max).is_ok(),
                "{key} = {max} (its largest) is refused: {:?}",
                load(key, max).err()
            );
            let error = load(key, max + 1).expect_err(key).to_string();
            assert!(
                error.starts_with(&format!("{key} must be at most {max}")),
                "{key} = {}: {error}",
                max + 1
            );
        }
    }
    // The rules of the keys that are not numbers in a range, as the reference states them.
    let refused = |key: &str, value: String| {
        let error =
            Config::load(None, Vec::new(), &ConfigFlags::default().with(key, value.clone()))
                .expect_err(key)
                .to_string();
        assert!(error.starts_with(key), "{key} = {value}: {error}");
    };
    for &(key, max) in NAME_KEYS {
        assert!(rule_of(key).unwrap().contains(&format!("1 to {max} characters")));
        assert!(
            Config::load(None, Vec::new(), &ConfigFlags::default().with(key, "a".repeat(max)))
                .is_ok(),
            "{key}"
        );
        refused(key, "a".repeat(max + 1));
    }
    refused("api_key", "k".repeat(API_KEY_MIN_CHARS - 1));
    refused("cluster_replicas", "2".into());
    assert_eq!(rule_of("cluster_replicas").as_deref(), Some("1 or 3"));
    let described: Vec<&str> = KEY_DOCS.iter().map(|doc| doc.name).collect();
    assert_eq!(described, KEYS);
    let heartbeat = KEY_DOCS.iter().find(|doc| doc.name == "heartbeat_secs").unwrap();
    assert_eq!(
        (
            heartbeat.form(),
            heartbeat.env_var().as_str(),
            heartbeat.flag().as_str(),
            heartbeat.bounds().as_deref()
        ),
        (
            "a whole number of seconds",
            "LIVEGATE_HEARTBEAT_SECS",
            "--heartbeat-secs",
            Some("at least 1")
        )
    );
}

#[test]
fn configured_cells() {
    let load = |flags: &[(&str, &str)]| {
        let flags = flags.iter().fold(ConfigFlags::default(), |f, (k, v)| f.with(k, *v));
        Config::load(None, Vec::new(), &flags).unwrap().configured_cells()
    };
    assert_eq!(load(&[]), vec!["default".to_string()], "one cell: the node's own");
    assert_eq!(
        load(&[("cell", "west"), ("peers", "b@east=http://127.0.0.1:1,c=http://127.0.0.1:2")]),
        vec!["east", "west"]
    );
    assert_eq!(
        load(&[("cell", "north"), ("cells", "west,north,east")]),
        vec!["east", "north", "west"],
        "sorted"
    );
    let no_list: Vec<String> = Vec::new();
    assert_eq!(
        load(&[("cell", "west"), ("cluster_nats_url", "nats://127.0.0.1:4222")]),
        no_list,
        "cluster mode: the cells heard"
    );
    assert_eq!(
        load(&[
            ("cell", "west"),
            ("cluster_nats_url", "nats://127.0.0.1:4222"),
            ("cells", "east,west")
        ]),
        vec!["east", "west"],
        "cluster mode with a list"
    );
    let many: Vec<String> = (0..=MAX_CELLS).map(|i| format!("c{i}")).collect();
    let flags = ConfigFlags::default().with("cell", "c0").with("cells", many.join(","));
    let err = Config::load(None, Vec::new(), &flags).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("cells may list at most {MAX_CELLS} cells, got {} (set by --cells)", MAX_CELLS + 1)
    );
}

#[test]
fn dev_defaults_change_only_what_no_layer_sets() {
    let dev = Config::load_over(Config::dev_defaults(), None, Vec::new(), &ConfigFlags::default())
        .unwrap();
    assert_eq!(
        (dev.drain_wait_secs, dev.drain_spread_secs),
        (DEV_DRAIN_WAIT_SECS, DEV_DRAIN_SPREAD_SECS)
    );
    assert_eq!(dev.allowed_origins, ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]);
    assert_eq!(dev.drain_grace_secs, Config::default().drain_grace_secs, "nothing else changes");
    let env = vec![("LIVEGATE_DRAIN_WAIT_SECS".to_string(), "7".to_string())];
    let flags = ConfigFlags::default().with("allowed_origins", "https://app.example");
    let set = Config::load_over(Config::dev_defaults(), None, env, &flags).unwrap();
    assert_eq!(
        (set.drain_wait_secs, set.allowed_origins.as_slice()),
        (7, &["https://app.example".to_string()][..])
    );
    // The plain defaults are untouched by the dev ones.
    let plain = Config::load(None, Vec::new(), &ConfigFlags::default()).unwrap();
    assert_eq!((plain.drain_wait_secs, plain.allowed_origins.is_empty()), (15, true));
}

#[test]
fn allowed_origins_take_a_port_wildcard_and_no_other() {
    let load = |value: &str| {
        Config::load(None, Vec::new(), &ConfigFlags::default().with("allowed_origins", value))
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        load("http://localhost:*,https://app.example").unwrap().allowed_origins,
        ["http://localhost:*", "https://app.example"]
    );
    assert_eq!(
        load("https://*.example").unwrap_err(),
        "allowed_origins entries may use `*` only as the port (http://localhost:*), got \"https://*.example\" (set by --allowed-origins)"
    );
}
