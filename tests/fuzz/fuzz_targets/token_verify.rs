//! `core::credentials::token::verify` on arbitrary strings, secrets and clocks never panics; and for
//! arbitrary claims, `sign` then `verify` gives the same claims back (within the limits
//! the wire form has: strings of at most 255 bytes, at most 255 rooms; longer ones are
//! cut, and must then either verify as the cut claims or be rejected as malformed). A
//! signed token changed anywhere never verifies.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use livegate::core::credentials::token::{self, Claims, TokenError};

#[derive(Arbitrary, Debug)]
struct ClaimsInput {
    user: String,
    device: String,
    /// A token minted by this build says when (format 5); `None`: formats 1 and 3.
    issued_at_ms: Option<u64>,
    expires_at_ms: u64,
    nonce: [u8; 16],
    rooms: Vec<String>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    secret: Vec<u8>,
    token: String,
    now_ms: u64,
    claims: ClaimsInput,
    /// Where to change the signed token, and the character to put there.
    edit_at: usize,
    edit_to: u8,
}

const WIRE_MAX: usize = 255;

fn fits(claims: &Claims) -> bool {
    claims.user.len() <= WIRE_MAX
        && claims.device.len() <= WIRE_MAX
        && claims.rooms.len() <= WIRE_MAX
        && claims.rooms.iter().all(|r| r.len() <= WIRE_MAX)
}

fn is_cut_of(cut: &str, full: &str) -> bool {
    full.as_bytes().starts_with(cut.as_bytes()) && (cut.len() == full.len() || cut.len() == WIRE_MAX)
}

fuzz_target!(|input: Input| {
    // 1. Arbitrary token text: an answer, never a panic. An accepted token names a claim
    //    set that signs back to exactly that token (the encoding is canonical).
    if let Ok(claims) = token::verify(&input.secret, &input.token, input.now_ms) {
        assert!(claims.expires_at_ms > input.now_ms);
        assert_eq!(token::sign(&input.secret, &claims), input.token, "accepted a non-canonical token");
    }

    // 2. Round trip of arbitrary claims.
    let c = input.claims;
    let claims = Claims { user: c.user, device: c.device, issued_at_ms: c.issued_at_ms, expires_at_ms: c.expires_at_ms, nonce: c.nonce, rooms: c.rooms, publish: Vec::new(), cell: None };
    let signed = token::sign(&input.secret, &claims);
    // Verify a moment before the expiry (when there is one).
    let now = claims.expires_at_ms.saturating_sub(1);
    let verified = token::verify(&input.secret, &signed, now);
    if claims.expires_at_ms == 0 {
        // Nothing is earlier than 0: such a token is always expired.
        assert!(verified.is_err(), "{verified:?}");
    } else if fits(&claims) && signed.len() <= token::MAX_TOKEN_LEN {
        assert_eq!(verified, Ok(claims.clone()), "sign/verify round trip of {claims:?}");
    } else {
        match &verified {
            Ok(got) => {
                assert_eq!((got.issued_at_ms, got.expires_at_ms, got.nonce), (claims.issued_at_ms, claims.expires_at_ms, claims.nonce));
                assert!(is_cut_of(&got.user, &claims.user) && is_cut_of(&got.device, &claims.device), "{got:?}");
                assert_eq!(got.rooms.len(), claims.rooms.len().min(WIRE_MAX));
                for (g, r) in got.rooms.iter().zip(&claims.rooms) {
                    assert!(is_cut_of(g, r), "room {g:?} from {r:?}");
                }
            }
            Err(e) => assert_eq!(*e, TokenError::Malformed, "{claims:?}"),
        }
    }
    // At the expiry itself a token that verified before is expired; one that did not
    // fails the same way.
    let at_expiry = token::verify(&input.secret, &signed, claims.expires_at_ms);
    match &verified {
        Ok(_) => assert_eq!(at_expiry, Err(TokenError::Expired)),
        Err(e) => assert_eq!(at_expiry, Err(*e)),
    }

    // 3. A signed token changed in one place never verifies (when it verified before).
    if verified.is_ok() && !signed.is_empty() {
        let mut edited = signed.clone().into_bytes();
        let at = input.edit_at % edited.len();
        edited[at] = input.edit_to;
        if let Ok(edited) = String::from_utf8(edited) {
            if edited != signed {
                let again = token::verify(&input.secret, &edited, now);
                assert!(again.is_err(), "edited token {edited:?} (from {signed:?}) verified as {again:?}");
            }
        }
    }
});
