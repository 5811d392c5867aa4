//! Hostile HTTP clients against a real `strom server --http-listen` and a
//! real `strom gen --control-listen`: idle keep-alive and half-header
//! connections are closed after their timeouts, more connections than the
//! cap are closed at accept, and with a low `ulimit -n` they never take
//! the descriptors the native front end and storage need. The generator's
//! control endpoint refuses a cross-site form post.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::http::http_addr;
use common::{ok, ServerProcess};

const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// True once the server closed `s` (EOF or reset) within `within`; data
/// it sends first (a response) is read past.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("read timeout");
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn idle_and_half_header_http_connections_are_closed_and_spare_the_native_port() {
    let base = tempfile::tempdir().expect("temp dir");
    let config = base.path().join("server.toml");
    std::fs::write(
        &config,
        "http_listen = \"127.0.0.1:0\"\n\
         http_header_timeout_ms = 500\n\
         http_idle_timeout_ms = 1000\n\
         transforms = false\n",
    )
    .expect("writing the config");
    // As `ulimit -n 400`: 420 hostile connections would take every
    // descriptor without a budget.
    let server =
        ServerProcess::start_with_nofile(base.path(), &["--config", config.to_str().unwrap()], 400);
    let http = http_addr(&server);
    let mut conns = Vec::new();
    for i in 0..420 {
        let mut s = match TcpStream::connect(&http) {
            Ok(s) => s,
            // The listen backlog is full: the server is refusing, which
            // is fine; what matters is below.
            Err(_) => continue,
        };
        let _ = if i % 2 == 0 {
            // A complete request on a keep-alive connection, then idle.
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        } else {
            // Half a header, never finished.
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        };
        conns.push(s);
    }
    // The native front end still works while they are open.
    ok(
        server.cli(&["topic", "create", "still-works"], "", CLI_TIMEOUT),
        "topic create with 420 hostile HTTP connections open",
    );
    // Every hostile connection is closed: at accept (past the cap) or
    // after its header or idle timeout.
    let t0 = Instant::now();
    let open: usize = conns
        .iter_mut()
        .map(|s| !closed_within(s, Duration::from_secs(5)) as usize)
        .sum();
    assert_eq!(
        open,
        0,
        "{open} of {} HTTP connections still open after {:?}",
        conns.len(),
        t0.elapsed()
    );
    let err = server.stderr();
    assert!(
        err.contains("file-descriptor budget"),
        "the budget is logged at startup; stderr:\n{err}"
    );
    // And a well-behaved HTTP client is served again.
    let mut s = TcpStream::connect(&http).expect("connecting");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("writing");
    let mut resp = String::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.read_to_string(&mut resp);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
}

#[test]
fn more_http_connections_than_the_cap_are_closed_at_accept() {
    let base = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with_config(
        base.path(),
        "http_listen = \"127.0.0.1:0\"\nhttp_max_connections = 10\n",
    );
    let http = http_addr(&server);
    let held: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(&http).expect("connecting"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(&http).expect("connecting"))
        .collect();
    let closed = extra
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_secs(2)))
        .filter(|c| *c)
        .count();
    assert_eq!(closed, 10, "connections past http_max_connections");
    drop(held);
}

#[test]
fn idle_silent_and_half_header_connections_are_closed_after_their_timeouts() {
    let base = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with_config(
        base.path(),
        "http_listen = \"127.0.0.1:0\"\nhttp_header_timeout_ms = 300\nhttp_idle_timeout_ms = 600\n",
    );
    let http = http_addr(&server);
    let mut conns: Vec<(&str, TcpStream)> = Vec::new();
    for _ in 0..20 {
        let mut idle = TcpStream::connect(&http).expect("connecting");
        idle.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        conns.push(("an idle keep-alive", idle));
        let mut half = TcpStream::connect(&http).expect("connecting");
        half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
        conns.push(("a half header", half));
        conns.push(("a silent", TcpStream::connect(&http).expect("connecting")));
    }
    for (what, s) in conns.iter_mut() {
        assert!(
            closed_within(s, Duration::from_secs(5)),
            "{what} connection is still open"
        );
    }
}

/// One HTTP/1.1 request with `content_type`; the status code.
fn post(addr: &str, path: &str, content_type: &str, body: &str) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connecting to the control endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("sending");
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {resp:?}"))
}

#[test]
fn the_generator_control_endpoint_refuses_a_cross_site_form_post() {
    let base = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(base.path());
    ok(
        server.cli(&["topic", "create", "ctl"], "", CLI_TIMEOUT),
        "topic create",
    );
    let gf = server.group_file.to_str().expect("utf-8 path");
    let mut child = Command::new(common::strom_bin())
        .args([
            "--group-file",
            gf,
            "gen",
            "--topic",
            "ctl",
            "--devices",
            "2",
            "--control-listen",
            "127.0.0.1:0",
        ])
        .env_remove("STROM_LOG")
        .env_remove("STROM_GROUP_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning strom gen");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("control listening on http://") {
                let _ = tx.send(a.to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("gen printed its control address");
    // What a hostile page's <form method=post> can send: a simple
    // content type, no custom header.
    for (path, ctype, body) in [
        ("/rate", "application/x-www-form-urlencoded", "rate=5000"),
        ("/rate?rate=5000", "application/x-www-form-urlencoded", ""),
        ("/start", "text/plain", ""),
        ("/stop", "multipart/form-data; boundary=x", ""),
    ] {
        assert_eq!(
            post(&addr, path, ctype, body),
            415,
            "POST {path} as {ctype} must be refused"
        );
    }
    let mut s = TcpStream::connect(&addr).expect("connecting");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let st: serde_json::Value = serde_json::from_str(body).expect("a JSON status");
    assert_eq!(
        (st["state"].as_str(), st["target_rate"].as_f64()),
        (Some("stopped"), Some(0.0)),
        "the refused posts changed nothing: {st}"
    );
    // A JSON request (what curl --json and scripts send) works.
    assert_eq!(
        post(&addr, "/rate", "application/json", "{\"rate\": 10}"),
        200
    );
    let _ = child.kill();
    let _ = child.wait();
}
