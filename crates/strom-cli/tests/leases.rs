//! Producer leases end to end: the real `strom server` with a short lease
//! (`producer_lease_ms` in its config file) and `strom produce` children.
//! A producer killed with SIGKILL stops renewing, its lease expires, and a
//! consumer reaches the end of the stream; `--keep-open` takes no lease, so
//! its producer stays open after the process exits.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::procs::*;
use common::{ok, wait_bounded, ServerProcess};
use serde_json::Value;

const LEASE: Duration = Duration::from_millis(1500);

fn server_with_short_lease(base: &std::path::Path) -> ServerProcess {
    ServerProcess::start_with_config(
        base,
        &format!("producer_lease_ms = {}\n", LEASE.as_millis()),
    )
}

/// `topic describe TOPIC --json`'s `state` object.
fn state(server: &ServerProcess, topic: &str) -> Value {
    let out = ok(
        server.cli(&["topic", "describe", topic, "--json"], "", CLI_TIMEOUT),
        "topic describe --json",
    );
    let v: Value = serde_json::from_str(&out.stdout).expect("describe prints JSON");
    v["state"].clone()
}

#[test]
fn kill_9_producer_lease_expires_and_consumers_reach_end_of_stream() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = server_with_short_lease(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    ok(
        server.cli(&["topic", "create", "t"], "", CLI_TIMEOUT),
        "create",
    );

    let mut producer = spawn(
        &["--group-file", &gf, "produce", "t"],
        Stdio::piped(),
        Stdio::piped(),
    );
    let mut input = producer.stdin.take().expect("stdin");
    input.write_all(b"{\"a\":1}\n").expect("writing a line");
    input.flush().expect("flush");
    let mut printed = BufReader::new(producer.stdout.take().expect("stdout"));
    let mut line = String::new();
    printed
        .read_line(&mut line)
        .expect("reading the stored offset");
    assert_eq!(pos(&line), (0, 0), "the event was stored");
    // Idle past several leases while alive: its renewals keep it open.
    std::thread::sleep(LEASE * 3);
    let st = state(&server, "t");
    assert_eq!(st["open_producers"], 1, "a live producer is renewed: {st}");
    assert_eq!(st["expired_producers"], 0, "{st}");

    producer.kill().expect("SIGKILL the producer");
    producer.wait().expect("reaping the producer");
    drop(input);

    let killed_at = Instant::now();
    let (mut consumer, out) = follow_consumer(&gf);
    let reader = read_lines(out);
    let status = wait_bounded(&mut consumer, LEASE * 10)
        .expect("consume --follow reaches the end of the stream once the lease expires");
    assert!(status.success(), "consume --follow exits 0: {status:?}");
    let lines = reader.join().expect("stdout reader");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(killed_at.elapsed() < LEASE * 10);

    let st = state(&server, "t");
    assert_eq!(st["expired_producers"], 1, "{st}");
    assert_eq!(st["closed_producers"], 0, "expired is not closed: {st}");
    assert_eq!(st["open_producers"], 0, "{st}");
    assert_eq!(st["ended"], true, "{st}");
    let human = ok(
        server.cli(&["topic", "describe", "t"], "", CLI_TIMEOUT),
        "topic describe",
    );
    assert!(
        human.stdout.contains("expired_producers=1"),
        "{}",
        human.stdout
    );
}

#[test]
fn keep_open_producer_never_expires() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = server_with_short_lease(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    ok(
        server.cli(&["topic", "create", "t"], "", CLI_TIMEOUT),
        "create",
    );
    ok(
        server.cli(&["produce", "t", "--keep-open"], "{\"a\":1}\n", CLI_TIMEOUT),
        "produce --keep-open",
    );
    let (mut consumer, out) = follow_consumer(&gf);
    let reader = read_lines(out);
    // Several lease periods after the producer's process exited.
    std::thread::sleep(LEASE * 4);
    assert!(
        consumer.try_wait().expect("polling consume").is_none(),
        "the stream must stay open: consume --follow exited"
    );
    let st = state(&server, "t");
    assert_eq!(st["open_producers"], 1, "{st}");
    assert_eq!(st["expired_producers"], 0, "{st}");
    assert_eq!(st["ended"], false, "{st}");
    // Ending it explicitly still works, and the consumer then finishes.
    ok(
        server.cli(&["topic", "complete", "t"], "", CLI_TIMEOUT),
        "complete",
    );
    let status = wait_bounded(&mut consumer, CLI_TIMEOUT).expect("consume ends");
    assert!(status.success(), "{status:?}");
    assert_eq!(reader.join().expect("stdout reader").len(), 1);
}

/// Reads a child's stdout as it comes (`consume` acks only what its reader
/// took from the pipe), returning every line at its end.
fn read_lines(out: BufReader<std::process::ChildStdout>) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || out.lines().map(|l| l.expect("stdout")).collect())
}
