//! Credentials, in one place: what a client connects with, and every decision about it.
//! Pure: the secret, `now` and what the records say are parameters; the records
//! themselves (spent nonces, revocations, kicks) are kept behind one store seam,
//! `store::credentials::CredentialStore` (the embedded store, or NATS in cluster mode).
//!
//! A credential's life, and where each step is decided:
//!
//! - **Formats** ([`token`]): a connection token (`POST /v1/tokens`, HMAC-SHA256 over
//!   its claims) and a resume credential (handed out in `welcome`, [`mint_resume`]);
//!   [`jwt`]: a JWT a backend signs, whose claims become a token's [`token::Claims`].
//! - **Verify**: the signature and expiry ([`token::verify`], [`token::verify_resume`],
//!   [`jwt::grant`]); then this node's memory of void credentials ([`spent`]); then the
//!   records: a resume credential is void when its session's credentials were revoked or
//!   its user kicked after it was issued, a token when its user was kicked
//!   ([`resume_void`], [`token_void`]). What it grants is a [`Grant`].
//! - **Spend**: the nonce is marked used in the store; a second use is refused
//!   ([`Void::Used`]). **Give back**: a handshake refused with something the client is
//!   told to retry unmarks the nonce it marked, and [`spent::SpentNonces::forget`]s it.
//! - **Revoke**: a kicked or replaced connection voids its session's resume credentials
//!   issued up to then ([`token::Resume::revoked_by`]).
//! - **Kick**: a kick voids every credential of the user (or device) issued at or before
//!   it ([`token::voided_by_kick`]); the registry's memory of recent kicks catches a
//!   connection whose check came before the kick's record ([`kicks`]).

pub mod jwt;
pub mod kicks;
pub mod spent;
pub mod token;

pub use spent::{SpentNonces, Void};

/// The kind of credential a handshake presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A token minted by `POST /v1/tokens`.
    Token,
    /// A JWT a backend signed (`jwt_*` keys).
    Jwt,
    /// A resume credential from an earlier `welcome`.
    Resume,
}

impl Kind {
    /// The credential's label in `livegate_handshakes_total`.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Token => "token",
            Kind::Jwt => "jwt",
            Kind::Resume => "resume",
        }
    }
}

/// Who a verified credential says the client is, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub user: String,
    pub device: String,
    /// Room patterns it may read (empty: any room).
    pub rooms: Vec<String>,
    /// Room patterns it may publish to (empty: none).
    pub publish: Vec<String>,
    /// The session to resume (a resume credential names it; a token may ask for one).
    pub session: Option<String>,
    /// The user's home cell as the token claimed it (a resume credential carries it on).
    pub cell: Option<String>,
}

impl Grant {
    /// What a token (minted, or a JWT's claims) grants; `session`: the one the
    /// handshake asks to resume, if any.
    pub fn of_token(claims: token::Claims, session: Option<String>) -> Grant {
        let token::Claims { user, device, rooms, publish, cell, .. } = claims;
        Grant { user, device, rooms, publish, session, cell }
    }

    /// What a resume credential grants: a connection as the one that received it.
    pub fn of_resume(resume: token::Resume) -> Grant {
        let token::Resume { user, device, session, rooms, publish, cell, .. } = resume;
        Grant { user, device, rooms, publish, session: Some(session), cell }
    }
}

/// Why a resume credential whose signature and expiry are good is void, given when its
/// session's credentials were last revoked and its user (or device) last kicked.
pub fn resume_void(
    resume: &token::Resume,
    revoked_at_ms: Option<u64>,
    kicked_at_ms: Option<u64>,
) -> Option<Void> {
    if resume.revoked_by(revoked_at_ms) {
        Some(Void::Revoked)
    } else if token::voided_by_kick(resume.issued_at_ms, kicked_at_ms) {
        Some(Void::Kicked)
    } else {
        None
    }
}

/// Why a token (minted, or a JWT) issued at `issued_at_ms` is void, given when its user
/// (or device) was last kicked.
pub fn token_void(issued_at_ms: u64, kicked_at_ms: Option<u64>) -> Option<Void> {
    token::voided_by_kick(issued_at_ms, kicked_at_ms).then_some(Void::Kicked)
}

/// A resume credential handed to a connection.
#[derive(Clone)]
pub struct ResumeGrant {
    pub credential: String,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
}

/// Never prints the credential: it opens a connection as its user.
impl std::fmt::Debug for ResumeGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeGrant")
            .field("issued_at_ms", &self.issued_at_ms)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

/// A fresh one-time resume credential for a connection opened with `grant` on
/// `session`, issued at `now_ms` for `ttl_ms`, with a fresh random `nonce`.
pub fn mint_resume(
    secret: &[u8],
    grant: &Grant,
    session: &str,
    now_ms: u64,
    ttl_ms: u64,
    nonce: [u8; 16],
) -> ResumeGrant {
    let expires_at_ms = now_ms.saturating_add(ttl_ms);
    let resume = token::Resume {
        user: grant.user.clone(),
        device: grant.device.clone(),
        session: session.to_string(),
        rooms: grant.rooms.clone(),
        publish: grant.publish.clone(),
        issued_at_ms: now_ms,
        expires_at_ms,
        nonce,
        cell: grant.cell.clone(),
    };
    ResumeGrant {
        credential: token::sign_resume(secret, &resume),
        issued_at_ms: now_ms,
        expires_at_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn grant() -> Grant {
        Grant {
            user: "u1".into(),
            device: "phone".into(),
            rooms: vec!["match:*".into()],
            publish: vec!["chat:1".into()],
            session: None,
            cell: Some("eu".into()),
        }
    }

    #[test]
    fn a_minted_resume_credential_carries_the_grant_on_to_its_session() {
        let minted = mint_resume(SECRET, &grant(), "s1", 1_000, 60_000, [7; 16]);
        assert_eq!((minted.issued_at_ms, minted.expires_at_ms), (1_000, 61_000));
        let resume = token::verify_resume(SECRET, &minted.credential, 2_000).expect("verifies");
        assert_eq!(resume.nonce, [7; 16]);
        assert_eq!(Grant::of_resume(resume), Grant { session: Some("s1".into()), ..grant() });
        assert_eq!(
            token::verify_resume(SECRET, &minted.credential, 61_001),
            Err(token::TokenError::Expired)
        );
        assert!(
            !format!("{minted:?}").contains(&minted.credential),
            "the credential is never printed"
        );
    }

    #[test]
    fn revocations_and_kicks_void_what_was_issued_up_to_them() {
        let minted = mint_resume(SECRET, &grant(), "s1", 1_000, 60_000, [7; 16]);
        let resume = token::verify_resume(SECRET, &minted.credential, 1_000).expect("verifies");
        let cases = [
            (None, None, None),
            (Some(999), Some(999), None),
            (Some(1_000), None, Some(Void::Revoked)),
            (None, Some(1_000), Some(Void::Kicked)),
            // Both: the revocation is named.
            (Some(5_000), Some(5_000), Some(Void::Revoked)),
        ];
        for (revoked, kicked, void) in cases {
            assert_eq!(
                resume_void(&resume, revoked, kicked),
                void,
                "revoked {revoked:?}, kicked {kicked:?}"
            );
        }
        assert_eq!(token_void(1_000, Some(1_000)), Some(Void::Kicked));
        assert_eq!(token_void(1_001, Some(1_000)), None);
        assert_eq!(token_void(1_000, None), None);
    }

    #[test]
    fn a_token_grants_its_claims_and_the_session_asked_for() {
        let claims = token::Claims {
            user: "u1".into(),
            device: "phone".into(),
            issued_at_ms: Some(1),
            expires_at_ms: 2,
            nonce: [1; 16],
            rooms: vec!["match:*".into()],
            publish: vec!["chat:1".into()],
            cell: Some("eu".into()),
        };
        assert_eq!(
            Grant::of_token(claims, Some("s9".into())),
            Grant { session: Some("s9".into()), ..grant() }
        );
        assert_eq!(
            [Kind::Token, Kind::Jwt, Kind::Resume].map(Kind::label),
            ["token", "jwt", "resume"]
        );
    }
}
