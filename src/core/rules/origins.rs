//! Which browser origins `allowed_origins` lets in: an entry is an exact origin
//! (`https://app.example`, compared without regard to case), or an origin whose port is
//! `*` (`http://localhost:*`: that scheme and host on any port, or on none). Nothing else
//! is a pattern: a `*` anywhere else is refused when the configuration is read, so an
//! entry never lets in more than it says. Pure: text in, a yes or no out.

/// Why an `allowed_origins` entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadOrigin {
    #[error("entries are scheme://host[:port] without a path, got {0:?}")]
    Form(String),
    #[error("entries may use `*` only as the port (http://localhost:*), got {0:?}")]
    Wildcard(String),
}

/// The origins `livegate serve --dev` allows unless `allowed_origins` is set: pages served
/// from this machine, on any port.
pub const DEV_ORIGINS: [&str; 3] = ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"];

/// Checks one `allowed_origins` entry.
pub fn check_entry(entry: &str) -> Result<(), BadOrigin> {
    let Some((_, rest)) =
        entry.split_once("://").filter(|(scheme, _)| matches!(*scheme, "http" | "https"))
    else {
        return Err(BadOrigin::Form(entry.to_string()));
    };
    if rest.is_empty() || rest.contains('/') {
        return Err(BadOrigin::Form(entry.to_string()));
    }
    let host = rest.strip_suffix(":*").unwrap_or(rest);
    if host.is_empty() || host.contains('*') {
        return Err(BadOrigin::Wildcard(entry.to_string()));
    }
    Ok(())
}

/// Whether `origin` (a request's `Origin` header) is what `entry` allows.
pub fn matches(entry: &str, origin: &str) -> bool {
    match entry.strip_suffix(":*") {
        Some(base) => without_port(origin).eq_ignore_ascii_case(base),
        None => entry.eq_ignore_ascii_case(origin),
    }
}

/// `origin` without its `:port`, if it has one (`http://[::1]:5173` → `http://[::1]`).
fn without_port(origin: &str) -> &str {
    match origin.rsplit_once(':') {
        Some((base, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && base.contains("://") =>
        {
            base
        }
        _ => origin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_entries_and_any_port() {
        let cases: &[(&str, &str, bool)] = &[
            ("https://app.example", "https://app.example", true),
            ("https://app.example", "https://APP.example", true),
            ("https://app.example", "https://app.example:8443", false),
            ("https://app.example", "http://app.example", false),
            ("http://localhost:*", "http://localhost:5173", true),
            ("http://localhost:*", "http://localhost", true),
            ("http://localhost:*", "http://localhost:", false),
            ("http://localhost:*", "https://localhost:5173", false),
            ("http://localhost:*", "http://localhost.evil.example:80", false),
            ("http://localhost:*", "http://evil.example/http://localhost:1", false),
            ("http://127.0.0.1:*", "http://127.0.0.1:8080", true),
            ("http://127.0.0.1:*", "http://127.0.0.10:8080", false),
            ("http://[::1]:*", "http://[::1]:3000", true),
            ("http://[::1]:*", "http://[::1]", true),
            ("http://[::1]:*", "http://[::2]:3000", false),
            ("http://localhost:*", "null", false),
        ];
        for &(entry, origin, want) in cases {
            assert_eq!(matches(entry, origin), want, "{entry} vs {origin}");
        }
    }

    #[test]
    fn entries_are_checked() {
        for good in
            ["https://app.example", "http://localhost:8080", "http://localhost:*", "http://[::1]:*"]
        {
            assert_eq!(check_entry(good), Ok(()), "{good}");
        }
        for form in ["app.example", "ftp://x", "https://app.example/", "https://", "https://a/b"] {
            assert_eq!(check_entry(form), Err(BadOrigin::Form(form.into())), "{form}");
        }
        for wild in ["https://*.example", "*", "http://*:*", "http://:*"] {
            assert!(check_entry(wild).is_err(), "{wild}");
        }
        assert_eq!(
            check_entry("https://*.example"),
            Err(BadOrigin::Wildcard("https://*.example".into()))
        );
        for entry in DEV_ORIGINS {
            assert_eq!(check_entry(entry), Ok(()), "{entry}");
        }
    }
}
