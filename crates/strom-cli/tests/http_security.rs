//! The HTTP endpoint with `--auth` (docs/security.md, "HTTP"): `/metrics`
//! is open to the scraper networks (loopback by default) and otherwise
//! needs a bearer token; the dashboard's data (`/api/*`) needs a token
//! whose principal may describe the cluster, by header or by the cookie
//! `/login` sets; a bad token or one without the right is refused.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::auth::{http_addr, token_for};
use common::ServerProcess;

/// `GET path` with `headers`: the status code and the whole response.
fn get(addr: &str, path: &str, headers: &[String]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, out)
}

#[test]
fn api_needs_a_token_that_may_describe_the_cluster_and_metrics_a_scraper_network_or_one() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with_config(
        tmp.path(),
        "auth = true\nsuper_users = [\"User:ops\"]\nhttp_listen = \"127.0.0.1:0\"\nhttp_metrics_networks = [\"10.0.0.0/8\"]\n",
    );
    let http = http_addr(&s);
    let bearer = |t: &str| vec![format!("Authorization: Bearer {t}")];
    let ops = token_for(&s, "ops", 600);
    // /metrics from a network that is not the scrapers': a token is needed.
    assert_eq!(get(&http, "/metrics", &[]).0, 401);
    let (code, body) = get(&http, "/metrics", &bearer(&ops));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("strom_"), "{body}");
    // The API: none, a forged and an unprivileged token are refused.
    let (code, body) = get(&http, "/api/snapshot", &[]);
    assert_eq!(code, 401, "{body}");
    assert!(
        body.to_lowercase().contains("www-authenticate: bearer"),
        "{body}"
    );
    assert_eq!(get(&http, "/api/group", &bearer("strom1.x.y")).0, 401);
    let (code, body) = get(&http, "/api/history", &bearer(&token_for(&s, "bob", 600)));
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("User:bob"), "{body}");
    assert_eq!(get(&http, "/api/snapshot", &bearer(&ops)).0, 200);
    // The browser's way: /login sets the cookie the dashboard's requests carry.
    let (code, resp) = get(&http, &format!("/login?token={ops}"), &[]);
    assert_eq!(code, 303, "{resp}");
    let cookie = resp
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .expect("a cookie")
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(resp.contains("HttpOnly"), "{resp}");
    assert_eq!(
        get(&http, "/api/snapshot", &[format!("Cookie: {cookie}")]).0,
        200
    );
    assert_eq!(
        get(
            &http,
            &format!("/login?token={}", token_for(&s, "bob", 600)),
            &[]
        )
        .0,
        403
    );
}

#[test]
fn metrics_stay_open_to_loopback_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), &["--auth", "--http-listen", "127.0.0.1:0"]);
    let http = http_addr(&s);
    assert_eq!(get(&http, "/metrics", &[]).0, 200);
    assert_eq!(get(&http, "/api/snapshot", &[]).0, 401);
}
