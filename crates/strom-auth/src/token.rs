//! Strom tokens: bearer tokens a batch job carries (`STROM_TOKEN`).
//!
//! A token is `strom1.<claims>.<mac>`: the claims as JSON in unpadded
//! base64url, and an HMAC-SHA256 of `strom1.<claims>` under a key derived
//! from the cluster secret (so a token proves the cluster's key signed it,
//! and the key that proves membership is never used for tokens). The claims
//! carry the subject, an id (for revocation), the issue and expiry times,
//! and an optional [`Scope`]: topic and group patterns and operations the
//! token is limited to.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::principal::{Mechanism, Principal};
pub use crate::scope::Scope;

const PREFIX: &str = "strom1.";
const KEY_LABEL: &[u8] = b"strom token key v1";
/// The longest token accepted; longer input is refused before decoding.
pub const MAX_TOKEN_LEN: usize = 8192;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a Strom token (it starts with `strom1.` and has three dot-separated parts)")]
    Malformed,
    #[error("the token is {0} bytes; at most {MAX_TOKEN_LEN} are accepted")]
    TooLong(usize),
    #[error("the token's signature does not match this cluster's key (signed for another cluster, or altered)")]
    BadSignature,
    #[error("the token's claims are invalid: {0}")]
    BadClaims(String),
    #[error("the token expired at {0} (Unix seconds)")]
    Expired(u64),
}

/// What a token says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The principal's name (`User:<sub>` in ACLs).
    pub sub: String,
    /// The token's id, for revocation.
    pub jti: String,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Expires at, Unix seconds.
    pub exp: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
}

impl Claims {
    /// New claims with a fresh random id, valid `ttl_secs` from `now`.
    pub fn new(sub: &str, now: u64, ttl_secs: u64) -> Result<Self, TokenError> {
        let mut id = [0u8; 12];
        getrandom::fill(&mut id)
            .map_err(|e| TokenError::BadClaims(format!("no randomness: {e}")))?;
        Ok(Claims {
            sub: sub.to_string(),
            jti: id.iter().map(|b| format!("{b:02x}")).collect(),
            iat: now,
            exp: now.saturating_add(ttl_secs),
            topics: vec![],
            groups: vec![],
            ops: vec![],
        })
    }

    /// The scope, if the claims limit the token (checked).
    pub fn scope(&self) -> Result<Option<Scope>, TokenError> {
        if self.topics.is_empty() && self.groups.is_empty() && self.ops.is_empty() {
            return Ok(None);
        }
        Scope::new(&self.topics, &self.groups, &self.ops)
            .map(Some)
            .map_err(TokenError::BadClaims)
    }

    fn check(&self) -> Result<(), TokenError> {
        let bad = |m: &str| Err(TokenError::BadClaims(m.to_string()));
        if self.sub.is_empty()
            || self.sub.len() > 256
            || self.sub.chars().any(|c| c.is_control() || c == ':')
        {
            return bad("the subject is 1 to 256 printable characters without ':'");
        }
        if self.jti.is_empty() || self.jti.len() > 128 {
            return bad("the token id is 1 to 128 characters");
        }
        if self.exp <= self.iat {
            return bad("it expires before it was issued");
        }
        self.scope().map(|_| ())
    }

    /// The principal a connection presenting these claims is.
    pub fn principal(&self) -> Result<Principal, TokenError> {
        let mut p = Principal::user(self.sub.clone(), Mechanism::Token);
        p.scope = self.scope()?;
        p.token_id = Some(self.jti.clone());
        p.expires = Some(self.exp);
        Ok(p)
    }
}

/// The key tokens are signed and checked with, derived from the cluster secret.
#[derive(Clone)]
pub struct TokenKey([u8; 32]);

impl TokenKey {
    pub fn from_secret(secret: &[u8]) -> Self {
        let mut m = hmac(secret);
        m.update(KEY_LABEL);
        TokenKey(m.finalize().into_bytes().into())
    }

    /// The token for `claims`.
    pub fn sign(&self, claims: &Claims) -> Result<String, TokenError> {
        claims.check()?;
        let json = serde_json::to_vec(claims).map_err(|e| TokenError::BadClaims(e.to_string()))?;
        let body = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json));
        let mut m = hmac(&self.0);
        m.update(body.as_bytes());
        let token = format!(
            "{body}.{}",
            URL_SAFE_NO_PAD.encode(m.finalize().into_bytes())
        );
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong(token.len()));
        }
        Ok(token)
    }

    /// The claims of a token this key signed, unexpired at `now`.
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        let token = token.trim();
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong(token.len()));
        }
        let rest = token.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
        let (claims_b64, mac_b64) = rest.split_once('.').ok_or(TokenError::Malformed)?;
        let mac = URL_SAFE_NO_PAD
            .decode(mac_b64)
            .map_err(|_| TokenError::Malformed)?;
        let mut m = hmac(&self.0);
        m.update(&token.as_bytes()[..PREFIX.len() + claims_b64.len()]);
        m.verify_slice(&mac).map_err(|_| TokenError::BadSignature)?;
        let json = URL_SAFE_NO_PAD
            .decode(claims_b64)
            .map_err(|_| TokenError::Malformed)?;
        let claims: Claims =
            serde_json::from_slice(&json).map_err(|e| TokenError::BadClaims(e.to_string()))?;
        claims.check()?;
        if claims.exp <= now {
            return Err(TokenError::Expired(claims.exp));
        }
        Ok(claims)
    }
}

fn hmac(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{Operation, Resource};

    #[test]
    fn a_signed_token_verifies_only_under_its_key_and_before_expiry() {
        let key = TokenKey::from_secret(b"0123456789abcdef0123456789abcdef");
        let mut c = Claims::new("alice", 100, 60).unwrap();
        c.topics = vec!["sim.*".into()];
        c.ops = vec!["produce".into()];
        let t = key.sign(&c).unwrap();
        assert_eq!(key.verify(&t, 159).unwrap(), c);
        assert_eq!(key.verify(&t, 160), Err(TokenError::Expired(160)));
        let other = TokenKey::from_secret(b"another secret of enough length!");
        assert_eq!(other.verify(&t, 120), Err(TokenError::BadSignature));
        // Any altered byte of the claims breaks the signature.
        let mut forged = t.clone().into_bytes();
        forged[10] ^= 1;
        let forged = String::from_utf8(forged).unwrap();
        assert!(key.verify(&forged, 120).is_err());
        assert_eq!(key.verify("strom1.abc", 120), Err(TokenError::Malformed));
        assert_eq!(key.verify("bearer", 120), Err(TokenError::Malformed));
        assert!(matches!(
            key.verify(&"x".repeat(MAX_TOKEN_LEN + 1), 1),
            Err(TokenError::TooLong(_))
        ));
        let p = c.principal().unwrap();
        assert_eq!(p.to_string(), "User:alice");
        assert!(p
            .scope
            .unwrap()
            .permits(Operation::Write, &Resource::topic("sim.1"))
            .is_ok());
    }

    #[test]
    fn bad_claims_are_refused_at_signing() {
        let key = TokenKey::from_secret(b"k");
        let mut c = Claims::new("a:b", 1, 5).unwrap();
        assert!(key.sign(&c).is_err());
        c.sub = "ok".into();
        c.ops = vec!["fly".into()];
        assert!(matches!(key.sign(&c), Err(TokenError::BadClaims(m)) if m.contains("fly")));
    }
}
