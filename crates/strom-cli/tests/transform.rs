//! In-transit transforms on real `strom server` processes
//! (docs/transforms.md): a filter and a compression chained over a
//! 3-member replicated group, with the member leading most source
//! partitions killed with SIGKILL mid-run and started again. The output
//! must hold exactly the expected events: each source event that passes
//! the filter once, in source order per partition, with its data, and
//! nothing else. The source's end of stream carries through the chain.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::replicated::{self, Group, PARTITIONS, TOPIC};
use common::{ok, read_all, wait_for, Stored};
use strom_client::Driver;

const CLI: Duration = Duration::from_secs(60);
const LONG: Duration = Duration::from_secs(120);

/// The event pushed as number `i`: metadata and data.
fn event(i: u64) -> (String, Vec<u8>) {
    let meta = format!(
        "{{\"i\":{i},\"keep\":{},\"junk\":\"x\"}}",
        !i.is_multiple_of(3)
    );
    // Compressible data, different per event.
    let data = (0..2048u64).map(|k| ((i + k / 64) % 251) as u8).collect();
    (meta, data)
}

/// Pushes events until `stop`, in windows of 12; returns how many were
/// acknowledged and how many failed.
fn produce(d: Driver, stop: Arc<AtomicBool>, acked: Arc<Mutex<(u64, u64)>>) {
    let t = d.open_topic(TOPIC).unwrap();
    let p = t.producer().unwrap();
    let mut i = 0u64;
    while !stop.load(Ordering::Acquire) {
        let window: Vec<_> = (0..12)
            .map(|_| {
                let (meta, data) = event(i);
                let part = (i % u64::from(PARTITIONS)) as u32;
                i += 1;
                p.push_with(meta, data, Some(part), &[]).ok()
            })
            .collect();
        let _ = p.flush();
        for f in window {
            let mut a = acked.lock().unwrap();
            match f.map(|f| f.wait()) {
                Some(Ok(_)) => a.0 += 1,
                _ => a.1 += 1,
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    p.close().unwrap();
}

fn transform_lag(g: &Group, name: &str) -> Option<u64> {
    let out = g.zero.cli(&["transform", "list", "--json"], "", CLI);
    out.lines().iter().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        (v["name"] == name).then(|| v["lag"].as_u64()).flatten()
    })
}

fn field(meta: &[u8], key: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(meta).unwrap();
    v[key].clone()
}

/// What the output must hold, per partition: the source's events that
/// pass the filter, in source order, as (i, data).
fn expected(src: &BTreeMap<(u32, u64), Stored>) -> BTreeMap<u32, Vec<(u64, Vec<u8>)>> {
    let mut out: BTreeMap<u32, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    for ((p, _), e) in src {
        if field(&e.meta, "keep") == serde_json::json!(true) {
            let i = field(&e.meta, "i").as_u64().unwrap();
            out.entry(*p).or_default().push((i, e.data.clone()));
        }
    }
    out
}

fn got(out: &BTreeMap<(u32, u64), Stored>) -> BTreeMap<u32, Vec<(u64, Vec<u8>)>> {
    let mut got: BTreeMap<u32, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    for ((p, _), e) in out {
        let v: serde_json::Value = serde_json::from_slice(&e.meta).unwrap();
        assert!(
            v.get("junk").is_none(),
            "the projection dropped 'junk': {v}"
        );
        assert_eq!(v["keep"], serde_json::json!(true), "only kept events pass");
        got.entry(*p)
            .or_default()
            .push((v["i"].as_u64().unwrap(), e.data.clone()));
    }
    got
}

/// The member (not 0, which keeps the registry) leading most source
/// partitions.
fn busiest_joined_leader(d: &Driver) -> u32 {
    let info = d.describe(TOPIC).unwrap();
    let mut led: BTreeMap<u32, usize> = BTreeMap::new();
    for p in info.partitions.iter().filter(|p| p.member != 0) {
        *led.entry(p.member).or_default() += 1;
    }
    led.into_iter()
        .max_by_key(|(_, n)| *n)
        .map_or(1, |(m, _)| m)
}

#[test]
fn a_filter_and_compression_chain_survives_a_sigkill_with_exact_output() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = replicated::start(tmp.path());
    ok(
        g.zero.cli(
            &[
                "transform",
                "create",
                "clean",
                "--from",
                TOPIC,
                "--to",
                "kept",
                "--filter",
                "keep == true",
                "--project",
                "i,keep",
            ],
            "",
            CLI,
        ),
        "creating the filter",
    );
    ok(
        g.zero.cli(
            &[
                "transform",
                "create",
                "pack",
                "--from",
                "kept",
                "--to",
                "packed",
                "--compress",
                "zstd:3",
            ],
            "",
            CLI,
        ),
        "creating the compression",
    );
    let packed = g.d.describe("packed").unwrap();
    assert_eq!(packed.spec.compression, "zstd:3");
    assert_eq!(packed.spec.replication_factor, 3, "made like the source");

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new((0u64, 0u64)));
    let pd = Driver::connect(&g.zero.group_file).unwrap();
    let (s, a) = (stop.clone(), acked.clone());
    let producer = std::thread::spawn(move || produce(pd, s, a));
    wait_for("events through the chain", || {
        g.d.describe("packed")
            .is_ok_and(|i| i.partitions.iter().map(|p| p.next_offset).sum::<u64>() > 200)
    });

    // SIGKILL the member leading most source partitions mid-run, and
    // start it again on its data.
    let victim = busiest_joined_leader(&g.d);
    let (proc_, dir) = g.joined.remove(&victim).unwrap();
    drop(proc_);
    wait_for("acks after the kill", || acked.lock().unwrap().0 > 1500);
    let back = g.zero.join_member(
        &dir,
        &[],
        replicated::member_stderr(tmp.path(), 10 + victim),
    );
    g.joined.insert(victim, (back, dir));
    wait_for("more acks with the member back", || {
        acked.lock().unwrap().0 > 2500
    });
    stop.store(true, Ordering::Release);
    producer.join().unwrap();
    let (n_acked, n_failed) = *acked.lock().unwrap();
    assert_eq!(n_failed, 0, "no push failed");

    // Both transforms catch up with the source.
    let deadline = std::time::Instant::now() + LONG;
    while !(transform_lag(&g, "clean") == Some(0) && transform_lag(&g, "pack") == Some(0)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the transforms did not catch up: lags {:?} {:?}; status:\n{}",
            transform_lag(&g, "clean"),
            transform_lag(&g, "pack"),
            g.zero.cli(&["status"], "", CLI).stdout,
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // The source ended (its producer closed): both outputs end in turn.
    wait_for("the chain's output to end", || {
        g.d.describe("packed").is_ok_and(|i| i.state.ended)
    });
    let src = read_all(&g.d, TOPIC, "check-src", LONG);
    assert!(
        src.len() as u64 >= n_acked,
        "every acknowledged event is in the source"
    );
    let want = expected(&src.events);
    let mid = got(&read_all(&g.d, "kept", "check-kept", LONG).events);
    let out = got(&read_all(&g.d, "packed", "check-packed", LONG).events);
    let count: usize = want.values().map(Vec::len).sum();
    eprintln!(
        "source {} events ({n_acked} acked), {count} pass the filter; member {victim} was killed",
        src.len()
    );
    assert_eq!(mid, want, "the filter's output is exactly the kept events");
    assert_eq!(
        out, want,
        "the compression's output is exactly the kept events"
    );
}

/// A 4x4 uint8 array whose element (r, c) is `4 * r + c + i`.
fn array(i: u8) -> Vec<u8> {
    (0..16u8).map(|k| k.wrapping_add(i)).collect()
}

/// One server with a topic of 2 partitions.
fn server_with_source(topic: &str) -> (tempfile::TempDir, common::ServerProcess) {
    let tmp = tempfile::tempdir().unwrap();
    let s = common::ServerProcess::start(tmp.path());
    let args = ["topic", "create", topic, "--partitions", "2"];
    ok(s.cli(&args, "", CLI), "creating the source");
    (tmp, s)
}

#[test]
fn a_chain_ends_when_its_source_ends_and_its_steps_apply() {
    let (_tmp, s) = server_with_source("frames");
    let cli = |args: &[&str]| s.cli(args, "", CLI);
    ok(
        cli(&[
            "transform",
            "create",
            "thin",
            "--from",
            "frames",
            "--to",
            "thin",
            "--downsample",
            "2,2",
            "--rename",
            "t=time",
        ]),
        "creating the downsample",
    );
    ok(
        cli(&[
            "transform",
            "create",
            "z",
            "--from",
            "thin",
            "--to",
            "zipped",
            "--compress",
            "lz4",
        ]),
        "creating the compression",
    );
    // Refusals, each with its reason, and nothing recorded.
    for (args, why) in [
        (
            vec![
                "transform",
                "create",
                "thin",
                "--from",
                "frames",
                "--to",
                "x",
            ],
            "exists",
        ),
        (
            vec!["transform", "create", "a", "--from", "nope", "--to", "x"],
            "nope",
        ),
        (
            vec![
                "transform",
                "create",
                "b",
                "--from",
                "frames",
                "--to",
                "frames",
            ],
            "read and write",
        ),
        (
            vec![
                "transform",
                "create",
                "c",
                "--from",
                "frames",
                "--to",
                "thin",
                "--compress",
                "zstd",
            ],
            "compression",
        ),
        (
            vec![
                "transform",
                "create",
                "d",
                "--from",
                "frames",
                "--to",
                "y",
                "--filter",
                "[0]",
            ],
            "comparison",
        ),
        (
            vec![
                "transform",
                "create",
                "e f",
                "--from",
                "frames",
                "--to",
                "y",
            ],
            "invalid transform name",
        ),
        (vec!["transform", "delete", "nope"], "no transform"),
    ] {
        let out = cli(&args);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(out.stderr.contains(why), "{args:?}: {}", out.stderr);
    }

    let d = s.connect();
    let t = d.open_topic("frames").unwrap();
    let p = t.producer().unwrap();
    let desc = br#"{"dtype":"|u1","shape":[4,4],"order":"C"}"#;
    for i in 0..40u8 {
        let meta = format!("{{\"t\":{i},\"keep\":1}}");
        p.push_with(meta, array(i), Some(u32::from(i % 2)), desc)
            .unwrap();
    }
    p.close().unwrap();
    let deadline = std::time::Instant::now() + LONG;
    while !d.describe("zipped").is_ok_and(|i| i.state.ended) {
        assert!(
            std::time::Instant::now() < deadline,
            "the chain's output did not end"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = read_all(&d, "zipped", "check", LONG);
    assert_eq!(out.len(), 40);
    for e in out.events.values() {
        let v: serde_json::Value = serde_json::from_slice(&e.meta).unwrap();
        assert!(v.get("t").is_none(), "renamed: {v}");
        let i = v["time"].as_u64().unwrap() as u8;
        let a = array(i);
        assert_eq!(
            e.data,
            vec![a[0], a[2], a[8], a[10]],
            "event {i} down-sampled"
        );
    }
    let listed = cli(&["transform", "list"]).stdout;
    assert!(
        listed.contains("thin") && listed.contains("rename,downsample"),
        "{listed}"
    );
    // `status` shows the transforms and their lag, and so does its JSON.
    let status = cli(&["status"]).stdout;
    assert!(status.contains("transform.thin=20/0"), "{status}");
    let row = status
        .lines()
        .find(|l| l.starts_with("z "))
        .unwrap_or_else(|| panic!("no row for z in {status}"));
    assert!(row.contains(" 0  compress"), "{row}");
    let v: serde_json::Value = serde_json::from_str(&cli(&["status", "--json"]).stdout).unwrap();
    let lags: Vec<_> = v["transforms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["lag"].clone())
        .collect();
    assert_eq!(lags, vec![serde_json::json!(0), serde_json::json!(0)]);
    ok(cli(&["transform", "delete", "thin"]), "deleting");
    let listed = cli(&["transform", "list", "--json"]).stdout;
    assert!(!listed.contains("\"name\":\"thin\""), "deleted: {listed}");
    assert!(listed.contains("\"z\""), "the other stays: {listed}");
}

/// Sets the committed offset of `consumer` on one partition, as a crash
/// between an output's append and its source's commit leaves it.
fn commit(addr: &str, topic: &str, partition: u32, consumer: &str, offset: u64) {
    let req = strom_proto::Request::Commit {
        topic: topic.into(),
        partition,
        consumer: consumer.into(),
        offset,
    };
    let mut s = common::raw::connect(addr);
    std::io::Write::write_all(&mut s, &common::raw::request_frame(9, &req, b"")).unwrap();
    let got = common::raw::read_until_reply(&mut s, 9, "a commit");
    let answers = common::raw::responses(&got);
    assert!(
        matches!(
            answers.iter().find(|(id, _)| *id == 9),
            Some((_, strom_proto::Response::Done))
        ),
        "commit answered {answers:?}"
    );
}

/// The output of `topic`, per partition, as metadata `i` values.
fn outputs(d: &Driver, topic: &str) -> BTreeMap<u32, Vec<u64>> {
    let mut got: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for ((p, _), e) in read_all(d, topic, "check", LONG).events {
        got.entry(p)
            .or_default()
            .push(field(&e.meta, "i").as_u64().unwrap());
    }
    got
}

/// The mechanism exactly-once rests on, without a crash's timing: the
/// transform is stopped, its progress set back to offset 0 (as if no
/// commit had landed), and started again. It transforms every source
/// batch again, and the output partitions answer each stamped batch from
/// their sequence tables: nothing is written twice, and what comes after
/// is written once.
#[test]
fn a_rerun_from_an_older_commit_writes_nothing_twice() {
    let (_tmp, s) = server_with_source("src");
    let cli = |args: &[&str]| s.cli(args, "", CLI);
    let create = [
        "transform",
        "create",
        "copy",
        "--from",
        "src",
        "--to",
        "dst",
        "--project",
        "i",
    ];
    ok(cli(&create), "creating the transform");
    let d = s.connect();
    let p = d.open_topic("src").unwrap().producer().unwrap();
    let push = |from: u64, to: u64| {
        for i in from..to {
            p.push_with(
                format!("{{\"i\":{i}}}"),
                vec![1u8; 10],
                Some((i % 2) as u32),
                &[],
            )
            .unwrap();
            if i % 6 == 5 {
                p.flush().unwrap(); // batches of 3 per partition
            }
        }
        p.flush().unwrap();
    };
    let lag = || {
        let out = cli(&["transform", "list", "--json"]);
        let v: serde_json::Value = serde_json::from_str(out.lines().first()?).unwrap();
        v["lag"].as_u64()
    };
    let caught_up = |n: u64| {
        wait_for("the transform to catch up", || {
            lag() == Some(0)
                && d.describe("dst")
                    .is_ok_and(|i| i.partitions.iter().map(|p| p.next_offset).sum::<u64>() >= n)
        })
    };
    push(0, 60);
    caught_up(60);
    let want = |n: u64| -> BTreeMap<u32, Vec<u64>> {
        (0..2)
            .map(|p| (p as u32, (p..n).step_by(2).collect()))
            .collect()
    };
    assert_eq!(outputs(&d, "dst"), want(60));

    ok(cli(&["transform", "delete", "copy"]), "deleting");
    std::thread::sleep(Duration::from_secs(3)); // its workers stop within a second
    for part in 0..2 {
        commit(&s.addr, "src", part, "transform.copy", 0);
    }
    assert_eq!(lag(), None, "deleted: not listed");
    ok(cli(&create), "creating it again");
    // It reads all 60 again (lag back to 0) and appends nothing new.
    wait_for("the rerun to catch up", || lag() == Some(0));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        outputs(&d, "dst"),
        want(60),
        "the rerun wrote nothing twice"
    );
    push(60, 90);
    caught_up(90);
    assert_eq!(outputs(&d, "dst"), want(90), "and what came after, once");
}
