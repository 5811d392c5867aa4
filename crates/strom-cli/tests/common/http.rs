//! Reading a server's HTTP endpoint in tests: its address from the
//! server's log, `GET` over HTTP/1.0, samples of `/metrics` by name and
//! label, `promtool check metrics` on the text, and headless Chromium
//! for the dashboard.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::ServerProcess;

/// The HTTP address a server printed on stderr
/// (`strom http listening on http://ADDR`), once it has.
pub fn http_addr_in(log: &str) -> Option<String> {
    let rest = log.split("strom http listening on http://").nth(1)?;
    Some(rest.lines().next()?.trim().to_string())
}

/// The HTTP address `server` printed on stderr (without `http://` or
/// `https://`), once it has.
pub fn http_addr(server: &ServerProcess) -> String {
    let url = server.printed("strom http listening on ");
    let addr = url
        .trim_start_matches("http://")
        .trim_start_matches("https://");
    addr.to_string()
}

/// `GET path` over HTTP/1.0: (status, content type, body).
pub fn get(http: &str, path: &str, accept: &str) -> (u16, String, String) {
    let mut c = TcpStream::connect(http).expect("connecting to the HTTP endpoint");
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.0\r\nHost: {http}\r\nAccept: {accept}\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).expect("reading the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, ctype, body.to_string())
}

/// `/metrics` of `http` in the classic text format.
pub fn metrics(http: &str) -> String {
    let (status, _, text) = get(http, "/metrics", "*/*");
    assert_eq!(status, 200, "{text}");
    text
}

/// The sum of every sample of `name` whose labels contain `filter`.
pub fn sample_sum(metrics: &str, name: &str, filter: &str) -> f64 {
    samples(metrics, name, filter).into_iter().sum()
}

/// Every sample of `name` whose labels contain `filter`.
pub fn samples(metrics: &str, name: &str, filter: &str) -> Vec<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(filter))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .collect()
}

/// `promtool check metrics` accepts `text`.
pub fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; `make test` installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- metrics ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn chromium(args: &[&str], profile: &std::path::Path) -> std::process::Output {
    let bin = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new("which")
                .arg(b)
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("headless Chromium (Debian package chromium; `make test` installs it)");
    // Bounded: a hung browser fails the test instead of stalling it.
    let mut cmd = Command::new("timeout");
    cmd.args(["90", bin]);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=4000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .stdin(Stdio::null());
    cmd.output().expect("running chromium")
}
