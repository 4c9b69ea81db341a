//! JWTs a backend signs: the decisions, without the cryptography or the JSON. Pure: the
//! caller parses the header and the claims (and checks the signature with the key this
//! module picked); time is a parameter.
//!
//! - [`looks_like_jwt`]: which tokens go to JWT verification (three base64url parts) and
//!   which to the minted format (one dot).
//! - [`KeyKind::of_spki`]: the algorithm a PEM public key fixes (RSA → RS256, EC P-256 →
//!   ES256, Ed25519 → EdDSA); an HMAC secret is HS256. The algorithm follows the key,
//!   never the token's header.
//! - [`choose_key`]: the configured key a header's `alg` and `kid` name, refusing `none`,
//!   algorithms no configured key has (algorithm confusion) and unknown key ids.
//! - [`grant`]: the claims, checked at `now` against the issuer, the audience and the
//!   lifetime bound, as the [`Claims`] a minted token carries; the `jti` becomes the
//!   nonce that the same one-time store spends.
//!
//! Leeway: [`LEEWAY_SECS`] (5 s) on `exp`, `nbf` and `iat`, for clocks that differ a little
//! between the backend and the node; the spent `jti` is kept until `exp` plus the leeway.

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::token::{Claims, MAX_TOKEN_LEN};
use crate::core::rules::names;

/// Seconds a JWT's times may be off: accepted until `exp + LEEWAY_SECS`, from
/// `nbf - LEEWAY_SECS`, with `iat` at most this far ahead.
pub const LEEWAY_SECS: u64 = 5;
/// Longest `jti`, in bytes.
pub const MAX_JTI_LEN: usize = 128;
/// Patterns per list (`rooms`, `publish`), as a minted token holds.
pub const MAX_PATTERNS: usize = 255;
/// Device when the token names none.
pub const DEFAULT_DEVICE: &str = "web";
/// Shortest `jwt_hmac_secret`, in bytes (RFC 7518 §3.2: a key at least as long as the hash).
pub const HMAC_SECRET_MIN_BYTES: usize = 32;

/// The algorithms livegate verifies, each fixed by the kind of key it is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Alg {
    HS256,
    RS256,
    ES256,
    EdDSA,
}

impl Alg {
    /// The header's `alg` value.
    pub fn name(self) -> &'static str {
        match self {
            Alg::HS256 => "HS256",
            Alg::RS256 => "RS256",
            Alg::ES256 => "ES256",
            Alg::EdDSA => "EdDSA",
        }
    }

    /// The algorithm a header names, compared exactly (RFC 7515: case-sensitive).
    fn named(alg: &str) -> Option<Alg> {
        [Alg::HS256, Alg::RS256, Alg::ES256, Alg::EdDSA].into_iter().find(|a| a.name() == alg)
    }
}

impl std::fmt::Display for Alg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kinds of public key a PEM file or a JWKS entry may hold, each with its one algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Rsa,
    EcP256,
    Ed25519,
}

/// DER object identifiers (their encoded bytes) of the key algorithms and the one curve.
const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

impl KeyKind {
    pub fn alg(self) -> Alg {
        match self {
            KeyKind::Rsa => Alg::RS256,
            KeyKind::EcP256 => Alg::ES256,
            KeyKind::Ed25519 => Alg::EdDSA,
        }
    }

    /// The kind of a DER SubjectPublicKeyInfo (a `PUBLIC KEY` PEM block), read from its
    /// AlgorithmIdentifier; `Err` names what it is instead.
    pub fn of_spki(der: &[u8]) -> Result<KeyKind, &'static str> {
        let not_spki = "not a DER SubjectPublicKeyInfo";
        let (outer, _) = der_element(der, 0x30).ok_or(not_spki)?;
        let (algorithm, _) = der_element(outer, 0x30).ok_or(not_spki)?;
        let (oid, params) = der_element(algorithm, 0x06).ok_or(not_spki)?;
        match oid {
            OID_RSA => Ok(KeyKind::Rsa),
            OID_ED25519 => Ok(KeyKind::Ed25519),
            OID_EC_PUBLIC_KEY => match der_element(params, 0x06) {
                Some((OID_P256, _)) => Ok(KeyKind::EcP256),
                _ => Err("an EC key on a curve other than P-256 (ES256 needs P-256)"),
            },
            _ => Err("a key of an algorithm livegate does not verify (RSA, EC P-256 or Ed25519)"),
        }
    }
}

/// The contents of the DER element with `tag` at the start of `der`, and what follows it.
fn der_element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = der.split_first()?;
    if first != tag {
        return None;
    }
    let (&len, rest) = rest.split_first()?;
    let (len, rest) = if len < 0x80 {
        (len as usize, rest)
    } else {
        let n = (len & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, &b| (acc << 8) | b as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// Why a JWT is refused. The handshake answers [`JwtError::Expired`] as `token_expired`
/// and everything else as `invalid_token`, with this text as the message.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum JwtError {
    #[error("JWTs are not enabled on this server (no jwt_hmac_secret, jwt_public_key_file or jwt_jwks_file)")]
    NotEnabled,
    #[error("JWT is longer than {MAX_TOKEN_LEN} bytes")]
    Oversized,
    #[error("JWT is malformed: {0}")]
    Malformed(String),
    #[error("JWT algorithm \"none\" is never accepted: sign the token")]
    AlgNone,
    #[error("JWT algorithm {0:?} is not supported (HS256, RS256, ES256, EdDSA)")]
    UnsupportedAlgorithm(String),
    #[error("JWT algorithm {alg} is not accepted: this server's keys verify {accepted}")]
    AlgorithmNotAccepted { alg: Alg, accepted: String },
    #[error("JWT key id {0:?} is not in jwt_jwks_file")]
    UnknownKid(String),
    #[error("JWT algorithm {alg} does not match key {kid:?}, which verifies {key}")]
    KeyAlgorithmMismatch { kid: String, key: Alg, alg: Alg },
    #[error("JWT signature is invalid")]
    BadSignature,
    #[error("JWT has expired (exp)")]
    Expired,
    #[error("JWT is not valid yet (nbf)")]
    NotYetValid,
    #[error("JWT was issued in the future (iat)")]
    IssuedInFuture,
    #[error("JWT lives longer than token_ttl_max_secs ({max_secs} s): exp is too far ahead")]
    LifetimeTooLong { max_secs: u64 },
    #[error("JWT lacks the required claim {0}")]
    MissingClaim(&'static str),
    #[error("JWT claim {claim} {problem}")]
    BadClaim { claim: &'static str, problem: String },
    #[error("JWT issuer (iss) is not jwt_issuer")]
    WrongIssuer,
    #[error("JWT audience (aud) does not name jwt_audience")]
    WrongAudience,
    #[error("JWT claim cell {0:?} is not one of the configured cells")]
    UnknownCell(String),
}

/// At most 64 characters of what a client sent, for a message.
fn shown(text: &str) -> String {
    text.chars().take(64).collect()
}

/// Whether a presented token is a JWT (three base64url parts, the signature possibly
/// empty as in `alg: none`) rather than a minted token (`body.mac`).
pub fn looks_like_jwt(token: &str) -> bool {
    let base64url =
        |part: &str| part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let mut parts = token.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(header), Some(claims), Some(signature), None) => {
            !header.is_empty()
                && !claims.is_empty()
                && [header, claims, signature].into_iter().all(base64url)
        }
        _ => false,
    }
}

/// A configured key as [`choose_key`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySlot<'a> {
    pub alg: Alg,
    /// Its `kid` (JWKS entries may have one).
    pub kid: Option<&'a str>,
    /// Whether it comes from `jwt_jwks_file`.
    pub in_set: bool,
}

/// The index in `keys` of the key that verifies a token whose header says `alg` and
/// `kid`. A `kid` that a JWKS entry has picks that entry, whose algorithm must be `alg`;
/// otherwise the key whose algorithm is `alg` among the secret, the PEM key and the JWKS
/// entries without a `kid`. A `kid` that no entry has, with a JWKS configured and no
/// other key for `alg`, is unknown.
pub fn choose_key(alg: &str, kid: Option<&str>, keys: &[KeySlot<'_>]) -> Result<usize, JwtError> {
    if keys.is_empty() {
        return Err(JwtError::NotEnabled);
    }
    if alg.eq_ignore_ascii_case("none") {
        return Err(JwtError::AlgNone);
    }
    let alg = Alg::named(alg).ok_or_else(|| JwtError::UnsupportedAlgorithm(shown(alg)))?;
    if let Some(kid) = kid {
        if let Some(at) = keys.iter().position(|k| k.in_set && k.kid == Some(kid)) {
            if keys[at].alg != alg {
                return Err(JwtError::KeyAlgorithmMismatch {
                    kid: shown(kid),
                    key: keys[at].alg,
                    alg,
                });
            }
            return Ok(at);
        }
    }
    if let Some(at) = keys.iter().position(|k| k.alg == alg && (!k.in_set || k.kid.is_none())) {
        return Ok(at);
    }
    match kid {
        Some(kid) if keys.iter().any(|k| k.in_set) => Err(JwtError::UnknownKid(shown(kid))),
        _ => {
            let mut accepted: Vec<Alg> = keys.iter().map(|k| k.alg).collect();
            accepted.sort();
            accepted.dedup();
            let accepted = accepted.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ");
            Err(JwtError::AlgorithmNotAccepted { alg, accepted })
        }
    }
}

/// The claims of a JWT whose signature checked, as plain values (times in seconds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Presented {
    pub sub: Option<String>,
    pub device: Option<String>,
    pub rooms: Option<Vec<String>>,
    pub publish: Option<Vec<String>>,
    pub cell: Option<String>,
    pub exp: Option<u64>,
    pub nbf: Option<u64>,
    pub iat: Option<u64>,
    pub jti: Option<String>,
    pub iss: Option<String>,
    /// `aud`, a string or a list (absent: empty).
    pub aud: Vec<String>,
}

/// What the configuration asks of every JWT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy<'a> {
    /// `jwt_issuer`: when set, `iss` must be it.
    pub issuer: Option<&'a str>,
    /// `jwt_audience`: when set, `aud` must name it.
    pub audience: Option<&'a str>,
    /// `token_ttl_max_secs`: `exp` at most this far after `now` (plus the leeway).
    pub max_ttl_secs: u64,
}

/// The claims of a verified JWT at `now_ms`, as the [`Claims`] of a minted token: `sub`
/// the user, `device` (default "web"), `rooms` and `publish` patterns, `cell` (one
/// `knows_cell` accepts), `exp` the expiry plus [`LEEWAY_SECS`] (how long its nonce is
/// kept), `iat` the issue time (absent: the earliest it could have been, as for the oldest
/// minted format), and the nonce derived from `iss` and `jti` ([`jti_nonce`]).
pub fn grant(
    claims: Presented,
    policy: &Policy<'_>,
    now_ms: u64,
    knows_cell: impl Fn(&str) -> bool,
) -> Result<Claims, JwtError> {
    let user = claims.sub.ok_or(JwtError::MissingClaim("sub"))?;
    let exp = claims.exp.ok_or(JwtError::MissingClaim("exp"))?;
    let jti = claims.jti.ok_or(JwtError::MissingClaim("jti"))?;
    if let Some(issuer) = policy.issuer {
        if claims.iss.as_deref() != Some(issuer) {
            return Err(JwtError::WrongIssuer);
        }
    }
    if let Some(audience) = policy.audience {
        if !claims.aud.iter().any(|a| a == audience) {
            return Err(JwtError::WrongAudience);
        }
    }
    let ms = |secs: u64| secs.saturating_mul(1000);
    let leeway_ms = ms(LEEWAY_SECS);
    let expires_at_ms = ms(exp).saturating_add(leeway_ms);
    if expires_at_ms <= now_ms {
        return Err(JwtError::Expired);
    }
    if claims.nbf.is_some_and(|nbf| ms(nbf) > now_ms.saturating_add(leeway_ms)) {
        return Err(JwtError::NotYetValid);
    }
    if claims.iat.is_some_and(|iat| ms(iat) > now_ms.saturating_add(leeway_ms)) {
        return Err(JwtError::IssuedInFuture);
    }
    if ms(exp) > now_ms.saturating_add(ms(policy.max_ttl_secs)).saturating_add(leeway_ms) {
        return Err(JwtError::LifetimeTooLong { max_secs: policy.max_ttl_secs });
    }
    if jti.is_empty() || jti.len() > MAX_JTI_LEN {
        return Err(JwtError::BadClaim {
            claim: "jti",
            problem: format!("must be 1 to {MAX_JTI_LEN} bytes long"),
        });
    }
    names::check_user(&user).map_err(|e| JwtError::BadClaim {
        claim: "sub",
        problem: format!("is not a user name: {e}"),
    })?;
    let device = claims.device.unwrap_or_else(|| DEFAULT_DEVICE.to_string());
    names::check_device(&device).map_err(|e| JwtError::BadClaim {
        claim: "device",
        problem: format!("is not a device name: {e}"),
    })?;
    let rooms = patterns("rooms", claims.rooms.unwrap_or_default())?;
    let publish = patterns("publish", claims.publish.unwrap_or_default())?;
    if let Some(cell) = &claims.cell {
        if !knows_cell(cell) {
            return Err(JwtError::UnknownCell(shown(cell)));
        }
    }
    // Absent `iat`: minted at the earliest the lifetime bound allows, so a kick never lets
    // an old token through (as `Claims::issued_at_or_earliest` does for old formats).
    let issued_at_ms = match claims.iat {
        Some(iat) => ms(iat),
        None => ms(exp).saturating_sub(ms(policy.max_ttl_secs)),
    };
    Ok(Claims {
        user,
        device,
        issued_at_ms: Some(issued_at_ms),
        expires_at_ms,
        nonce: jti_nonce(claims.iss.as_deref(), &jti),
        rooms,
        publish,
        cell: claims.cell,
    })
}

/// Room patterns: each a room name, optionally ending in `*`; at most [`MAX_PATTERNS`].
fn patterns(claim: &'static str, patterns: Vec<String>) -> Result<Vec<String>, JwtError> {
    if patterns.len() > MAX_PATTERNS {
        return Err(JwtError::BadClaim {
            claim,
            problem: format!("holds more than {MAX_PATTERNS} patterns"),
        });
    }
    for pattern in &patterns {
        let name = pattern.strip_suffix('*').filter(|p| !p.is_empty()).unwrap_or(pattern);
        if names::check_room(name).is_err() {
            let problem =
                format!("pattern {:?} is not a room name, optionally ending in *", shown(pattern));
            return Err(JwtError::BadClaim { claim, problem });
        }
    }
    Ok(patterns)
}

/// The one-time nonce of a JWT: the first 16 bytes of SHA-256 over a label, the issuer
/// and the `jti`, so the same `jti` of two issuers is two tokens, and no JWT's nonce is
/// a minted token's (those are random).
pub fn jti_nonce(iss: Option<&str>, jti: &str) -> [u8; 16] {
    let mut hash = Sha256::new();
    hash.update(b"livegate jwt jti\0");
    hash.update(iss.unwrap_or_default().as_bytes());
    hash.update(b"\0");
    hash.update(jti.as_bytes());
    let digest = hash.finalize();
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&digest[..16]);
    nonce
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000_000_000;
    const NOW_SECS: u64 = NOW / 1000;

    #[test]
    fn which_tokens_are_jwts() {
        let cases = [
            ("eyJh.eyJz.c2ln", true),
            ("eyJh.eyJz.", true), // alg none: an empty signature
            ("eyJh-_.eyJz_-.c2ln-_", true),
            ("AQID.c2ln", false),       // a minted token: body.mac
            ("eyJh..c2ln", false),      // no claims
            (".eyJz.c2ln", false),      // no header
            ("a.b.c.d", false),         // four parts (JWE has five)
            ("eyJh.eyJz.c2ln=", false), // padding is not base64url
            ("eyJh.ey Jz.c2ln", false), // a space
            ("eyJh.eyJz.c2l+", false),  // base64, not base64url
        ];
        for (token, jwt) in cases {
            assert_eq!(looks_like_jwt(token), jwt, "{token}");
        }
    }

    const HS: KeySlot<'static> = KeySlot { alg: Alg::HS256, kid: None, in_set: false };
    const RS: KeySlot<'static> = KeySlot { alg: Alg::RS256, kid: None, in_set: false };
    const SET_EC: KeySlot<'static> = KeySlot { alg: Alg::ES256, kid: Some("ec-1"), in_set: true };
    const SET_ED: KeySlot<'static> = KeySlot { alg: Alg::EdDSA, kid: Some("ed-1"), in_set: true };
    const SET_NO_KID: KeySlot<'static> = KeySlot { alg: Alg::RS256, kid: None, in_set: true };

    #[test]
    fn the_key_follows_the_configuration_never_the_header_alone() {
        let accepted = |alg: Alg, accepted: &str| -> Result<usize, JwtError> {
            Err(JwtError::AlgorithmNotAccepted { alg, accepted: accepted.into() })
        };
        let cases: &[(&str, Option<&str>, &[KeySlot], Result<usize, JwtError>)] = &[
            ("HS256", None, &[], Err(JwtError::NotEnabled)),
            ("none", None, &[HS], Err(JwtError::AlgNone)),
            ("NONE", None, &[HS, RS], Err(JwtError::AlgNone)),
            ("nOnE", Some("ec-1"), &[SET_EC], Err(JwtError::AlgNone)),
            ("HS512", None, &[HS], Err(JwtError::UnsupportedAlgorithm("HS512".into()))),
            ("hs256", None, &[HS], Err(JwtError::UnsupportedAlgorithm("hs256".into()))),
            ("HS256", None, &[HS], Ok(0)),
            ("RS256", None, &[HS, RS], Ok(1)),
            // Algorithm confusion: an HS256 token against an RSA key, RS256 against a secret.
            ("HS256", None, &[RS], accepted(Alg::HS256, "RS256")),
            ("RS256", None, &[HS], accepted(Alg::RS256, "HS256")),
            ("EdDSA", None, &[HS, RS, SET_EC], accepted(Alg::EdDSA, "HS256, RS256, ES256")),
            // A kid picks its JWKS entry, whose algorithm is fixed by its key type.
            ("ES256", Some("ec-1"), &[HS, SET_EC, SET_ED], Ok(1)),
            ("EdDSA", Some("ed-1"), &[SET_EC, SET_ED], Ok(1)),
            (
                "HS256",
                Some("ec-1"),
                &[HS, SET_EC],
                Err(JwtError::KeyAlgorithmMismatch {
                    kid: "ec-1".into(),
                    key: Alg::ES256,
                    alg: Alg::HS256,
                }),
            ),
            ("ES256", Some("nope"), &[SET_EC], Err(JwtError::UnknownKid("nope".into()))),
            ("ES256", None, &[SET_EC], accepted(Alg::ES256, "ES256")),
            // A kid no JWKS entry has still reaches the secret or PEM key of its algorithm.
            ("HS256", Some("backend-2"), &[HS, SET_EC], Ok(0)),
            ("HS256", Some("backend-2"), &[HS], Ok(0)),
            ("RS256", Some("backend-2"), &[HS], accepted(Alg::RS256, "HS256")),
            // An entry without a kid serves tokens without one.
            ("RS256", None, &[SET_EC, SET_NO_KID], Ok(1)),
        ];
        for (alg, kid, keys, want) in cases {
            assert_eq!(&choose_key(alg, *kid, keys), want, "alg {alg} kid {kid:?} keys {keys:?}");
        }
    }

    #[test]
    fn key_kinds_are_read_from_the_algorithm_identifier() {
        // SubjectPublicKeyInfo prefixes (the key bits after them do not matter here).
        let ed25519 = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
        let mut ed = ed25519.to_vec();
        ed.extend([7u8; 32]);
        assert_eq!(KeyKind::of_spki(&ed), Ok(KeyKind::Ed25519));
        let p256_head = [
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06,
            0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
        ];
        let mut p256 = p256_head.to_vec();
        p256.extend([4u8; 65]);
        assert_eq!(KeyKind::of_spki(&p256), Ok(KeyKind::EcP256));
        // P-384: secp384r1 is 1.3.132.0.34.
        let p384_head = [
            0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06,
            0x05, 0x2b, 0x81, 0x04, 0x00, 0x22, 0x03, 0x62, 0x00,
        ];
        let mut p384 = p384_head.to_vec();
        p384.extend([4u8; 97]);
        assert!(KeyKind::of_spki(&p384).unwrap_err().contains("P-256"));
        // RSA: a long form length (0x82 = two length bytes).
        let mut rsa = vec![0x30, 0x82, 0x01, 0x22, 0x30, 0x0d, 0x06, 0x09];
        rsa.extend(OID_RSA);
        rsa.extend([0x05, 0x00, 0x03, 0x82, 0x01, 0x0f, 0x00]);
        rsa.extend(vec![1u8; 0x10e]);
        assert_eq!(KeyKind::of_spki(&rsa), Ok(KeyKind::Rsa));
        for junk in [
            &[][..],
            &[0x30][..],
            &[0x30, 0x05, 0x30, 0x03, 0x06, 0x09, 0x2a][..],
            &[0x04, 0x00][..],
            &ed25519[..4],
        ] {
            assert!(KeyKind::of_spki(junk).is_err(), "{junk:?}");
        }
        assert_eq!(
            [KeyKind::Rsa, KeyKind::EcP256, KeyKind::Ed25519].map(KeyKind::alg),
            [Alg::RS256, Alg::ES256, Alg::EdDSA]
        );
    }

    fn presented() -> Presented {
        Presented {
            sub: Some("alice".into()),
            exp: Some(NOW_SECS + 60),
            jti: Some("j-1".into()),
            ..Presented::default()
        }
    }

    const POLICY: Policy<'static> = Policy { issuer: None, audience: None, max_ttl_secs: 3600 };

    fn check(claims: Presented, policy: &Policy<'_>) -> Result<Claims, JwtError> {
        grant(claims, policy, NOW, |cell| cell == "eu")
    }

    #[test]
    fn claims_become_the_grant_of_a_minted_token() {
        let granted = check(presented(), &POLICY).expect("valid");
        assert_eq!(granted.user, "alice");
        assert_eq!(granted.device, "web", "the default device");
        assert_eq!(
            (granted.rooms.len(), granted.publish.len(), granted.cell.clone()),
            (0, 0, None)
        );
        assert_eq!(
            granted.expires_at_ms,
            (NOW_SECS + 60 + LEEWAY_SECS) * 1000,
            "its nonce is kept through the leeway"
        );
        assert_eq!(
            granted.issued_at_ms,
            Some((NOW_SECS + 60 - 3600) * 1000),
            "no iat: the earliest it could be"
        );
        assert_eq!(granted.nonce, jti_nonce(None, "j-1"));

        let full = Presented {
            device: Some("phone".into()),
            rooms: Some(vec!["match:*".into(), "lobby".into()]),
            publish: Some(vec!["chat:*".into()]),
            cell: Some("eu".into()),
            iat: Some(NOW_SECS - 1),
            nbf: Some(NOW_SECS - 1),
            iss: Some("backend".into()),
            aud: vec!["other".into(), "livegate".into()],
            ..presented()
        };
        let policy = Policy { issuer: Some("backend"), audience: Some("livegate"), ..POLICY };
        let granted = check(full, &policy).expect("valid");
        assert_eq!(granted.device, "phone");
        assert_eq!(granted.rooms, ["match:*", "lobby"]);
        assert_eq!(granted.publish, ["chat:*"]);
        assert_eq!(granted.cell.as_deref(), Some("eu"));
        assert_eq!(granted.issued_at_ms, Some((NOW_SECS - 1) * 1000));
        assert_eq!(granted.nonce, jti_nonce(Some("backend"), "j-1"));
    }

    #[test]
    fn refusals_name_their_reason() {
        let strict = Policy { issuer: Some("backend"), audience: Some("livegate"), ..POLICY };
        let long_jti = "j".repeat(MAX_JTI_LEN + 1);
        let cases: Vec<(&str, Presented, &Policy, JwtError)> = vec![
            (
                "no sub",
                Presented { sub: None, ..presented() },
                &POLICY,
                JwtError::MissingClaim("sub"),
            ),
            (
                "no exp",
                Presented { exp: None, ..presented() },
                &POLICY,
                JwtError::MissingClaim("exp"),
            ),
            (
                "no jti",
                Presented { jti: None, ..presented() },
                &POLICY,
                JwtError::MissingClaim("jti"),
            ),
            (
                "expired",
                Presented { exp: Some(NOW_SECS - LEEWAY_SECS), ..presented() },
                &POLICY,
                JwtError::Expired,
            ),
            (
                "not yet",
                Presented { nbf: Some(NOW_SECS + LEEWAY_SECS + 1), ..presented() },
                &POLICY,
                JwtError::NotYetValid,
            ),
            (
                "iat ahead",
                Presented { iat: Some(NOW_SECS + LEEWAY_SECS + 1), ..presented() },
                &POLICY,
                JwtError::IssuedInFuture,
            ),
            (
                "too long",
                Presented { exp: Some(NOW_SECS + 3600 + LEEWAY_SECS + 1), ..presented() },
                &POLICY,
                JwtError::LifetimeTooLong { max_secs: 3600 },
            ),
            ("no iss", presented(), &strict, JwtError::WrongIssuer),
            (
                "wrong iss",
                Presented { iss: Some("x".into()), aud: vec!["livegate".into()], ..presented() },
                &strict,
                JwtError::WrongIssuer,
            ),
            (
                "no aud",
                Presented { iss: Some("backend".into()), ..presented() },
                &strict,
                JwtError::WrongAudience,
            ),
            (
                "wrong aud",
                Presented { iss: Some("backend".into()), aud: vec!["x".into()], ..presented() },
                &strict,
                JwtError::WrongAudience,
            ),
            (
                "unknown cell",
                Presented { cell: Some("us".into()), ..presented() },
                &POLICY,
                JwtError::UnknownCell("us".into()),
            ),
        ];
        for (why, claims, policy, want) in cases {
            assert_eq!(check(claims, policy), Err(want), "{why}");
        }
        let bad_claim = |claims: Presented| match check(claims, &POLICY) {
            Err(JwtError::BadClaim { claim, .. }) => claim,
            other => panic!("a bad claim, got {other:?}"),
        };
        assert_eq!(bad_claim(Presented { jti: Some(long_jti), ..presented() }), "jti");
        assert_eq!(bad_claim(Presented { jti: Some(String::new()), ..presented() }), "jti");
        assert_eq!(bad_claim(Presented { sub: Some("a b".into()), ..presented() }), "sub");
        assert_eq!(bad_claim(Presented { device: Some("x".repeat(40)), ..presented() }), "device");
        assert_eq!(
            bad_claim(Presented { rooms: Some(vec!["bad room".into()]), ..presented() }),
            "rooms"
        );
        assert_eq!(
            bad_claim(Presented { publish: Some(vec!["*".into()]), ..presented() }),
            "publish"
        );
        assert_eq!(
            bad_claim(Presented { rooms: Some(vec!["r".into(); MAX_PATTERNS + 1]), ..presented() }),
            "rooms"
        );
    }

    #[test]
    fn times_hold_within_the_leeway() {
        let at = |exp: u64, nbf: Option<u64>| {
            check(Presented { exp: Some(exp), nbf, ..presented() }, &POLICY).map(|_| ())
        };
        assert_eq!(at(NOW_SECS, None), Ok(()), "at exp, inside the leeway");
        assert_eq!(at(NOW_SECS - LEEWAY_SECS + 1, None), Ok(()));
        assert_eq!(at(NOW_SECS - LEEWAY_SECS, None), Err(JwtError::Expired));
        assert_eq!(
            at(NOW_SECS + 60, Some(NOW_SECS + LEEWAY_SECS)),
            Ok(()),
            "nbf within the leeway"
        );
        assert_eq!(
            at(NOW_SECS + 3600 + LEEWAY_SECS, None),
            Ok(()),
            "the lifetime bound plus the leeway"
        );
    }

    #[test]
    fn nonces_differ_by_jti_and_issuer() {
        let nonces = [
            jti_nonce(None, "a"),
            jti_nonce(None, "b"),
            jti_nonce(Some("x"), "a"),
            jti_nonce(Some(""), "x\0a"),
        ];
        for (i, a) in nonces.iter().enumerate() {
            for b in &nonces[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(jti_nonce(Some("x"), "a"), jti_nonce(Some("x"), "a"));
    }
}
