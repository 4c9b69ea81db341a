//! The webhooks' HTTP delivery: one signed POST ([`Poster`]) for the senders' attempts
//! and the dead letters' replays, and what a failure without an answer says without the
//! receiver's URL.

use std::io::Read;

use crate::core::rules::redact::url_for_log;
use crate::core::rules::webhooks::{self as rules, Attempt, ID_HEADER, SIGNATURE_HEADER};

use super::settings::WebhookSettings;

/// Bytes of a receiver's answer read (and ignored) so its connection can be reused.
const ANSWER_READ_MAX: u64 = 64 * 1024;

/// Makes one signed POST of a webhook: the senders' attempts and the replays.
pub(super) struct Poster {
    agent: ureq::Agent,
    url: String,
    /// `url` as it may be logged and shown (`core::rules::redact::url_for_log`).
    pub(super) url_for_log: String,
    secret: Vec<u8>,
}

impl Poster {
    pub(super) fn new(settings: &WebhookSettings) -> Poster {
        let agent = ureq::AgentBuilder::new()
            .timeout(settings.timeout)
            .redirects(0)
            .user_agent(concat!("livegate/", env!("CARGO_PKG_VERSION")))
            .build();
        Poster {
            agent,
            url: settings.url.clone(),
            url_for_log: url_for_log(&settings.url).to_string(),
            secret: settings.secret.clone(),
        }
    }

    /// One POST; the outcome and, for a failure without an answer, what went wrong.
    pub(super) fn post(&self, id: &str, body: &str) -> (Attempt, String) {
        let signature = rules::signature(&self.secret, body.as_bytes());
        let sent = self
            .agent
            .post(&self.url)
            .set("Content-Type", "application/json")
            .set(SIGNATURE_HEADER, &signature)
            .set(ID_HEADER, id)
            .send_string(body);
        match sent {
            Ok(answer) | Err(ureq::Error::Status(_, answer)) => {
                let status = answer.status();
                // Read the answer so the connection can serve the next attempt.
                let _ = std::io::copy(
                    &mut answer.into_reader().take(ANSWER_READ_MAX),
                    &mut std::io::sink(),
                );
                (Attempt::Status(status), String::new())
            }
            Err(ureq::Error::Transport(transport)) => {
                let timed_out = std::error::Error::source(&transport)
                    .and_then(|source| source.downcast_ref::<std::io::Error>())
                    .is_some_and(|io| {
                        matches!(
                            io.kind(),
                            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                        )
                    });
                (
                    if timed_out { Attempt::Timeout } else { Attempt::Unreachable },
                    transport_detail(&transport),
                )
            }
        }
    }
}

/// What went wrong without an answer, without the URL: ureq's own text starts with the
/// whole URL, whose userinfo or query may hold the receiver's credentials.
fn transport_detail(transport: &ureq::Transport) -> String {
    let mut detail = transport.kind().to_string();
    if let Some(message) = transport.message() {
        detail.push_str(": ");
        detail.push_str(message);
    }
    if let Some(source) = std::error::Error::source(transport) {
        detail.push_str(": ");
        detail.push_str(&source.to_string());
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_attempt_is_described_without_the_urls_credentials() {
        // Nothing listens on port 1: a transport error, whose own text names the URL.
        let url = "http://hook:s3cret@127.0.0.1:1/hooks?key=abc";
        let Err(ureq::Error::Transport(transport)) = ureq::post(url).send_string("{}") else {
            panic!("port 1 answered")
        };
        assert!(transport.to_string().contains("key=abc"), "ureq's text has the URL: {transport}");
        let detail = transport_detail(&transport);
        assert!(detail.starts_with("Connection Failed"), "{detail}");
        for secret in ["s3cret", "key=abc", "hook:"] {
            assert!(!detail.contains(secret), "{detail}");
        }
    }
}
