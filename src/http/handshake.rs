//! The connection handshake (`GET /v1/ws`, and `GET /v1/sse` through [`handshake`]): the
//! checks in one order, cheapest first; the credential verified, spent (given back when
//! the client is told to retry) and a resume credential minted; the connection's actor
//! started on its transport. Also the echo socket of the conformance suites.

use std::sync::atomic::Ordering;

use actix::Actor;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::errors::{api_error, internal, unroutable, wrong_node, ApiError};
use super::limits;
use super::request::check_session;
use super::state::AppState;
use crate::actors::connection::{Connection, Identity, InitialSubscription};
use crate::actors::directory::{DirectoryError, OpenSession};
use crate::actors::messages::CredentialTimes;
use crate::actors::transport::Transport;
use crate::actors::wsio::{Accepted, WsIo};
use crate::core::credentials::{self, jwt, token, Grant, Kind, ResumeGrant, Void};
use crate::protocol::{self, CloseCode, ErrorCode};
use crate::store::credentials::SpentIn;
use crate::world::{now_ms, random_bytes};

/// The credential a connection presents: a token (optionally naming the session to
/// resume) or a resume credential.
#[derive(Deserialize)]
pub(super) struct CredentialQuery {
    pub(super) token: Option<String>,
    /// A resume credential from an earlier `welcome`, instead of a token.
    pub(super) resume: Option<String>,
    pub(super) session: Option<String>,
    /// A node the client could not reach when it was sent there (issue 30): not a
    /// candidate for this handshake.
    pub(super) avoid: Option<String>,
}

/// A credential whose signature, expiry and revocation were checked; its nonce is not
/// spent yet, so a request refused now leaves it usable.
pub(super) struct Verified {
    pub(super) who: Grant,
    nonce: [u8; 16],
    expires_at_ms: u64,
    kind: Kind,
    times: CredentialTimes,
}

/// A spent credential: who it names, and where its nonce was marked, to give it back if
/// the handshake is refused with something the client is told to retry.
pub(super) struct Spent {
    who: Grant,
    nonce: [u8; 16],
    spent_in: SpentIn,
    expires_at_ms: u64,
    kind: Kind,
    times: CredentialTimes,
}

fn resume_invalid(why: &str) -> ApiError {
    api_error(
        ErrorCode::ResumeInvalid,
        format!("resume credential {why}; connect with a new token"),
    )
}

/// Verify the handshake's credential without spending it: a resume credential when
/// given, else the token. The decisions are `core::credentials`'; this reads the clock,
/// this node's memory of void credentials and the revocation and kick records.
async fn verify_credential(query: CredentialQuery, state: &AppState) -> Result<Verified, ApiError> {
    // Read before the revocations are: a kick this check misses was durable only after
    // it, which is what the registry's memory of kicks is judged by
    // (`core::credentials::kicks`).
    let now = now_ms();
    if let Some(credential) = query.resume.as_deref() {
        let resume = token::verify_resume(&state.token_secret, credential, now).map_err(|e| {
            resume_invalid(match e {
                token::TokenError::Malformed => "is malformed",
                token::TokenError::BadSignature => "has an invalid signature",
                token::TokenError::Expired => "has expired",
            })
        })?;
        known_void(state, &resume.nonce, now, Kind::Resume)?;
        let (revoked_at, kicked_at) = futures_util::future::join(
            state.credentials.resumes_revoked_at(&resume.session),
            state.credentials.kicked_at(&resume.user, &resume.device),
        )
        .await;
        let (revoked_at, kicked_at) = (revoked_at.map_err(internal)?, kicked_at.map_err(internal)?);
        if let Some(why) = credentials::resume_void(&resume, revoked_at, kicked_at) {
            state.spent.lock().remember(resume.nonce, resume.expires_at_ms, why, now);
            return Err(void_refusal(Kind::Resume, why));
        }
        let times = CredentialTimes { issued_at_ms: resume.issued_at_ms, checked_at_ms: now };
        let (nonce, expires_at_ms) = (resume.nonce, resume.expires_at_ms);
        let who = Grant::of_resume(resume);
        return Ok(Verified { who, nonce, expires_at_ms, kind: Kind::Resume, times });
    }
    let token = query
        .token
        .as_deref()
        .ok_or_else(|| api_error(ErrorCode::MissingToken, "missing token query parameter"))?;
    // A JWT a backend signed, or a minted token: what either grants is a minted
    // token's claims, spent and checked against kicks the same way from here.
    let (claims, kind) = if jwt::looks_like_jwt(token) {
        let claims =
            state.jwt.verify(token, now, |cell| state.router.knows_cell(cell)).map_err(|e| {
                let code = if e == jwt::JwtError::Expired {
                    ErrorCode::TokenExpired
                } else {
                    ErrorCode::InvalidToken
                };
                api_error(code, e.to_string())
            })?;
        (claims, Kind::Jwt)
    } else {
        let claims = token::verify(&state.token_secret, token, now).map_err(|e| {
            let code = match e {
                token::TokenError::Expired => ErrorCode::TokenExpired,
                token::TokenError::Malformed | token::TokenError::BadSignature => {
                    ErrorCode::InvalidToken
                }
            };
            api_error(code, e.to_string())
        })?;
        (claims, Kind::Token)
    };
    known_void(state, &claims.nonce, now, kind)?;
    let issued_at_ms =
        claims.issued_at_or_earliest(state.config.token_ttl_max().as_millis() as u64);
    let kicked_at =
        state.credentials.kicked_at(&claims.user, &claims.device).await.map_err(internal)?;
    if let Some(why) = credentials::token_void(issued_at_ms, kicked_at) {
        state.spent.lock().remember(claims.nonce, claims.expires_at_ms, why, now);
        return Err(void_refusal(kind, why));
    }
    let times = CredentialTimes { issued_at_ms, checked_at_ms: now };
    let (nonce, expires_at_ms) = (claims.nonce, claims.expires_at_ms);
    let who = Grant::of_token(claims, query.session);
    Ok(Verified { who, nonce, expires_at_ms, kind, times })
}

/// Spend a verified credential's nonce: from here it opens nothing else, unless it is
/// given back ([`give_back`]).
async fn spend_credential(verified: Verified, state: &AppState) -> Result<Spent, ApiError> {
    let Verified { who, nonce, expires_at_ms, kind, times } = verified;
    let Some(spent_in) =
        state.credentials.use_nonce(&nonce, expires_at_ms).await.map_err(internal)?
    else {
        state.spent.lock().remember(nonce, expires_at_ms, Void::Used, now_ms());
        return Err(void_refusal(kind, Void::Used));
    };
    Ok(Spent { who, nonce, spent_in, expires_at_ms, kind, times })
}

/// Refuse a credential this node already knows is void (`core::credentials::spent`),
/// before the revocation and kick records or the nonce store are read: a replay costs no
/// read.
fn known_void(state: &AppState, nonce: &[u8; 16], now: u64, kind: Kind) -> Result<(), ApiError> {
    match state.spent.lock().check(nonce, now) {
        Some(why) => Err(void_refusal(kind, why)),
        None => Ok(()),
    }
}

/// The refusal of a credential void for `why`.
fn void_refusal(kind: Kind, why: Void) -> ApiError {
    match (kind, why) {
        (Kind::Resume, Void::Used) => resume_invalid("was already used"),
        (Kind::Resume, Void::Revoked) => {
            resume_invalid("was revoked (its session was kicked or replaced)")
        }
        (Kind::Resume, Void::Kicked) => resume_invalid("was revoked (its user was kicked)"),
        (Kind::Token, Void::Used) => api_error(ErrorCode::TokenReplayed, "token was already used"),
        (Kind::Jwt, Void::Used) => {
            api_error(ErrorCode::TokenReplayed, "JWT was already used (its jti is spent)")
        }
        (Kind::Token | Kind::Jwt, Void::Revoked | Void::Kicked) => api_error(
            ErrorCode::InvalidToken,
            "token was revoked: its user was kicked after it was minted",
        ),
    }
}

/// A refusal the client is told to retry (`migration_budget`, `directory_unavailable`)
/// leaves its credential usable: the nonce this handshake marked is given back. Nothing
/// was opened with it, and while it was marked no other handshake could spend it, so a
/// credential still opens at most one connection.
async fn give_back(state: &AppState, spent: &Spent) {
    match state.credentials.unuse_nonce(&spent.nonce, spent.spent_in).await {
        // A replay that found it marked meanwhile remembered it: usable again here too.
        Ok(()) => state.spent.lock().forget(&spent.nonce),
        Err(error) => tracing::warn!(%error, "a refused handshake's credential stays spent"),
    }
}

/// The directory's refusals of a session, as answers; `true` when the client is told to
/// retry (the credential is given back).
pub(super) fn directory_refusal(error: DirectoryError) -> (ApiError, bool) {
    match error {
        DirectoryError::Budget(refusal) => {
            let crate::core::nodes::sessions::BudgetError::Spent { retry_after_secs } = refusal;
            (
                api_error(ErrorCode::MigrationBudget, refusal.to_string())
                    .retry_after(retry_after_secs),
                true,
            )
        }
        DirectoryError::Unavailable(why) => {
            (api_error(ErrorCode::DirectoryUnavailable, why.to_string()), true)
        }
        DirectoryError::Elsewhere { node, url } => (wrong_node(node, url), true),
        DirectoryError::Unroutable(why) => (unroutable(&why), true),
        other => (internal(other), false),
    }
}

/// A fresh one-time resume credential for the connection being opened.
fn mint_resume(state: &AppState, who: &Grant, session: &str) -> ResumeGrant {
    let ttl_ms = state.config.resume_ttl().as_millis() as u64;
    credentials::mint_resume(&state.token_secret, who, session, now_ms(), ttl_ms, random_bytes())
}

/// The WebSocket upgrade; refusals are counted by their error code. A browser cannot
/// read a refused upgrade, so the refusals a client must act on (go to another node,
/// wait before moving) accept the socket and close it at once with a close code:
/// 4421 whose reason is the URL to use (after an `error` frame naming node and URL, for
/// URLs longer than a close reason), 4029 whose reason is the seconds to wait.
pub(super) async fn upgrade(
    req: HttpRequest,
    query: web::Query<CredentialQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let refusal = match upgrade_checked(req.clone(), query, state.clone()).await {
        Ok(accepted) => return Ok(accepted),
        Err(refusal) => refusal,
    };
    refused(&state, &refusal);
    let closing = match (refusal.code, &refusal.elsewhere, refusal.retry_after_secs) {
        (ErrorCode::WrongNode, Some(elsewhere), _) => {
            let (node, url) = &**elsewhere;
            let reason = if url.len() <= MAX_CLOSE_REASON { url.clone() } else { String::new() };
            Some((
                protocol::wrong_node_frame(&refusal.message, node, url),
                CloseCode::WrongNode,
                reason,
            ))
        }
        (ErrorCode::MigrationBudget, _, Some(secs)) => Some((
            protocol::error_frame(None, None, refusal.code, &refusal.message),
            CloseCode::MigrationBudget,
            secs.to_string(),
        )),
        _ => None,
    };
    let (Some((frame, code, reason)), Ok(switching)) = (closing, switching_protocols(&req)) else {
        return Err(refusal);
    };
    Ok(accept(switching, state.config.max_frame_bytes, move |mut io| {
        io.text(&frame);
        io.close(Some(actix_http::ws::CloseReason {
            code: code.code().into(),
            description: Some(reason),
        }));
        io.finish(REFUSAL_CLOSE_WITHIN);
    }))
}

/// The longest close reason a WebSocket close frame carries (125 bytes less the code).
pub(super) const MAX_CLOSE_REASON: usize = 123;
/// How long an accepted-and-refused socket may take to read its close.
pub(super) const REFUSAL_CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// A node name given by a client (`avoid`): at most 255 bytes of printable ASCII.
pub(super) fn check_node_name(node: Option<&str>) -> Result<(), ApiError> {
    match node {
        Some(name) if name.len() > 255 || !name.bytes().all(|b| b.is_ascii_graphic()) => Err(
            ApiError::bad_request("avoid must name a node: at most 255 printable ASCII characters"),
        ),
        _ => Ok(()),
    }
}

/// Count and log a refused handshake (WebSocket or SSE).
pub(super) fn refused(state: &AppState, refusal: &ApiError) {
    tracing::debug!(
        reason = refusal.code.as_str(),
        status = refusal.status.as_u16(),
        "handshake refused"
    );
    state.metrics.handshake_rejected(refusal.code.as_str());
}

/// A connection the handshake admitted, ready for its actor.
pub(super) struct Admitted {
    pub(super) id: crate::actors::messages::ConnId,
    pub(super) identity: Identity,
    /// Its place under the limits and its session lease, held until the connection ends.
    pub(super) permit: Box<dyn Send>,
}

/// The checks every connection's handshake makes (WebSocket and SSE), in one order,
/// cheapest first, so that nothing a refusal could have avoided is spent:
/// the node's phase (503 while draining); `shape`, the request itself (a WebSocket
/// upgrade; an SSE request's rooms and cursor); the origin; the connection limits (a
/// permit); the credential's signature, expiry and revocation; `authorise`, what the
/// verified credential may do (an SSE request's rooms); only then the nonce is spent,
/// the session opened in the directory and both flushed, and a resume credential minted.
/// A directory refusal the client is told to retry gives the nonce back.
pub(super) async fn handshake<S>(
    req: &HttpRequest,
    state: &AppState,
    query: CredentialQuery,
    shape: impl FnOnce() -> Result<S, ApiError>,
    authorise: impl FnOnce(&S, &Grant) -> Result<(), ApiError>,
) -> Result<(S, Admitted), ApiError> {
    if !state.lifecycle.phase().accepts_connections() {
        return Err(api_error(ErrorCode::Unavailable, "node is not accepting connections"));
    }
    // A request that is malformed, or that a limit refuses, must not spend a token.
    check_session(query.session.as_deref())?;
    check_node_name(query.avoid.as_deref())?;
    let avoid = query.avoid.clone().filter(|node| !node.is_empty());
    let shaped = shape()?;
    check_origin(req, state)?;
    let permit = admit(req, state)?;
    let verified = verify_credential(query, state).await?;
    authorise(&shaped, &verified.who)?;
    let spent = spend_credential(verified, state).await?;
    let open = OpenSession {
        user: spent.who.user.clone(),
        asked: spent.who.session.clone(),
        avoid,
        cell: spent.who.cell.clone(),
    };
    // Spent for good unless given back: a replay here is then refused before anything
    // is read.
    let spent_for_good =
        || state.spent.lock().remember(spent.nonce, spent.expires_at_ms, Void::Used, now_ms());
    let grant = match state.session_opener.open(open).await {
        Ok(grant) => grant,
        Err(error) => {
            let (refusal, retry) = directory_refusal(error);
            if retry {
                give_back(state, &spent).await;
            } else {
                spent_for_good();
            }
            return Err(refusal);
        }
    };
    spent_for_good();
    state.metrics.handshake_credential(spent.kind.label());
    let Spent { who, times, .. } = spent;
    // The nonce (and any session record) must survive a crash, or a restart would reopen
    // a replay window. Concurrent handshakes share the flush (`durable`).
    state.handshake_flushes.durable().await.map_err(internal)?;
    let resume = mint_resume(state, &who, &grant.session);
    let identity = Identity {
        user: who.user.into(),
        device: who.device.into(),
        session: grant.session,
        rooms: who.rooms,
        publish: who.publish,
        warmup: grant.warmup,
        resume: Some(resume),
        credential: times,
    };
    let id = state.next_conn.fetch_add(1, Ordering::Relaxed);
    Ok((shaped, Admitted { id, identity, permit: Box::new((permit, grant.lease)) }))
}

/// Start a connection's actor on `io`.
pub(super) fn start_connection(
    state: &AppState,
    admitted: Admitted,
    io: Transport,
    rooms: Vec<InitialSubscription>,
) {
    let Admitted { id, identity, permit } = admitted;
    let settings = state.connection.clone();
    let rooms_table = state.rooms.clone();
    Connection::create(move |ctx: &mut actix::Context<Connection>| {
        use actix::AsyncContext;
        Connection::new(id, identity, settings, rooms_table, io, ctx.address().recipient())
            .holding(permit)
            .subscribing(rooms)
    });
}

/// The credential is verified and spent before anything is upgraded.
pub(super) async fn upgrade_checked(
    req: HttpRequest,
    query: web::Query<CredentialQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (switching, admitted) =
        handshake(&req, &state, query.into_inner(), || switching_protocols(&req), |_, _| Ok(()))
            .await?;
    let started = state.clone();
    Ok(accept(switching, state.config.max_frame_bytes, move |io| {
        start_connection(&started, admitted, Transport::Ws(io), Vec::new());
    }))
}

/// The 101 answer to a valid WebSocket handshake (not sent until the handler accepts).
pub(super) fn switching_protocols(req: &HttpRequest) -> Result<HttpResponse, ApiError> {
    let response = actix_http::ws::handshake(req.head())
        .map_err(|e| ApiError::bad_request(format!("not a WebSocket upgrade: {e}")))?
        .finish();
    Ok(HttpResponse::from(response.map_into_boxed_body()))
}

/// Accept the upgrade: `start` runs the connection's actor once the 101 is written
/// (`upgrade`).
pub(super) fn accept(
    mut switching: HttpResponse,
    max_frame_bytes: usize,
    start: impl FnOnce(WsIo) + 'static,
) -> HttpResponse {
    switching.extensions_mut().insert(Accepted::new(max_frame_bytes, start));
    switching
}

/// Browser pages may connect only from an allowed origin.
pub(super) fn check_origin(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    let origin = req.headers().get("origin").map(|v| v.to_str().unwrap_or("(not text)"));
    if state.access.read().allows_origin(origin) {
        return Ok(());
    }
    state.metrics.limit_hit("origin");
    Err(api_error(ErrorCode::ForbiddenOrigin, "this origin may not connect here"))
}

/// A place for one more connection from this client address, within the node's limits.
pub(super) fn admit(
    req: &HttpRequest,
    state: &AppState,
) -> Result<limits::ConnectionPermit, ApiError> {
    let peer = req.peer_addr().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
    let ip = state.limits.client_ip(peer, req.headers());
    state.limits.admit(ip, now_ms()).map_err(|refusal| {
        state.metrics.limit_hit(refusal.limit());
        tracing::info!(client = %ip, %peer, limit = refusal.limit(), "connection refused by a limit");
        match refusal {
            limits::LimitRefusal::Node(_) => api_error(ErrorCode::TooManyConnections, refusal.to_string()),
            // The one status that is not its code's. The HTTP API documents one code for
            // both connection limits, `too_many_connections`: 503 when the node is full
            // (try another node), 429 when this address holds too many (docs/src/security.md,
            // the limits table); the handshake-refusal metric is labelled by that code. Splitting it
            // would change what clients and dashboards see, so the status is set here.
            limits::LimitRefusal::PerIp(_) => {
                let mut error = api_error(ErrorCode::TooManyConnections, refusal.to_string());
                error.status = StatusCode::TOO_MANY_REQUESTS;
                error
            }
            limits::LimitRefusal::HandshakeRate { retry_after_ms, .. } => {
                api_error(ErrorCode::RateLimited, refusal.to_string()).retry_after(retry_after_ms.div_ceil(1000))
            }
        }
    })
}

/// Test-only echo socket for WebSocket conformance suites (config `ws_echo`).
pub(super) async fn echo(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if !state.config.ws_echo {
        return Err(api_error(ErrorCode::NotFound, "the echo socket is off (config ws_echo)"));
    }
    let switching = switching_protocols(&req)?;
    let permit: Box<dyn Send> = Box::new(admit(&req, &state)?);
    let max_message_bytes = state.config.max_message_bytes;
    Ok(accept(switching, state.config.max_frame_bytes, move |io| {
        crate::actors::echo::EchoSocket::new(io, max_message_bytes, permit).start();
    }))
}
