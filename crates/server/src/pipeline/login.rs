//! The password authenticator's exchange: STARTUP is answered AUTHENTICATE, then one
//! AUTH_RESPONSE carries a SASL PLAIN token that is checked off the event loop; success
//! answers AUTH_SUCCESS, anything else Bad_credentials and closes the connection.
//!
//! Failures are counted per source address: past a few, the address must wait before its
//! next password is checked, and an attempt during the wait is refused unchecked, so that
//! a password cannot be guessed at line rate (nor the CPU spent on hashing).

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use sluice_engine::auth::LoginError;
use sluice_protocol::sasl::parse_plain;
use sluice_protocol::{DbError, ErrorCode, ErrorResponse};
use tracing::{info, warn};

use super::{reply, Request};
use crate::connection::LoginPhase;
use crate::login_limiter::{LoginVerdict, THROTTLED_MESSAGE};

/// An address that failed too often.
const THROTTLED: ErrorResponse = ErrorResponse::new(DbError::BadCredentials, THROTTLED_MESSAGE);

/// The longest user name an audit line shows (the text is the client's).
const AUDIT_NAME_BYTES: usize = 64;

fn audit_name(user: &str) -> &str {
    let mut end = user.len().min(AUDIT_NAME_BYTES);
    while !user.is_char_boundary(end) {
        end -= 1;
    }
    &user[..end]
}

/// Answers Bad_credentials (or the error given) and closes the connection.
fn refuse(request: Request, e: &ErrorResponse) {
    let conn = request.conn.clone();
    reply::static_error(request, e);
    conn.outbox.close();
}

/// Checks the token of an AUTH_RESPONSE; the answer comes from a task, since the password
/// hash runs on the blocking pool.
pub fn authenticate(request: Request, token: Option<Bytes>) {
    let shard = request.shard.clone();
    let conn = request.conn.clone();
    debug_assert_eq!(conn.login.get(), LoginPhase::Awaiting);
    let peer = conn.peer;
    let ip = peer.map(|p| p.ip());
    if let Some(ip) = ip {
        if let LoginVerdict::Throttled { retry_after } = shard.logins.check(ip, shard.clock.now()) {
            shard.metrics.logins_throttled.fetch_add(1, Relaxed);
            warn!(
                target: "sluice::audit",
                source = ?peer,
                retry_after_ms = retry_after.as_millis() as u64,
                "login refused unchecked: too many failures from this address"
            );
            return refuse(request, &THROTTLED);
        }
    }
    let token = token.unwrap_or_default();
    let (user, password) = match parse_plain(&token) {
        Ok(c) => (c.user.to_owned(), c.password.to_vec()),
        Err(e) => {
            if let Some(ip) = ip {
                shard.logins.record_failure(ip, shard.clock.now());
            }
            shard.metrics.logins_failed.fetch_add(1, Relaxed);
            warn!(target: "sluice::audit", source = ?peer, reason = e.message(), "login failed");
            return refuse(
                request,
                &ErrorResponse::new(DbError::BadCredentials, e.message()),
            );
        }
    };
    conn.login.set(LoginPhase::Checking);
    tokio::task::spawn_local(async move {
        // One check at a time per address; the address may have been throttled while it
        // waited for its turn, by the failures of the checks before it.
        // Held until the outcome is recorded, so that the next attempt sees this failure.
        let _turn = match ip {
            Some(ip) => Some(shard.logins.turn(ip).await),
            None => None,
        };
        if let Some(ip) = ip {
            if let LoginVerdict::Throttled { .. } = shard.logins.check(ip, shard.clock.now()) {
                shard.metrics.logins_throttled.fetch_add(1, Relaxed);
                warn!(
                    target: "sluice::audit",
                    source = ?peer,
                    "login refused unchecked: too many failures from this address"
                );
                conn.login.set(LoginPhase::Awaiting);
                return refuse(request, &THROTTLED);
            }
        }
        let outcome = shard.engine.auth().login(&user, &password).await;
        match outcome {
            Ok(u) => {
                if let Some(ip) = ip {
                    shard.logins.record_success(ip);
                }
                shard.metrics.logins_succeeded.fetch_add(1, Relaxed);
                info!(target: "sluice::audit", user = %u.name, source = ?peer, "login succeeded");
                {
                    let mut session = conn.session.borrow_mut();
                    session.user = Some(u);
                    session.peer = peer;
                }
                conn.login.set(LoginPhase::Done);
                conn.ready.set(true);
                let compression = conn.compression.get();
                reply::control(request, |b, stream| {
                    sluice_protocol::response::encode_auth_success(b, stream, None, compression)
                });
            }
            Err(LoginError { code, message }) => {
                if let Some(ip) = ip {
                    shard.logins.record_failure(ip, shard.clock.now());
                }
                shard.metrics.logins_failed.fetch_add(1, Relaxed);
                warn!(
                    target: "sluice::audit",
                    user = audit_name(&user),
                    source = ?peer,
                    reason = message,
                    "login failed"
                );
                conn.login.set(LoginPhase::Awaiting);
                let error = if code == ErrorCode::BadCredentials {
                    DbError::BadCredentials
                } else {
                    DbError::ServerError
                };
                refuse(request, &ErrorResponse::new(error, message));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::audit_name;

    #[test]
    fn audit_names_are_bounded_on_a_char_boundary() {
        assert_eq!(audit_name("alice"), "alice");
        let long = "é".repeat(100);
        let cut = audit_name(&long);
        assert!(cut.len() <= 64 && cut.len() >= 62);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
