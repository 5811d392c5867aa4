//! SASL on the Kafka port (docs/security.md): `SaslHandshake` v1 then
//! `SaslAuthenticate`, with two mechanisms that carry a Strom token, so
//! kcat, confluent-kafka, kafka-python and the Java client authenticate
//! with settings their users know:
//! - `OAUTHBEARER`: the token is the bearer token (`auth=Bearer <token>`);
//! - `PLAIN`: the user name is the token's subject and the password is the
//!   token.
//!
//! A connection that authenticates gets its own context for the token's
//! principal ([`Ctx::for_principal`]); one that does not stays anonymous,
//! and the ACLs decide what that may do.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use strom_auth::scram::{Mechanism as ScramMech, ServerExchange};
use strom_auth::Principal;

use crate::error::{kcode, FrameError};
use crate::guard;
use crate::request::{decode, ready, Ctx, Header, Reply};

const MECHANISMS: &[&str] = &["OAUTHBEARER", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// Where a connection is in its SASL exchange.
#[derive(Default)]
pub struct SaslState {
    mechanism: Option<&'static str>,
    done: bool,
    /// A SCRAM exchange between its two rounds.
    scram: Option<ServerExchange>,
}

/// Whether `key` is one of the SASL requests this module answers.
pub fn is_sasl(key: i16) -> bool {
    key == ApiKey::SaslHandshake as i16 || key == ApiKey::SaslAuthenticate as i16
}

/// Answers a SASL request; the principal it proved, if it did.
pub fn handle(
    ctx: &Arc<Ctx>,
    state: &mut SaslState,
    h: &Header,
    body: Bytes,
) -> Result<(Reply, Option<Principal>), FrameError> {
    let (v, c) = (h.version, h.correlation);
    if h.key == ApiKey::SaslHandshake as i16 {
        let req: SaslHandshakeRequest =
            decode("SaslHandshake", guard::SASL_HANDSHAKE, v, false, body)?;
        let asked = req.mechanism.as_str().to_ascii_uppercase();
        let code = match MECHANISMS.iter().find(|m| **m == asked) {
            Some(m) if !state.done => {
                state.mechanism = Some(m);
                kcode::NONE
            }
            Some(_) => kcode::ILLEGAL_SASL_STATE,
            None => kcode::UNSUPPORTED_SASL_MECHANISM,
        };
        let resp = SaslHandshakeResponse::default()
            .with_error_code(code)
            .with_mechanisms(
                MECHANISMS
                    .iter()
                    .map(|m| StrBytes::from_static_str(m))
                    .collect(),
            );
        return Ok((ready(ctx.respond(ApiKey::SaslHandshake, v, c, &resp)), None));
    }
    let req: SaslAuthenticateRequest =
        decode("SaslAuthenticate", guard::SASL_AUTHENTICATE, v, false, body)?;
    let outcome = match (state.mechanism, state.done) {
        (Some(m), false) if m.starts_with("SCRAM-") => scram(ctx, state, m, &req.auth_bytes),
        (Some(m), false) => authenticate(ctx, m, &req.auth_bytes).map(|p| (Some(p), Bytes::new())),
        _ => Err((
            kcode::ILLEGAL_SASL_STATE,
            "SaslAuthenticate needs a SaslHandshake first, once per connection".to_string(),
        )),
    };
    let (resp, who) = match outcome {
        // SCRAM's first round: the server's first message, more to come.
        Ok((None, bytes)) => (
            SaslAuthenticateResponse::default().with_auth_bytes(bytes),
            None,
        ),
        Ok((Some(p), bytes)) => {
            state.done = true;
            let life = p.expires.map_or(0, |e| {
                e.saturating_sub(strom_server::now_secs())
                    .saturating_mul(1000) as i64
            });
            tracing::info!(principal = %p, "Kafka connection authenticated");
            let r = SaslAuthenticateResponse::default()
                .with_session_lifetime_ms(life)
                .with_auth_bytes(bytes);
            (r, Some(p))
        }
        Err((code, message)) => {
            tracing::warn!(error = %message, "Kafka SASL authentication failed");
            let r = SaslAuthenticateResponse::default()
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message)));
            (r, None)
        }
    };
    Ok((
        ready(ctx.respond(ApiKey::SaslAuthenticate, v, c, &resp)),
        who,
    ))
}

/// One round of SCRAM: the first starts the exchange (the server's first
/// message goes back), the second checks the proof and proves the user.
fn scram(
    ctx: &Ctx,
    state: &mut SaslState,
    mechanism: &str,
    auth: &[u8],
) -> Result<(Option<Principal>, Bytes), (i16, String)> {
    let fail = |m: String| (kcode::SASL_AUTHENTICATION_FAILED, m);
    let text = std::str::from_utf8(auth).map_err(|_| fail("SASL bytes are not UTF-8".into()))?;
    let m = ScramMech::parse(mechanism).ok_or_else(|| fail("unknown SCRAM mechanism".into()))?;
    match state.scram.take() {
        None => {
            let table = ctx.services.access.table();
            let lookup = |user: &str| {
                table
                    .scram
                    .get(user)
                    .and_then(|cs| cs.iter().find(|c| c.mechanism == m.name()).cloned())
            };
            let (ex, first) = ServerExchange::start(m, text, lookup).map_err(fail)?;
            state.scram = Some(ex);
            Ok((None, Bytes::from(first.into_bytes())))
        }
        Some(ex) => {
            let last = ex.finish(text).map_err(fail)?;
            let p = Principal::user(ex.user(), strom_auth::Mechanism::Sasl);
            Ok((Some(p), Bytes::from(last.into_bytes())))
        }
    }
}

/// The principal `auth` proves under `mechanism`.
fn authenticate(ctx: &Ctx, mechanism: &str, auth: &[u8]) -> Result<Principal, (i16, String)> {
    let fail = |m: String| (kcode::SASL_AUTHENTICATION_FAILED, m);
    let text = std::str::from_utf8(auth).map_err(|_| fail("SASL bytes are not UTF-8".into()))?;
    let (user, token) = match mechanism {
        "PLAIN" => plain(text)
            .ok_or_else(|| fail("a PLAIN message is authzid NUL user NUL password".into()))?,
        _ => (
            None,
            bearer(text)
                .ok_or_else(|| fail("an OAUTHBEARER message carries auth=Bearer <token>".into()))?,
        ),
    };
    let p = ctx
        .services
        .authenticate_token(token)
        .map_err(|e| fail(e.to_string()))?;
    match user {
        Some(u) if u != p.name => Err(fail(format!(
            "the user name '{u}' is not the token's subject '{}'",
            p.name
        ))),
        _ => Ok(p),
    }
}

/// `authzid NUL authcid NUL passwd` (RFC 4616): the user and the password.
fn plain(text: &str) -> Option<(Option<&str>, &str)> {
    let mut parts = text.splitn(3, '\0');
    let authzid = parts.next()?;
    let user = parts.next()?;
    let pass = parts.next()?;
    if !authzid.is_empty() && authzid != user {
        return None;
    }
    Some((Some(user), pass))
}

/// The token of an RFC 7628 client response: `n,,\x01auth=Bearer T\x01\x01`.
fn bearer(text: &str) -> Option<&str> {
    text.split('\x01')
        .find_map(|kv| kv.strip_prefix("auth="))
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sasl_messages_parse_and_malformed_ones_do_not() {
        assert_eq!(plain("\0alice\0tok"), Some((Some("alice"), "tok")));
        assert_eq!(plain("alice\0alice\0tok"), Some((Some("alice"), "tok")));
        assert_eq!(plain("bob\0alice\0tok"), None);
        assert_eq!(plain("alice"), None);
        assert_eq!(
            bearer("n,,\x01auth=Bearer strom1.a.b\x01\x01"),
            Some("strom1.a.b")
        );
        assert_eq!(bearer("n,,\x01host=x\x01auth=Bearer t\x01\x01"), Some("t"));
        assert_eq!(bearer("n,,\x01\x01"), None);
    }
}
