//! Tokens a backend signs (issue 49): JWTs with HS256 (`jwt_hmac_secret`), RS256, ES256 and
//! EdDSA (`jwt_public_key_file`, the algorithm fixed by the key) and a JWK Set
//! (`jwt_jwks_file`, the key picked by `kid`) open a connection once, with the claims a
//! minted token carries, and their `jti` is spent through the same one-time store: a
//! replay is `token_replayed`, after a restart too. Each way a JWT is refused is a test
//! here: `alg: none`, algorithm confusion, expired, not yet valid, oversized, a bad
//! signature, missing claims, a wrong issuer or audience, an unknown `kid`. The keys are
//! made by the test (rcgen on ring, the rsa crate); no private key is kept anywhere.

use crate::common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const SECRET: &str = "a-backend-secret-of-at-least-32-bytes!";

/// A key a backend signs with: the algorithm, the private half, the public half (PEM).
struct Signer {
    alg: Algorithm,
    key: EncodingKey,
    public_pem: String,
    /// The raw public key (ES256: an uncompressed point; EdDSA: 32 bytes), for a JWK.
    public_raw: Vec<u8>,
    /// The `kid` its tokens name.
    kid: Option<String>,
}

impl Signer {
    fn hmac() -> Signer {
        let key = EncodingKey::from_secret(SECRET.as_bytes()).expect("HMAC key");
        Signer {
            alg: Algorithm::HS256,
            key,
            public_pem: String::new(),
            public_raw: Vec::new(),
            kid: None,
        }
    }

    /// One RSA key per test binary: generating it takes a moment.
    fn rsa() -> Signer {
        static KEY: OnceLock<(Vec<u8>, String)> = OnceLock::new();
        let (private_der, public_pem) = KEY.get_or_init(|| {
            use rsa::pkcs1::EncodeRsaPrivateKey;
            use rsa::pkcs8::EncodePublicKey;
            use rsa::Generate;
            let key = rsa::PrivateKey::generate();
            let private = key.to_pkcs1_der().expect("PKCS#1 DER").as_bytes().to_vec();
            let public = key.to_public_key().to_public_key_der().expect("SPKI DER");
            (private, pem_block("PUBLIC KEY", public.as_bytes()))
        });
        let key = EncodingKey::from_rsa_der(private_der);
        Signer {
            alg: Algorithm::RS256,
            key,
            public_pem: public_pem.clone(),
            public_raw: Vec::new(),
            kid: None,
        }
    }

    fn ec() -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
        let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).expect("EC key");
        Signer {
            alg: Algorithm::ES256,
            key,
            public_pem: pair.public_key_pem(),
            public_raw: pair.public_key_raw().to_vec(),
            kid: None,
        }
    }

    fn ed() -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("Ed25519 key");
        let key = EncodingKey::from_ed_pem(pair.serialize_pem().as_bytes()).expect("Ed25519 key");
        Signer {
            alg: Algorithm::EdDSA,
            key,
            public_pem: pair.public_key_pem(),
            public_raw: pair.public_key_raw().to_vec(),
            kid: None,
        }
    }

    /// The public key as a JWK with `kid`; the signer from now on names `kid`.
    fn jwk(&mut self, kid: &str) -> Value {
        let raw = &self.public_raw;
        self.kid = Some(kid.to_string());
        match self.alg {
            // An uncompressed point: 0x04 || x || y.
            Algorithm::ES256 => json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                "x": URL_SAFE_NO_PAD.encode(&raw[1..33]), "y": URL_SAFE_NO_PAD.encode(&raw[33..65])}),
            Algorithm::EdDSA => {
                json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": URL_SAFE_NO_PAD.encode(raw)})
            }
            other => panic!("no JWK for {other:?} here"),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = self.kid.clone();
        jsonwebtoken::encode(&header, claims, &self.key).expect("sign")
    }
}

/// `der` as a PEM block.
fn pem_block(tag: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let lines: Vec<&str> =
        body.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).expect("ascii")).collect();
    format!("-----BEGIN {tag}-----\n{}\n-----END {tag}-----\n", lines.join("\n"))
}

/// A `jti` no other token of this test binary has.
fn fresh_jti() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("jti-{}-{}", now_ms(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn now_secs() -> u64 {
    now_ms() / 1000
}

/// The claims of a token for `user`, valid for five minutes, with a fresh `jti`.
fn claims(user: &str) -> Value {
    json!({"sub": user, "exp": now_secs() + 300, "iat": now_secs(), "jti": fresh_jti()})
}

/// A file in `dir` holding `text`.
fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write key file");
    path
}

fn key_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("livegate-jwt-keys-").tempdir().expect("tempdir")
}

/// A server that takes JWTs signed with `signer`: HS256 by the secret, the others by the
/// public key's PEM file in `dir`.
fn server_for(signer: &Signer, dir: &tempfile::TempDir) -> TestServer {
    let pem = (signer.alg != Algorithm::HS256).then(|| file(dir, "public.pem", &signer.public_pem));
    TestServer::start(move |c| match pem {
        Some(path) => c.jwt_public_key_file = Some(path),
        None => c.jwt_hmac_secret = Some(SECRET.to_string()),
    })
}

/// The user a connection was opened as: its inbox is `user:<id>`.
async fn user_of(client: &mut WsClient) -> String {
    let notice = client.wait_inbox_subscribed(WAIT).await;
    notice["room"]
        .as_str()
        .and_then(|r| r.strip_prefix("user:"))
        .unwrap_or_else(|| panic!("inbox notice: {notice}"))
        .to_string()
}

/// Connects with `token` and asserts a 401 refusal with `code` whose message contains
/// `reason`.
async fn assert_refused(server: &TestServer, token: &str, code: &str, reason: &str) {
    match WsClient::try_connect(server.addr, Some(token), None).await {
        Ok(c) => {
            panic!("a JWT that must be refused ({code}: {reason}) got a welcome {}", c.welcome)
        }
        Err(Rejected { status, body }) => {
            assert_eq!((status, error_code(&body)), (401, code), "{reason}: {body}");
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(reason), "the message names the reason ({reason}): {body}");
        }
    }
}

/// The life of a good JWT: it connects, its user's connection gets a welcome (with a resume
/// credential), receives an event published to a room, and the same JWT is refused after.
async fn connects_once(server: &TestServer, token: &str, user: &str) {
    let mut client = WsClient::connect(server.addr, token, None).await;
    assert_eq!(client.welcome["op"], "welcome", "{}", client.welcome);
    assert_eq!(user_of(&mut client).await, user, "the user is the sub claim");
    assert!(
        client.welcome["resume"].as_str().is_some_and(|r| !r.is_empty()),
        "a resume credential: {}",
        client.welcome
    );
    client.subscribe_ok("match:1").await;
    server.http().publish_ok("match:1", Some("goal-1"), json!({"goal": user}));
    let events = client.next_events(1).await;
    assert_eq!(
        (&events[0]["id"], &events[0]["data"]),
        (&json!("goal-1"), &json!({"goal": user})),
        "{events:?}"
    );
    assert_refused(server, token, "token_replayed", "already used").await;
    client.assert_alive().await;
    assert_eq!(server.http().metric("livegate_handshakes_total{credential=\"jwt\"}"), Some(1.0));
    assert_eq!(server.http().metric("livegate_handshakes_total{credential=\"token\"}"), Some(0.0));
}

#[tokio::test]
async fn hs256_connects_once_gets_events_and_is_refused_on_replay() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::hmac();
    let server = server_for(&signer, &dir);
    connects_once(&server, &signer.sign(&claims("alice")), "alice").await;
}

#[tokio::test]
async fn rs256_by_a_pem_public_key_connects_once() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::rsa();
    let server = server_for(&signer, &dir);
    connects_once(&server, &signer.sign(&claims("alice")), "alice").await;
}

#[tokio::test]
async fn es256_by_a_pem_public_key_connects_once() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::ec();
    let server = server_for(&signer, &dir);
    connects_once(&server, &signer.sign(&claims("alice")), "alice").await;
}

#[tokio::test]
async fn eddsa_by_a_pem_public_key_connects_once() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::ed();
    let server = server_for(&signer, &dir);
    connects_once(&server, &signer.sign(&claims("alice")), "alice").await;
}

/// A JWK Set with an ES256 and an EdDSA key; tokens name theirs by `kid`.
fn jwks_server(dir: &tempfile::TempDir, signers: &mut [&mut Signer]) -> TestServer {
    let keys: Vec<Value> =
        signers.iter_mut().enumerate().map(|(i, s)| s.jwk(&format!("key-{i}"))).collect();
    let path = file(dir, "jwks.json", &json!({"keys": keys}).to_string());
    TestServer::start(move |c| c.jwt_jwks_file = Some(path))
}

#[tokio::test]
async fn a_jwks_key_picked_by_kid_connects_once_and_an_unknown_kid_is_refused() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let (mut ec, mut ed) = (Signer::ec(), Signer::ed());
    let server = jwks_server(&dir, &mut [&mut ec, &mut ed]);
    assert_eq!((ec.kid.as_deref(), ed.kid.as_deref()), (Some("key-0"), Some("key-1")));
    connects_once(&server, &ed.sign(&claims("alice")), "alice").await;
    let mut ok = WsClient::connect(server.addr, &ec.sign(&claims("bob")), None).await;
    assert_eq!(user_of(&mut ok).await, "bob");

    let unknown = Signer { kid: Some("key-9".into()), ..Signer::ec() };
    assert_refused(
        &server,
        &unknown.sign(&claims("carol")),
        "invalid_token",
        "key id \"key-9\" is not in jwt_jwks_file",
    )
    .await;
    // A kid whose key is of another type: the key's type fixes the algorithm.
    let wrong_type = Signer { kid: Some("key-0".into()), ..Signer::ed() };
    assert_refused(
        &server,
        &wrong_type.sign(&claims("carol")),
        "invalid_token",
        "does not match key \"key-0\", which verifies ES256",
    )
    .await;
    // The right kid with another key's signature.
    let forged = Signer { kid: Some("key-1".into()), ..Signer::ed() };
    assert_refused(
        &server,
        &forged.sign(&claims("carol")),
        "invalid_token",
        "signature is invalid",
    )
    .await;
}

/// A token whose header and claims are given as JSON, with `signature` as its third part.
fn raw_jwt(header: &Value, claims: &Value, signature: &[u8]) -> String {
    let part = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());
    format!("{}.{}.{}", part(header), part(claims), URL_SAFE_NO_PAD.encode(signature))
}

/// HMAC-SHA256 of a token's first two parts with `key`, as a backend (or an attacker) would.
fn hs256(header: &Value, claims: &Value, key: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let unsigned = raw_jwt(header, claims, b"");
    let signing_input = unsigned.trim_end_matches('.');
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    mac.update(signing_input.as_bytes());
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()))
}

#[tokio::test]
async fn alg_none_is_refused() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let server = server_for(&Signer::hmac(), &dir);
    for alg in ["none", "None", "NONE"] {
        let token = raw_jwt(&json!({"alg": alg, "typ": "JWT"}), &claims("mallory"), b"");
        assert!(token.ends_with('.'), "an unsecured JWT has an empty signature: {token}");
        assert_refused(&server, &token, "invalid_token", "algorithm \"none\" is never accepted")
            .await;
    }
}

#[tokio::test]
async fn hs256_signed_with_the_rsa_public_key_is_refused_by_a_server_with_that_key() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let rsa = Signer::rsa();
    let server = server_for(&rsa, &dir);
    // The classic confusion: the public key's PEM bytes (which anyone may have) used as an
    // HMAC secret, hoping the server verifies HS256 with "its key".
    let token = hs256(
        &json!({"alg": "HS256", "typ": "JWT"}),
        &claims("mallory"),
        rsa.public_pem.as_bytes(),
    );
    assert_refused(
        &server,
        &token,
        "invalid_token",
        "algorithm HS256 is not accepted: this server's keys verify RS256",
    )
    .await;
    // The genuine RS256 token still works.
    let mut client = WsClient::connect(server.addr, &rsa.sign(&claims("alice")), None).await;
    assert_eq!(user_of(&mut client).await, "alice");
}

#[tokio::test]
async fn rs256_header_is_refused_by_an_hmac_only_server() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let server = server_for(&Signer::hmac(), &dir);
    let token = Signer::rsa().sign(&claims("mallory"));
    assert_refused(
        &server,
        &token,
        "invalid_token",
        "algorithm RS256 is not accepted: this server's keys verify HS256",
    )
    .await;
    // Nor does an RS256 header over an HMAC made with the secret pass.
    let token = hs256(&json!({"alg": "RS256"}), &claims("mallory"), SECRET.as_bytes());
    assert_refused(&server, &token, "invalid_token", "algorithm RS256 is not accepted").await;
}

#[tokio::test]
async fn expired_and_not_yet_valid_jwts_are_refused() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::hmac();
    let server = server_for(&signer, &dir);
    let now = now_secs();
    let expired = json!({"sub": "alice", "exp": now - 60, "iat": now - 120, "jti": fresh_jti()});
    assert_refused(&server, &signer.sign(&expired), "token_expired", "has expired").await;
    let early = json!({"sub": "alice", "exp": now + 300, "nbf": now + 120, "jti": fresh_jti()});
    assert_refused(&server, &signer.sign(&early), "invalid_token", "not valid yet (nbf)").await;
    // Longer than token_ttl_max_secs (a day by default).
    let long = json!({"sub": "alice", "exp": now + 2 * 86400, "jti": fresh_jti()});
    assert_refused(&server, &signer.sign(&long), "invalid_token", "longer than token_ttl_max_secs")
        .await;
}

#[tokio::test]
async fn an_oversized_jwt_is_refused_before_it_is_decoded() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::hmac();
    let server = server_for(&signer, &dir);
    let mut big = claims("alice");
    big["padding"] = json!("x".repeat(4096));
    let token = signer.sign(&big);
    assert!(token.len() > 4096, "{}", token.len());
    assert_refused(&server, &token, "invalid_token", "longer than 4096 bytes").await;
}

#[tokio::test]
async fn a_bad_signature_is_refused_and_leaves_the_genuine_token_usable() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::hmac();
    let server = server_for(&signer, &dir);
    let claims = claims("alice");
    let token = signer.sign(&claims);
    let other_secret =
        hs256(&json!({"alg": "HS256"}), &claims, b"another-secret-of-at-least-32-bytes!!");
    assert_refused(&server, &other_secret, "invalid_token", "signature is invalid").await;
    // The claims changed under the genuine signature.
    let (head, rest) = token.split_once('.').expect("three parts");
    let signature = rest.split_once('.').expect("three parts").1;
    let mut raised = claims.clone();
    raised["rooms"] = json!(["*admin"]);
    raised["sub"] = json!("admin");
    let tampered = format!("{head}.{}.{signature}", URL_SAFE_NO_PAD.encode(raised.to_string()));
    assert_refused(&server, &tampered, "invalid_token", "signature is invalid").await;
    // Refusals spent nothing.
    let mut client = WsClient::connect(server.addr, &token, None).await;
    assert_eq!(user_of(&mut client).await, "alice");
}

#[tokio::test]
async fn a_jwt_without_sub_exp_or_jti_is_refused() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::hmac();
    let server = server_for(&signer, &dir);
    for claim in ["sub", "exp", "jti"] {
        let mut partial = claims("alice");
        partial.as_object_mut().expect("object").remove(claim);
        assert_refused(
            &server,
            &signer.sign(&partial),
            "invalid_token",
            &format!("lacks the required claim {claim}"),
        )
        .await;
    }
    let mut long_jti = claims("alice");
    long_jti["jti"] = json!("j".repeat(129));
    assert_refused(
        &server,
        &signer.sign(&long_jti),
        "invalid_token",
        "claim jti must be 1 to 128 bytes long",
    )
    .await;
}

#[tokio::test]
async fn a_wrong_issuer_or_audience_is_refused_when_configured() {
    let _gate = crate::common::gate!();
    let signer = Signer::hmac();
    let server = TestServer::start(|c| {
        c.jwt_hmac_secret = Some(SECRET.to_string());
        c.jwt_issuer = Some("https://backend.example".into());
        c.jwt_audience = Some("livegate".into());
    });
    let with = |iss: Value, aud: Value| {
        let mut c = claims("alice");
        c["iss"] = iss;
        c["aud"] = aud;
        signer.sign(&c)
    };
    assert_refused(
        &server,
        &with(json!("https://evil.example"), json!("livegate")),
        "invalid_token",
        "issuer (iss)",
    )
    .await;
    assert_refused(&server, &with(Value::Null, json!("livegate")), "invalid_token", "issuer (iss)")
        .await;
    assert_refused(
        &server,
        &with(json!("https://backend.example"), json!("another-service")),
        "invalid_token",
        "audience (aud)",
    )
    .await;
    assert_refused(
        &server,
        &with(json!("https://backend.example"), Value::Null),
        "invalid_token",
        "audience (aud)",
    )
    .await;
    // Both right (aud may be a list that names it).
    let good = with(json!("https://backend.example"), json!(["another-service", "livegate"]));
    let mut client = WsClient::connect(server.addr, &good, None).await;
    assert_eq!(user_of(&mut client).await, "alice");
}

#[tokio::test]
async fn a_replayed_jti_is_refused_also_after_a_restart() {
    let _gate = crate::common::gate!();
    let signer = Signer::hmac();
    let tweak = |c: &mut livegate::config::Config| c.jwt_hmac_secret = Some(SECRET.to_string());
    let server = TestServer::start(tweak);
    let claims = claims("alice");
    let token = signer.sign(&claims);
    let unused = signer.sign(&self::claims("bob"));
    drop(WsClient::connect(server.addr, &token, None).await);
    // Another token with the same jti (other claims, a new signature) is the same token.
    let mut same_jti = claims.clone();
    same_jti["device"] = json!("phone");
    assert_refused(&server, &signer.sign(&same_jti), "token_replayed", "its jti is spent").await;

    let dir = server.stop();
    let server = TestServer::start_in(dir, tweak);
    assert_refused(&server, &token, "token_replayed", "its jti is spent").await;
    let mut client = WsClient::connect(server.addr, &unused, None).await;
    assert_eq!(
        user_of(&mut client).await,
        "bob",
        "a JWT not used before the restart still opens a connection"
    );
}

#[tokio::test]
async fn the_rooms_and_publish_claims_are_enforced() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::ed();
    let server = server_for(&signer, &dir);
    let mut grant = claims("alice");
    grant["device"] = json!("phone");
    grant["rooms"] = json!(["match:*", "chat:1"]);
    grant["publish"] = json!(["chat:*"]);
    let mut client = WsClient::connect(server.addr, &signer.sign(&grant), None).await;
    assert_eq!(user_of(&mut client).await, "alice");
    client.subscribe_ok("match:7").await;
    client.subscribe_ok("chat:1").await;
    let refused = client.subscribe("news").await;
    assert_eq!(
        (&refused["op"], &refused["code"]),
        (&json!("error"), &json!("forbidden")),
        "outside rooms: {refused}"
    );

    let published =
        client.request(json!({"op": "publish", "room": "chat:1", "data": {"text": "hi"}})).await;
    assert_eq!(published["op"], "published", "{published}");
    let events = client.next_events(1).await;
    assert_eq!(
        (&events[0]["from"], &events[0]["data"]),
        (&json!("alice"), &json!({"text": "hi"})),
        "{events:?}"
    );
    let refused =
        client.request(json!({"op": "publish", "room": "match:7", "data": {"goal": true}})).await;
    assert_eq!(
        (&refused["op"], &refused["code"]),
        (&json!("error"), &json!("forbidden")),
        "outside publish: {refused}"
    );

    // No publish claim: publishes nowhere; no rooms claim: reads any room.
    let mut reader = WsClient::connect(server.addr, &signer.sign(&claims("bob")), None).await;
    reader.subscribe_ok("news").await;
    let refused = reader.request(json!({"op": "publish", "room": "news", "data": {}})).await;
    assert_eq!(refused["code"], "forbidden", "{refused}");

    // A bad pattern is refused at the handshake.
    let mut bad = claims("carol");
    bad["rooms"] = json!(["bad room"]);
    assert_refused(&server, &signer.sign(&bad), "invalid_token", "claim rooms pattern").await;
}

#[tokio::test]
async fn the_welcomes_resume_credential_reconnects_as_the_jwt_granted() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::hmac();
    let server = server_for(&signer, &dir);
    let mut grant = claims("alice");
    grant["rooms"] = json!(["match:*"]);
    let first = WsClient::connect(server.addr, &signer.sign(&grant), None).await;
    let session = first.session().to_string();
    let resume = first.welcome["resume"].as_str().expect("resume").to_string();
    drop(first);
    let mut again =
        WsClient::try_connect_url(&format!("ws://{}/v1/ws?resume={resume}", server.addr))
            .await
            .expect("the resume opens");
    assert_eq!(again.session(), session, "{}", again.welcome);
    assert_eq!(user_of(&mut again).await, "alice");
    again.subscribe_ok("match:1").await;
    let refused = again.subscribe("news").await;
    assert_eq!(refused["code"], "forbidden", "the JWT's rooms carry over: {refused}");
}

#[tokio::test]
async fn a_jwt_opens_a_server_sent_events_stream_once() {
    let _gate = crate::common::gate!();
    let dir = key_dir();
    let signer = Signer::ec();
    let server = server_for(&signer, &dir);
    let token = signer.sign(&claims("alice"));
    let mut stream =
        crate::sse::Sse::connect(server.addr, &format!("token={token}&rooms=match:1")).await;
    assert_eq!(stream.welcome["op"], "welcome", "{}", stream.welcome);
    stream.expect_subscribed(&["match:1"]).await;
    server.http().publish_ok("match:1", None, json!({"n": 1}));
    let (events, _) = stream.events(1).await;
    assert_eq!(events[0]["data"], json!({"n": 1}));
    let replay =
        crate::sse::Sse::open(server.addr, &format!("/v1/sse?token={token}&rooms=match:1"), &[])
            .await;
    let refused = replay.err().expect("a replay is refused");
    assert_eq!((refused.status, refused.code()), (401, "token_replayed"), "{:?}", refused.body);
}

#[tokio::test]
async fn jwts_are_refused_where_no_key_is_configured_and_minted_tokens_still_work() {
    let _gate = crate::common::gate!();
    let server = TestServer::start(|_| {});
    assert_refused(
        &server,
        &Signer::hmac().sign(&claims("alice")),
        "invalid_token",
        "JWTs are not enabled",
    )
    .await;
    let mut client = server.client("alice").await;
    assert_eq!(user_of(&mut client).await, "alice");

    // Beside a JWT key, minted tokens keep working too.
    let dir = key_dir();
    let server = server_for(&Signer::ed(), &dir);
    let mut client = server.client("bob").await;
    assert_eq!(user_of(&mut client).await, "bob");
}

#[test]
fn key_files_livegate_cannot_use_stop_check_config_and_serve_with_one_line() {
    let _gate = crate::common::gate!();
    use crate::observability::{effective, livegate, refused};
    let dir = key_dir();
    let cwd = dir.path();
    let path = |name: &str, text: &str| file(&dir, name, text).display().to_string();
    let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("key");
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "a missing file",
            vec!["--jwt-public-key-file".into(), cwd.join("nowhere.pem").display().to_string()],
            "jwt_public_key_file: cannot read",
        ),
        (
            "a private key",
            vec!["--jwt-public-key-file".into(), path("private.pem", &p256.serialize_pem())],
            "holds a private key (PRIVATE KEY): give livegate the public key only",
        ),
        (
            "a P-384 key",
            vec!["--jwt-public-key-file".into(), path("p384.pem", &p384.public_key_pem())],
            "an EC key on a curve other than P-256",
        ),
        (
            "not PEM",
            vec!["--jwt-public-key-file".into(), path("junk.pem", "hello")],
            "not a PEM file",
        ),
        (
            "a JWKS that is not JSON",
            vec!["--jwt-jwks-file".into(), path("junk.json", "{")],
            "not a JWK Set",
        ),
        (
            "a symmetric JWK",
            vec![
                "--jwt-jwks-file".into(),
                path("oct.json", r#"{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}"#),
            ],
            "key \"s\" is kty oct: livegate verifies RSA, EC P-256 and OKP Ed25519 keys",
        ),
        (
            "an empty JWKS",
            vec!["--jwt-jwks-file".into(), path("empty.json", r#"{"keys":[]}"#)],
            "holds no signing key",
        ),
        (
            "a short secret",
            vec!["--jwt-hmac-secret".into(), "sh0rt-s3cret".into()],
            "jwt_hmac_secret must be at least 32 bytes long",
        ),
    ];
    for (what, args, want) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let data = cwd.join("data").display().to_string();
        let serve = [
            &["serve", "--listen", "127.0.0.1:0", "--data-dir", &data, "--api-key", API_KEY][..],
            &args,
        ]
        .concat();
        for (command, ran) in [
            ("check-config", livegate(&[&["check-config"][..], &args].concat(), &[], cwd)),
            ("serve", livegate(&serve, &[], cwd)),
        ] {
            let line = refused(&ran, &format!("{command} with {what}"));
            assert!(line.contains(want), "{command} with {what}: {line}");
            assert!(!line.contains("sh0rt-s3cret"), "the secret is never echoed: {line}");
        }
    }

    // Usable keys: check-config says what JWTs are verified with and masks the secret.
    let public = path(
        "ed.pem",
        &rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key").public_key_pem(),
    );
    let ran = livegate(
        &["check-config", "--jwt-public-key-file", &public],
        &[("LIVEGATE_JWT_HMAC_SECRET", SECRET)],
        cwd,
    );
    let table = effective(&ran, "usable keys");
    assert!(
        ran.stdout.contains(
            "JWTs are verified with HS256 (jwt_hmac_secret), EdDSA (jwt_public_key_file)"
        ),
        "{}",
        ran.stdout
    );
    assert_eq!(table["jwt_hmac_secret"].as_str(), Some("********"));
    assert!(!ran.stdout.contains(SECRET), "{}", ran.stdout);
}
