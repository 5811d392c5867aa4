//! Who may read what over HTTP (docs/security.md, "HTTP"). With `auth` on:
//! `/metrics` is open to the scraper networks (`http_metrics_networks`,
//! loopback by default) and otherwise needs a bearer token; the dashboard's
//! data (`/api/*`) needs a token, from an `Authorization: Bearer` header or
//! the `strom_token` cookie that `/login?token=…` sets (or, over mutual
//! TLS, a verified client certificate), and shows only the
//! topics its principal may describe (all of them if it may describe the
//! cluster). Tokens are checked by the service layer, as on
//! the native and Kafka ports. Without `auth` everything is open (the
//! server then serves only loopback: protected mode).

use std::net::IpAddr;

use crate::listener::PeerAddr;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use strom_auth::{Mechanism, Operation, Principal, Resource};
use strom_server::audit::{Actor, FrontEnd};
use strom_server::Services;

/// The cookie the dashboard's requests carry the token in.
pub const COOKIE: &str = "strom_token";

/// What a request reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Metrics,
    Api,
}

/// Whether `ip` is in `cidr` (`10.0.0.0/8`, `::1/128`, or one address).
pub fn in_network(ip: IpAddr, cidr: &str) -> bool {
    let (net, bits) = match cidr.split_once('/') {
        Some((n, b)) => (n, b.parse::<u32>().ok()),
        None => (cidr, None),
    };
    let Ok(net) = net.trim().parse::<IpAddr>() else {
        return false;
    };
    let ip = match (ip, net) {
        (IpAddr::V6(v6), IpAddr::V4(_)) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        _ => ip,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let bits = bits.unwrap_or(32).min(32);
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let bits = bits.unwrap_or(128).min(128);
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The token a request carries: a bearer header, else the cookie.
fn token(headers: &HeaderMap) -> Option<&str> {
    if let Some(t) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(t.trim());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            kv.trim()
                .strip_prefix(COOKIE)
                .and_then(|r| r.strip_prefix('='))
        })
}

/// A refused request: its status and why.
pub struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut r = (self.0, self.1).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"strom\""),
            );
        }
        r
    }
}

fn refuse(status: StatusCode, why: String) -> Refusal {
    Refusal(status, why)
}

/// What a request that was let in may see.
pub enum Sees {
    /// The whole group (no `auth`, a scraper network, or a principal that
    /// may describe the cluster).
    All,
    /// Only the topics this principal may describe (`/api/*`).
    TopicsOf(Principal),
}

impl Sees {
    /// Whether `topic` is shown.
    pub fn topic(&self, svc: &Services, topic: &str) -> bool {
        match self {
            Sees::All => true,
            Sees::TopicsOf(who) => svc
                .access
                .check(who, Operation::Describe, &Resource::topic(topic))
                .is_ok(),
        }
    }
}

/// What the request may see if it may read what `need` names; the
/// refusal otherwise (in the audit trail, with the principal if its token
/// proved one). `/metrics` needs the cluster's `describe`; `/api/*` takes
/// any valid token and shows the topics its principal may describe.
pub fn check(
    svc: &Services,
    headers: &HeaderMap,
    conn: &PeerAddr,
    need: Need,
) -> Result<Sees, Refusal> {
    let peer = conn.addr.ip();
    if !svc.access.enabled() {
        return Ok(Sees::All);
    }
    let nets = &svc.config.http_metrics_networks;
    if need == Need::Metrics && nets.iter().any(|n| in_network(peer, n)) {
        return Ok(Sees::All);
    }
    decide(svc, headers, conn.cert_subject.as_deref(), need).map_err(|(who, refusal)| {
        let who = who.map_or_else(Principal::anonymous, |w| *w);
        let actor = Actor {
            front_end: FrontEnd::Http,
            peer: Some(&peer),
            principal: &who,
        };
        let path = match need {
            Need::Metrics => "http:/metrics",
            Need::Api => "http:/api",
        };
        let member = svc.control.member();
        svc.audit.refused(member, &actor, &"get", &path, &refusal.1);
        refusal
    })
}

/// [`check`] for a request from outside the scraper networks: the
/// refusal comes with the principal, if the request proved one. A token
/// says who the request is; without one, the subject of a verified client
/// certificate (mutual TLS, `tls_client_ca`) does, as on the native port.
fn decide(
    svc: &Services,
    headers: &HeaderMap,
    cert_subject: Option<&str>,
    need: Need,
) -> Result<Sees, (Option<Box<Principal>>, Refusal)> {
    let who = match (token(headers), cert_subject) {
        (Some(t), _) => svc
            .authenticate_token(t)
            .map_err(|e| (None, refuse(StatusCode::UNAUTHORIZED, e.to_string())))?,
        (None, Some(cn)) => Principal::user(cn.to_string(), Mechanism::Certificate),
        (None, None) => return Err((None, refuse(
            StatusCode::UNAUTHORIZED,
            "a token is needed: send `Authorization: Bearer <token>`, or open /login?token=<token> once in the browser (or present a client certificate over mutual TLS)".into(),
        ))),
    };
    match svc
        .access
        .check(&who, Operation::Describe, &Resource::cluster())
    {
        Ok(()) => Ok(Sees::All),
        Err(_) if need == Need::Api => Ok(Sees::TopicsOf(who)),
        Err(e) => Err((
            Some(Box::new(who)),
            refuse(StatusCode::FORBIDDEN, e.to_string()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_fall_in_their_networks_only() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(in_network(ip("127.0.0.1"), "127.0.0.0/8"));
        assert!(in_network(ip("10.1.2.3"), "10.0.0.0/8"));
        assert!(!in_network(ip("11.1.2.3"), "10.0.0.0/8"));
        assert!(in_network(ip("::1"), "::1/128"));
        assert!(in_network(ip("::ffff:127.0.0.1"), "127.0.0.0/8"));
        assert!(in_network(ip("192.168.1.9"), "192.168.1.9"));
        assert!(!in_network(ip("192.168.1.9"), "not a network"));
        assert!(in_network(ip("8.8.8.8"), "0.0.0.0/0"));
    }
}
