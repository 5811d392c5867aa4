//! Kafka's Java clients (kafka-clients 4.3.1) against the Kafka front end:
//! the `strom server` binary with `--kafka-listen 127.0.0.1:0`, and
//! `tests/java-kafka/Check.java` run in Java's single-file source mode
//! (AdminClient, the default idempotent producer with lz4, a group
//! consumer, committed and listed offsets, a member resuming at the
//! committed offsets), then the same events read natively; and the
//! idempotent producer's own epoch bump after expired batches. Needs a JDK
//! and the jars in `target/java-kafka/lib` (`make setup-test` runs
//! `scripts/java-kafka.sh`); without them the test fails and says so.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::kafka::start;
use common::read_all;

/// Records the Java producer sends, then the records Check.java adds for
/// its resume step (its `RESUME`).
const N: usize = 3000;
const RESUME: usize = 100;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The jar directory and the Java program, after checking that `java` runs
/// and the jars are there: a missing piece fails the test with the fix.
fn java_setup() -> (PathBuf, PathBuf) {
    let root = repo_root();
    let lib = root.join("target/java-kafka/lib");
    let check = root.join("tests/java-kafka/Check.java");
    let java = Command::new("java")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        matches!(java, Ok(s) if s.success()),
        "`java` (a JDK 17 or newer) is not on PATH: run `make setup-test` \
         (scripts/java-kafka.sh installs it and Kafka's Java clients)"
    );
    assert!(
        lib.join("kafka-clients-4.3.1.jar").is_file(),
        "Kafka's Java clients are not in {}: run `make setup-test` (scripts/java-kafka.sh)",
        lib.display()
    );
    assert!(check.is_file(), "{} is missing", check.display());
    (lib, check)
}

/// Runs Check.java with `first` and `args`, bounded; returns its exit
/// status success, stdout and stderr.
fn run_check(first: &str, args: &[&str]) -> (bool, String, String) {
    run_check_with(&[], first, args)
}

/// [`run_check`] with JVM options first (`-Dcheck.client.NAME=VALUE` sets
/// a client property).
fn run_check_with(jvm: &[String], first: &str, args: &[&str]) -> (bool, String, String) {
    let (lib, check) = java_setup();
    let mut child = Command::new("java")
        // Kafka's clients log through slf4j-simple, to stderr: warnings only.
        .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        .args(jvm)
        .arg("-cp")
        .arg(format!("{}/*", lib.display()))
        .arg(&check)
        .arg(first)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning java");
    let mut out = child.stdout.take().expect("stdout is piped");
    let mut err = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let status = common::wait_bounded(&mut child, Duration::from_secs(90));
    let stdout = reader.join().expect("stdout reader");
    let stderr = err_reader.join().expect("stderr reader");
    let status = status.unwrap_or_else(|| {
        panic!("Check.java did not finish within 90 s\nstdout:\n{stdout}\nstderr:\n{stderr}")
    });
    (status.success(), stdout, stderr)
}

#[test]
fn java_admin_idempotent_producer_and_group_consumer_work() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path());
    let started = Instant::now();
    let n = N.to_string();
    let (ok, out, err) = run_check(&broker, &["jt", "java-group", &n]);
    let took = started.elapsed();
    assert!(
        ok && out.lines().any(|l| l == "CHECK OK"),
        "Check.java failed\nstdout:\n{out}\nstderr:\n{err}\nserver:\n{}",
        server.stderr()
    );
    for step in [
        "ok admin:",
        "ok produce:",
        "ok consume:",
        "ok offsets:",
        "ok resume:",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(step)),
            "no {step:?} line\n{out}"
        );
    }
    eprintln!("Check.java took {took:?}");

    // The same events natively: every record, as the front end maps it.
    let driver = server.connect();
    let native = read_all(&driver, "jt", "native-reader", Duration::from_secs(30));
    let total = N + RESUME;
    assert_eq!(native.len(), total);
    assert_eq!(native.end.len(), 3, "three partitions: {:?}", native.end);
    let mut seen = vec![false; total];
    for ev in native.events.values() {
        let meta: serde_json::Value = serde_json::from_slice(&ev.meta).expect("JSON metadata");
        let headers = &meta["kafka"]["headers"];
        assert_eq!(headers[0][0], "idx", "{meta}");
        assert_eq!(headers[1], serde_json::json!(["src", "java"]), "{meta}");
        let i: usize = headers[0][1]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("header idx in {meta}"));
        assert!(i < total && !seen[i], "record {i} twice or out of range");
        seen[i] = true;
        assert_eq!(meta["kafka"]["key"], format!("key-{}", i % 37), "{meta}");
        let value = format!("value-{i}-{}", "x".repeat(i % 53));
        assert_eq!(ev.data, value.as_bytes());
    }

    // The Java group's commits (after the resume step: the end) are the
    // Strom consumer offsets of that name.
    for (p, end) in &native.end {
        let offsets = driver
            .consumer_offsets("jt", *p)
            .expect("reading consumer offsets");
        let committed = offsets.iter().find(|(n, _)| n == "java-group");
        if *end > 0 {
            assert_eq!(
                committed.map(|(_, o)| *o),
                Some(*end),
                "partition {p}: {offsets:?}"
            );
        }
    }
}

/// Kafka's Java producer bumps its epoch itself (same producer id) when
/// batches expire, here while the server is stopped (SIGSTOP), and numbers
/// its next batches from 0 again; the front end must store them rather than
/// take them for retries of the first ones.
#[test]
fn java_producer_epoch_bump_after_expired_batches_loses_no_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path());
    let pid = server.pid().to_string();
    let (ok, out, err) = run_check("--epoch-bump", &[&broker, "je", &pid]);
    // Whatever happened, the server runs again.
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    assert!(
        ok && out.lines().any(|l| l == "CHECK OK"),
        "Check.java --epoch-bump failed\nstdout:\n{out}\nstderr:\n{err}\nserver:\n{}",
        server.stderr()
    );
    let driver = server.connect();
    let native = read_all(&driver, "je", "native-reader", Duration::from_secs(30));
    let values: Vec<String> = native
        .events
        .values()
        .map(|e| String::from_utf8_lossy(&e.data).into_owned())
        .filter(|v| !v.starts_with('X'))
        .collect();
    assert_eq!(
        values,
        ["A0", "A1", "A2", "A3", "A4", "B0", "B1", "B2", "B3", "B4"],
        "every acknowledged record once, in order"
    );
}

/// `Admin.listConsumerGroupOffsets(group)` naming no partitions sends an
/// `OffsetFetch` naming no topics ("all of the group's offsets"); the front
/// end answers with every partition the group committed on.
#[test]
fn java_lists_a_whole_groups_committed_offsets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path());
    let (ok, out, err) = run_check(
        &broker,
        &["jw", "java-whole", "300", "--whole-group-offsets"],
    );
    assert!(
        ok && out.lines().any(|l| l == "CHECK OK"),
        "Check.java failed\nstdout:\n{out}\nstderr:\n{err}\nserver:\n{}",
        server.stderr()
    );
}

/// Kafka's Java clients over `SASL_SSL` (PLAIN, a Strom token as the
/// password, the server's CA as a PEM trust store) against a server with
/// `--auth --kafka-tls`: admin, idempotent producer and group consumer as
/// the super user; a user without ACLs is refused with Kafka's
/// authorization error.
#[test]
fn java_clients_over_sasl_ssl_with_a_token_and_an_acl_refusal() {
    use common::certs::{ca, issue};
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let server_ca = ca(d, "server");
    let (cert, key) = issue(d, &server_ca, "localhost", true);
    let (server, broker) = common::kafka::start_with_args(
        &d.join("s"),
        &[
            "--auth",
            "--super-user",
            "User:ops",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--kafka-tls",
        ],
    );
    let token = |sub: &str| common::auth::token_for(&server, sub, 3600);
    let jvm = |sub: &str| {
        vec![
            "-Dcheck.client.security.protocol=SASL_SSL".to_string(),
            "-Dcheck.client.sasl.mechanism=PLAIN".into(),
            format!(
                "-Dcheck.client.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"{sub}\" password=\"{}\";",
                token(sub)
            ),
            "-Dcheck.client.ssl.truststore.type=PEM".into(),
            format!("-Dcheck.client.ssl.truststore.location={}", server_ca.pem.display()),
        ]
    };
    let (ok, out, err) = run_check_with(&jvm("ops"), &broker, &["sec", "sec-group", "300"]);
    assert!(
        ok && out.lines().any(|l| l == "CHECK OK"),
        "Check.java over SASL_SSL failed\nstdout:\n{out}\nstderr:\n{err}\nserver:\n{}",
        server.stderr()
    );
    let (ok, out, _) = run_check_with(&jvm("nobody"), &broker, &["sec2", "g2", "10"]);
    assert!(!ok, "a user without ACLs may not create or write: {out}");
    assert!(
        out.contains("Authorization"),
        "Kafka's authorization error: {out}"
    );
}
