//! What of a configured URL may be written to a log: its scheme, host, port and path.
//! The userinfo (`user:password@`, or a bare token `token@`, as NATS takes it) and the
//! query and fragment (where webhook receivers put their API keys) are cut off, so a log
//! shipped elsewhere never carries a credential. A comma-separated list (NATS seed
//! servers) is redacted piece by piece.

/// Marks where userinfo or a query was cut: the operator sees that one was configured.
const CUT: &str = "***";

/// `url` as it may be logged: userinfo replaced by `***@`, query and fragment by `?***`.
pub fn url_for_log(url: &str) -> String {
    url.split(',').map(one_url).collect::<Vec<_>>().join(",")
}

fn one_url(url: &str) -> String {
    let url = url.trim();
    let (scheme, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    // The authority ends at the path, the query or the fragment, whichever comes first.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let host = match authority.rfind('@') {
        Some(at) => format!("{CUT}@{}", &authority[at + 1..]),
        None => authority.to_string(),
    };
    let path = match tail.find(['?', '#']) {
        Some(at) => format!("{}?{CUT}", &tail[..at]),
        None => tail.to_string(),
    };
    format!("{scheme}{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_queries_never_reach_the_log() {
        let cases = [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("nats://livegate:s3cret@nats.internal:4222", "nats://***@nats.internal:4222"),
            ("nats://t0ken@nats.internal", "nats://***@nats.internal"),
            ("nats://a:b@n1:4222,nats://c:d@n2:4222", "nats://***@n1:4222,nats://***@n2:4222"),
            ("https://backend.example/hooks", "https://backend.example/hooks"),
            ("https://backend.example/hooks?key=abc&x=1", "https://backend.example/hooks?***"),
            (
                "https://u:p@backend.example:8443/a/b?key=abc#frag",
                "https://***@backend.example:8443/a/b?***",
            ),
            ("https://backend.example?key=abc", "https://backend.example?***"),
            ("https://backend.example/h#token=abc", "https://backend.example/h?***"),
            // An '@' in the path is not userinfo; one in the password is.
            ("https://backend.example/users/@me", "https://backend.example/users/@me"),
            ("https://u:p@ss@backend.example/", "https://***@backend.example/"),
            ("user:pw@host:4222", "***@host:4222"),
            ("", ""),
        ];
        for (url, logged) in cases {
            assert_eq!(url_for_log(url), logged, "{url}");
            for secret in ["s3cret", "t0ken", "key=abc", ":p@", "token=abc"] {
                assert!(!url_for_log(url).contains(secret), "{url}");
            }
        }
    }
}
