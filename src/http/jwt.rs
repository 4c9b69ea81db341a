//! JWTs a backend signs, the half with I/O and crates: [`JwtKeys`] reads the keys the
//! configuration names (`jwt_hmac_secret`, `jwt_public_key_file`, `jwt_jwks_file`) once at
//! start, and checks a token's signature with the `jsonwebtoken` crate. Which key, which
//! algorithm and what the claims grant are `core::credentials::jwt`'s decisions; what a verified JWT
//! grants is a minted token's [`Claims`], spent through the same one-time store.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::config::Config;
use crate::core::credentials::jwt::{self, Alg, JwtError, KeyKind, KeySlot, Policy, Presented};
use crate::core::credentials::token::{Claims, MAX_TOKEN_LEN};

/// A configured verification key.
struct Key {
    alg: Alg,
    /// A JWKS entry's `kid`.
    kid: Option<String>,
    in_set: bool,
    decoding: DecodingKey,
}

/// Every key JWTs are checked with, and what the configuration asks of their claims.
pub struct JwtKeys {
    keys: Vec<Key>,
    issuer: Option<String>,
    audience: Option<String>,
    max_ttl_secs: u64,
}

/// A key file that cannot be used; the node does not start with it.
#[derive(Debug, thiserror::Error)]
pub enum JwtKeyError {
    #[error("{key}: cannot read {}: {source}", path.display())]
    Read { key: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{key}: {}: {problem}", path.display())]
    Invalid { key: &'static str, path: PathBuf, problem: String },
    #[error("jwt_hmac_secret: {0}")]
    Secret(String),
}

/// A JWKS file's entry, as far as livegate reads it.
#[derive(Deserialize)]
struct JwkEntry {
    kty: String,
    crv: Option<String>,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    key_use: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<JwkEntry>,
}

/// What the header says, read before any key is chosen.
#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    crit: Option<serde_json::Value>,
}

/// The claims livegate reads; others are ignored.
#[derive(Deserialize)]
struct WireClaims {
    sub: Option<String>,
    device: Option<String>,
    rooms: Option<Vec<String>>,
    publish: Option<Vec<String>>,
    cell: Option<String>,
    exp: Option<serde_json::Number>,
    nbf: Option<serde_json::Number>,
    iat: Option<serde_json::Number>,
    jti: Option<String>,
    iss: Option<String>,
    aud: Option<Audience>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl JwtKeys {
    /// The keys `config` names (none: JWTs are refused as not enabled).
    pub fn load(config: &Config) -> Result<JwtKeys, JwtKeyError> {
        let mut keys = Vec::new();
        if let Some(secret) = &config.jwt_hmac_secret {
            let decoding = DecodingKey::from_secret(secret.as_bytes())
                .map_err(|e| JwtKeyError::Secret(e.to_string()))?;
            keys.push(Key { alg: Alg::HS256, kid: None, in_set: false, decoding });
        }
        if let Some(path) = &config.jwt_public_key_file {
            keys.push(public_key(path)?);
        }
        if let Some(path) = &config.jwt_jwks_file {
            keys.extend(key_set(path)?);
        }
        Ok(JwtKeys {
            keys,
            issuer: config.jwt_issuer.clone(),
            audience: config.jwt_audience.clone(),
            max_ttl_secs: config.token_ttl_max_secs,
        })
    }

    /// What the keys verify, for the start-up log and `check-config`: `HS256`, `RS256
    /// (PEM)`, `ES256 kid=k1 (JWKS)`, ...
    pub fn describe(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| match (&k.kid, k.in_set, k.alg) {
                (_, false, Alg::HS256) => "HS256 (jwt_hmac_secret)".to_string(),
                (_, false, alg) => format!("{alg} (jwt_public_key_file)"),
                (Some(kid), true, alg) => format!("{alg} kid={kid} (jwt_jwks_file)"),
                (None, true, alg) => format!("{alg} (jwt_jwks_file)"),
            })
            .collect()
    }

    /// Check `token` (a JWT: `core::credentials::jwt::looks_like_jwt`) at `now_ms`: size, header,
    /// signature with the key `core::credentials::jwt::choose_key` picks, then the claims. The `jti` is
    /// not spent here: the handshake spends the returned nonce as a minted token's.
    pub fn verify(
        &self,
        token: &str,
        now_ms: u64,
        knows_cell: impl Fn(&str) -> bool,
    ) -> Result<Claims, JwtError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(JwtError::Oversized);
        }
        if self.keys.is_empty() {
            return Err(JwtError::NotEnabled);
        }
        let header_part = token.split('.').next().unwrap_or_default();
        let header_json = URL_SAFE_NO_PAD
            .decode(header_part)
            .map_err(|_| malformed("the header is not base64url"))?;
        let header: Header = serde_json::from_slice(&header_json)
            .map_err(|e| JwtError::Malformed(format!("the header is not a JWT header: {e}")))?;
        if header.crit.is_some() {
            return Err(malformed(
                "the header names critical extensions (crit), which livegate does not implement",
            ));
        }
        let slots: Vec<KeySlot<'_>> = self
            .keys
            .iter()
            .map(|k| KeySlot { alg: k.alg, kid: k.kid.as_deref(), in_set: k.in_set })
            .collect();
        let key = &self.keys[jwt::choose_key(&header.alg, header.kid.as_deref(), &slots)?];
        let mut validation = Validation::new(algorithm(key.alg));
        // Times, issuer and audience are core::credentials::jwt's, with the node's `now`.
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        let data =
            jsonwebtoken::decode::<WireClaims>(token, &key.decoding, &validation).map_err(|e| {
                match e.into_kind() {
                    ErrorKind::InvalidSignature
                    | ErrorKind::InvalidEcdsaKey
                    | ErrorKind::InvalidEddsaKey
                    | ErrorKind::InvalidRsaKey(_) => JwtError::BadSignature,
                    ErrorKind::Json(e) => {
                        JwtError::Malformed(format!("the claims are not what livegate reads: {e}"))
                    }
                    ErrorKind::Base64(_) | ErrorKind::Utf8(_) | ErrorKind::InvalidToken => {
                        malformed("a part is not base64url JSON")
                    }
                    other => JwtError::Malformed(format!("{other:?}")),
                }
            })?;
        let policy = Policy {
            issuer: self.issuer.as_deref(),
            audience: self.audience.as_deref(),
            max_ttl_secs: self.max_ttl_secs,
        };
        jwt::grant(presented(data.claims)?, &policy, now_ms, knows_cell)
    }
}

fn malformed(why: &str) -> JwtError {
    JwtError::Malformed(why.to_string())
}

fn algorithm(alg: Alg) -> Algorithm {
    match alg {
        Alg::HS256 => Algorithm::HS256,
        Alg::RS256 => Algorithm::RS256,
        Alg::ES256 => Algorithm::ES256,
        Alg::EdDSA => Algorithm::EdDSA,
    }
}

/// The claims as plain values: NumericDates (seconds, fractions dropped) as whole numbers.
fn presented(claims: WireClaims) -> Result<Presented, JwtError> {
    let seconds =
        |claim: &'static str, value: Option<serde_json::Number>| -> Result<Option<u64>, JwtError> {
            let Some(number) = value else { return Ok(None) };
            let secs = number.as_u64().or_else(|| {
                number.as_f64().filter(|f| f.is_finite() && *f >= 0.0).map(|f| f as u64)
            });
            secs.map(Some).ok_or(JwtError::BadClaim {
                claim,
                problem: "must be a non-negative number of seconds".to_string(),
            })
        };
    Ok(Presented {
        exp: seconds("exp", claims.exp)?,
        nbf: seconds("nbf", claims.nbf)?,
        iat: seconds("iat", claims.iat)?,
        sub: claims.sub,
        device: claims.device,
        rooms: claims.rooms,
        publish: claims.publish,
        cell: claims.cell,
        jti: claims.jti,
        iss: claims.iss,
        aud: match claims.aud {
            None => Vec::new(),
            Some(Audience::One(aud)) => vec![aud],
            Some(Audience::Many(auds)) => auds,
        },
    })
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, JwtKeyError> {
    std::fs::read(path).map_err(|source| JwtKeyError::Read {
        key,
        path: path.to_path_buf(),
        source,
    })
}

/// `jwt_public_key_file`: one PEM public key (`PUBLIC KEY`, or `RSA PUBLIC KEY`), whose
/// kind fixes the algorithm.
fn public_key(path: &Path) -> Result<Key, JwtKeyError> {
    const KEY: &str = "jwt_public_key_file";
    let invalid =
        |problem: String| JwtKeyError::Invalid { key: KEY, path: path.to_path_buf(), problem };
    let text = read(KEY, path)?;
    let block = pem::parse(&text).map_err(|e| invalid(format!("not a PEM file: {e}")))?;
    let kind = match block.tag() {
        "PUBLIC KEY" => {
            KeyKind::of_spki(block.contents()).map_err(|what| invalid(format!("holds {what}")))?
        }
        "RSA PUBLIC KEY" => KeyKind::Rsa,
        tag if tag.contains("PRIVATE") => {
            return Err(invalid(format!(
                "holds a private key ({tag}): give livegate the public key only"
            )));
        }
        tag => return Err(invalid(format!("holds a {tag}, not a PUBLIC KEY"))),
    };
    let decoding = match kind {
        KeyKind::Rsa => DecodingKey::from_rsa_pem(&text),
        KeyKind::EcP256 => DecodingKey::from_ec_pem(&text),
        KeyKind::Ed25519 => DecodingKey::from_ed_pem(&text),
    }
    .map_err(|e| invalid(format!("not a usable {:?} public key: {e}", kind)))?;
    Ok(Key { alg: kind.alg(), kid: None, in_set: false, decoding })
}

/// `jwt_jwks_file`: a JWK Set; each signing key's `kty` (and `crv`) fixes its algorithm.
/// Encryption keys (`use: enc`) are skipped.
fn key_set(path: &Path) -> Result<Vec<Key>, JwtKeyError> {
    const KEY: &str = "jwt_jwks_file";
    let invalid =
        |problem: String| JwtKeyError::Invalid { key: KEY, path: path.to_path_buf(), problem };
    let set: JwkSet = serde_json::from_slice(&read(KEY, path)?)
        .map_err(|e| invalid(format!("not a JWK Set ({{\"keys\": [...]}}): {e}")))?;
    let mut keys: Vec<Key> = Vec::new();
    for (at, entry) in set.keys.into_iter().enumerate() {
        if entry.key_use.as_deref() == Some("enc") {
            continue;
        }
        let name =
            entry.kid.as_deref().map_or_else(|| format!("key {at}"), |kid| format!("key {kid:?}"));
        let field = |value: &Option<String>, field: &str| {
            value
                .clone()
                .ok_or_else(|| invalid(format!("{name} (kty {}) lacks {field}", entry.kty)))
        };
        let (alg, decoding) = match (entry.kty.as_str(), entry.crv.as_deref()) {
            ("RSA", _) => (
                Alg::RS256,
                DecodingKey::from_rsa_components(&field(&entry.n, "n")?, &field(&entry.e, "e")?),
            ),
            ("EC", Some("P-256")) => (
                Alg::ES256,
                DecodingKey::from_ec_components(&field(&entry.x, "x")?, &field(&entry.y, "y")?),
            ),
            ("OKP", Some("Ed25519")) => {
                (Alg::EdDSA, DecodingKey::from_ed_components(&field(&entry.x, "x")?))
            }
            (kty, crv) => {
                let crv = crv.map(|c| format!(" crv {c}")).unwrap_or_default();
                return Err(invalid(format!("{name} is kty {kty}{crv}: livegate verifies RSA, EC P-256 and OKP Ed25519 keys")));
            }
        };
        let decoding = decoding.map_err(|e| invalid(format!("{name} is not a usable key: {e}")))?;
        if let Some(named) = entry.alg.as_deref().filter(|named| *named != alg.name()) {
            return Err(invalid(format!(
                "{name} says alg {named}, but its key type verifies {alg}"
            )));
        }
        if entry.kid.is_some() && keys.iter().any(|k| k.kid == entry.kid) {
            return Err(invalid(format!("{name} appears twice")));
        }
        keys.push(Key { alg, kid: entry.kid, in_set: true, decoding });
    }
    if keys.is_empty() {
        return Err(invalid("holds no signing key".to_string()));
    }
    Ok(keys)
}
