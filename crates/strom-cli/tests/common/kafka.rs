//! Kafka clients in process-level tests: a `strom server` with a Kafka
//! listener on port 0, and kcat (librdkafka) run with a bounded time.
//! Needs `kcat` on PATH (`make setup-test` installs it).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::ServerProcess;

/// A server with a Kafka listener, and that listener's address.
pub fn start(base: &Path) -> (ServerProcess, String) {
    listening(ServerProcess::start_with(
        base,
        &["--kafka-listen", "127.0.0.1:0"],
    ))
}

/// A server with a Kafka listener and `extra` config lines, and the
/// listener's address.
pub fn start_with_config(base: &Path, extra: &str) -> (ServerProcess, String) {
    listening(ServerProcess::start_with_config(
        base,
        &format!("kafka_listen = \"127.0.0.1:0\"\n{extra}"),
    ))
}

/// A server with a Kafka listener and `extra` server arguments, and the
/// listener's address.
#[allow(dead_code)] // not every test binary uses it
pub fn start_with_args(base: &Path, extra: &[&str]) -> (ServerProcess, String) {
    let mut args = extra.to_vec();
    args.extend(["--kafka-listen", "127.0.0.1:0"]);
    listening(ServerProcess::start_with(base, &args))
}

/// `server` and the Kafka address it printed.
fn listening(server: ServerProcess) -> (ServerProcess, String) {
    let addr = server.printed("strom kafka listening on ");
    (server, addr)
}

/// Runs kcat with `args` and `stdin`, bounded; returns stdout, asserting
/// success.
pub fn kcat(args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning kcat (install it: apt-get install kcat, or make setup-test)");
    let mut input = child.stdin.take().expect("stdin is piped");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut { out }, &mut v);
        v
    });
    let status = super::wait_bounded(&mut child, Duration::from_secs(120))
        .unwrap_or_else(|| panic!("kcat {args:?} did not finish within 120 s"));
    let _ = writer.join();
    let stdout = reader.join().expect("stdout reader");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(status.success(), "kcat {args:?} failed: {status}\n{err}");
    stdout
}
