//! Connection tokens and resume credentials: HMAC-SHA256 over what they grant. Pure:
//! signing and verification take the secret and `now`; single use (the nonce) is
//! enforced by the caller against the store.
//!
//! Wire form: `base64url(body) "." base64url(mac)`. A token's body =
//! `1 u8 | expires_at_ms u64 BE | nonce [16] | str user | str device | u8 n | n × str room`;
//! a resume credential's body =
//! `2 u8 | issued_at_ms u64 BE | expires_at_ms u64 BE | nonce [16] | str user | str device
//! | str session | u8 n | n × str room`; each `str` a u8 length then UTF-8 bytes. A
//! token or credential that grants client publish is format 3 or 4: the same
//! body with a second pattern list, `u8 m | m × str publish pattern`, at its end. One
//! without publish rights is still written as format 1 or 2, so builds that predate
//! client publish read it, and formats 1 and 2 keep verifying (granting no publish).
//! A token that says when it was minted (so a later kick of its user voids it) is format
//! 5: `5 u8 | issued_at_ms u64 BE | expires_at_ms u64 BE | nonce [16] | str user | str
//! device | u8 n | n × str room | u8 m | m × str publish pattern` (m may be 0); this
//! build mints format 5, and formats 1 and 3 keep verifying with no issue time.
//! A token with a home cell claim (`cell`) is format 6: format 5's body followed by
//! `str cell`; a resume credential minted from a connection whose token had one is format
//! 7: format 4's body (the publish list always present, m may be 0) followed by `str
//! cell`. Without a claim tokens stay format 5 and credentials 2 or 4, so builds that
//! predate the claim read everything this build mints for users without one.
//! The first byte keeps tokens and credentials apart: neither verifies as the other.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

const TOKEN_VERSION: u8 = 1;
const RESUME_VERSION: u8 = 2;
/// A token with publish patterns.
const TOKEN_PUBLISH_VERSION: u8 = 3;
/// A resume credential with publish patterns.
const RESUME_PUBLISH_VERSION: u8 = 4;
/// A token with its issue time (and a publish pattern list, possibly empty).
const TOKEN_ISSUED_VERSION: u8 = 5;
/// Format 5 with a home cell claim at its end.
const TOKEN_CELL_VERSION: u8 = 6;
/// A resume credential with publish patterns (possibly none) and a home cell claim.
const RESUME_CELL_VERSION: u8 = 7;
/// Longer tokens are rejected before any decoding.
pub const MAX_TOKEN_LEN: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub user: String,
    pub device: String,
    /// When it was minted (format 5); `None` for formats 1 and 3, which do not say.
    pub issued_at_ms: Option<u64>,
    pub expires_at_ms: u64,
    pub nonce: [u8; 16],
    /// Room patterns the token may read (empty: any room).
    pub rooms: Vec<String>,
    /// Room patterns the connection may publish to (empty: none).
    pub publish: Vec<String>,
    /// The user's home cell as the backend claims it (format 6); `None`: the rendezvous
    /// choice over the configured cells.
    pub cell: Option<String>,
}

/// What a resume credential grants: a connection as the one that received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    pub user: String,
    pub device: String,
    pub session: String,
    /// The room patterns of the token the first connection of the chain opened with.
    pub rooms: Vec<String>,
    /// The publish patterns of that token (empty: none).
    pub publish: Vec<String>,
    /// When it was handed out: a revocation of the session up to this moment voids it.
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
    pub nonce: [u8; 16],
    /// The home cell claim of that token (format 7), if it had one.
    pub cell: Option<String>,
}

impl Claims {
    /// When the token was minted, for the kick rule ([`voided_by_kick`]): a token that
    /// does not say (formats 1 and 3) counts as minted at the earliest it could have
    /// been, `max_ttl_ms` before its expiry, so a kick never lets an old one through.
    pub fn issued_at_or_earliest(&self, max_ttl_ms: u64) -> u64 {
        self.issued_at_ms.unwrap_or(self.expires_at_ms.saturating_sub(max_ttl_ms))
    }
}

/// Whether a kick of the credential's user (and device) at `kicked_at_ms` (if any) voids
/// a credential issued at `issued_at_ms`: every one issued at or before the kick is void.
pub fn voided_by_kick(issued_at_ms: u64, kicked_at_ms: Option<u64>) -> bool {
    kicked_at_ms.is_some_and(|at| issued_at_ms <= at)
}

impl Resume {
    /// Whether a revocation of its session up to `revoked_upto_ms` (if any) voids it:
    /// every credential handed out at or before that moment is void.
    pub fn revoked_by(&self, revoked_upto_ms: Option<u64>) -> bool {
        revoked_upto_ms.is_some_and(|upto| self.issued_at_ms <= upto)
    }
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
    let mut body = Vec::with_capacity(72);
    // A claim needs format 6, which says when the token was minted: one that does not
    // say counts as minted at 0 (any kick voids it).
    if claims.issued_at_ms.is_some() || claims.cell.is_some() {
        body.push(if claims.cell.is_some() { TOKEN_CELL_VERSION } else { TOKEN_ISSUED_VERSION });
        body.extend_from_slice(&claims.issued_at_ms.unwrap_or(0).to_be_bytes());
        body.extend_from_slice(&claims.expires_at_ms.to_be_bytes());
        body.extend_from_slice(&claims.nonce);
        put_str(&mut body, &claims.user);
        put_str(&mut body, &claims.device);
        put_rooms(&mut body, &claims.rooms);
        put_rooms(&mut body, &claims.publish);
        if let Some(cell) = &claims.cell {
            put_str(&mut body, cell);
        }
        return body;
    }
    body.push(if claims.publish.is_empty() { TOKEN_VERSION } else { TOKEN_PUBLISH_VERSION });
    body.extend_from_slice(&claims.expires_at_ms.to_be_bytes());
    body.extend_from_slice(&claims.nonce);
    put_str(&mut body, &claims.user);
    put_str(&mut body, &claims.device);
    put_rooms(&mut body, &claims.rooms);
    if !claims.publish.is_empty() {
        put_rooms(&mut body, &claims.publish);
    }
    body
}

/// A count byte, then each pattern as a `str` (at most 255).
fn put_rooms(out: &mut Vec<u8>, rooms: &[String]) {
    out.push(rooms.len().min(255) as u8);
    for room in rooms.iter().take(255) {
        put_str(out, room);
    }
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
    fn u64(&mut self) -> Result<u64, TokenError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().map_err(|_| TokenError::Malformed)?))
    }
    fn string(&mut self) -> Result<String, TokenError> {
        let len = self.u8()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| TokenError::Malformed)
    }
    /// The format byte: `Ok(false)` for `plain`, `Ok(true)` for `with_publish` (the body
    /// ends with publish patterns), anything else is malformed.
    fn version(&mut self, plain: u8, with_publish: u8) -> Result<bool, TokenError> {
        match self.u8()? {
            v if v == plain => Ok(false),
            v if v == with_publish => Ok(true),
            _ => Err(TokenError::Malformed),
        }
    }
    fn nonce(&mut self) -> Result<[u8; 16], TokenError> {
        self.take(16)?.try_into().map_err(|_| TokenError::Malformed)
    }
    /// A cell claim: a non-empty `str`.
    fn cell(&mut self) -> Result<String, TokenError> {
        Some(self.string()?).filter(|cell| !cell.is_empty()).ok_or(TokenError::Malformed)
    }
    fn patterns(&mut self) -> Result<Vec<String>, TokenError> {
        let n = self.u8()?;
        (0..n).map(|_| self.string()).collect()
    }
    /// The room patterns and (`with_publish`) the publish patterns, which end the body:
    /// anything after them is malformed.
    fn patterns_to_end(
        &mut self,
        with_publish: bool,
    ) -> Result<(Vec<String>, Vec<String>), TokenError> {
        let rooms = self.patterns()?;
        let publish = if with_publish { self.patterns()? } else { Vec::new() };
        if !self.0.is_empty() || (with_publish && publish.is_empty()) {
            return Err(TokenError::Malformed);
        }
        Ok((rooms, publish))
    }
}

fn decode_body(body: &[u8]) -> Result<Claims, TokenError> {
    if let Some(&version @ (TOKEN_ISSUED_VERSION | TOKEN_CELL_VERSION)) = body.first() {
        let mut r = Reader(&body[1..]);
        let issued_at_ms = Some(r.u64()?);
        let expires_at_ms = r.u64()?;
        let nonce = r.nonce()?;
        let user = r.string()?;
        let device = r.string()?;
        let rooms = r.patterns()?;
        let publish = r.patterns()?;
        let cell = if version == TOKEN_CELL_VERSION { Some(r.cell()?) } else { None };
        if !r.0.is_empty() {
            return Err(TokenError::Malformed);
        }
        return Ok(Claims {
            user,
            device,
            issued_at_ms,
            expires_at_ms,
            nonce,
            rooms,
            publish,
            cell,
        });
    }
    let mut r = Reader(body);
    let with_publish = r.version(TOKEN_VERSION, TOKEN_PUBLISH_VERSION)?;
    let expires_at_ms = r.u64()?;
    let nonce = r.nonce()?;
    let user = r.string()?;
    let device = r.string()?;
    let (rooms, publish) = r.patterns_to_end(with_publish)?;
    Ok(Claims {
        user,
        device,
        issued_at_ms: None,
        expires_at_ms,
        nonce,
        rooms,
        publish,
        cell: None,
    })
}

fn encode_resume(resume: &Resume) -> Vec<u8> {
    let mut body = Vec::with_capacity(80);
    body.push(match (&resume.cell, resume.publish.is_empty()) {
        (Some(_), _) => RESUME_CELL_VERSION,
        (None, true) => RESUME_VERSION,
        (None, false) => RESUME_PUBLISH_VERSION,
    });
    body.extend_from_slice(&resume.issued_at_ms.to_be_bytes());
    body.extend_from_slice(&resume.expires_at_ms.to_be_bytes());
    body.extend_from_slice(&resume.nonce);
    put_str(&mut body, &resume.user);
    put_str(&mut body, &resume.device);
    put_str(&mut body, &resume.session);
    put_rooms(&mut body, &resume.rooms);
    if let Some(cell) = &resume.cell {
        put_rooms(&mut body, &resume.publish);
        put_str(&mut body, cell);
    } else if !resume.publish.is_empty() {
        put_rooms(&mut body, &resume.publish);
    }
    body
}

fn decode_resume(body: &[u8]) -> Result<Resume, TokenError> {
    if body.first() == Some(&RESUME_CELL_VERSION) {
        let mut r = Reader(&body[1..]);
        let issued_at_ms = r.u64()?;
        let expires_at_ms = r.u64()?;
        let nonce = r.nonce()?;
        let user = r.string()?;
        let device = r.string()?;
        let session = r.string()?;
        let rooms = r.patterns()?;
        let publish = r.patterns()?;
        let cell = Some(r.cell()?);
        if !r.0.is_empty() {
            return Err(TokenError::Malformed);
        }
        return Ok(Resume {
            user,
            device,
            session,
            rooms,
            publish,
            issued_at_ms,
            expires_at_ms,
            nonce,
            cell,
        });
    }
    let mut r = Reader(body);
    let with_publish = r.version(RESUME_VERSION, RESUME_PUBLISH_VERSION)?;
    let issued_at_ms = r.u64()?;
    let expires_at_ms = r.u64()?;
    let nonce = r.nonce()?;
    let user = r.string()?;
    let device = r.string()?;
    let session = r.string()?;
    let (rooms, publish) = r.patterns_to_end(with_publish)?;
    Ok(Resume {
        user,
        device,
        session,
        rooms,
        publish,
        issued_at_ms,
        expires_at_ms,
        nonce,
        cell: None,
    })
}

/// `base64url(body) "." base64url(mac)`.
fn seal(secret: &[u8], body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    format!("{}.{}", URL_SAFE_NO_PAD.encode(body), URL_SAFE_NO_PAD.encode(tag))
}

/// The body of a sealed text, once its length and MAC are checked (in constant time).
fn open(secret: &[u8], sealed: &str) -> Result<Vec<u8>, TokenError> {
    if sealed.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let (body_b64, tag_b64) = sealed.split_once('.').ok_or(TokenError::Malformed)?;
    let body = URL_SAFE_NO_PAD.decode(body_b64).map_err(|_| TokenError::Malformed)?;
    let tag = URL_SAFE_NO_PAD.decode(tag_b64).map_err(|_| TokenError::Malformed)?;
    let mut mac = mac(secret);
    mac.update(&body);
    mac.verify_slice(&tag).map_err(|_| TokenError::BadSignature)?;
    Ok(body)
}

/// Sign a resume credential with `secret` (the token secret).
pub fn sign_resume(secret: &[u8], resume: &Resume) -> String {
    seal(secret, &encode_resume(resume))
}

/// Check the signature and the expiry of a resume credential. A token is not one.
pub fn verify_resume(secret: &[u8], credential: &str, now_ms: u64) -> Result<Resume, TokenError> {
    let resume = decode_resume(&open(secret, credential)?)?;
    if resume.expires_at_ms <= now_ms {
        return Err(TokenError::Expired);
    }
    Ok(resume)
}

/// Sign `claims` with `secret`. Strings longer than 255 bytes are cut (callers validate
/// names first, so this never happens with valid input).
pub fn sign(secret: &[u8], claims: &Claims) -> String {
    seal(secret, &encode_body(claims))
}

/// Check the signature (in constant time) and the expiry of a token.
pub fn verify(secret: &[u8], token: &str, now_ms: u64) -> Result<Claims, TokenError> {
    let claims = decode_body(&open(secret, token)?)?;
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
            issued_at_ms: None,
            expires_at_ms: 1_000,
            nonce: [7; 16],
            rooms: vec!["match:*".into()],
            publish: Vec::new(),
            cell: None,
        }
    }

    fn publisher() -> Claims {
        Claims { publish: vec!["chat:*".into(), "lobby".into()], ..claims() }
    }

    fn issued() -> Claims {
        Claims { issued_at_ms: Some(400), ..claims() }
    }

    #[test]
    fn round_trip() {
        for claims in [issued(), Claims { publish: vec!["chat:*".into()], ..issued() }] {
            let token = sign(b"secret", &claims);
            assert_eq!(verify(b"secret", &token, 999), Ok(claims));
        }
        let token = sign(b"secret", &claims());
        assert_eq!(verify(b"secret", &token, 999), Ok(claims()));
        let token = sign(b"secret", &publisher());
        assert_eq!(verify(b"secret", &token, 999), Ok(publisher()));
    }

    #[test]
    fn formats_name_whether_publish_patterns_follow() {
        assert_eq!(
            encode_body(&claims())[0],
            TOKEN_VERSION,
            "no publish rights: the format older builds read"
        );
        assert_eq!(encode_body(&publisher())[0], TOKEN_PUBLISH_VERSION);
        let plain = Resume { publish: Vec::new(), ..resume() };
        assert_eq!(encode_resume(&plain)[0], RESUME_VERSION);
        assert_eq!(encode_resume(&resume())[0], RESUME_PUBLISH_VERSION);
        // A format-3 body whose publish list is empty is no body this build writes.
        let mut empty_list = encode_body(&claims());
        empty_list[0] = TOKEN_PUBLISH_VERSION;
        empty_list.push(0);
        assert_eq!(decode_body(&empty_list), Err(TokenError::Malformed));
        // A format-1 body carrying a publish list is refused, not read as rights.
        let mut smuggled = encode_body(&publisher());
        smuggled[0] = TOKEN_VERSION;
        assert_eq!(decode_body(&smuggled), Err(TokenError::Malformed));
        assert_eq!(
            encode_body(&issued())[0],
            TOKEN_ISSUED_VERSION,
            "a token that says when it was minted"
        );
    }

    #[test]
    fn a_kick_voids_what_was_issued_up_to_it_and_a_token_without_an_issue_time_counts_as_old() {
        const DAY: u64 = 86_400_000;
        let cases = [
            // (issued at, kicked at, voided)
            (500, None, false),
            (500, Some(499), false),
            (500, Some(500), true),
            (500, Some(10_000), true),
        ];
        for (issued_at, kicked_at, voided) in cases {
            assert_eq!(
                voided_by_kick(issued_at, kicked_at),
                voided,
                "issued {issued_at}, kicked {kicked_at:?}"
            );
        }
        let minted =
            Claims { issued_at_ms: Some(DAY + 5), expires_at_ms: DAY + 60_000, ..claims() };
        assert_eq!(minted.issued_at_or_earliest(DAY), DAY + 5);
        let unknown = Claims { issued_at_ms: None, ..minted.clone() };
        assert_eq!(
            unknown.issued_at_or_earliest(DAY),
            60_000,
            "the earliest it could have been minted"
        );
        assert_eq!(Claims { expires_at_ms: 10, ..unknown }.issued_at_or_earliest(DAY), 0);
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

    fn resume() -> Resume {
        Resume {
            user: "u1".into(),
            device: "phone".into(),
            session: "s1".into(),
            rooms: vec!["match:*".into()],
            publish: vec!["chat:*".into()],
            issued_at_ms: 500,
            expires_at_ms: 1_000,
            nonce: [9; 16],
            cell: None,
        }
    }

    fn claimed() -> Claims {
        Claims { cell: Some("north".into()), ..issued() }
    }

    #[test]
    fn a_cell_claim_round_trips_and_without_one_the_old_formats_stay() {
        for claims in [claimed(), Claims { publish: vec!["chat:*".into()], ..claimed() }] {
            let token = sign(b"secret", &claims);
            assert_eq!(encode_body(&claims)[0], TOKEN_CELL_VERSION);
            assert_eq!(verify(b"secret", &token, 999), Ok(claims));
        }
        assert_eq!(
            encode_body(&issued())[0],
            TOKEN_ISSUED_VERSION,
            "no claim: format 5, as before"
        );
        // A claim on a token that does not say when it was minted: minted at 0.
        let undated = Claims { issued_at_ms: None, ..claimed() };
        assert_eq!(
            verify(b"secret", &sign(b"secret", &undated), 999),
            Ok(Claims { issued_at_ms: Some(0), ..undated })
        );
        for credential in [
            Resume { cell: Some("west".into()), ..resume() },
            Resume { cell: Some("west".into()), publish: Vec::new(), ..resume() },
        ] {
            assert_eq!(encode_resume(&credential)[0], RESUME_CELL_VERSION);
            assert_eq!(
                verify_resume(b"secret", &sign_resume(b"secret", &credential), 999),
                Ok(credential)
            );
        }
        assert_eq!(
            encode_resume(&resume())[0],
            RESUME_PUBLISH_VERSION,
            "no claim: format 4, as before"
        );
        // An empty claim is no body this build writes.
        let mut empty = encode_body(&issued());
        empty[0] = TOKEN_CELL_VERSION;
        empty.push(0);
        assert_eq!(decode_body(&empty), Err(TokenError::Malformed));
        // A claimed token is not a credential, nor the other way round.
        let token = sign(b"secret", &claimed());
        assert_eq!(verify_resume(b"secret", &token, 0), Err(TokenError::Malformed));
        let credential = sign_resume(b"secret", &Resume { cell: Some("west".into()), ..resume() });
        assert_eq!(verify(b"secret", &credential, 0), Err(TokenError::Malformed));
    }

    #[test]
    fn truncated_or_padded_claimed_bodies_are_malformed_not_panics() {
        let full = encode_body(&claimed());
        for cut in 0..full.len() {
            assert_eq!(decode_body(&full[..cut]), Err(TokenError::Malformed), "cut {cut}");
        }
        let full = encode_resume(&Resume { cell: Some("west".into()), ..resume() });
        for cut in 0..full.len() {
            assert_eq!(decode_resume(&full[..cut]), Err(TokenError::Malformed), "cut {cut}");
        }
        let mut padded = full.clone();
        padded.push(0);
        assert_eq!(decode_resume(&padded), Err(TokenError::Malformed));
    }

    #[test]
    fn resume_round_trip_and_rejections() {
        let credential = sign_resume(b"secret", &resume());
        assert_eq!(verify_resume(b"secret", &credential, 999), Ok(resume()));
        let token = sign(b"secret", &claims());
        let publishing_token = sign(b"secret", &publisher());
        let cases: Vec<(&str, String, &[u8], u64, TokenError)> = vec![
            (
                "a publishing token is not a resume credential",
                publishing_token,
                b"secret",
                0,
                TokenError::Malformed,
            ),
            ("other secret", credential.clone(), b"other", 0, TokenError::BadSignature),
            ("expired", credential.clone(), b"secret", 1_000, TokenError::Expired),
            (
                "a token is not a resume credential",
                token.clone(),
                b"secret",
                0,
                TokenError::Malformed,
            ),
            ("too long", "a".repeat(MAX_TOKEN_LEN + 1), b"secret", 0, TokenError::Malformed),
        ];
        for (name, credential, secret, now, expected) in cases {
            assert_eq!(verify_resume(secret, &credential, now), Err(expected), "{name}");
        }
        assert_eq!(
            verify(b"secret", &credential, 0),
            Err(TokenError::Malformed),
            "a resume credential is not a token"
        );
    }

    #[test]
    fn a_revocation_voids_credentials_issued_up_to_it() {
        let issued_at_500 = resume();
        let cases = [(None, false), (Some(499), false), (Some(500), true), (Some(10_000), true)];
        for (revoked_at, voided) in cases {
            assert_eq!(issued_at_500.revoked_by(revoked_at), voided, "revoked at {revoked_at:?}");
        }
    }

    #[test]
    fn truncated_or_padded_resume_bodies_are_malformed_not_panics() {
        let full = encode_resume(&resume());
        for cut in 0..full.len() {
            assert_eq!(decode_resume(&full[..cut]), Err(TokenError::Malformed), "cut {cut}");
        }
        let mut padded = full.clone();
        padded.push(0);
        assert_eq!(decode_resume(&padded), Err(TokenError::Malformed));
    }

    #[test]
    fn truncated_or_padded_bodies_are_malformed_not_panics() {
        for claims in [claims(), publisher(), issued()] {
            let full = encode_body(&claims);
            for cut in 0..full.len() {
                assert_eq!(decode_body(&full[..cut]), Err(TokenError::Malformed), "cut {cut}");
            }
            let mut padded = full.clone();
            padded.push(0);
            assert_eq!(decode_body(&padded), Err(TokenError::Malformed));
        }
    }
}
