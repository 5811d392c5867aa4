//! Groups of real `strom server` processes: a 3-member group surviving
//! `kill -9` of one member, `strom cluster up` + `strom status`, the mpirun
//! launcher path, and partitions added while producers and consumers run.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::live_members;
use strom_client::{ConsumerOptions, Driver, Next, StartPos, TopicSpec};

const WAIT: Duration = Duration::from_secs(20);

fn strom() -> &'static str {
    env!("CARGO_BIN_EXE_strom")
}

/// One rank of a launched group (as `strom cluster up` and mpirun start them).
struct Rank {
    child: Child,
}

impl Rank {
    fn start(base: &Path, rank: u32, size: u32) -> Rank {
        let log = std::fs::File::create(base.join(format!("rank-{rank}.log"))).unwrap();
        let child = Command::new(strom())
            .args(["server", "--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(base.join("data"))
            .arg("--group-file")
            .arg(base.join("group.json"))
            .env("STROM_RANK", rank.to_string())
            .env("STROM_SIZE", size.to_string())
            .env_remove("STROM_GROUP_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning strom server");
        Rank { child }
    }

    fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaping");
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn group(base: &Path, size: u32) -> (Vec<Rank>, Driver) {
    let ranks: Vec<Rank> = (0..size).map(|r| Rank::start(base, r, size)).collect();
    let gf = base.join("group.json");
    wait_for("the group file", || gf.exists());
    let d = Driver::connect(&gf).expect("connecting to the group");
    wait_for("every member alive", || live_members(&d) == size as usize);
    (ranks, d)
}

fn payload(p: u32, i: u32) -> Vec<u8> {
    (0..(64 + i % 300))
        .map(|k| (k * 7 + p * 13 + i) as u8)
        .collect()
}

#[test]
fn three_member_group_survives_kill_9_of_one_member() {
    let dir = tempfile::tempdir().unwrap();
    let (mut ranks, d) = group(dir.path(), 3);
    let topic = d.create_topic(TopicSpec::new("spread", 6)).unwrap();
    let info = topic.info();
    for m in 0..3 {
        let owned = info.partitions.iter().filter(|p| p.member == m).count();
        assert_eq!(
            owned, 2,
            "member {m} should own 2 of 6 partitions: {info:?}"
        );
    }
    let victim = 2u32;
    let lost: Vec<u32> = info
        .partitions
        .iter()
        .filter(|p| p.member == victim)
        .map(|p| p.id)
        .collect();
    let kept: Vec<u32> = info
        .partitions
        .iter()
        .filter(|p| p.member != victim)
        .map(|p| p.id)
        .collect();

    let producer = topic.producer().unwrap();
    for p in 0..6 {
        let futs: Vec<_> = (0..100)
            .map(|i| {
                producer
                    .push_with(
                        format!("{{\"p\":{p},\"i\":{i}}}"),
                        payload(p, i),
                        Some(p),
                        &[],
                    )
                    .unwrap()
            })
            .collect();
        for f in futs {
            f.wait().unwrap();
        }
    }

    // A consumer of the surviving partitions runs across the kill.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (topic, kept, stop) = (topic.clone(), kept.clone(), stop.clone());
        std::thread::spawn(move || {
            let c = topic
                .consumer_with(
                    "survivor",
                    ConsumerOptions {
                        partitions: Some(kept),
                        start: StartPos::Beginning,
                        ..Default::default()
                    },
                )
                .unwrap();
            let mut n = 0;
            while n < 800 && !stop.load(Ordering::Relaxed) {
                match c.pull_timeout(Duration::from_millis(200)) {
                    Ok(Next::Event(ev)) => {
                        let v = ev.json().unwrap();
                        let (p, i) = (
                            v["p"].as_u64().unwrap() as u32,
                            v["i"].as_u64().unwrap() as u32,
                        );
                        assert_eq!(ev.data(), &payload(p, i % 100)[..], "data of {p}/{i}");
                        n += 1;
                    }
                    Ok(Next::EndOfStream) => panic!("unexpected end of stream"),
                    Err(e) if e.code() == strom_client::ErrorCode::TIMEOUT => {}
                    Err(e) => panic!("the survivors' consumer saw an error: {e}"),
                }
            }
            n
        })
    };

    ranks[victim as usize].kill9();
    // Producing to surviving partitions carries on without error.
    for &p in &kept {
        let futs: Vec<_> = (100..200)
            .map(|i| {
                producer
                    .push_with(
                        format!("{{\"p\":{p},\"i\":{i}}}"),
                        payload(p, i % 100),
                        Some(p),
                        &[],
                    )
                    .unwrap()
            })
            .collect();
        for f in futs {
            f.wait().expect("a surviving partition must accept events");
        }
    }
    // Producing to the dead member's partition fails, naming member and partition.
    let err = producer
        .push_with("{\"p\":2}", vec![1u8], Some(lost[0]), &[])
        .unwrap()
        .wait()
        .expect_err("the dead member's partition cannot ack");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("member {victim}"))
            && msg.contains(&format!("partition {}", lost[0])),
        "{msg}"
    );

    // describe and status mark the dead member's partitions, naming it.
    let described = d.describe("spread").unwrap();
    for p in &described.partitions {
        if p.member == victim {
            assert_eq!(p.status.as_str(), "unavailable", "{p:?}");
            assert!(
                p.status.reason().contains(&format!("member {victim}")),
                "{p:?}"
            );
        } else {
            assert!(p.status.is_ok(), "a live member's partition: {p:?}");
        }
    }
    let status = Command::new(strom())
        .args(["status", "--json", "--group-file"])
        .arg(dir.path().join("group.json"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let unavailable: Vec<u64> = v["topics"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["status"] == "unavailable")
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        unavailable,
        lost.iter().map(|p| *p as u64).collect::<Vec<_>>(),
        "strom status marks exactly the dead member's partitions"
    );

    let got = {
        let deadline = Instant::now() + WAIT;
        while !reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("survivor consumer panicked")
    };
    assert_eq!(got, 800, "every event of the 4 surviving partitions");

    // Restart the member on its data dir: its partitions serve every acked event.
    let member_alive = |d: &Driver| {
        d.members()
            .map(|m| m.iter().any(|m| m.id == victim && m.alive))
            .unwrap_or(false)
    };
    // The heartbeat reports the dead member, then its return.
    wait_for("the master to notice the dead member", || !member_alive(&d));
    ranks[victim as usize] = Rank::start(dir.path(), victim, 3);
    wait_for("the member to rejoin", || member_alive(&d));
    let c = topic
        .consumer_with(
            "after-restart",
            ConsumerOptions {
                partitions: Some(lost.clone()),
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 200 {
        match c
            .pull_timeout(WAIT)
            .expect("events of the restarted member")
        {
            Next::Event(ev) => {
                let v = ev.json().unwrap();
                let (p, i) = (
                    v["p"].as_u64().unwrap() as u32,
                    v["i"].as_u64().unwrap() as u32,
                );
                assert_eq!(ev.data(), &payload(p, i)[..]);
                assert!(seen.insert((p, i)), "duplicate {p}/{i}");
            }
            Next::EndOfStream => panic!("unexpected end of stream"),
        }
    }
    assert!(matches!(
        c.pull_timeout(Duration::from_millis(300)),
        Err(e) if e.code() == strom_client::ErrorCode::TIMEOUT
    ));
}

fn run_cli(args: &[&str], gf: Option<&Path>) -> (bool, String, String) {
    let mut cmd = Command::new(strom());
    cmd.args(args).env_remove("STROM_GROUP_FILE");
    if let Some(g) = gf {
        cmd.env("STROM_GROUP_FILE", g);
    }
    let out = cmd.output().expect("running strom");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cluster_up_then_status_json_shows_three_live_members() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let d = data.to_str().unwrap();
    let (ok, out, err) = run_cli(&["cluster", "up", "--servers", "3", "--data-dir", d], None);
    assert!(ok, "cluster up failed: {err}");
    let gf = PathBuf::from(out.trim());
    assert!(gf.exists(), "cluster up prints the group file path: {out}");
    let driver = Driver::connect(&gf).unwrap();
    wait_for("3 live members", || live_members(&driver) == 3);
    let (ok, _, err) = run_cli(&["topic", "create", "c", "--partitions", "3"], Some(&gf));
    assert!(ok, "{err}");
    let (ok, out, err) = run_cli(&["status", "--json"], Some(&gf));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("status --json prints JSON");
    let members = v["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    assert!(members.iter().all(|m| m["alive"] == true), "{out}");
    assert!(
        members.iter().all(|m| m["partitions"] == 1),
        "one partition each: {out}"
    );
    assert_eq!(v["topics"][0]["partitions"].as_array().unwrap().len(), 3);
    let (ok, _, err) = run_cli(&["cluster", "down", "--data-dir", d], None);
    assert!(ok, "cluster down failed: {err}");
    assert!(!data.join("cluster.json").exists());
}

#[test]
fn mpirun_launches_a_group_without_linking_mpi() {
    let dir = tempfile::tempdir().unwrap();
    let gf = dir.path().join("group.json");
    let mut mpirun = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            "3",
            strom(),
            "server",
        ])
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--group-file")
        .arg(&gf)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("STROM_RANK")
        .env_remove("STROM_SIZE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mpirun must be installed (make test installs openmpi-bin)");
    wait_for("the group file", || gf.exists());
    let d = Driver::connect(&gf).unwrap();
    wait_for("3 live ranks", || live_members(&d) == 3);
    let t = d.create_topic(TopicSpec::new("mpi", 3)).unwrap();
    let members: std::collections::BTreeSet<u32> =
        t.info().partitions.iter().map(|p| p.member).collect();
    assert_eq!(members.len(), 3, "one partition per rank");
    let p = t.producer().unwrap();
    for i in 0..30 {
        p.push(format!("{{\"i\":{i}}}"), ()).unwrap();
    }
    p.close().unwrap();
    let c = t.consumer("c").unwrap();
    let mut n = 0;
    for e in &c {
        e.unwrap();
        n += 1;
    }
    assert_eq!(n, 30);
    let _ = Command::new("kill")
        .args(["-TERM", &mpirun.id().to_string()])
        .status();
    let deadline = Instant::now() + WAIT;
    while mpirun.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = mpirun.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn added_partitions_reach_running_producer_and_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("grow", 2)).unwrap();
    let c = t.consumer("watcher").unwrap();
    let p = t.producer().unwrap();
    let mut seen_new_on_produce = false;
    let mut futures = Vec::new();
    let start = Instant::now();
    let mut added = false;
    while start.elapsed() < WAIT && !seen_new_on_produce {
        futures.push(p.push("{\"x\":1}", ()).unwrap());
        if !added && start.elapsed() > Duration::from_millis(200) {
            d.add_partitions("grow", 2, None).unwrap();
            added = true;
        }
        if futures.len() % 50 == 0 {
            p.flush().unwrap();
            for f in futures.drain(..) {
                seen_new_on_produce |= f.wait().unwrap().partition >= 2;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(
        seen_new_on_produce,
        "a running producer must pick up the new partitions"
    );
    p.close().unwrap();
    let mut partitions = std::collections::BTreeSet::new();
    for ev in &c {
        partitions.insert(ev.unwrap().partition);
    }
    assert!(
        partitions.contains(&2) && partitions.contains(&3),
        "consumer saw {partitions:?}"
    );
}

#[test]
fn known_partitions_keep_working_while_the_registry_master_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let (mut ranks, d) = group(dir.path(), 3);
    let topic = d.create_topic(TopicSpec::new("orphan", 3)).unwrap();
    let info = topic.info();
    let others: Vec<u32> = info
        .partitions
        .iter()
        .filter(|p| p.member != 0)
        .map(|p| p.id)
        .collect();
    assert_eq!(others.len(), 2);
    let producer = topic.producer().unwrap();
    let consumer = topic
        .consumer_with(
            "c",
            ConsumerOptions {
                partitions: Some(others.clone()),
                ..Default::default()
            },
        )
        .unwrap();
    ranks[0].kill9();
    // Past the members' heartbeat timeout (3 s) and a round of failed
    // lease renewals: nothing on the data path waits for the master.
    std::thread::sleep(Duration::from_secs(4));
    for &p in &others {
        for i in 0..20 {
            producer
                .push_with(format!("{{\"i\":{i}}}"), vec![p as u8; 10], Some(p), &[])
                .unwrap()
                .wait()
                .expect("partitions on live members accept events without the master");
        }
    }
    for _ in 0..40 {
        match consumer
            .pull_timeout(WAIT)
            .expect("consuming without the master")
        {
            Next::Event(ev) => assert_eq!(ev.data(), &[ev.partition as u8; 10][..]),
            Next::EndOfStream => panic!("unexpected end of stream"),
        }
    }
    let err = match d.create_topic(TopicSpec::new("new", 1)) {
        Err(e) => e,
        Ok(_) => panic!("topic creation must fail while the master is down"),
    };
    assert_eq!(
        err.code(),
        strom_client::ErrorCode::CONNECTION_FAILED,
        "{err}"
    );
    assert!(
        err.to_string().contains("registry master is unreachable"),
        "{err}"
    );
}

/// A shared group on a topic spread over two members: each member writes
/// the dead letters of its own partitions into a dead-letter partition it
/// hosts (the default dead-letter topic is placed like the source), and a
/// named dead-letter topic that has no partition on one of the owners is
/// refused when the group is created, not left to park dead letters.
#[test]
fn dead_letters_stay_on_the_member_that_owns_the_partition() {
    use strom_client::{ErrorCode, GroupOptions, ProducerOptions};
    let base = tempfile::tempdir().unwrap();
    let (_ranks, d) = group(base.path(), 2);
    let src = d.create_topic(TopicSpec::new("src", 2)).unwrap();
    let placement: Vec<u32> = src.info().partitions.iter().map(|p| p.member).collect();
    assert_eq!(placement.len(), 2);
    assert_ne!(placement[0], placement[1], "spread over both members");

    let lonely = placement[0];
    d.create_topic_on(TopicSpec::new("dlq-one", 1), Some(lonely))
        .unwrap();
    let refused = src
        .consumer_group(
            "named",
            GroupOptions {
                max_deliveries: Some(2),
                dead_letter: Some("dlq-one".into()),
                ..GroupOptions::shared()
            },
        )
        .err()
        .expect("a dead-letter topic missing from one owner is refused");
    assert_eq!(refused.code(), ErrorCode::INVALID_ARGUMENT, "{refused}");
    assert!(
        refused
            .to_string()
            .contains(&format!("member {}", placement[1])),
        "{refused}"
    );

    let p = src
        .producer_with(ProducerOptions {
            lease: None,
            ..Default::default()
        })
        .unwrap();
    for part in [0u32, 1] {
        p.push_with(format!("{{\"p\":{part}}}"), (), Some(part), &[])
            .unwrap()
            .wait()
            .unwrap();
    }
    p.close().unwrap();
    let mut o = GroupOptions::shared();
    o.max_deliveries = Some(2);
    o.consumer.prefetch = 1;
    let c = src.consumer_group("g", o).unwrap();
    while let Next::Event(e) = c.pull_timeout(Duration::from_secs(20)).unwrap() {
        e.nack().wait().unwrap();
    }
    let dlq = d.open_topic("src.g.dlq").unwrap();
    let dlq_placement: Vec<u32> = dlq.info().partitions.iter().map(|p| p.member).collect();
    assert_eq!(dlq_placement, placement, "placed like the source");
    for part in 0..2u32 {
        let r = dlq
            .consumer_with(
                &format!("check-{part}"),
                ConsumerOptions {
                    partitions: Some(vec![part]),
                    start: StartPos::Beginning,
                    ..Default::default()
                },
            )
            .unwrap();
        let Next::Event(dead) = r.pull_timeout(Duration::from_secs(20)).unwrap() else {
            panic!("no dead letter in partition {part}");
        };
        let env = dead.json().unwrap();
        assert_eq!(env["partition"], part, "{env}");
        assert_eq!(env["deliveries"], 2, "{env}");
    }
}
