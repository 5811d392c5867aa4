//! Quotas (docs/quotas.md) against a real `strom server`: a principal's
//! produce and consume quotas hold it at its rate while an unthrottled
//! principal on the same server runs far above it; a storage quota refuses
//! appends with `QUOTA_EXCEEDED` and loses nothing acknowledged; a Kafka
//! client's Produce answers report `throttle_time_ms`; `strom quota` sets,
//! lists and removes them (with `alter` on the cluster only).

mod common;

use std::ffi::OsStr;
use std::thread;
use std::time::{Duration, Instant};

use common::auth::{cli, succeeded, token_for};
use common::kafka_raw::{connect, i16_at, i32_at, record_batch, request, response, string};
use common::{read_all, wait_for, ServerProcess};
use strom_client::{Driver, ErrorCode, Next, Transports};

const AUTH: &[&str] = &["--auth", "--super-user", "User:admin"];
const MIB: u64 = 1 << 20;
/// The data part of every event.
const EVENT: usize = 64 << 10;
/// How long the throttled clients run.
const RUN: Duration = Duration::from_secs(3);

fn connect_as(s: &ServerProcess, who: &str) -> Driver {
    let t = token_for(s, who, 3600);
    Driver::connect_as(&s.group_file, Transports::default(), Some(t)).expect("connecting")
}

/// `strom quota ARGS` as `who`; its output.
fn quota(s: &ServerProcess, who: &str, args: &[&str]) -> std::process::Output {
    let file = s.data_dir.parent().unwrap().join(format!("{who}.token"));
    std::fs::write(&file, token_for(s, who, 3600)).unwrap();
    let mut all = vec!["quota"];
    all.extend_from_slice(args);
    cli(s, &all, &[("STROM_TOKEN_FILE", OsStr::new(&file))], "")
}

/// Sets a quota as the admin, and waits until the server enforces it.
fn set_quota(s: &ServerProcess, args: &[&str]) {
    let before = enforced(s);
    let mut all = vec!["set"];
    all.extend_from_slice(args);
    succeeded(&quota(s, "admin", &all), "strom quota set");
    wait_for("the server to enforce the new quota table", || {
        enforced(s) > before
    });
}

/// The version of the quota table the server enforces (its snapshot).
fn enforced(s: &ServerProcess) -> u64 {
    let json = connect_as(s, "admin")
        .server_snapshot_at(&s.addr)
        .expect("a snapshot");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["quotas"]["version"].as_u64().unwrap_or(0)
}

/// Allows every principal everything on topics (the test is about quotas).
fn open_topics(admin: &Driver) {
    let acl = r#"[{"principal":"*","resource":"topic","pattern":{"prefix":""},"operation":"all","permission":"allow"},
                  {"principal":"*","resource":"group","pattern":{"prefix":""},"operation":"all","permission":"allow"}]"#;
    admin.alter_acls(true, acl.into()).expect("adding ACLs");
}

/// Pushes events of `EVENT` bytes to `topic` as fast as acks allow,
/// until `run` passed or `cap` bytes were pushed; bytes per second over
/// the time until the last was acknowledged.
fn produce_for(d: &Driver, topic: &str, run: Duration, cap: u64) -> f64 {
    let p = d.open_topic(topic).unwrap().producer().unwrap();
    let start = Instant::now();
    let mut pending = std::collections::VecDeque::new();
    let mut sent = 0u64;
    while start.elapsed() < run && sent < cap {
        pending.push_back(p.push_with("{}", vec![7u8; EVENT], Some(0), &[]).unwrap());
        sent += EVENT as u64;
        while pending.len() > 64 {
            pending
                .pop_front()
                .unwrap()
                .wait()
                .expect("an acknowledged push");
        }
    }
    p.flush().unwrap();
    for f in pending {
        f.wait().expect("an acknowledged push");
    }
    sent as f64 / start.elapsed().as_secs_f64()
}

/// Reads `n` events of `topic` with their data under a fresh consumer;
/// bytes of data per second.
fn consume(d: &Driver, topic: &str, name: &str, n: usize) -> f64 {
    let c = d.open_topic(topic).unwrap().consumer(name).unwrap();
    let start = Instant::now();
    let mut bytes = 0u64;
    for _ in 0..n {
        match c.pull_timeout(Duration::from_secs(30)).expect("an event") {
            Next::Event(ev) => bytes += ev.data_vec().len() as u64,
            Next::EndOfStream => panic!("{topic} ended early"),
        }
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

fn assert_near(rate: f64, quota: u64, what: &str) {
    let q = quota as f64;
    eprintln!(
        "{what}: {:.3} MiB/s (quota {:.3} MiB/s)",
        rate / MIB as f64,
        q / MIB as f64
    );
    assert!(
        (rate - q).abs() <= q * 0.10,
        "{what}: {rate:.0} B/s is not within 10% of its quota of {q:.0} B/s"
    );
}

#[test]
fn a_produce_quota_holds_its_principal_at_the_rate_while_another_runs_free() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), AUTH);
    let admin = connect_as(&s, "admin");
    open_topics(&admin);
    for t in ["slow", "fast"] {
        admin
            .create_topic(strom_client::TopicSpec::new(t, 1))
            .unwrap();
    }
    set_quota(&s, &["--user", "alice", "--produce-bytes-per-sec", "1MiB"]);
    let (alice, bob) = (connect_as(&s, "alice"), connect_as(&s, "bob"));
    let fast = thread::spawn(move || produce_for(&bob, "fast", RUN, 256 * MIB));
    let slow = produce_for(&alice, "slow", RUN, u64::MAX);
    let fast = fast.join().unwrap();
    assert_near(slow, MIB, "alice, with a produce quota");
    eprintln!(
        "bob, unthrottled at the same time: {:.1} MiB/s",
        fast / MIB as f64
    );
    assert!(
        fast > 4.0 * MIB as f64,
        "bob has no quota but produced at only {fast:.0} B/s"
    );
    // The server counts what it held, per quota.
    let json = admin.server_snapshot_at(&s.addr).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let held = &v["quotas"]["throttled"];
    assert!(
        held.as_array()
            .unwrap()
            .iter()
            .any(|t| t["kind"] == "produce"
                && t["key"] == "user User:alice"
                && t["answers"].as_u64() > Some(0)),
        "no throttled answers counted for alice: {held}"
    );
}

#[test]
fn a_consume_quota_holds_its_principal_at_the_rate_while_another_runs_free() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), AUTH);
    let admin = connect_as(&s, "admin");
    open_topics(&admin);
    admin
        .create_topic(strom_client::TopicSpec::new("data", 1))
        .unwrap();
    let _open = admin.open_topic("data").unwrap().producer().unwrap();
    // 3 MiB: three seconds at alice's quota.
    let n = (3 * MIB) as usize / EVENT;
    produce_for(&admin, "data", Duration::from_secs(60), 3 * MIB);
    set_quota(&s, &["--user", "alice", "--consume-bytes-per-sec", "1MiB"]);
    let (alice, bob) = (connect_as(&s, "alice"), connect_as(&s, "bob"));
    let fast = thread::spawn(move || {
        // Bob reads the same events again and again meanwhile.
        let mut rates = Vec::new();
        for i in 0..4 {
            rates.push(consume(&bob, "data", &format!("bob{i}"), n));
        }
        rates.into_iter().fold(0.0, f64::max)
    });
    let slow = consume(&alice, "data", "alice", n);
    let fast = fast.join().unwrap();
    assert_near(slow, MIB, "alice, with a consume quota");
    eprintln!(
        "bob, unthrottled at the same time: {:.1} MiB/s",
        fast / MIB as f64
    );
    assert!(
        fast > 4.0 * MIB as f64,
        "bob has no quota but consumed at only {fast:.0} B/s"
    );
}

#[test]
fn a_storage_quota_refuses_appends_with_its_code_and_loses_nothing_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), AUTH);
    let admin = connect_as(&s, "admin");
    open_topics(&admin);
    admin
        .create_topic(strom_client::TopicSpec::new("sim.full", 1))
        .unwrap();
    let _open = admin.open_topic("sim.full").unwrap().producer().unwrap();
    set_quota(&s, &["--topic-prefix", "sim.", "--stored-bytes", "1MiB"]);
    let alice = connect_as(&s, "alice");
    let p = alice.open_topic("sim.full").unwrap().producer().unwrap();
    let mut acked = 0u64;
    let refusal = loop {
        assert!(
            acked < 64,
            "1 MiB of quota took more than 64 events of 64 KiB"
        );
        let r = p
            .push_with(
                format!("{{\"i\":{acked}}}"),
                vec![acked as u8; EVENT],
                Some(0),
                &[],
            )
            .and_then(|f| {
                p.flush()?;
                f.wait()
            });
        match r {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(refusal.code(), ErrorCode::QUOTA_EXCEEDED, "{refusal}");
    let text = refusal.to_string();
    eprintln!("the refusal: {text}");
    assert!(
        text.contains("topic prefix sim.*") && text.contains("1048576"),
        "the refusal names the quota: {text}"
    );
    assert!(acked >= 16, "only {acked} events fit under 1 MiB");
    // Every acknowledged event is there, whole and in order.
    let got = read_all(&admin, "sim.full", "check", Duration::from_secs(20));
    assert_eq!(got.len() as u64, acked, "acknowledged events kept");
    for (i, ((_, off), ev)) in got.events.iter().enumerate() {
        assert_eq!((*off, ev.data.len()), (i as u64, EVENT));
        assert!(ev.data.iter().all(|b| *b == i as u8), "event {i}'s data");
    }
    // Raising it lets the topic grow again.
    set_quota(&s, &["--topic-prefix", "sim.", "--stored-bytes", "64MiB"]);
    let f = p.push_with("{}", vec![1u8; 16], Some(0), &[]).unwrap();
    p.flush().unwrap();
    f.wait().expect("an append under the raised quota");
}

#[test]
fn strom_quota_sets_lists_and_removes_and_only_cluster_admins_change_them() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start_with(tmp.path(), AUTH);
    open_topics(&connect_as(&s, "admin"));
    let refused = quota(
        &s,
        "mallory",
        &["set", "--user", "mallory", "--produce-bytes-per-sec", "1G"],
    );
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("NOT_AUTHORIZED") || err.contains("may not alter"),
        "{err}"
    );
    set_quota(&s, &["--user", "alice", "--produce-bytes-per-sec", "2MiB"]);
    set_quota(&s, &["--topic", "t1", "--consume-bytes-per-sec", "500k"]);
    set_quota(&s, &["--user", "alice", "--consume-bytes-per-sec", "1MiB"]);
    let list = succeeded(&quota(&s, "admin", &["list"]), "strom quota list");
    assert!(
        list.contains("user User:alice\tproduce_bytes_per_sec=2097152\tconsume_bytes_per_sec=1048576\tstored_bytes=-"),
        "{list}"
    );
    assert!(
        list.contains("topic t1\tproduce_bytes_per_sec=-\tconsume_bytes_per_sec=512000"),
        "{list}"
    );
    succeeded(
        &quota(&s, "admin", &["remove", "--topic", "t1"]),
        "strom quota remove",
    );
    let list = succeeded(&quota(&s, "admin", &["list"]), "strom quota list");
    assert!(!list.contains("topic t1"), "{list}");
    // Hostile or malformed values are refused before anything is sent.
    for bad in [
        &["set", "--user", "a", "--topic", "t", "--stored-bytes", "1"][..],
        &["set", "--topic", "../x", "--stored-bytes", "1"],
        &["set", "--user", "a", "--stored-bytes", "1"],
        &["set", "--topic", "t"],
        &[
            "set",
            "--topic",
            "t",
            "--produce-bytes-per-sec",
            "99999999999999999999",
        ],
    ] {
        let o = quota(&s, "admin", bad);
        assert!(!o.status.success(), "{bad:?} was accepted");
    }
    // The registry keeps them across a restart (here without auth, so
    // that any local client may list them).
    let (status, _) = s.terminate(Duration::from_secs(20));
    assert!(status.success());
    let s = ServerProcess::start(tmp.path());
    let out = s.cli(&["quota", "list"], "", Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout
            .contains("user User:alice\tproduce_bytes_per_sec=2097152"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("topic t1"), "{}", out.stdout);
}

/// Kafka Produce v3 of one record batch to `topic`/0: (error, throttle_time_ms).
fn kafka_produce(
    s: &mut std::net::TcpStream,
    corr: i32,
    topic: &str,
    records: &[u8],
) -> (i16, i32) {
    let mut b = (-1i16).to_be_bytes().to_vec(); // transactional id
    b.extend_from_slice(&1i16.to_be_bytes()); // acks 1
    b.extend_from_slice(&10_000i32.to_be_bytes());
    b.extend_from_slice(&1i32.to_be_bytes());
    string(&mut b, topic);
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&(records.len() as i32).to_be_bytes());
    b.extend_from_slice(records);
    std::io::Write::write_all(s, &request(0, 3, corr, &b)).expect("sending Produce");
    let r = response(s).expect("a Produce answer");
    // corr, topics(1), name, partitions(1), index, error, base offset,
    // log append time, then throttle_time_ms.
    let at = 4 + 4 + 2 + topic.len() + 4 + 4;
    (i16_at(&r, at), i32_at(&r, at + 2 + 8 + 8))
}

#[test]
fn kafka_produce_answers_report_throttle_time_and_hold_the_client_at_the_quota() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, kafka) = common::kafka::start(tmp.path());
    let d = s.connect();
    d.create_topic(strom_client::TopicSpec::new("k", 1))
        .unwrap();
    let before = enforced_open(&s);
    let out = s.cli(
        &[
            "quota",
            "set",
            "--topic",
            "k",
            "--produce-bytes-per-sec",
            "512KiB",
        ],
        "",
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "{}", out.stderr);
    wait_for("the quota to be enforced", || enforced_open(&s) > before);
    let value = vec![3u8; EVENT];
    let batch = record_batch(-1, -1, -1, &[&value]);
    let mut conn = connect(&kafka);
    let start = Instant::now();
    let mut throttled = 0;
    let n = 24; // 1.5 MiB: three seconds at the quota
    for corr in 0..n {
        let (error, throttle_ms) = kafka_produce(&mut conn, corr, "k", &batch);
        assert_eq!(error, 0, "produce {corr}");
        throttled += i32::from(throttle_ms > 0);
    }
    let rate = (n as usize * batch.len()) as f64 / start.elapsed().as_secs_f64();
    assert!(
        throttled > n / 2,
        "only {throttled} of {n} answers reported a throttle time"
    );
    assert_near(rate, 512 << 10, "a Kafka producer with a topic quota");
    let got = read_all(&d, "k", "check", Duration::from_secs(20));
    assert_eq!(got.len(), n as usize, "every produced record is stored");
}

/// [`enforced`] on a server without auth.
fn enforced_open(s: &ServerProcess) -> u64 {
    let json = s.connect().server_snapshot_at(&s.addr).expect("a snapshot");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["quotas"]["version"].as_u64().unwrap_or(0)
}
