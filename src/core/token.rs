//! Connection tokens: HMAC-SHA256 over {user, device, expiry, nonce, room patterns}.
//! Pure: signing and verification take the secret and `now`; single use (the nonce) is
//! enforced by the caller against the store.
//!
//! Wire form: `base64url(body) "." base64url(mac)`, body =
//! `version u8 | expires_at_ms u64 BE | nonce [16] | str user | str device | u8 n | n × str room`,
//! each `str` a u8 length then UTF-8 bytes.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

const TOKEN_VERSION: u8 = 1;
/// Longer tokens are rejected before any decoding.
pub const MAX_TOKEN_LEN: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub user: String,
    pub device: String,
    pub expires_at_ms: u64,
    pub nonce: [u8; 16],
    /// Room patterns the token may read (empty: any room).
    pub rooms: Vec<String>,
}

#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
pub enum TokenError {
    #[error("token is malformed")]
    Malformed,
    #[error("token signature is invalid")]
    BadSignature,
    #[error("token has expired")]
    Expired,
}

fn mac(secret: &[u8]) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length")
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let bytes = &s.as_bytes()[..s.len().min(255)];
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

fn encode_body(claims: &Claims) -> Vec<u8> {
    let mut body = Vec::with_capacity(64);
    body.push(TOKEN_VERSION);
    body.extend_from_slice(&claims.expires_at_ms.to_be_bytes());
    body.extend_from_slice(&claims.nonce);
    put_str(&mut body, &claims.user);
    put_str(&mut body, &claims.device);
    body.push(claims.rooms.len().min(255) as u8);
    for room in claims.rooms.iter().take(255) {
        put_str(&mut body, room);
    }
    body
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], TokenError> {
        if self.0.len() < n {
            return Err(TokenError::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, TokenError> {
        Ok(self.take(1)?[0])
    }
    fn string(&mut self) -> Result<String, TokenError> {
        let len = self.u8()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| TokenError::Malformed)
    }
}

fn decode_body(body: &[u8]) -> Result<Claims, TokenError> {
    let mut r = Reader(body);
    if r.u8()? != TOKEN_VERSION {
        return Err(TokenError::Malformed);
    }
    let expires_at_ms = u64::from_be_bytes(r.take(8)?.try_into().map_err(|_| TokenError::Malformed)?);
    let nonce: [u8; 16] = r.take(16)?.try_into().map_err(|_| TokenError::Malformed)?;
    let user = r.string()?;
    let device = r.string()?;
    let n = r.u8()?;
    let rooms = (0..n).map(|_| r.string()).collect::<Result<_, _>>()?;
    if !r.0.is_empty() {
        return Err(TokenError::Malformed);
    }
    Ok(Claims { user, device, expires_at_ms, nonce, rooms })
}

/// Sign `claims` with `secret`. Strings longer than 255 bytes are cut (callers validate
/// names first, so this never happens with valid input).
pub fn sign(secret: &[u8], claims: &Claims) -> String {
    let body = encode_body(claims);
    let mut mac = mac(secret);
    mac.update(&body);
    let tag = mac.finalize().into_bytes();
    format!("{}.{}", URL_SAFE_NO_PAD.encode(&body), URL_SAFE_NO_PAD.encode(tag))
}

/// Check the signature (in constant time) and the expiry of a token.
pub fn verify(secret: &[u8], token: &str, now_ms: u64) -> Result<Claims, TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let (body_b64, tag_b64) = token.split_once('.').ok_or(TokenError::Malformed)?;
    let body = URL_SAFE_NO_PAD.decode(body_b64).map_err(|_| TokenError::Malformed)?;
    let tag = URL_SAFE_NO_PAD.decode(tag_b64).map_err(|_| TokenError::Malformed)?;
    let mut mac = mac(secret);
    mac.update(&body);
    mac.verify_slice(&tag).map_err(|_| TokenError::BadSignature)?;
    let claims = decode_body(&body)?;
    if claims.expires_at_ms <= now_ms {
        return Err(TokenError::Expired);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            user: "u1".into(),
            device: "phone".into(),
            expires_at_ms: 1_000,
            nonce: [7; 16],
            rooms: vec!["match:*".into()],
        }
    }

    #[test]
    fn round_trip() {
        let token = sign(b"secret", &claims());
        assert_eq!(verify(b"secret", &token, 999), Ok(claims()));
    }

    #[test]
    fn rejections() {
        let token = sign(b"secret", &claims());
        let (body, tag) = token.split_once('.').unwrap();
        let mut flipped_tag = tag.to_string();
        let last = flipped_tag.pop().unwrap();
        flipped_tag.push(if last == 'A' { 'B' } else { 'A' });
        let other_body = sign(b"secret", &Claims { user: "u2".into(), ..claims() });
        let other_body = other_body.split_once('.').unwrap().0;
        let cases: Vec<(String, &[u8], u64, TokenError)> = vec![
            (token.clone(), b"other", 0, TokenError::BadSignature),
            (token.clone(), b"secret", 1_000, TokenError::Expired),
            (format!("{body}.{flipped_tag}"), b"secret", 0, TokenError::BadSignature),
            (format!("{other_body}.{tag}"), b"secret", 0, TokenError::BadSignature),
            ("no-dot".into(), b"secret", 0, TokenError::Malformed),
            ("!!.??".into(), b"secret", 0, TokenError::Malformed),
            ("".into(), b"secret", 0, TokenError::Malformed),
            ("a".repeat(MAX_TOKEN_LEN + 1), b"secret", 0, TokenError::Malformed),
        ];
        for (token, secret, now, expected) in cases {
            assert_eq!(verify(secret, &token, now), Err(expected), "token {token:.40}");
        }
    }

    #[test]
    fn truncated_or_padded_bodies_are_malformed_not_panics() {
        let full = encode_body(&claims());
        for cut in 0..full.len() {
            assert_eq!(decode_body(&full[..cut]), Err(TokenError::Malformed), "cut {cut}");
        }
        let mut padded = full.clone();
        padded.push(0);
        assert_eq!(decode_body(&padded), Err(TokenError::Malformed));
    }
}
