//! The HTTP endpoint with `--auth` (docs/security.md, "HTTP"): `/metrics`
//! is open to the scraper networks (loopback by default) and otherwise
//! needs a bearer token; the dashboard's data (`/api/*`) needs a valid
//! token, by header or by the cookie `/login` sets, and shows only the
//! topics its principal may describe (all with the cluster's describe); a
//! bad token is refused. Over `--http-tls`, `strom top` reads it with
//! `--tls-ca` and a token, and a client that does not trust the CA, or
//! speaks plain HTTP, gets nothing.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::auth::{cli, succeeded, token_for};
use common::certs::{ca, issue};
use common::http::http_addr;
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
fn api_needs_a_valid_token_and_metrics_a_scraper_network_or_one() {
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
    // A principal without the cluster's describe is let in, to see no topic.
    let (code, body) = get(&http, "/api/history", &bearer(&token_for(&s, "bob", 600)));
    assert_eq!(code, 200, "{body}");
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
        get(&http, "/login?token=strom1.forged.token", &[]).0,
        401,
        "a forged token sets no cookie"
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

/// `strom top --http URL --once --json` with `env`; its output.
fn top(s: &ServerProcess, url: &str, env: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
    cli(s, &["top", "--http", url, "--once", "--json"], env, "")
}

/// The topics of the partitions a `strom top --json` frame shows.
fn topics_shown(json: &str) -> std::collections::BTreeSet<String> {
    let v: serde_json::Value = serde_json::from_str(json).expect("top --json");
    let mut out = std::collections::BTreeSet::new();
    for s in v["endpoints"][0]["group"]["servers"].as_array().unwrap() {
        for p in s["partitions"].as_array().unwrap() {
            out.insert(p["topic"].as_str().unwrap().to_string());
        }
    }
    out
}

#[test]
fn over_https_strom_top_shows_a_user_only_the_topics_it_may_describe() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let server_ca = ca(d, "server");
    let (cert, key) = issue(d, &server_ca, "localhost", true);
    let s = ServerProcess::start_with(
        &d.join("s"),
        &[
            "--auth",
            "--super-user",
            "User:ops",
            "--http-listen",
            "127.0.0.1:0",
            "--http-tls",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    // http_addr waits for the line; the server prints it after the group
    // file names the server, so it may come after start_with returns.
    let http = http_addr(&s);
    assert!(
        s.stderr().contains("strom http listening on https://"),
        "{}",
        s.stderr()
    );
    let url = format!("https://{http}");
    let ops = token_for(&s, "ops", 600);
    let as_ops = [("STROM_TOKEN", std::ffi::OsStr::new(&ops))];
    for t in ["mine", "theirs"] {
        succeeded(
            &cli(&s, &["topic", "create", t], &as_ops, ""),
            "topic create",
        );
    }
    succeeded(
        &cli(
            &s,
            &[
                "acl",
                "add",
                "--principal",
                "User:alice",
                "--topic",
                "mine",
                "--operation",
                "describe",
            ],
            &as_ops,
            "",
        ),
        "acl add",
    );
    let alice = token_for(&s, "alice", 600);
    let ca_pem = server_ca.pem.as_os_str();
    let run = |token: &str| {
        top(
            &s,
            &url,
            &[
                ("STROM_TOKEN", std::ffi::OsStr::new(token)),
                ("STROM_TLS_CA", ca_pem),
            ],
        )
    };
    let all = topics_shown(&succeeded(&run(&ops), "top as ops"));
    assert!(all.contains("mine") && all.contains("theirs"), "{all:?}");
    let hers = topics_shown(&succeeded(&run(&alice), "top as alice"));
    assert_eq!(
        hers.into_iter().collect::<Vec<_>>(),
        vec!["mine".to_string()]
    );

    // No CA, another CA, plain HTTP: nothing is shown.
    let no_ca = top(&s, &url, &[("STROM_TOKEN", std::ffi::OsStr::new(&ops))]);
    assert!(!no_ca.status.success());
    assert!(String::from_utf8_lossy(&no_ca.stderr).contains("--tls-ca"));
    let other = ca(d, "other");
    let untrusted = top(
        &s,
        &url,
        &[
            ("STROM_TOKEN", std::ffi::OsStr::new(&ops)),
            ("STROM_TLS_CA", other.pem.as_os_str()),
        ],
    );
    assert!(!untrusted.status.success());
    let err = String::from_utf8_lossy(&untrusted.stderr).to_lowercase();
    assert!(err.contains("certificate"), "{err}");
    let plain = top(&s, &http, &[("STROM_TOKEN", std::ffi::OsStr::new(&ops))]);
    assert!(!plain.status.success(), "plain HTTP to the TLS port");
}

#[test]
fn over_mutual_tls_the_client_certificates_subject_is_the_http_principal() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let server_ca = ca(d, "server");
    let client_ca = ca(d, "clients");
    let (cert, key) = issue(d, &server_ca, "localhost", true);
    let s = ServerProcess::start_with(
        &d.join("s"),
        &[
            "--auth",
            "--super-user",
            "User:ops",
            "--http-listen",
            "127.0.0.1:0",
            "--http-tls",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-client-ca",
            client_ca.pem.to_str().unwrap(),
        ],
    );
    let url = format!("https://{}", http_addr(&s));
    let ops_token = token_for(&s, "ops", 600);
    let as_ops = [("STROM_TOKEN", std::ffi::OsStr::new(&ops_token))];
    for t in ["mine", "theirs"] {
        succeeded(
            &cli(&s, &["topic", "create", t], &as_ops, ""),
            "topic create",
        );
    }
    let acl = [
        "acl",
        "add",
        "--principal",
        "User:alice",
        "--topic",
        "mine",
        "--operation",
        "describe",
    ];
    succeeded(&cli(&s, &acl, &as_ops, ""), "acl add");
    // No token: the certificate says who the request is.
    let with_cert = |cn: &str, ca: &common::certs::Ca| {
        let (c, k) = issue(d, ca, cn, false);
        let env = [
            ("STROM_TLS_CA", server_ca.pem.as_os_str()),
            ("STROM_TLS_CERT", c.as_os_str()),
            ("STROM_TLS_KEY", k.as_os_str()),
        ];
        top(&s, &url, &env)
    };
    let all = topics_shown(&succeeded(&with_cert("ops", &client_ca), "top as ops"));
    assert!(all.contains("mine") && all.contains("theirs"), "{all:?}");
    let hers = topics_shown(&succeeded(&with_cert("alice", &client_ca), "top as alice"));
    assert_eq!(hers.into_iter().collect::<Vec<_>>(), ["mine"]);
    // A certificate the client CA did not sign gets nothing.
    let other = ca(d, "other");
    let forged = with_cert("ops", &other);
    assert!(!forged.status.success(), "a certificate from another CA");
}
